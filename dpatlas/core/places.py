"""Places every layer shares: the CRS and columns of a frame of tract boundaries, the refusal
of boundaries the pipeline cannot use, the real outlines bundled with libpysal, and tract
positions (centroids, a local projection in km). The states' FIPS table is
`dpatlas.core.state_fips`.

The input checks (`dpatlas.release.boundaries`), the synthetic geography
(`dpatlas.evaluation.synthetic_boundaries`) and the published files (`dpatlas.publication`)
read these here, so none of them imports another for them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely
from shapely.geometry import Polygon

from dpatlas.core.errors import ReleaseRefused

CRS = "EPSG:4326"
BOUNDARY_COLUMNS = ["geoid", "state", "county", "geometry"]


class BoundaryError(ValueError, ReleaseRefused):
    """Boundaries (a file or a list of GEOIDs) the pipeline cannot use; the message says why."""


# --------------------------------------------------------------------------------------------
# Real outlines (issue 21 item 6): libpysal's bundled examples, read offline. ``us_income``
# holds the 48 contiguous states, ``sids2`` North Carolina's 100 counties with their FIPS codes
# and names. The shapefiles have no .prj; their metadata says unprojected longitude/latitude
# (no datum), and they are used as EPSG:4326.
_STATES_EXAMPLE = ("us_income", "us48.shp", "STATE_FIPS")
_COUNTIES_EXAMPLE = {"37": ("sids2", "sids2.shp", "FIPS", "NAME")}
# Islands smaller than this share of their state are left out of the outline: at this
# resolution they are slivers, too small for a synthetic county of their own.
_MIN_ISLAND_SHARE = 0.01


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
def real_state_outlines() -> dict[str, object]:
    """The 48 contiguous states' outlines by FIPS code, without their smallest islands."""
    example, file_name, fips = _STATES_EXAMPLE
    frame = _example_frame(example, file_name)
    outlines = {}
    for code, geometry in zip(frame[fips].astype(str), frame.geometry):
        parts = polygon_parts(geometry)
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


def real_counties(state_fips: str, counties: Sequence[str]) -> np.ndarray | None:
    """The real polygons of these 5-digit county codes, if the library outlines every one."""
    frame = _real_county_frame(state_fips)
    if frame is None or not set(counties) <= set(frame.index):
        return None
    return frame.loc[list(counties), "geometry"].to_numpy()


def polygon_parts(geometry) -> list[Polygon]:
    """The non-empty polygons of a geometry, largest first."""
    parts = [p for p in shapely.get_parts(geometry) if isinstance(p, Polygon) and not p.is_empty]
    return sorted(parts, key=lambda p: p.area, reverse=True)


def boundaries_frame(geoids: list[str], geometries) -> gpd.GeoDataFrame:
    """Tract boundaries as the pipeline holds them: ``geoid``, ``state``, ``county`` and
    ``geometry`` (EPSG:4326), sorted by GEOID."""
    geoid = pd.Series(geoids, dtype=str)
    gdf = gpd.GeoDataFrame({"geoid": geoid, "state": geoid.str[:2], "county": geoid.str[:5]},
                           geometry=gpd.GeoSeries(list(geometries), crs=CRS), crs=CRS)
    return gdf.sort_values("geoid", ignore_index=True)[BOUNDARY_COLUMNS]


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
