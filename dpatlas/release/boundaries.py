"""The input tract boundaries and their checks: GEOIDs (:func:`geoid_problems`), reading a
TIGER/Line-style file and refusing what the pipeline cannot use (:func:`load_boundaries`:
unreadable, malformed or duplicate GEOIDs, bad geometries, coordinates that do not fit the
declared CRS), and writing boundary files (:func:`write_boundaries`).

Validation (`tasks/validate.py`) and `dpatlas config check` call these before anything is drawn; they
import nothing of `dpatlas.publication` (an import-linter contract).
"""

from __future__ import annotations

import re
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyogrio
import shapely

from dpatlas.core.places import CRS, BoundaryError, boundaries_frame
from dpatlas.core.state_fips import STATE_FIPS


# --------------------------------------------------------------------------------------------
# GEOIDs

_GEOID = re.compile(r"\d{11}")
_MAX_EXAMPLES = 5


def _examples(values) -> str:
    values = list(values)
    shown = ", ".join(repr(v) for v in values[:_MAX_EXAMPLES])
    return shown + (", ..." if len(values) > _MAX_EXAMPLES else "")


def geoid_problems(geoids: pd.Series) -> list[str]:
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

    problems = geoid_problems(gdf[geoid_column])
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
    return boundaries_frame(list(gdf[geoid_column]), gdf.geometry.to_numpy())


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
