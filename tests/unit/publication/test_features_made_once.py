"""A release of several cells holds each tract's polygon once per cell. Its GeoJSON features
are made once per group of rows (the polygons reprojected, snapped and printed once each) and
written to each state's file, and each cell's archive input is made from the same polygons'
text (without the features' ids and the columns the tiles leave out); these tests check that
what is written is what making every row's feature on its own writes."""

from __future__ import annotations

import json

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely
from shapely.geometry import Polygon

from dpatlas.publication.cell_stream import GeoJsonAppender
from dpatlas.publication.cell_tiles import CellTileBuilder, cell_features_file
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


def _without_tile_columns(feature: dict) -> dict:
    """A published feature as a tract archive's input holds it: no id, none of the columns
    the tiles leave out."""
    from dpatlas.publication.tiles import NOT_IN_TILES

    return {"type": feature["type"], "geometry": feature["geometry"],
            "properties": {k: v for k, v in feature["properties"].items()
                           if k not in NOT_IN_TILES}}


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


def test_each_cells_input_holds_its_features_as_the_state_files_hold_them(tmp_path):
    """The per-state files and each cell's archive input, written with the features made
    once, against the cells' inputs made from the whole group on their own (the way before)."""
    table = _table(shared=True)
    alone, once = tmp_path / "alone", tmp_path / "once"
    alone.mkdir(), once.mkdir()
    by_itself = CellTileBuilder(alone, "r1", {}, tiler=None)
    by_itself.add_group(table)

    builder = CellTileBuilder(once, "r1", {}, tiler=None)
    for state in STATES:
        rows = table[table["state"] == state].reset_index(drop=True)
        appender = GeoJsonAppender(once / f"{state}.geojson", several_cells=True,
                                   cell_features=builder)
        appender.append(rows)
        appender.close()
    builder.end_group()

    assert builder.features() == by_itself.features() == {c: cell_features_file(c)
                                                         for c in CELLS}
    in_states = [f for s in STATES for f in _features(once / f"{s}.geojson")]
    assert len(in_states) == len(table)
    assert [f["id"] for f in in_states if f["properties"]["cell"] == "c1"] == [
        f"{g}/c1" for g in table.loc[table["cell"] == "c1", "geoid"]]
    assert all("p25_se" in f["properties"] for f in in_states)
    for cell in CELLS:
        mine = _features(once / cell_features_file(cell))
        assert mine == _features(alone / cell_features_file(cell))
        assert mine == [_without_tile_columns(f) for f in in_states
                        if f["properties"]["cell"] == cell]
        assert [f["properties"]["geoid"] for f in mine] == list(
            table.loc[table["cell"] == cell, "geoid"])


def test_a_cell_in_two_groups_is_refused(tmp_path):
    table = _table(shared=True)
    builder = CellTileBuilder(tmp_path, "r1", {}, tiler=None)
    builder.add_group(table[table["cell"] == "c1"].reset_index(drop=True))
    again = table[table["cell"].isin(["c1", "c2"])].reset_index(drop=True)
    with pytest.raises(PublishError, match="two groups of cells"):
        builder.add_group(again)


def test_the_frames_are_not_changed(tmp_path):
    table = _table(shared=True)
    before = pd.DataFrame(table.drop(columns="geometry")).copy()
    geoms = table.geometry.to_numpy().copy()
    geojson_parts(table, tmp_path / "x.geojson", per_cell=True)
    pd.testing.assert_frame_equal(pd.DataFrame(table.drop(columns="geometry")), before)
    assert all(a is b for a, b in zip(table.geometry.to_numpy(), geoms))


def test_a_group_that_fails_midway_leaves_no_file_open_and_starts_nothing(tmp_path):
    table = _table(shared=True)
    builder = CellTileBuilder(tmp_path, "r1", {}, tiler=None)
    appender = GeoJsonAppender(tmp_path / "01.geojson", several_cells=True,
                               cell_features=builder)
    appender.append(table[table["state"] == "01"].reset_index(drop=True))
    handles = [out for out, _ in builder.open.values()]
    assert len(handles) == len(CELLS) and not any(h.closed for h in handles)
    builder.close()  # the part failed before its group ended
    appender.close()
    assert all(h.closed for h in handles) and builder.open == {}
    assert builder.features() == {} and builder.pending == {}
