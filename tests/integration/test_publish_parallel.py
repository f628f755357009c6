"""Publishing writes its files side by side and streams its GeoJSON a state at a time
(issue 22, item 2): the same features as the frame's, every file, and a failure in any one
writer fails the publication with nothing visible."""

from __future__ import annotations

import json
import os
import re
import threading
import time

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely
from shapely.geometry import Polygon

import dpatlas.publication.cell_stream as S
import dpatlas.publication.tract_files as P
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication import geojson, tiles
from dpatlas.publication.geojson import geojson_geometry, rfc7946_geometries, write_geojson_rfc7946
from dpatlas.publication.cell_stream import write_release
from dpatlas.publication.tract_files import assemble, in_parallel, verify_release
from dpatlas.evaluation.synthetic_input import tract_geoids


def reference_features(gdf: gpd.GeoDataFrame) -> list[dict]:
    """The features as the frame states them, built one by one in Python (the writer's
    previous method): GEOID ids, JSON scalars, coordinates rounded to 6 decimals."""
    geoms = rfc7946_geometries(gdf.to_crs("EPSG:4326").geometry.to_numpy())
    out = []
    for (_, row), geom in zip(gdf.drop(columns="geometry").iterrows(), geoms):
        props = {}
        for key, value in row.items():
            if value is None or value is pd.NA or (isinstance(value, float) and not np.isfinite(value)):
                props[key] = None
            elif isinstance(value, (bool, np.bool_)):
                props[key] = bool(value)
            elif isinstance(value, (int, np.integer)):
                props[key] = int(value)
            elif isinstance(value, (float, np.floating)):
                props[key] = float(value)
            else:
                props[key] = str(value)
        out.append({"type": "Feature", "id": row["geoid"], "properties": props,
                    "geometry": geojson_geometry(geom)})
    return out


@pytest.fixture(scope="module")
def three_states():
    """Tracts of three states (so the writer streams three runs), with every kind of value."""
    geoids = np.concatenate([tract_geoids(s, 12, 3)[0] for s in ("01", "06", "48")])
    gdf = synth_boundaries(list(geoids), seed=5)
    n = len(gdf)
    rng = np.random.default_rng(0)
    gdf["state"] = gdf["geoid"].str[:2]
    gdf["n"] = rng.integers(0, 500, n)
    gdf["flag"] = rng.random(n) < 0.5
    gdf["p25"] = np.where(rng.random(n) < 0.2, np.nan, rng.random(n).round(4))
    gdf["far"] = np.where(rng.random(n) < 0.1, np.inf, rng.normal(0, 1e6, n))
    gdf["reason"] = pd.Series(np.where(rng.random(n) < 0.3, None, "fewer than min_n"),
                              dtype=object)
    gdf["label"] = pd.array(np.where(rng.random(n) < 0.3, None, "x"), dtype="string")
    # a vertex with many decimals: printed again with at most 6
    gdf.loc[0, "geometry"] = Polygon([(-87.123456789012, 33.1), (-87.0, 33.1),
                                      (-87.0, 33.2), (-87.123456789012, 33.1)])
    return gdf


def test_streamed_geojson_equals_the_frames_features(three_states, tmp_path):
    path = write_geojson_rfc7946(three_states, tmp_path / "t.geojson")
    doc = json.loads(path.read_text())
    assert doc["type"] == "FeatureCollection" and "crs" not in doc
    assert doc["features"] == reference_features(three_states)
    geoms = rfc7946_geometries(three_states.geometry.to_numpy())
    assert doc["bbox"] == [round(float(v), 6) for v in shapely.total_bounds(geoms)]
    written = json.loads(path.read_text(), parse_float=lambda s: s)  # numbers as written
    coordinates = json.dumps([f["geometry"]["coordinates"] for f in written["features"]])
    decimals = [len(d) for d in re.findall(r"\.(\d+)", coordinates)]
    assert "e" not in coordinates.lower() and decimals and max(decimals) <= 6
    assert '"-87.123457"' in coordinates  # the long vertex, printed again
    assert len(geojson.row_runs(pd.DataFrame(three_states))) == 3  # one run per state


def test_streamed_geojson_without_state_or_rows(three_states, tmp_path, monkeypatch):
    monkeypatch.setattr(geojson, "_GEOJSON_CHUNK_ROWS", 7)  # several chunks
    plain = three_states.drop(columns="state")
    doc = json.loads(write_geojson_rfc7946(plain, tmp_path / "a.geojson").read_text())
    assert doc["features"] == reference_features(plain)
    empty = json.loads(write_geojson_rfc7946(plain.iloc[:0], tmp_path / "b.geojson").read_text())
    assert empty == {"type": "FeatureCollection", "features": []}


@pytest.fixture(scope="module")
def table():
    geoids, _ = tract_geoids("01", 40, 4)
    boundaries = synth_boundaries(list(geoids), seed=4)
    rng = np.random.default_rng(1)
    n = len(boundaries)
    results = pd.DataFrame({"geoid": boundaries["geoid"], "cell": "all",
                            "n": rng.integers(20, 300, n), "mechanism": "NoisyStats",
                            "status": "released", "reason": None,
                            "p25_raw": rng.normal(0.4, 0.2, n), "p75_raw": rng.normal(0.6, 0.2, n),
                            "epsilon_spent": 1.0, "delta_spent": 0.0})
    return assemble(results, boundaries)


def window(spans: dict, name: str, fn):
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spans[name] = (start, time.perf_counter())
    return timed


def slowed(seconds: float, fn):
    """``fn`` taking ``seconds`` longer: windows of a few milliseconds would not overlap
    however the work is scheduled, so each side of an overlap test takes this long."""
    def slow(*args, **kwargs):
        time.sleep(seconds)
        return fn(*args, **kwargs)
    return slow


