"""Census-tract boundaries: real TIGER/Line-style files, and synthetic stand-ins.

The release is map-ready, so every tract needs a polygon. Real runs load the Census Bureau's
TIGER/Line tract files (`load_boundaries`); runs on synthetic states (`dpatlas.evaluation.synthetic_input`) have no
such file, so `synth_boundaries` draws a plausible geography for any list of tract GEOIDs:

- each state is its real outline, at its real place (the 48 contiguous states, from
  libpysal's bundled ``us_income`` example; Alaska, Hawaii, DC and Puerto Rico, which it does
  not outline, get a seeded irregular polygon at about their place);
- North Carolina's counties are its real counties (libpysal's ``sids2`` example: the 100
  counties with their FIPS codes and names) when every county code of the GEOIDs is a real
  one; other states (or other codes) are cut into synthetic counties by a
  capacity-constrained power diagram, so a county's area is proportional to its number of
  tracts and tract areas stay comparable across counties;
- each county is cut into tracts by a Lloyd-relaxed Voronoi diagram clipped to the county
  (with power weights to even out tract sizes where Lloyd alone leaves them uneven);
- tracts on the two sides of a county line are given the same vertices there.

Every tract is then a valid polygon (a single Polygon, except where an island too small for a
tract of its own joins the nearest tract), tracts do not overlap, neighbouring tracts share
their edges vertex for vertex (a valid polygon coverage), and the tracts of a county tile the
county and those of a state tile the state. Real: outlines, FIPS codes, county names;
synthetic: tracts, their codes and everything measured in them.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyogrio
import shapely
from shapely.geometry import Polygon

from dpatlas.core.errors import ReleaseRefused
from dpatlas.core.state_fips import STATE_FIPS  # noqa: F401 (the GEOID check; re-exported)


CRS = "EPSG:4326"
COLUMNS = ["geoid", "state", "county", "geometry"]


class BoundaryError(ValueError, ReleaseRefused):
    """Boundaries (a file or a list of GEOIDs) the pipeline cannot use; the message says why."""


# --------------------------------------------------------------------------------------------
# GEOIDs

_GEOID = re.compile(r"\d{11}")
_MAX_EXAMPLES = 5


def _examples(values) -> str:
    values = list(values)
    shown = ", ".join(repr(v) for v in values[:_MAX_EXAMPLES])
    return shown + (", ..." if len(values) > _MAX_EXAMPLES else "")


def _geoid_problems(geoids: pd.Series) -> list[str]:
    """What is wrong with a column of GEOIDs (an empty list if nothing is)."""
    total = len(geoids)
    text = geoids.astype(object).where(geoids.notna(), None)
    well_formed = np.array([isinstance(g, str) and _GEOID.fullmatch(g) is not None for g in text],
                           dtype=bool)
    problems = []
    # Numbers are not GEOIDs whatever their digits: 37001000100 stored as an integer is said
    # so, not "not 11 digits" (issue 31 O12), and 6001000100 has lost its leading zero.
    numbers = np.array([isinstance(g, (int, float, np.number)) and not isinstance(g, bool)
                        for g in text], dtype=bool)
    if numbers.any():
        column = f"column '{geoids.name}'" if isinstance(geoids.name, str) else "column"
        problems.append(f"the GEOID {column} holds numbers, not text ({int(numbers.sum())} of "
                        f"{total}, e.g. {_examples(text[numbers])}): GEOIDs must be 11-digit "
                        "text, and as numbers their leading zeros may be lost (06001000100 "
                        "becomes 6001000100); store and read the column as text")
    malformed = ~well_formed & ~numbers
    if malformed.any():
        hint = ""
        if any(isinstance(g, str) and len(g) == 10 and g.isdigit() for g in text):
            hint = (" (10-digit GEOIDs: leading zeros were probably lost, e.g. "
                    "6001000100 for 06001000100; store and read GEOIDs as text)")
        problems.append(f"{int(malformed.sum())} of {total} GEOIDs are not 11 digits "
                        f"(2 state + 3 county + 6 tract), e.g. {_examples(text[malformed])}{hint}")
    valid = text[well_formed]
    unknown = valid[~valid.str[:2].isin(list(STATE_FIPS))]
    if len(unknown):
        problems.append(f"{len(unknown)} of {total} GEOIDs start with a code that is not a US "
                        f"state FIPS code, e.g. {_examples(unknown)}")
    counts = valid.value_counts()
    repeated = counts[counts > 1]
    if len(repeated):
        problems.append(f"{len(repeated)} GEOIDs occur more than once ({int(repeated.sum())} rows), "
                        f"e.g. {_examples(sorted(repeated.index))}")
    return problems


# --------------------------------------------------------------------------------------------
# Synthetic boundaries

# Real outlines (issue 21 item 6): libpysal's bundled examples, read offline. ``us_income``
# holds the 48 contiguous states, ``sids2`` North Carolina's 100 counties with their FIPS codes
# and names. The shapefiles have no .prj; their metadata says unprojected longitude/latitude
# (no datum), and they are used as EPSG:4326.
_STATES_EXAMPLE = ("us_income", "us48.shp", "STATE_FIPS")
_COUNTIES_EXAMPLE = {"37": ("sids2", "sids2.shp", "FIPS", "NAME")}
# Islands smaller than this share of their state are left out of the outline: at this
# resolution they are slivers, too small for a synthetic county of their own.
_MIN_ISLAND_SHARE = 0.01

# States the library does not outline (Alaska, Hawaii, DC, Puerto Rico): a synthetic,
# irregular polygon of this span (degrees) at about the real place (lon, lat).
_BLOB_PLACE: dict[str, tuple[float, float, float]] = {
    "02": (-152.0, 64.0, 4.0), "11": (-77.02, 38.91, 0.1), "15": (-157.0, 20.8, 1.5),
    "72": (-66.5, 18.2, 1.0),
}

_OUTLINE_VERTICES = 96
_COUNTY_LLOYD_ROUNDS = 4
_NEWTON_ITERATIONS = 30
_COUNTY_AREA_TOLERANCE = 0.01  # stop once every county is within 1% of its target area
_LLOYD_ITERATIONS = 5
# Lloyd evens out tracts only slowly in a long, thin county; past this ratio of largest to
# smallest tract, power weights even them out instead, to within _TRACT_AREA_TOLERANCE.
_TRACT_SPREAD_LIMIT = 3.0
_TRACT_AREA_TOLERANCE = 0.1
_STITCH_TOLERANCE = 1e-9  # degrees (0.1 mm): vertices this close to a county line are on it

# Independent random streams per state, so that e.g. the outline does not change when the
# list of tracts does.
_OUTLINE_STREAM, _COUNTY_STREAM, _TRACT_STREAM = 0, 1, 2


def _example_path(example: str, file_name: str) -> Path:
    """A file of one of libpysal's built-in examples: data files in its package folder (they
    are in its wheel, no download). Found without importing libpysal, which takes seconds (it
    loads scikit-learn) and, on import, creates a data folder in the user's home."""
    import importlib.util

    spec = importlib.util.find_spec("libpysal")
    if spec is None or not spec.submodule_search_locations:
        raise BoundaryError("synthetic boundaries need libpysal's bundled outlines: "
                            "pip install libpysal (see requirements.lock)")
    return Path(spec.submodule_search_locations[0]) / "examples" / example / file_name


