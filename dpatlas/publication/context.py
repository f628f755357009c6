"""The map's context (issue 33 item 4): the outlines of the 48 contiguous states around the
release, so that a state does not float on grey when the map is zoomed out.

Public geography, not from the input: libpysal's bundled Census outlines (the ones the
synthetic boundaries use, :mod:`dpatlas.core.places`), simplified to about 2 km
(a context layer drawn at low zoom), written as RFC 7946 GeoJSON beside the web map's app
(``states_context.geojson``, listed in the manifest like the app's other files).
"""

from __future__ import annotations

import functools
import io

import geopandas as gpd
import shapely

from dpatlas.core.state_fips import STATE_FIPS
from dpatlas.core.places import CRS, real_state_outlines
from dpatlas.publication.geojson import (FEATURE_COLLECTION_TAIL, feature_collection_head,
                                        geojson_parts, write_features)

CONTEXT_FILE = "states_context.geojson"
# Degrees: about 2 km, finer than a pixel below zoom 6, where the layer is meant to be seen.
SIMPLIFY_DEGREES = 0.02
CONTEXT_DECIMALS = 3  # 100 m: ample for outlines simplified to 2 km


def states_context() -> gpd.GeoDataFrame:
    """The 48 contiguous states' outlines, simplified: ``state`` (FIPS), ``name``,
    ``postal``, ``geometry`` (EPSG:4326), by FIPS code."""
    outlines = real_state_outlines()
    codes = sorted(outlines)
    geoms = shapely.simplify([outlines[c] for c in codes], SIMPLIFY_DEGREES,
                             preserve_topology=True)
    return gpd.GeoDataFrame({"state": codes, "name": [STATE_FIPS[c][1] for c in codes],
                             "postal": [STATE_FIPS[c][0] for c in codes]},
                            geometry=list(geoms), crs=CRS)


@functools.lru_cache(maxsize=1)
def states_context_bytes() -> bytes:
    """``states_context.geojson``'s bytes (the same for every release: built once)."""
    frame = states_context()
    props, geoms, ids = geojson_parts(frame, CONTEXT_FILE, CONTEXT_DECIMALS)
    out = io.StringIO()
    out.write(feature_collection_head(geoms, CONTEXT_DECIMALS))
    write_features(out, props, geoms, ids, CONTEXT_DECIMALS)
    out.write(FEATURE_COLLECTION_TAIL)
    return out.getvalue().encode("utf-8")