def test_the_tiles_are_built_while_the_other_files_are_written(table, tmp_path, monkeypatch):
    spans = {}
    monkeypatch.setattr(tiles, "build_tiles",
                        window(spans, "tiles", slowed(0.5, tiles.build_tiles)))
    monkeypatch.setattr(S, "write_map", window(spans, "map", slowed(0.5, S.write_map)))
    folder = write_release(table, {"release_id": "r1"}, tmp_path / "root", "r1",
                           config={"release": "r1"})
    manifest = verify_release(folder)  # every file there, as hashed
    assert set(P.PUBLISHED_FILES) | {tiles.TILES_FILE} <= set(manifest["files"])
    (t0, t1), (m0, m1) = spans["tiles"], spans["map"]
    assert t0 < m1 and m0 < t1, f"tiles {spans['tiles']} and map {spans['map']} did not overlap"


@pytest.mark.parametrize("owner, writer", [(S, "write_map"), (S.CsvAppender, "append"),
                                           (S.GeoParquetAppender, "append"), (S, "footprint")])
def test_a_failing_writer_fails_publish_and_leaves_nothing(table, tmp_path, monkeypatch, owner,
                                                           writer):
    class Broken(RuntimeError):
        pass

    def broken(*args, **kwargs):
        raise Broken(f"{writer} failed")
    monkeypatch.setattr(owner, writer, broken)
    root, internal = tmp_path / "root", tmp_path / "internal"
    with pytest.raises(Broken, match=writer):
        write_release(table, {"release_id": "r1"}, root, "r1", config={"release": "r1"},
                      internal_dir=internal)
    assert not os.path.lexists(root / "r1")
    assert list(internal.iterdir()) == []  # the staging folder is gone, tippecanoe done


def test_in_parallel_raises_after_every_started_job_stopped():
    finished = threading.Event()

    def slow():
        time.sleep(0.3)
        finished.set()
        return "slow"

    def fails():
        raise ValueError("no")
    assert in_parallel([lambda: 1, lambda: 2]) == [1, 2]
    with pytest.raises(ValueError, match="no"):
        in_parallel([slow, fails])
    assert finished.is_set()  # the running job was waited for, not left writing


def test_the_output_checks_run_beside_the_tiles_and_join_the_manifest(table, tmp_path,
                                                                       monkeypatch):
    """``alongside`` (publish's output contract checks) starts once the GeoJSON is written,
    overlaps tippecanoe, and what it returns is in the published manifest."""
    spans = {}
    monkeypatch.setattr(tiles, "build_tiles",
                        window(spans, "tiles", slowed(0.5, tiles.build_tiles)))
    geojson_done = []
    monkeypatch.setattr(S.GeoJsonAppender, "close",
                        window(spans, "geojson", S.GeoJsonAppender.close))

    def checks():
        geojson_done.append("geojson" in spans)
        time.sleep(0.5)
        return {"output_contract": {"suite": "published_tracts", "success": True}}
    folder = write_release(table, {"release_id": "r1"}, tmp_path / "root", "r1",
                           config={"release": "r1"}, alongside=window(spans, "checks", checks))
    manifest = verify_release(folder)
    assert manifest["output_contract"] == {"suite": "published_tracts", "success": True}
    assert geojson_done == [True]
    (t0, t1), (c0, c1) = spans["tiles"], spans["checks"]
    assert t0 < c1 and c0 < t1, f"tiles {spans['tiles']} and checks {spans['checks']} apart"


def test_a_failing_output_check_leaves_nothing(table, tmp_path):
    class ContractBroken(RuntimeError):
        pass

    def checks():
        raise ContractBroken("the release table breaks its output contract")
    root, internal = tmp_path / "root", tmp_path / "internal"
    with pytest.raises(ContractBroken, match="output contract"):
        write_release(table, {"release_id": "r1"}, root, "r1", config={"release": "r1"},
                      internal_dir=internal, alongside=checks)
    assert not os.path.lexists(root / "r1")
    assert list(internal.iterdir()) == []  # the staging folder is gone, tippecanoe done


def test_the_overview_png_draws_one_cell_named_in_its_title(table, tmp_path, monkeypatch):
    """With several cells the PNG draws one cell's rows (``all`` if published, else the first
    in order) and says which: stacking every cell's copy of each polygon showed the last one
    drawn and cost a polygon per tract-cell (issue 22, cells at scale)."""
    drawn = {}

    def capture(rows, path, title, max_width=None):
        drawn["cells"], drawn["rows"], drawn["title"] = set(rows["cell"]), len(rows), title
        path.write_bytes(b"\x89PNG\r\n\x1a\n")
    monkeypatch.setattr(S, "write_map", capture)
    two = pd.concat([table.assign(cell="outcome-2"), table.assign(cell="outcome-1")],
                    ignore_index=True)
    write_release(two, {"release_id": "r1"}, tmp_path / "root", "r1", config={"release": "r1"})
    assert drawn["cells"] == {"outcome-1"} and drawn["rows"] == len(table)
    assert ", cell outcome-1 (" in drawn["title"] and f"of {len(table)} released" in drawn["title"]
    three = pd.concat([two, table.assign(cell="all")], ignore_index=True)
    write_release(three, {"release_id": "r2"}, tmp_path / "root", "r2", config={"release": "r2"})
    assert drawn["cells"] == {"all"} and drawn["rows"] == len(table)
    write_release(table, {"release_id": "r3"}, tmp_path / "root", "r3", config={"release": "r3"})
    assert drawn["cells"] == {"all"} and "cell" not in drawn["title"]  # one cell: not named
