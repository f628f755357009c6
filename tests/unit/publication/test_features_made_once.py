"""A release of several cells holds each tract's polygon once per cell. Its GeoJSON features
are made once per group of rows (the polygons reprojected, snapped and printed once each) and
written to each state's file, and the map's tracts are made from the same values and polygon
texts (each cell and state's values document, the polygons' archive input); these tests check
that what is written is what making every row's feature on its own writes."""

from __future__ import annotations

import json

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely
from shapely.geometry import Polygon

from dpatlas.publication.cell_stream import GeoJsonAppender
from dpatlas.publication import tract_values as V
from dpatlas.publication.tract_files import PublishError
from dpatlas.publication.geojson import (FEATURE_COLLECTION_TAIL, distinct_objects,
                                         feature_collection_head, geojson_parts,
                                         write_features)

STATES = ("01", "02")
CELLS = ("c1", "c2", "c3")


def _polygon(k: int) -> Polygon:
    # vertices with more decimals than published and a clockwise ring, so snapping and
    # orienting both change them
    x, y = -86.0 + 0.0123456789 * k, 32.0 + 0.0098765432 * k
    return Polygon([(x, y), (x, y + 0.01000000049), (x + 0.01000000051, y + 0.01), (x, y)])


def _as_polygon_input(feature: dict) -> dict:
    """A published feature as the tract archive's input holds it: no id, the GEOID alone."""
    return {"type": feature["type"], "properties": {"geoid": feature["properties"]["geoid"]},
            "geometry": feature["geometry"]}


def _table(shared: bool) -> gpd.GeoDataFrame:
    """Two states of three tracts each, every tract in every cell, rows cell by cell; with
    ``shared`` each tract's polygon is one object in all its rows (as the release's rows
    joined to the boundaries are), else a copy per row."""
    polygons = {f"{s}00100{k}": _polygon(10 * i + k) for i, s in enumerate(STATES)
                for k in range(3)}
    rows = [(g, c) for c in CELLS for g in polygons]
    geometry = [polygons[g] if shared else shapely.from_wkb(shapely.to_wkb(polygons[g]))
                for g, _ in rows]
    rng = np.random.default_rng(7)
    return gpd.GeoDataFrame({"geoid": [g for g, _ in rows], "state": [g[:2] for g, _ in rows],
                             "cell": [c for _, c in rows],
                             "p25": rng.uniform(size=len(rows)).round(4),
                             "p25_se": rng.uniform(size=len(rows)).round(4)},  # not in tiles
                            geometry=geometry, crs="EPSG:4326")


def _features(path) -> list[dict]:
    return json.loads(path.read_text())["features"]


def test_distinct_objects_groups_rows_by_identity_and_gives_every_row_back():
    a, b = _polygon(1), _polygon(2)
    same_as_a = shapely.from_wkb(shapely.to_wkb(a))  # equal to a, another object
    values = np.array([a, b, a, same_as_a, b, a], dtype=object)
    first, inverse = distinct_objects(values)
    assert len(first) == 3
    assert all(x is y for x, y in zip(values[first][inverse], values))
    assert inverse[0] == inverse[2] == inverse[5] != inverse[3]


def test_shared_polygons_give_the_features_a_copy_per_row_gives(tmp_path):
    written = {}
    for shared in (True, False):
        props, geoms, ids = geojson_parts(_table(shared), tmp_path / "x.geojson", per_cell=True)
        path = tmp_path / f"{shared}.geojson"
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(feature_collection_head(geoms))
            write_features(fh, props, geoms, ids)
            fh.write(FEATURE_COLLECTION_TAIL)
        written[shared] = path.read_text()
    assert written[True] == written[False]
    features = json.loads(written[True])["features"]
    assert len(features) == len(STATES) * 3 * len(CELLS)
    ring = features[0]["geometry"]["coordinates"][0]
    assert all(len(repr(v).split(".")[1]) <= 6 for point in ring for v in point)
    assert shapely.is_ccw(shapely.LinearRing(ring))


def test_the_maps_tracts_hold_the_features_the_state_files_hold(tmp_path):
    """The per-state files and the map's tracts, written with the features made once: each
    cell and state's document holds the values of that cell's features of the state, and
    the archive's input the first cell's polygons with the GEOID alone."""
    from dpatlas.publication.tiles import NOT_IN_TILES

    table = _table(shared=True)
    writer = V.TractMapWriter(tmp_path, "r1", {}, list(CELLS))
    for state in STATES:
        rows = table[table["state"] == state].reset_index(drop=True)
        appender = GeoJsonAppender(tmp_path / f"{state}.geojson", several_cells=True,
                                   tract_map=writer)
        appender.append(rows)
        appender.close()
    writer.finish()

    in_states = [f for s in STATES for f in _features(tmp_path / f"{s}.geojson")]
    assert len(in_states) == len(table)
    assert [f["id"] for f in in_states if f["properties"]["cell"] == "c1"] == [
        f"{g}/c1" for g in table.loc[table["cell"] == "c1", "geoid"]]
    assert all("p25_se" in f["properties"] for f in in_states)
    assert writer.features() == {"c1": V.GEOMETRY_INPUT}
    assert _features(tmp_path / V.GEOMETRY_INPUT) == [
        _as_polygon_input(f) for f in in_states if f["properties"]["cell"] == "c1"]
    columns = V.value_columns(list(table.columns), NOT_IN_TILES)
    assert columns == ["geoid", "p25"] and writer.columns == columns
    assert sorted(writer.documents) == sorted(V.values_file(c, s) for c in CELLS
                                              for s in STATES)
    for cell in CELLS:
        for state in STATES:
            doc = V.read_document(tmp_path / V.values_file(cell, state))
            assert doc["rows"] == [[f["properties"][c] for c in columns] for f in in_states
                                   if f["properties"]["cell"] == cell
                                   and f["properties"]["state"] == state]


def test_a_cells_rows_of_a_state_in_two_groups_are_refused(tmp_path):
    table = _table(shared=True)
    writer = V.TractMapWriter(tmp_path, "r1", {}, list(CELLS))
    appender = GeoJsonAppender(tmp_path / "x.geojson", several_cells=True, tract_map=writer)
    appender.append(table[table["cell"] == "c1"].reset_index(drop=True))
    again = table[table["cell"].isin(["c1", "c2"])].reset_index(drop=True)
    with pytest.raises(PublishError, match="two groups of cells"):
        appender.append(again)
    appender.close()
    writer.close()


def test_the_frames_are_not_changed(tmp_path):
    table = _table(shared=True)
    before = pd.DataFrame(table.drop(columns="geometry")).copy()
    geoms = table.geometry.to_numpy().copy()
    geojson_parts(table, tmp_path / "x.geojson", per_cell=True)
    pd.testing.assert_frame_equal(pd.DataFrame(table.drop(columns="geometry")), before)
    assert all(a is b for a, b in zip(table.geometry.to_numpy(), geoms))


def test_a_group_that_fails_midway_leaves_no_file_open_and_starts_nothing(tmp_path):
    class NoTiler:
        def submit(self, *args, **kwargs):
            raise AssertionError("an archive was started for a part that failed")

    table = _table(shared=True)
    writer = V.TractMapWriter(tmp_path, "r1", {}, list(CELLS), NoTiler())
    appender = GeoJsonAppender(tmp_path / "01.geojson", several_cells=True, tract_map=writer)
    appender.append(table[table["state"] == "01"].reset_index(drop=True))
    handle = writer._input
    assert handle is not None and not handle.closed
    writer.close()  # the part failed before its last group
    appender.close()
    assert handle.closed