@functools.lru_cache(maxsize=None)
def _example_frame(example: str, file_name: str) -> gpd.GeoDataFrame:
    """A shapefile bundled with libpysal, in EPSG:4326 (it has no .prj: see above)."""
    return gpd.read_file(_example_path(example, file_name), engine="pyogrio").set_crs(CRS)


@functools.lru_cache(maxsize=1)
def _real_state_outlines() -> dict[str, object]:
    """The 48 contiguous states' outlines by FIPS code, without their smallest islands."""
    example, file_name, fips = _STATES_EXAMPLE
    frame = _example_frame(example, file_name)
    outlines = {}
    for code, geometry in zip(frame[fips].astype(str), frame.geometry):
        parts = _polygon_parts(geometry)
        kept = [p for p in parts if p.area >= _MIN_ISLAND_SHARE * geometry.area]
        outlines[code] = kept[0] if len(kept) == 1 else shapely.MultiPolygon(kept)
    return outlines


@functools.lru_cache(maxsize=None)
def _real_county_frame(state_fips: str) -> pd.DataFrame | None:
    """The state's real counties (``county``: 5-digit FIPS, ``name``, ``geometry``), or None."""
    if state_fips not in _COUNTIES_EXAMPLE:
        return None
    example, file_name, fips, name = _COUNTIES_EXAMPLE[state_fips]
    frame = _example_frame(example, file_name)
    return pd.DataFrame({"county": frame[fips].astype(str), "name": frame[name].astype(str),
                         "geometry": frame.geometry.to_numpy()}).set_index("county").sort_index()


def county_names() -> dict[str, str]:
    """Real county names by 5-digit FIPS code, for the states whose counties are outlined
    (North Carolina): public facts, e.g. for searching the map by county name."""
    names = {}
    for state_fips in _COUNTIES_EXAMPLE:
        names.update(_real_county_frame(state_fips)["name"].to_dict())
    return names


def _real_counties(state_fips: str, counties: Sequence[str]) -> np.ndarray | None:
    """The real polygons of these 5-digit county codes, if the library outlines every one."""
    frame = _real_county_frame(state_fips)
    if frame is None or not set(counties) <= set(frame.index):
        return None
    return frame.loc[list(counties), "geometry"].to_numpy()


def _blob_outline(state_fips: str, seed: int = 0) -> Polygon:
    """An irregular, star-shaped (hence simple) polygon at the state's place: for the states
    the library does not outline."""
    rng = np.random.default_rng([seed, int(state_fips), _OUTLINE_STREAM])
    n = _OUTLINE_VERTICES
    # Jitter stays below half a step, so the angles keep increasing and the ring cannot cross.
    theta = (np.arange(n) + rng.uniform(-0.3, 0.3, n)) * (2 * math.pi / n)
    radius = np.ones(n)
    for harmonic in range(1, 6):  # low harmonics give the broad shape: bulges and bays
        amplitude = rng.uniform(0.0, 0.22 / harmonic)  # sum of maxima < 0.5, so radius > 0
        radius += amplitude * np.cos(harmonic * theta + rng.uniform(0, 2 * math.pi))
    radius *= 1.0 + np.clip(rng.normal(0.0, 0.015, n), -0.04, 0.04)  # a ragged border
    aspect = math.exp(rng.uniform(-0.3, 0.3))
    x, y = radius * np.cos(theta) * aspect, radius * np.sin(theta) / aspect

    cx, cy, span = _BLOB_PLACE[state_fips]
    scale = span / max(np.ptp(x), np.ptp(y))
    x = cx + (x - (x.min() + x.max()) / 2) * scale
    y = cy + (y - (y.min() + y.max()) / 2) * scale
    return Polygon(np.column_stack([x, y]))


def _state_outline(state_fips: str, seed: int = 0):
    """The state's outline: the real one (48 states), else a synthetic polygon at its place,
    less any real state it reaches (DC's, between Maryland and Virginia). ``seed`` shapes only
    the synthetic ones."""
    real = _real_state_outlines()
    if state_fips in real:
        return real[state_fips]
    blob = _blob_outline(state_fips, seed)
    neighbours = [o for o in real.values() if o.intersects(blob)]
    return _polygon_parts(blob.difference(shapely.union_all(neighbours)))[0] if neighbours else blob


