"""Synthetic tract boundaries for synthetic states (the demo and the evaluations).

Real runs load the Census Bureau's TIGER/Line tract files (`dpatlas.release.boundaries`);
synthetic states (`dpatlas.evaluation.synthetic_input`) have no such file, so
`synth_boundaries` draws a plausible geography for any list of tract GEOIDs:

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

import math
from collections.abc import Sequence

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely
from shapely.geometry import Polygon

from dpatlas.core.places import (BoundaryError, boundaries_frame, polygon_parts, real_counties,
                                 real_state_outlines)
from dpatlas.release.boundaries import geoid_problems

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
    real = real_state_outlines()
    if state_fips in real:
        return real[state_fips]
    blob = _blob_outline(state_fips, seed)
    neighbours = [o for o in real.values() if o.intersects(blob)]
    return polygon_parts(blob.difference(shapely.union_all(neighbours)))[0] if neighbours else blob


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
        main, *rest = polygon_parts(cell)
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
    parts = polygon_parts(region)
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
    regions = real_counties(state_fips, list(counties.index))
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
    problems = geoid_problems(codes)
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
    return boundaries_frame(out_geoids, out_geoms)
