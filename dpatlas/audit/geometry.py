"""Polygons compared: the GeoParquet's, the GeoJSON's and the tiles' against a reference
(within the tolerances of (f)), the levels' dissolves, and the boundary file's."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow.parquet as pq

from .base import AuditUnreadable, LEVEL_DIGITS, LEVEL_STEMS, MAX_GEOJSON_BYTES, Mismatch, _shapely
from .files import _json_object, readable
from .cell_tiles import tract_archives
from .tiles import TILE_READ_ERRORS, pmtiles_tile_entries, tile_geometries


# --- geometry: every format's polygons are the GeoParquet's, and (--boundaries) the boundaries'

# GeoParquet against the boundary file, and GeoJSON against either: 1e-5 degrees (1.1 m north
# to south, less east to west). Publish copies the boundaries' polygons (reprojected to EPSG:4326
# by pyproj, as here) into the GeoParquet unchanged, and writes the GeoJSON snapped to a grid of
# 1e-6 degrees (RFC 7946's 6 decimals: at most 0.71e-6 per vertex); ten grid steps leave room
# for the snapping's repairs, while a polygon moved, swapped or redrawn is off by metres at least.
# (Releases before issue 33 have 7 decimals, well within it.)
GEOMETRY_TOLERANCE_DEGREES = 1e-5
# Vector tiles against the GeoParquet or the boundaries, at their lowest zoom, in units of that
# zoom's tile grid (4,096 per tile: ~150 m at z6, ~600 m at z4, ~10 km at z0 on the equator;
# :func:`tile_distance`): tippecanoe rounds every vertex to the grid (half a unit), simplifies
# each polygon by about one unit, simplifies shared borders once for both sides, and draws a
# polygon of a few square units as a square of its area. Measured on the demo release (North
# Carolina, 3,108 tracts at z6, 100 counties and a state at z0): at most 0.9 units for tracts,
# 0.7 for counties, 1.4 for the state; four units leave a margin of about three. A tract
# drawn in another's place is off by the distance between them (~80 units per 10 km at z6),
# and the GeoJSON and GeoParquet comparisons hold the exact shape.
TILE_TOLERANCE_UNITS = 4.0
# A part of a polygon this large (16 x 16 units at the lowest zoom) is drawn in the tiles: one
# smaller or thinner may vanish in simplification at that zoom.
TILE_LARGE_PART = (4 * TILE_TOLERANCE_UNITS) ** 2
_MERCATOR_MAX_LATITUDE = 85.0511287798066


def parquet_geometries(path: Path) -> tuple[list[tuple[str, str]], np.ndarray]:
    """(geoid, cell) and the polygon of every row of a published GeoParquet file: WKB in
    longitude/latitude (EPSG:4326 or OGC:CRS84, as publish writes it), read with pyarrow."""
    shapely = _shapely()
    schema = pq.read_schema(readable(path))
    geo = json.loads((schema.metadata or {}).get(b"geo", b"{}"))
    column = (geo.get("columns") or {}).get("geometry") if isinstance(geo, dict) else None
    if not isinstance(column, dict) or column.get("encoding") != "WKB":
        raise Mismatch(f"{path.name}: no WKB geometry column in its GeoParquet metadata")
    crs_id = (column.get("crs") or {}).get("id") if column.get("crs") is not None else None
    if column.get("crs") is not None and crs_id not in (
            {"authority": "EPSG", "code": 4326}, {"authority": "OGC", "code": "CRS84"}):
        raise Mismatch(f"{path.name}: geometry in {crs_id or 'an unnamed CRS'}, not the "
                       "EPSG:4326 longitude/latitude publish writes")
    table = pq.read_table(path, columns=["geoid", "cell", "geometry"])
    keys = list(zip((str(g) for g in table.column("geoid").to_pylist()),
                    (str(c) for c in table.column("cell").to_pylist())))
    wkb = np.array(table.column("geometry").to_pylist(), dtype=object)
    return keys, shapely.from_wkb(wkb)


def _reference_by_geoid(name: str, keys: list, geoms: np.ndarray) -> tuple[dict, list[str]]:
    """{geoid: polygon} of a published table (its first row's), and a problem if another of
    its rows (another cell) carries another polygon for the same GEOID."""
    shapely = _shapely()
    first, differing = {}, []
    wkb = shapely.to_wkb(geoms)
    seen: dict[str, bytes] = {}
    for (geoid, _), g, w in zip(keys, geoms, wkb):
        if geoid not in first:
            first[geoid], seen[geoid] = g, w
        elif w != seen[geoid]:
            differing.append(geoid)
    problems = [f"{name}: {len(differing)} row(s) whose polygon is not their GEOID's in "
                f"another cell, e.g. {differing[0]}"] if differing else []
    return first, problems


def _geometry_differences(fmt: str, keys: list, geoms: np.ndarray, reference: dict,
                          tolerance: float, unit: str, against: str,
                          measure: Callable | None = None) -> list[str]:
    """Rows of ``fmt`` whose polygon is farther than ``tolerance`` (in ``unit``; ``measure``,
    by default the Hausdorff distance) from their GEOID's in ``reference`` (``against``: whose
    polygon that is); rows of no reference GEOID are left to the row checks."""
    shapely = _shapely()
    index = [i for i, (geoid, _) in enumerate(keys) if geoid in reference]
    if not index:
        return []
    got = geoms[index]
    want = np.array([reference[keys[i][0]] for i in index], dtype=object)
    distance = (measure or shapely.hausdorff_distance)(got, want)
    off = ~(distance <= tolerance) & ~(shapely.is_missing(got) & shapely.is_missing(want))
    if not off.any():
        return []
    worst = np.nanmax(np.where(off, distance, np.nan)) if np.isfinite(distance[off]).any() \
        else math.nan
    example = keys[index[int(np.argmax(off))]][0]
    return [f"{fmt}: the polygon of {int(off.sum())} row(s) is not {against} (off by up to "
            f"{worst:.3g} {unit}, tolerance {tolerance:g}), e.g. {example}"]


def geojson_geometries(features: list) -> tuple[list[tuple[str, str]], np.ndarray]:
    """(geoid, cell) and the polygon of every feature of a published FeatureCollection."""
    shapely = _shapely()
    keys, geoms = [], []
    for f in features:
        props = (f.get("properties") or {}) if isinstance(f, dict) else {}
        keys.append((str(props.get("geoid")), str(props.get("cell"))))
        try:
            geoms.append(shapely.geometry.shape(f["geometry"]) if f.get("geometry") else None)
        except Exception:  # noqa: BLE001 - malformed: compared as missing
            geoms.append(None)
    return keys, np.array(geoms, dtype=object)


def _farthest_vertex(sources: np.ndarray, owner: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per target: the largest distance from a vertex of the sources it owns (``owner[i]``:
    the target of ``sources[i]``) to the target's boundary; 0 where it owns none."""
    shapely = _shapely()
    out = np.zeros(len(targets))
    coords, index = shapely.get_coordinates(sources, return_index=True)
    if len(coords):
        lines = shapely.boundary(targets)
        np.maximum.at(out, owner[index], shapely.distance(shapely.points(coords),
                                                          lines[owner[index]]))
    return out


