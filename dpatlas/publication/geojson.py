"""RFC 7946 GeoJSON of tract and level boundaries: geometries snapped, valid and
counter-clockwise (:func:`rfc7946_geometries`), and FeatureCollections streamed a state at a
time (:func:`write_geojson_rfc7946`, and the pieces `cell_stream` writes with)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Callable, Optional

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from dpatlas.core.places import CRS, BoundaryError


# 1e-6 degrees is about 11 cm, finer than any tract boundary is known; RFC 7946 section 11.2
# suggests 6 decimals (a 7th adds bytes, not truth).
GEOJSON_DECIMALS = 6


def rfc7946_geometries(geoms: np.ndarray, decimals: int = GEOJSON_DECIMALS) -> np.ndarray:
    """Polygons ready for RFC 7946: snapped to a grid of 10^-decimals degrees, kept valid,
    exterior rings counter-clockwise and holes clockwise (RFC 7946, section 3.1.6).

    Every vertex is rounded to the grid, and repeated vertices dropped. Where that leaves a
    polygon invalid (a collapsed spike, a ring touching itself), or the input was, that
    polygon is snap-rounded instead by ``shapely.set_precision``'s ``valid_output`` mode,
    which repairs what rounding breaks, so the output is valid where the input was. Rounding
    first costs a third of the CPU (0.53 against 1.68 s on the 74,001 synthetic national
    tracts) and gives the same polygons (``shapely.equals``) but one, where snap-rounding had
    also merged a vertex into a segment passing within the grid's half-step (a 2e-8 square
    degree sliver); a vertex two neighbours share is rounded to the same point in both.
    Orientation is set afterwards because the repair may rebuild rings either way round.
    """
    grid = 10.0 ** -decimals
    rounded = shapely.remove_repeated_points(
        shapely.set_precision(geoms, grid, mode="pointwise"), 0.0)
    broken = ~shapely.is_valid(rounded)
    if broken.any():
        rounded[broken] = shapely.set_precision(np.asarray(geoms)[broken], grid,
                                                mode="valid_output")
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
                          decimals: int = GEOJSON_DECIMALS, per_cell: bool | None = None) -> Path:
    """Write ``gdf`` as an RFC 7946 FeatureCollection.

    WGS 84 longitude/latitude (reprojected if needed) and no ``crs`` member (RFC 7946 section 4
    removed it: the CRS is always WGS 84), at most ``decimals`` decimals per coordinate,
    counter-clockwise exterior rings (:func:`rfc7946_geometries`), a ``bbox`` (section 5).
    Property values are JSON numbers, strings or null (NaN and NA become null). With a
    ``geoid`` column each feature's ``id`` (section 3.2) is its GEOID, or ``GEOID/cell`` when
    a GEOID has a feature per cell, so the id names one feature (``per_cell``: whether the
    release has several cells, when ``gdf`` is a piece of its table that may hold one cell).

    Streamed a state at a time (rows in their order; :func:`row_runs`): the file never exists
    as one string or one dict in memory. Geometries are written by GEOS (``shapely.to_geojson``,
    in C) rather than through Python coordinate lists: the snapped coordinates are the same
    doubles, and the few GEOS prints with more than ``decimals`` decimals are printed again.
    """
    path = Path(path)
    props, geoms, ids = geojson_parts(gdf, path, decimals, per_cell)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(feature_collection_head(geoms, decimals))
        write_features(fh, props, geoms, ids, decimals)
        fh.write(FEATURE_COLLECTION_TAIL)
    return path


# What closes the FeatureCollection :func:`feature_collection_head` opens.
FEATURE_COLLECTION_TAIL = "]}"


def geojson_parts(gdf: gpd.GeoDataFrame, path: Path | str, decimals: int = GEOJSON_DECIMALS,
                  per_cell: bool | None = None) -> tuple[pd.DataFrame, np.ndarray, list | None]:
    """What a FeatureCollection of ``gdf`` is written from: its properties, its RFC 7946
    geometries (WGS 84, snapped, counter-clockwise) and feature ids (:func:`feature_ids`;
    ``per_cell`` as there). ``path``: the file(s) being written (a state's part, a cell's
    archive input...), named in the refusal of a frame without a CRS."""
    if gdf.crs is None:
        raise BoundaryError(f"{path}: refusing to write boundaries without a CRS")
    # A release of several cells holds each tract's polygon once per cell, the same object in
    # every row (the rows are joined to the boundaries): each is reprojected and snapped once.
    polygons = gdf.geometry.to_numpy()
    first, inverse = distinct_objects(polygons)
    distinct = gpd.GeoSeries(polygons[first], crs=gdf.crs).to_crs(CRS)
    geoms = rfc7946_geometries(distinct.to_numpy(), decimals)[inverse]
    props = pd.DataFrame(gdf.drop(columns=gdf.geometry.name))
    return props, geoms, feature_ids(props, per_cell)


def distinct_objects(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the first row holding each distinct object of ``values`` (by
    identity, not by equality: the same Python object in several rows) and, per row, which of
    them it holds, so that ``values[first][inverse]`` is ``values`` again. Work done per
    distinct object is then done once, whatever the rows: an object is one value, so its
    result is the same in every row that holds it."""
    ids = np.fromiter(map(id, values), dtype=np.uint64, count=len(values))
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def feature_collection_head(geoms: np.ndarray, decimals: int = GEOJSON_DECIMALS) -> str:
    """The FeatureCollection's text up to its first feature, with the ``bbox`` of ``geoms``
    (RFC 7946 geometries: every feature's) when there are any."""
    head = '{"type":"FeatureCollection",'
    if len(geoms):
        bbox = [round(float(v), decimals) for v in shapely.total_bounds(geoms)]
        head += f'"bbox":{_json_text(bbox)},'
    return head + '"features":['