def _sample_inside(region, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` uniform random points strictly inside ``region`` (rejection from its bounding box)."""
    minx, miny, maxx, maxy = region.bounds
    hit_rate = region.area / ((maxx - minx) * (maxy - miny))
    shapely.prepare(region)
    found, total = [], 0
    while total < n:
        m = max(64, int(1.5 * (n - total) / hit_rate))
        xy = rng.uniform((minx, miny), (maxx, maxy), size=(m, 2))
        xy = xy[shapely.contains_xy(region, xy[:, 0], xy[:, 1])]
        found.append(xy)
        total += len(xy)
    return np.vstack(found)[:n]


def _power_diagram(sites: np.ndarray, weights: np.ndarray):
    """The power diagram of weighted sites: cells, and the edges between neighbouring cells.

    Cell i = {x : |x - p_i|^2 - w_i <= |x - p_j|^2 - w_j for all j}. Lifting p_i to
    (p_i, |p_i|^2 - w_i), the facets of the lower convex hull are the diagram's vertices (a
    facet on the plane a X + b Y + c Z + d = 0 is the vertex -(a, b) / 2c) and its edges join
    neighbouring cells. Four far corner sites make every real cell bounded.

    Returns the cells as convex polygons (None for an empty cell), the neighbouring pairs
    (m x 2) and, for each pair, their common edge as a segment (m x 2 x 2).
    """
    from scipy.spatial import ConvexHull

    n = len(sites)
    origin = sites.mean(axis=0)  # centred coordinates keep the lifted values small
    local = sites - origin
    far = 50.0 * max(1.0, float(np.abs(local).max()))
    corners = far * np.array([[-1.0, -1.0], [1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
    points = np.vstack([local, corners])
    w = np.concatenate([weights - weights.mean(), np.zeros(4)])
    hull = ConvexHull(np.column_stack([points, (points ** 2).sum(axis=1) - w]))
    lower = hull.equations[:, 2] < 0
    with np.errstate(divide="ignore", invalid="ignore"):  # upper facets are not used
        vertices = origin - hull.equations[:, :2] / (2.0 * hull.equations[:, 2:3])

    facets = np.flatnonzero(lower)
    simplices = hull.simplices[facets]
    owner = simplices.ravel()
    corner_of = np.repeat(vertices[facets], 3, axis=0)
    real = owner < n
    order = np.argsort(owner[real], kind="stable")
    cells = np.full(n, None, dtype=object)
    shapely.multipoints(corner_of[real][order], indices=owner[real][order], out=cells)
    cells = shapely.convex_hull(cells)

    # The edge opposite vertex k of a facet is shared with hull.neighbors[facet, k]; its dual
    # is the segment between the two facets' vertices.
    pairs, segments = [], []
    for k in range(3):
        a, b = simplices[:, (k + 1) % 3], simplices[:, (k + 2) % 3]
        other = hull.neighbors[facets, k]
        keep = (a < n) & (b < n) & lower[other] & (facets < other)
        pairs.append(np.column_stack([a[keep], b[keep]]))
        segments.append(np.stack([vertices[facets[keep]], vertices[other[keep]]], axis=1))
    return cells, np.vstack(pairs), np.concatenate(segments)


def _polygon_parts(geometry) -> list[Polygon]:
    parts = [p for p in shapely.get_parts(geometry) if isinstance(p, Polygon) and not p.is_empty]
    return sorted(parts, key=lambda p: p.area, reverse=True)


def _merge_fragments(cells: np.ndarray) -> np.ndarray:
    """Make each cell one Polygon; a cut-off piece joins the cell it shares most border with.

    Clipping a convex cell to a non-convex region can split it; the pieces lie inside the
    (connected) region, so each borders some other cell along a line.
    """
    cells = np.array(cells, dtype=object)
    fragments: list[tuple[int, Polygon]] = []
    for i, cell in enumerate(cells):
        if isinstance(cell, Polygon):
            continue
        main, *rest = _polygon_parts(cell)
        cells[i] = main
        fragments.extend((i, piece) for piece in rest)
    while fragments:
        unplaced = []
        for owner, piece in fragments:
            shared = shapely.length(shapely.intersection(piece.boundary, shapely.boundary(cells)))
            for j in np.argsort(-shared):
                if shared[j] <= 1e-9 * piece.length:
                    unplaced.append((owner, piece))
                    break
                merged = shapely.union(cells[j], piece)
                if isinstance(merged, Polygon):
                    cells[j] = merged
                    break
            else:
                unplaced.append((owner, piece))
        if len(unplaced) == len(fragments):
            # No line contact anywhere (only corners touch): keep the piece with its cell,
            # the one case where a cell stays a MultiPolygon.
            for owner, piece in unplaced:
                cells[owner] = shapely.union(cells[owner], piece)
            break
        fragments = unplaced
    return cells


class _ClippedPowerDiagram:
    """Power cells of fixed sites clipped to a region, their areas and the areas' Jacobian."""

    def __init__(self, sites: np.ndarray, weights: np.ndarray, region: Polygon):
        from scipy.sparse import coo_matrix

        cells, pairs, segments = _power_diagram(sites, weights)
        cells = shapely.intersection(cells, region)
        self.weights = weights
        self.cells = np.where(pd.isna(cells), Polygon(), cells)
        self.areas = shapely.area(self.cells)
        # Raising w_i by t moves the edge with j by t / (2 |p_i - p_j|) towards p_j, so
        # dA_i/dw_i = sum_j len_ij / (2 |p_i - p_j|) and dA_j/dw_i = -len_ij / (2 |p_i - p_j|).
        lengths = shapely.length(shapely.intersection(shapely.linestrings(segments), region))
        gap = np.linalg.norm(sites[pairs[:, 0]] - sites[pairs[:, 1]], axis=1)
        coupling = lengths / (2.0 * gap)
        i, j = pairs[:, 0], pairs[:, 1]
        # coo_matrix adds up repeated entries, which builds the diagonal sums.
        self.jacobian = coo_matrix(
            (np.concatenate([-coupling, -coupling, coupling, coupling]),
             (np.concatenate([i, j, i, j]), np.concatenate([j, i, i, j]))),
            shape=(len(sites), len(sites))).tocsr()


def _newton_step(jacobian, residual: np.ndarray) -> np.ndarray:
    """Solve jacobian @ step = residual.

    The Jacobian is a graph Laplacian (weights matter only up to a constant), so pin the last
    weight and solve the rest; a tiny ridge keeps that definite even if some cell touches the
    others only at a corner. Sparse, because a dense LAPACK solve on a busy machine can wait
    far longer on its threads than it computes.
    """
    from scipy.sparse import identity
    from scipy.sparse.linalg import spsolve

    reduced = jacobian[:-1, :-1]
    ridge = 1e-9 * max(float(reduced.diagonal().mean()), 1e-300)
    step = np.zeros(len(residual))
    step[:-1] = spsolve((reduced + ridge * identity(reduced.shape[0])).tocsc(), residual[:-1])
    return step


def _fit_weights(sites: np.ndarray, weights: np.ndarray, targets: np.ndarray, region: Polygon,
                 tolerance: float) -> _ClippedPowerDiagram:
    """Weights giving each clipped power cell its target area, to within ``tolerance``
    (relative): damped Newton's method.

    The areas' equations are those of semi-discrete optimal transport; Newton's method with
    steps halved until no cell shrinks below half the smallest starting or target area and
    the error falls converges from any start with no empty cell (Kitagawa, Merigot and
    Thibert 2019).
    """
    diagram = _ClippedPowerDiagram(sites, weights, region)
    if np.any(diagram.areas <= 0):  # restart from the Voronoi diagram: no cell is empty there
        diagram = _ClippedPowerDiagram(sites, np.zeros(len(sites)), region)
    floor = 0.5 * min(diagram.areas.min(), targets.min())
    for _ in range(_NEWTON_ITERATIONS):
        residual = targets - diagram.areas
        if np.max(np.abs(residual) / targets) < tolerance:
            break
        step = _newton_step(diagram.jacobian, residual)
        size = np.linalg.norm(residual)
        tau = 1.0
        while tau > 1e-3:
            trial = _ClippedPowerDiagram(sites, diagram.weights + tau * step, region)
            if (trial.areas.min() >= floor
                    and np.linalg.norm(targets - trial.areas) <= (1 - tau / 2) * size):
                diagram = trial
                break
            tau /= 2
        else:
            break  # no acceptable step: keep the best so far
    return diagram


def _largest_remainders(weights: np.ndarray, n: int) -> np.ndarray:
    """``n`` split into whole numbers in proportion to ``weights`` (largest remainders)."""
    quota = n * weights / weights.sum()
    counts = np.floor(quota).astype(int)
    counts[np.argsort(counts - quota, kind="stable")[:n - counts.sum()]] += 1
    return counts


def _per_part(region, n: int) -> tuple[list[Polygon], np.ndarray, list[Polygon]]:
    """A region's polygon parts (largest first) with ``n`` units shared among them by area:
    the parts given some, their numbers, and the parts given none (small islands)."""
    parts = _polygon_parts(region)
    counts = _largest_remainders(shapely.area(parts), n)  # the largest part gets one if n >= 1
    given = counts > 0
    return ([p for p, g in zip(parts, given) if g], counts[given],
            [p for p, g in zip(parts, given) if not g])


def _join_nearest(cells: np.ndarray, pieces: list[Polygon]) -> np.ndarray:
    """Each piece given no cell of its own (an island) joins the cell nearest to it."""
    cells = np.array(cells, dtype=object)
    for piece in pieces:
        j = int(np.argmin(shapely.distance(cells, piece)))
        cells[j] = shapely.union(cells[j], piece)
    return cells


def _county_regions(outline, tract_counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Cut the state into counties with areas proportional to ``tract_counts``; a state of
    several parts (islands, peninsulas) gets counties on each part in proportion to its area."""
    parts, counties_per_part, islands = _per_part(outline, len(tract_counts))
    regions, first = [], 0
    for part, k in zip(parts, counties_per_part):
        regions.append(_county_cells(part, tract_counts[first:first + k], rng))
        first += k
    return _join_nearest(np.concatenate(regions), islands)


def _county_cells(outline: Polygon, tract_counts: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
    """Cut a polygon into counties with areas proportional to ``tract_counts``.

    A capacity-constrained power diagram: fit the weights to the target areas, move each site
    to its cell's centroid (which makes counties compact rather than long and thin), repeat.
    """
    if len(tract_counts) == 1:
        return np.array([outline], dtype=object)
    targets = outline.area * tract_counts / tract_counts.sum()
    sites = _sample_inside(outline, len(tract_counts), rng)
    weights = np.zeros(len(tract_counts))
    shapely.prepare(outline)
    for round_ in range(_COUNTY_LLOYD_ROUNDS):
        diagram = _fit_weights(sites, weights, targets, outline, _COUNTY_AREA_TOLERANCE)
        if round_ == _COUNTY_LLOYD_ROUNDS - 1:
            break
        centroids = shapely.centroid(diagram.cells)
        # A centroid can fall outside a non-convex state; take a point inside the cell then.
        outside = ~shapely.contains(outline, centroids)
        centroids[outside] = shapely.point_on_surface(diagram.cells[outside])
        sites, weights = shapely.get_coordinates(centroids), diagram.weights
    return _merge_fragments(diagram.cells)


def _clipped_voronoi(points: np.ndarray, region) -> np.ndarray:
    diagram = shapely.voronoi_polygons(shapely.multipoints(points), extend_to=region, ordered=True)
    cells = shapely.get_parts(diagram)
    if len(cells) != len(points):  # only if two points coincide
        raise RuntimeError("Voronoi diagram lost a site")
    # Most cells lie inside the county; clipping only the others halves the time.
    crossing = ~shapely.contains_properly(region, cells)
    cells[crossing] = shapely.intersection(cells[crossing], region)
    return cells


def _tract_cells(region, n: int, rng: np.random.Generator) -> np.ndarray:
    """Cut a county into ``n`` tracts of similar size; a county of several parts (a real one
    split by a sound or a river) gets tracts on each part in proportion to its area."""
    parts, tracts_per_part, islands = _per_part(region, n)
    cells = [_polygon_tract_cells(part, k, rng) for part, k in zip(parts, tracts_per_part)]
    return _join_nearest(np.concatenate(cells), islands)


def _polygon_tract_cells(region: Polygon, n: int, rng: np.random.Generator) -> np.ndarray:
    """Cut a county into ``n`` tracts of similar size: Lloyd-relaxed Voronoi, clipped; if the
    sizes still differ a lot (a long, thin county), power cells fitted to equal areas."""
    if n == 1:
        return np.array([region], dtype=object)
    points = _sample_inside(region, n, rng)
    shapely.prepare(region)
    cells = _clipped_voronoi(points, region)
    for _ in range(_LLOYD_ITERATIONS):
        centroids = shapely.centroid(cells)
        # A non-convex cell's centroid can lie outside the county; use a point inside instead.
        outside = ~shapely.contains(region, centroids)
        centroids[outside] = shapely.point_on_surface(cells[outside])
        points = shapely.get_coordinates(centroids)
        cells = _clipped_voronoi(points, region)
    areas = shapely.area(cells)
    if areas.max() > _TRACT_SPREAD_LIMIT * areas.min():
        targets = np.full(n, region.area / n)
        cells = _fit_weights(points, np.zeros(n), targets, region, _TRACT_AREA_TOLERANCE).cells
    return _merge_fragments(cells)


def _synth_state(state_fips: str, geoids: list[str], seed: int) -> tuple[list[str], list]:
    counties = pd.Series(geoids, dtype=object).groupby([g[:5] for g in geoids]).agg(sorted)
    counts = counties.map(len).to_numpy(dtype=float)
    regions = _real_counties(state_fips, list(counties.index))
    if regions is None:  # synthetic counties inside the state's outline
        regions = _county_regions(_state_outline(state_fips, seed), counts,
                                  np.random.default_rng([seed, int(state_fips), _COUNTY_STREAM]))
    tract_rng = np.random.default_rng([seed, int(state_fips), _TRACT_STREAM])
    tracts = [_tract_cells(region, len(county_geoids), tract_rng)
              for region, county_geoids in zip(regions, counties)]
    tracts = _stitch_county_lines(regions, tracts)
    return [g for county_geoids in counties for g in county_geoids], list(np.concatenate(tracts))


def _stitch_county_lines(regions: np.ndarray, tracts: list[np.ndarray]) -> list[np.ndarray]:
    """Give the tracts on both sides of a county line the same vertices.

    Each county's tracts are clipped to it on their own, so where a tract edge meets the
    county line there is a vertex on that side only (a T-junction), computed to within
    rounding; tracts across the line then do not share edges exactly, and a union of them
    keeps slivers of ~1e-16 degrees that can split it into pieces. Snapping each county's
    tracts to the tract corners lying on its neighbours' boundaries inserts the missing vertices
    (the tolerance is far below any real feature, so nothing else moves).
    """
    if len(regions) == 1:
        return tracts
    border_corners = []
    for region, cells in zip(regions, tracts):
        corners = shapely.points(np.unique(shapely.get_coordinates(cells), axis=0))
        on_line = shapely.dwithin(corners, region.boundary, _STITCH_TOLERANCE)
        border_corners.append(shapely.get_coordinates(corners[on_line]))
    tree = shapely.STRtree(regions)
    stitched = []
    for c, (region, cells) in enumerate(zip(regions, tracts)):
        neighbours = [d for d in tree.query(region, predicate="intersects") if d != c]
        if not neighbours:
            stitched.append(cells)
            continue
        reference = shapely.multipoints(np.vstack([border_corners[d] for d in neighbours]))
        touching = shapely.dwithin(cells, region.boundary, _STITCH_TOLERANCE)
        cells = cells.copy()
        cells[touching] = shapely.snap(cells[touching], reference, _STITCH_TOLERANCE)
        stitched.append(cells)
    return stitched


def synth_boundaries(geoids: Sequence[str], seed: int = 0) -> gpd.GeoDataFrame:
    """Synthetic tract polygons for the given 11-digit GEOIDs (any number of states).

    Returns columns ``geoid``, ``state`` (2 digits), ``county`` (5 digits: state + county) and
    ``geometry`` in EPSG:4326, one row per GEOID, sorted by GEOID. Each state is its real
    outline at its real place (see the module docstring); its counties tile it (North
    Carolina's real counties, synthetic ones elsewhere, with areas proportional to their
    numbers of tracts); each county's tracts tile the county. The same GEOIDs and seed
    give the same polygons, and a state's polygons do not depend on the other states listed.
    """
    codes = pd.Series(list(geoids), dtype=object)
    problems = _geoid_problems(codes)
    if problems:
        raise BoundaryError("synth_boundaries: " + "; ".join(problems))
    codes = sorted(codes)
    by_state: dict[str, list[str]] = {}
    for g in codes:
        by_state.setdefault(g[:2], []).append(g)
    out_geoids, out_geoms = [], []
    for state_fips, state_geoids in by_state.items():
        g, geoms = _synth_state(state_fips, state_geoids, seed)
        out_geoids.extend(g)
        out_geoms.extend(geoms)
    return _frame(out_geoids, out_geoms)


def _frame(geoids: list[str], geometries) -> gpd.GeoDataFrame:
    geoid = pd.Series(geoids, dtype=str)
    gdf = gpd.GeoDataFrame({"geoid": geoid, "state": geoid.str[:2], "county": geoid.str[:5]},
                           geometry=gpd.GeoSeries(list(geometries), crs=CRS), crs=CRS)
    return gdf.sort_values("geoid", ignore_index=True)[COLUMNS]


# --------------------------------------------------------------------------------------------
# Positions

_KM_PER_DEGREE_LAT = 110.574  # WGS84, mid-latitudes
_KM_PER_DEGREE_LON_EQUATOR = 111.320


def tract_centroids(boundaries: gpd.GeoDataFrame) -> pd.DataFrame:
    """Each tract's centroid in degrees: columns ``lon``, ``lat``, indexed by ``geoid``."""
    geoms = boundaries.to_crs(CRS).geometry.to_numpy()
    xy = shapely.get_coordinates(shapely.centroid(geoms))
    return pd.DataFrame({"lon": xy[:, 0], "lat": xy[:, 1]},
                        index=pd.Index(boundaries["geoid"].astype(str), name="geoid"))


def local_km(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    """(x, y) in km: an equirectangular projection about the points' mean latitude.

    Distances within a state (a few degrees) are off by at most a few percent, which is all
    a smooth synthetic field needs; it is not a survey projection.
    """
    lon, lat = np.asarray(lon, dtype=float), np.asarray(lat, dtype=float)
    lat0 = float(lat.mean()) if lat.size else 0.0
    x = lon * _KM_PER_DEGREE_LON_EQUATOR * math.cos(math.radians(lat0))
    return np.column_stack([x, lat * _KM_PER_DEGREE_LAT])


# --------------------------------------------------------------------------------------------
# RFC 7946 GeoJSON

# 1e-6 degrees is about 11 cm, finer than any tract boundary is known; RFC 7946 section 11.2
# suggests 6 decimals (a 7th adds bytes, not truth).
GEOJSON_DECIMALS = 6


def rfc7946_geometries(geoms: np.ndarray, decimals: int = GEOJSON_DECIMALS) -> np.ndarray:
    """Polygons ready for RFC 7946: snapped to a grid of 10^-decimals degrees, kept valid,
    exterior rings counter-clockwise and holes clockwise (RFC 7946, section 3.1.6).

    ``shapely.set_precision`` rounds every vertex to the grid and repairs what rounding breaks
    (a collapsed spike, a ring touching itself), so the output is valid where the input was;
    orientation is set afterwards because the repair may rebuild rings either way round.
    """
    rounded = shapely.set_precision(geoms, 10.0 ** -decimals, mode="valid_output")
    oriented = shapely.orient_polygons(rounded, exterior_cw=False)
    bad = ~shapely.is_valid(oriented) | shapely.is_empty(oriented)
    if bad.any():
        raise BoundaryError(f"{int(bad.sum())} tract polygon(s) are empty or invalid after "
                            f"rounding to {decimals} decimals; check the boundary file")
    return oriented


def _rounded_coordinates(value, decimals: int):
    """Nested coordinate lists with every number rounded (``repr`` of a float rounded to
    ``decimals`` places has at most that many decimals)."""
    if isinstance(value, (list, tuple)):
        return [_rounded_coordinates(v, decimals) for v in value]
    return round(float(value), decimals)


def geojson_geometry(geom, decimals: int = GEOJSON_DECIMALS) -> dict | None:
    """An RFC 7946 geometry object for one (already oriented) shapely geometry; None if empty."""
    if geom is None or shapely.is_empty(geom):
        return None
    mapping = shapely.geometry.mapping(geom)
    return {"type": mapping["type"],
            "coordinates": _rounded_coordinates(mapping["coordinates"], decimals)}


def write_geojson_rfc7946(gdf: gpd.GeoDataFrame, path: str | Path,
                          decimals: int = GEOJSON_DECIMALS) -> Path:
    """Write ``gdf`` as an RFC 7946 FeatureCollection.

    WGS 84 longitude/latitude (reprojected if needed) and no ``crs`` member (RFC 7946 section 4
    removed it: the CRS is always WGS 84), at most ``decimals`` decimals per coordinate,
    counter-clockwise exterior rings (:func:`rfc7946_geometries`), a ``bbox`` (section 5).
    Property values are JSON numbers, strings or null (NaN and NA become null). With a
    ``geoid`` column each feature's ``id`` (section 3.2) is its GEOID, or ``GEOID/cell`` when
    a GEOID has a feature per cell, so the id names one feature.

    Streamed a state at a time (rows in their order; :func:`_row_runs`): the file never exists
    as one string or one dict in memory. Geometries are written by GEOS (``shapely.to_geojson``,
    in C) rather than through Python coordinate lists: the snapped coordinates are the same
    doubles, and the few GEOS prints with more than ``decimals`` decimals are printed again.
    """
    path = Path(path)
    props, geoms, ids = geojson_parts(gdf, path, decimals)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(feature_collection_head(geoms, decimals))
        write_features(fh, props, geoms, ids, decimals)
        fh.write(FEATURE_COLLECTION_TAIL)
    return path


# What closes the FeatureCollection :func:`feature_collection_head` opens.
FEATURE_COLLECTION_TAIL = "]}"


def geojson_parts(gdf: gpd.GeoDataFrame, path: Path, decimals: int = GEOJSON_DECIMALS,
                  per_cell: bool | None = None) -> tuple[pd.DataFrame, np.ndarray, list | None]:
    """What a FeatureCollection of ``gdf`` is written from: its properties, its RFC 7946
    geometries (WGS 84, snapped, counter-clockwise) and feature ids (:func:`feature_ids`;
    ``per_cell`` as there). ``path``: named in the refusal of a frame without a CRS."""
    if gdf.crs is None:
        raise BoundaryError(f"{path}: refusing to write boundaries without a CRS")
    gdf = gdf.to_crs(CRS)
    geoms = rfc7946_geometries(gdf.geometry.to_numpy(), decimals)
    props = pd.DataFrame(gdf.drop(columns=gdf.geometry.name))
    return props, geoms, feature_ids(props, per_cell)


def feature_collection_head(geoms: np.ndarray, decimals: int = GEOJSON_DECIMALS) -> str:
    """The FeatureCollection's text up to its first feature, with the ``bbox`` of ``geoms``
    (RFC 7946 geometries: every feature's) when there are any."""
    head = '{"type":"FeatureCollection",'
    if len(geoms):
        bbox = [round(float(v), decimals) for v in shapely.total_bounds(geoms)]
        head += f'"bbox":{_json_text(bbox)},'
    return head + '"features":['


def write_features(fh, props: pd.DataFrame, geoms: np.ndarray, ids: list | None,
                   decimals: int = GEOJSON_DECIMALS, after_others: bool = False) -> bool:
    """Append the features of these rows to an open FeatureCollection, a state at a time
    (:func:`_row_runs`); ``after_others``: features were written before (a comma first).
    Returns whether the collection now holds a feature."""
    for a, b in _row_runs(props):
        texts = _feature_texts(props.iloc[a:b], geoms[a:b],
                               None if ids is None else ids[a:b], decimals)
        fh.write(("," if after_others else "") + ",".join(texts))
        after_others = True
    return after_others


# Rows per chunk of the streamed GeoJSON when the table has no ``state`` column.
_GEOJSON_CHUNK_ROWS = 5000


def _row_runs(props: pd.DataFrame) -> list[tuple[int, int]]:
    """Consecutive row ranges [a, b) to write together: the runs of equal ``state`` (a state
    at a time, rows keep their order), else chunks of :data:`_GEOJSON_CHUNK_ROWS` rows."""
    n = len(props)
    if n == 0:
        return []
    if "state" in props.columns:
        state = props["state"].astype(str).to_numpy()
        cuts = np.flatnonzero(state[1:] != state[:-1]) + 1
    else:
        cuts = np.arange(_GEOJSON_CHUNK_ROWS, n, _GEOJSON_CHUNK_ROWS)
    edges = [0, *cuts.tolist(), n]
    return list(zip(edges[:-1], edges[1:]))


def _json_text(value) -> str:
    import json

    # json.dumps uses the C encoder; json.dump to a file falls back to the pure-Python one.
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _feature_texts(props: pd.DataFrame, geoms: np.ndarray, ids: list[str] | None,
                   decimals: int) -> list[str]:
    """Each row's Feature as JSON text: id, properties (:func:`_json_scalar`'s values), and
    the geometry as GEOS writes it (null when empty)."""
    columns = [_json_values(props[c]) for c in props.columns]
    names = list(props.columns)
    geometry = _geometry_texts(geoms, decimals)
    out = []
    for i, row in enumerate(zip(*columns)):
        feature = '{"type":"Feature",'
        if ids is not None:
            feature += f'"id":{_json_text(ids[i])},'
        out.append(feature + f'"properties":{_json_text(dict(zip(names, row)))},'
                   f'"geometry":{geometry[i]}}}')
    return out


def _json_values(column: pd.Series) -> list:
    """A column's values as :func:`_json_scalar` makes them, whole numpy columns at a time."""
    values = column.to_numpy()
    if values.dtype.kind == "f":
        out = values.tolist()
        for i in np.flatnonzero(~np.isfinite(values)).tolist():
            out[i] = None
        return out
    if values.dtype.kind in "biu":
        return values.tolist()
    return [None if _missing(v) else _json_scalar(v) for v in values]


def _missing(value) -> bool:
    return value is None or value is pd.NA or value is pd.NaT or (
        isinstance(value, (float, np.floating)) and not math.isfinite(value))


# A number GEOS printed with more decimals than asked (its doubles are the snapped ones).
_LONG_DECIMAL = re.compile(r"-?\d+\.\d{8,}(?:[eE][-+]?\d+)?")


def _geometry_texts(geoms: np.ndarray, decimals: int) -> list[str]:
    """RFC 7946 geometry objects as text, null where empty; numbers with at most ``decimals``
    decimals (``repr`` of a float rounded to that many places)."""
    empty = shapely.is_missing(geoms) | shapely.is_empty(geoms)
    texts = np.full(len(geoms), "null", dtype=object)
    if (~empty).any():
        texts[~empty] = shapely.to_geojson(geoms[~empty])
    return [_LONG_DECIMAL.sub(lambda m: repr(round(float(m.group()), decimals)), t)
            if t != "null" else t for t in texts]


def feature_ids(props: pd.DataFrame, per_cell: bool | None = None) -> list[str] | None:
    """Feature ids: the GEOID (text, leading zeros kept), or ``GEOID/cell`` when the table
    holds a GEOID more than once (one row per cell); None without a ``geoid`` column.
    ``per_cell``: whether the release has several cells, when ``props`` is a part of it (one
    cell's rows: its GEOIDs are unique, yet the ids must be those of the whole file)."""
    if "geoid" not in props.columns:
        return None
    geoids = props["geoid"].astype(str)
    if per_cell is None:
        per_cell = not geoids.is_unique
    if not per_cell or "cell" not in props.columns:
        return list(geoids)
    return list(geoids + "/" + props["cell"].astype(str))


def _json_scalar(value):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return str(value)


# --------------------------------------------------------------------------------------------
# Files

_OGR_SUFFIXES = {".zip", ".gpkg", ".geojson", ".json", ".shp"}
_PARQUET_SUFFIXES = {".parquet"}
_READ_ERRORS = (pyogrio.errors.DataSourceError, pyogrio.errors.DataLayerError,
                pyogrio.errors.GeometryError, pyogrio.errors.FieldError, OSError, ValueError)


def _read(path: Path) -> gpd.GeoDataFrame:
    suffix = path.suffix.lower()
    try:
        if suffix in _PARQUET_SUFFIXES:
            return gpd.read_parquet(path)
        # A zip is opened in place by pyogrio (GDAL's /vsizip/); TIGER zips hold one shapefile.
        layers = pyogrio.list_layers(path)
        if len(layers) != 1:
            names = [str(name) for name in layers[:, 0]]
            raise BoundaryError(f"{path}: expected one layer of tracts, found {len(names)}: {names}")
        return gpd.read_file(path, engine="pyogrio")
    except BoundaryError:
        raise
    except _READ_ERRORS as exc:
        raise BoundaryError(f"{path}: cannot read as {suffix[1:]} boundaries: {exc}") from exc


# Coordinates may reach this far (a share of the area of use's width or height) outside the
# CRS's area of use: EPSG areas follow coastlines and borders loosely, tracts include water.
_AREA_OF_USE_MARGIN = 0.02


def _extent_text(bounds) -> str:
    minx, miny, maxx, maxy = bounds
    return f"x {minx:.6g} to {maxx:.6g}, y {miny:.6g} to {maxy:.6g}"


def _crs_name(crs) -> str:
    code = crs.to_authority()
    return ":".join(code) if code else crs.name


def _is_degrees(crs) -> bool:
    return crs.is_geographic and all(a.unit_name in ("degree", "degree (supplier to define "
                                                     "representation)") for a in crs.axis_info[:2])


def _inside_area_of_use(crs, bounds: np.ndarray) -> bool:
    """Whether every geometry's bounding box lies in the CRS's area of use (with a margin).

    ``bounds`` is (n, 4): minx, miny, maxx, maxy per geometry, in the CRS's units. The area
    of use is given in degrees; for a projected CRS it is transformed into its units first.
    For a geographic CRS in degrees it is compared directly, allowing an area that crosses
    the antimeridian (NAD83's runs from 167.65°E eastwards to 40.73°W, for the Aleutians).
    """
    from pyproj import CRS as ProjCRS, Transformer

    area = crs.area_of_use
    if area is None:  # e.g. a custom CRS without an EPSG entry: nothing to compare with
        return True
    west, south, east, north = area.bounds
    if _is_degrees(crs):
        height = north - south
        width = (east - west) % 360 or 360.0
        lat_ok = ((bounds[:, 1] >= south - _AREA_OF_USE_MARGIN * height)
                  & (bounds[:, 3] <= north + _AREA_OF_USE_MARGIN * height))
        margin = _AREA_OF_USE_MARGIN * width

        def lon_ok(lon):
            if west <= east:
                return (lon >= west - margin) & (lon <= east + margin)
            return (lon >= west - margin) | (lon <= east + margin)  # across the antimeridian

        return bool((lat_ok & lon_ok(bounds[:, 0]) & lon_ok(bounds[:, 2])).all())
    to_crs = Transformer.from_crs(ProjCRS.from_epsg(4326), crs, always_xy=True)
    minx, miny, maxx, maxy = to_crs.transform_bounds(west, south, east, north, densify_pts=21)
    mx, my = _AREA_OF_USE_MARGIN * (maxx - minx), _AREA_OF_USE_MARGIN * (maxy - miny)
    return bool((bounds[:, 0] >= minx - mx).all() and (bounds[:, 2] <= maxx + mx).all()
                and (bounds[:, 1] >= miny - my).all() and (bounds[:, 3] <= maxy + my).all())


def _check_crs(path: Path, gdf: gpd.GeoDataFrame) -> None:
    """Refuse coordinates that do not fit the declared CRS (the map would be silently wrong).

    A missing CRS, a projected CRS whose coordinates all lie within ±180/±90 (degrees labelled
    as metres: every tract would land within metres of Null Island), and coordinates outside
    the CRS's area of use are refused with one line naming the file, the CRS and the extent.
    """
    geoms = gdf.geometry.to_numpy()
    bounds = shapely.bounds(geoms[~shapely.is_empty(geoms)])
    extent = _extent_text(shapely.total_bounds(geoms))
    if gdf.crs is None:
        raise BoundaryError(f"{path}: no coordinate reference system (e.g. a shapefile without "
                            f"its .prj); extent found {extent}. Give the file its CRS (TIGER/Line "
                            "files are EPSG:4269).")
    name = _crs_name(gdf.crs)
    in_degree_range = (np.abs(bounds[:, [0, 2]]) <= 180).all() and (
        np.abs(bounds[:, [1, 3]]) <= 90).all()
    if gdf.crs.is_projected and in_degree_range:
        raise BoundaryError(f"{path}: coordinates look like degrees labelled {name} (a projected "
                            f"CRS); extent found {extent}. Label the file with the CRS its "
                            "coordinates are in (TIGER/Line files are EPSG:4269).")
    if not _inside_area_of_use(gdf.crs, bounds):
        area = gdf.crs.area_of_use
        raise BoundaryError(f"{path}: coordinates lie outside the area of use of the declared "
                            f"CRS {name} ({area.name.split(':')[0].split('.')[0]}: "
                            f"{_extent_text(area.bounds)} degrees); extent found {extent}. "
                            "Label the file with the CRS its coordinates are in.")


def load_boundaries(path: str | Path, geoid_column: str = "GEOID") -> gpd.GeoDataFrame:
    """Load a TIGER/Line-style tract file and check it.

    Reads a zipped shapefile (.zip), GeoPackage (.gpkg), GeoParquet (.parquet), GeoJSON
    (.geojson, .json) or a bare shapefile (.shp). Returns columns ``geoid`` (11-digit text),
    ``state``, ``county`` and ``geometry``, reprojected to EPSG:4326 and sorted by GEOID.
    Raises BoundaryError, naming the file, if it is missing or unreadable, lacks
    ``geoid_column``, or has malformed, unknown-state or duplicate GEOIDs, or empty, invalid or
    non-polygon geometries; or if it has no CRS, or coordinates that do not fit its CRS
    (outside the CRS's area of use, or degrees labelled with a projected CRS).
    """
    path = Path(path)
    supported = sorted(_OGR_SUFFIXES | _PARQUET_SUFFIXES)
    if path.suffix.lower() not in supported:
        raise BoundaryError(f"{path}: unsupported file type {path.suffix or '(none)'!r}; "
                            f"expected one of {', '.join(supported)}")
    if not path.is_file():
        raise BoundaryError(f"{path}: file not found")
    gdf = _read(path)
    if geoid_column not in gdf.columns:
        found = [c for c in gdf.columns if c != gdf.geometry.name]
        raise BoundaryError(f"{path}: no GEOID column {geoid_column!r}; columns found: {found} "
                            f"(pass geoid_column= to use another)")

    if len(gdf) == 0:
        raise BoundaryError(f"{path}: no tracts in the file")

    problems = _geoid_problems(gdf[geoid_column])
    geoms = gdf.geometry.to_numpy()
    label = gdf[geoid_column].astype(object).to_numpy()  # rows are named by their GEOID
    total = len(gdf)
    empty = pd.isna(geoms) | shapely.is_empty(geoms)
    if empty.any():
        problems.append(f"{int(empty.sum())} of {total} geometries are empty, "
                        f"e.g. GEOID {_examples(label[empty])}")
    polygonal = np.isin(shapely.get_type_id(geoms), [3, 6])  # Polygon, MultiPolygon
    not_polygon = ~empty & ~polygonal
    if not_polygon.any():
        problems.append(f"{int(not_polygon.sum())} of {total} geometries are not polygons, "
                        f"e.g. GEOID {_examples(label[not_polygon])}")
    invalid = ~empty & polygonal & ~shapely.is_valid(geoms)
    if invalid.any():
        first = shapely.is_valid_reason(geoms[invalid][0])
        problems.append(f"{int(invalid.sum())} of {total} geometries are invalid, "
                        f"e.g. GEOID {_examples(label[invalid])} (first: {first})")
    if problems:
        raise BoundaryError(f"{path}: " + "; ".join(problems))
    _check_crs(path, gdf)

    gdf = gdf.to_crs(CRS)
    return _frame(list(gdf[geoid_column]), gdf.geometry.to_numpy())


def write_boundaries(gdf: gpd.GeoDataFrame, path: str | Path) -> Path:
    """Write boundaries as GeoParquet (.parquet), GeoJSON (.geojson, .json) or GeoPackage (.gpkg).

    An existing file is replaced. Returns the path written.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if gdf.crs is None:
        raise BoundaryError(f"{path}: refusing to write boundaries without a CRS")
    if suffix in _PARQUET_SUFFIXES:
        gdf.to_parquet(path, index=False)
    elif suffix in {".geojson", ".json", ".gpkg"}:
        path.unlink(missing_ok=True)  # a GeoPackage would otherwise keep its other layers
        driver = "GPKG" if suffix == ".gpkg" else "GeoJSON"
        gdf.to_file(path, driver=driver, engine="pyogrio", index=False)
    else:
        raise BoundaryError(f"{path}: cannot write {suffix or '(no extension)'!r}; "
                            f"use .parquet, .geojson, .json or .gpkg")
    return path