def tile_distance(tiles: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """How far a tile polygon is from its reference polygon (both in tile units): the larger
    of the farthest tile vertex from the reference's outline, and the farthest vertex of the
    reference's large parts (TILE_LARGE_PART units² or more) from the tile polygon's outline;
    NaN where either is missing. Not the Hausdorff distance: a part too small or thin to draw
    at this zoom may be left out of the tiles (an island of a coastal tract), but nothing
    drawn may be away from the polygon, and no large part may be left out or redrawn."""
    shapely = _shapely()
    count = np.arange(len(tiles))
    drawn = _farthest_vertex(tiles, count, reference)
    parts, owner = shapely.get_parts(reference, return_index=True)
    large = shapely.area(parts) >= TILE_LARGE_PART
    kept = _farthest_vertex(parts[large], owner[large], tiles)
    distance = np.maximum(drawn, kept)
    distance[shapely.is_missing(tiles) | shapely.is_missing(reference)] = np.nan
    return distance


def to_tile_units(reference: dict, zoom: int, extent: int) -> dict:
    """{geoid: polygon} from longitude/latitude to world tile units of ``zoom`` (Web
    Mercator, y down, ``extent`` units per tile): the grid tippecanoe drew the tiles on."""
    shapely = _shapely()
    scale = float(1 << zoom) * extent

    def project(xy):
        lat = np.radians(np.clip(xy[:, 1], -_MERCATOR_MAX_LATITUDE, _MERCATOR_MAX_LATITUDE))
        return np.column_stack([(xy[:, 0] + 180.0) / 360.0 * scale,
                                (1.0 - np.arcsinh(np.tan(lat)) / math.pi) / 2.0 * scale])

    geoids = list(reference)
    projected = shapely.transform(np.array([reference[g] for g in geoids], dtype=object),
                                  project)
    return dict(zip(geoids, projected))


def format_geometry_problems(stem: str, reference: dict, against: str, *,
                             parquet: tuple | None = None, features: list | None = None,
                             tiles: tuple | None = None, layer: str | None = None) -> list[str]:
    """Every given format of ``stem``'s polygons against ``reference`` ({geoid: polygon} in
    longitude/latitude, named ``against``): the GeoParquet's rows (``parquet``: keys and
    polygons) and the GeoJSON's ``features`` within GEOMETRY_TOLERANCE_DEGREES, the vector
    tiles' features (``tiles``: the header and entries of their lowest zoom) within
    TILE_TOLERANCE_UNITS of that zoom. A format whose polygons cannot be decoded or compared
    is a finding too."""
    against = f"{against}'s"

    def compare_tiles():
        keys, geoms, zoom, extent = tile_geometries(tiles[1], layer or stem)
        return _geometry_differences(
            f"{stem}.pmtiles", keys, geoms, to_tile_units(reference, zoom, extent),
            TILE_TOLERANCE_UNITS, f"units of the z{zoom} tile grid", against, tile_distance)

    comparisons = [
        ("parquet", parquet, lambda: _geometry_differences(
            f"{stem}.parquet", *parquet, reference, GEOMETRY_TOLERANCE_DEGREES, "degrees",
            against)),
        ("geojson", features, lambda: _geometry_differences(
            f"{stem}.geojson", *geojson_geometries(features), reference,
            GEOMETRY_TOLERANCE_DEGREES, "degrees", against)),
        ("pmtiles", tiles, compare_tiles)]
    problems = []
    for suffix, given, compare in comparisons:
        if given is None:
            continue
        try:
            problems += compare()
        except Exception as err:  # noqa: BLE001 - malformed polygons are a finding
            problems.append(f"{stem}.{suffix}: its polygons cannot be compared with "
                            f"{against} ({type(err).__name__}: {err})")
    return problems


def dissolve_problems(folder: Path, level: str, units: dict) -> list[str]:
    """Each unit's polygon in the level's GeoParquet (``units``: {geoid: polygon}) is the
    union of its tracts' in tracts.parquet, as publish dissolves the boundaries: a coverage
    union, or the general one where that is not valid; within GEOMETRY_TOLERANCE_DEGREES."""
    shapely = _shapely()
    tracts, _ = _reference_by_geoid("tracts.parquet",
                                    *parquet_geometries(folder / "tracts.parquet"))
    digits, groups = LEVEL_DIGITS[level], {}
    for geoid, polygon in tracts.items():
        groups.setdefault(geoid[:digits], []).append(polygon)
    union = {}
    for unit, polygons in groups.items():
        merged = shapely.coverage_union_all(polygons)
        union[unit] = merged if shapely.is_valid(merged) else shapely.union_all(polygons)
    return _geometry_differences(f"{LEVEL_STEMS[level]}.parquet", [(u, "") for u in units],
                                 np.array(list(units.values()), dtype=object), union,
                                 GEOMETRY_TOLERANCE_DEGREES, "degrees",
                                 "the union of its tracts' in tracts.parquet")


def boundary_polygons(path: Path, column: str) -> dict:
    """{geoid: polygon} of a boundary file, in EPSG:4326 longitude/latitude (reprojected by
    pyproj, as the release's boundaries were), read with geopandas (--boundaries only)."""
    import geopandas

    if path.suffix.lower() == ".parquet":
        frame = geopandas.read_parquet(path)
    else:
        frame = geopandas.read_file(path)
    if frame.crs is None:
        raise AuditUnreadable(f"--boundaries {path}: no coordinate reference system")
    frame = frame.to_crs("EPSG:4326")
    return dict(zip((str(g) for g in frame[column]), frame.geometry.to_numpy()))


def boundary_geometry_problems(folder: Path, m: dict, path: Path, column: str) -> list[str]:
    """The polygons of tracts.parquet, tracts.geojson and tracts.pmtiles (when listed) are
    the boundary file's, by GEOID (the formats check compares them with one another)."""
    try:
        reference = boundary_polygons(path, column)
    except AuditUnreadable:
        raise
    except Exception as err:  # noqa: BLE001 - the anchor itself cannot be read
        raise AuditUnreadable(f"--boundaries {path}: its polygons cannot be read "
                              f"({type(err).__name__}: {err})") from None
    against = f"the boundary file {path.name}"
    try:
        problems = format_geometry_problems(
            "tracts", reference, against, parquet=parquet_geometries(folder / "tracts.parquet"))
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        problems = [f"tracts.parquet: its polygons cannot be read ({type(err).__name__}: "
                    f"{err})"]
    try:
        features = _json_object(folder / "tracts.geojson", "tracts.geojson", Mismatch,
                                MAX_GEOJSON_BYTES).get("features") or []
        problems += format_geometry_problems("tracts", reference, against, features=features)
    except (Mismatch, AttributeError, TypeError) as err:
        problems.append(f"tracts.geojson cannot be read: {err}")
    listed = m.get("files") or {}
    for archive in (a for a in tract_archives(folder, m, set(m.get("cells") or []))[0]
                    if a.name in listed):  # every cell's archive (or tracts.pmtiles)
        try:
            problems += format_geometry_problems(
                archive.stem, reference, against, tiles=pmtiles_tile_entries(
                    folder / archive.name), layer="tracts")
        except TILE_READ_ERRORS as err:
            problems.append(f"{archive.name} cannot be read: {type(err).__name__} {err}")
    return problems