def write_features(fh, props: pd.DataFrame, geoms: np.ndarray, ids: list | None,
                   decimals: int = GEOJSON_DECIMALS, after_others: bool = False,
                   made: Optional[Callable[[dict[str, list], list[str]], None]] = None) -> bool:
    """Append the features of these rows to an open FeatureCollection, a state at a time
    (:func:`row_runs`); ``after_others``: features were written before (a comma first).
    ``made``: given each state's :func:`json_columns` and :func:`geometry_texts` once its
    features are written (the map's tracts are made of the same texts). Returns whether the
    collection now holds a feature."""
    for a, b in row_runs(props):
        rows = props.iloc[a:b]
        values, geometry = json_columns(rows), geometry_texts(geoms[a:b], decimals)
        after_others = write_feature_texts(
            fh, _feature_texts(values, geometry, None if ids is None else ids[a:b]),
            after_others)
        if made is not None:
            made(values, geometry)
    return after_others


def write_feature_texts(fh, texts: list[str], after_others: bool = False) -> bool:
    """Append features made by :func:`feature_texts` to an open FeatureCollection
    (``after_others``: a comma first); whether the collection now holds a feature."""
    if not texts:
        return after_others
    fh.write(("," if after_others else "") + ",".join(texts))
    return True


# Rows per chunk of the streamed GeoJSON when the table has no ``state`` column.
_GEOJSON_CHUNK_ROWS = 5000


def row_runs(props: pd.DataFrame) -> list[tuple[int, int]]:
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


def feature_texts(props: pd.DataFrame, geoms: np.ndarray, ids: list[str] | None,
                  decimals: int = GEOJSON_DECIMALS) -> list[str]:
    """Each row's Feature as JSON text: id, properties (:func:`_json_scalar`'s values), and
    the geometry as GEOS writes it (null when empty), written with
    :func:`write_feature_texts` (:func:`write_features` makes them a state at a time)."""
    return _feature_texts(json_columns(props), geometry_texts(geoms, decimals), ids)


def _feature_texts(values: dict[str, list], geometry: list[str],
                   ids: list[str] | None) -> list[str]:
    """Each row's Feature, compact, from its property ``values``, its geometry's text and,
    unless ``ids`` is None, its id: the published features and the archives' input alike.

    orjson, not json.dumps: 0.38-0.62 against 2.16-2.68 CPU-s for the 74,001 national
    tracts, the same text but for the spelling of exponents (1e-5, 1e16 where json writes
    1e-05, 1e+16: the same doubles). Its non-finite floats would be null, json's an error:
    :func:`_json_values` has made them None already."""
    import orjson

    names, dumps = list(values), orjson.dumps
    head = ['{"type":"Feature",' if ids is None
            else f'{{"type":"Feature","id":{dumps(ids[i]).decode()},'
            for i in range(len(geometry))]
    return [f'{head[i]}"properties":{dumps(dict(zip(names, row))).decode()},'
            f'"geometry":{geometry[i]}}}' for i, row in enumerate(zip(*values.values()))]


def json_columns(props: pd.DataFrame) -> dict[str, list]:
    """Each column's values as a feature's properties hold them (:func:`_json_values`), by
    name in the table's order."""
    return {c: _json_values(props[c]) for c in props.columns}


def tile_input_texts(values: dict[str, list], geometry: list[str]) -> list[str]:
    """Each row's Feature as tippecanoe's input, never published: the properties ``values``
    holds (:func:`json_columns`; the caller leaves out what the archive does not carry:
    tippecanoe parses every property of its input, ``--exclude`` or not) and the row's
    :func:`geometry_texts`; no ``id`` (tippecanoe keeps numeric ids only, and a published id
    is the GEOID as text).

    Written as the published features are (:func:`_feature_texts`), so the archive is the
    one they give (a test builds both and compares their tiles)."""
    return _feature_texts(values, geometry, None)


def _json_values(column: pd.Series) -> list:
    """A column's values as :func:`_json_scalar` makes them, whole numpy columns at a time."""
    if isinstance(column.dtype, pd.StringDtype):  # text or missing, nothing else: as is
        # (74,001 national tracts: 0.10-0.13 CPU-s for the table, 0.67-0.78 value by value)
        return column.to_numpy(dtype=object, na_value=None).tolist()
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
_EIGHT_DECIMALS = re.compile(r"\.\d{8}")  # where _LONG_DECIMAL can match


def geometry_texts(geoms: np.ndarray, decimals: int = GEOJSON_DECIMALS) -> list[str]:
    """Each geometry as a feature's ``geometry`` text (:func:`feature_texts`): RFC 7946
    geometry objects, null where empty; numbers with at most ``decimals`` decimals (``repr``
    of a float rounded to that many places)."""
    first, inverse = distinct_objects(geoms)  # a polygon in every cell's row: printed once
    distinct = geoms[first]
    empty = shapely.is_missing(distinct) | shapely.is_empty(distinct)
    texts = np.full(len(distinct), "null", dtype=object)
    if (~empty).any():
        texts[~empty] = shapely.to_geojson(distinct[~empty])
    # Only the few texts with such a number are rewritten (1,398 of the 74,001 national
    # tracts): the rewriting pattern, searched in every text, cost 1.2 CPU-s there, most of
    # it failing on numbers of six decimals; the plain search for 8 decimals, 0.1.
    for i in [i for i, t in enumerate(texts) if _EIGHT_DECIMALS.search(t)]:
        texts[i] = _LONG_DECIMAL.sub(lambda m: repr(round(float(m.group()), decimals)),
                                     texts[i])
    return texts[inverse].tolist()


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


