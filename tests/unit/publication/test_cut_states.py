"""Publish parts of a state cut by its cells (issue 35, item 1): the plan, and a state's CSV
and GeoJSON joined from its parts' as if one part had written them."""

from __future__ import annotations

import json

import geopandas as gpd
import pandas as pd
import pytest
from shapely.geometry import box

from dpatlas.publication import release_parts
from dpatlas.publication.cell_stream import GeoJsonAppender
from dpatlas.publication.release_parts import plan_parts
from dpatlas.publication.state_parts import PARQUET_PARTS, parts_of, piece_name
from dpatlas.publication.tract_files import PublishError


def geoids(counts: dict[str, int]) -> list[str]:
    return [f"{state}{i:09d}" for state, n in counts.items() for i in range(n)]


def test_a_state_larger_than_a_part_is_cut_by_its_cells_and_the_others_packed(monkeypatch):
    monkeypatch.setattr(release_parts, "PART_ROWS", 100)
    cells = [f"c{i}" for i in range(5)]
    parts = plan_parts(cells, geoids({"01": 5, "02": 5, "06": 40, "08": 10}))
    assert [(p.name, p.states, p.piece, [c for g in p.groups for c in g]) for p in parts] == [
        ("states-01-02", ("01", "02"), 0, cells),
        ("states-06-cells-1", ("06",), 0, ["c0", "c1"]),
        ("states-06-cells-2", ("06",), 1, ["c2", "c3"]),
        ("states-06-cells-3", ("06",), 2, ["c4"]),
        ("states-08", ("08",), 0, cells)]
    assert all(p.run == f"published-{p.name}" for p in parts)
    # every (state, cell) is in exactly one part
    pairs = [(s, c) for p in parts for s in p.states for g in p.groups for c in g]
    assert len(pairs) == len(set(pairs)) == 4 * 5


def test_one_cell_never_cuts_a_state_and_a_release_within_bounds_is_as_before(monkeypatch):
    monkeypatch.setattr(release_parts, "PART_ROWS", 100)
    assert [p.name for p in plan_parts(["c0"], geoids({"01": 500, "02": 5}))] == [
        "states-01", "states-02"]
    assert [p.name for p in plan_parts(["c0", "c1"], geoids({"01": 10, "02": 10}))] == [
        "states-01-02"]


def test_piece_names_and_their_order():
    assert piece_name("tracts/state=06/part-0.parquet", 3) == "tracts/state=06/part-3.parquet"
    assert piece_name("tracts-csv/state=06/tracts.csv", 3) == "tracts-csv/state=06/tracts.csv"
    names = [f"tracts/state=06/part-{k}.parquet" for k in (10, 2, 0)] + [
        "tracts/state=01/part-0.parquet", "tracts-csv/state=06/tracts.csv"]
    assert parts_of(names, PARQUET_PARTS) == [
        "tracts/state=01/part-0.parquet", "tracts/state=06/part-0.parquet",
        "tracts/state=06/part-2.parquet", "tracts/state=06/part-10.parquet"]


def _table(cell: str) -> gpd.GeoDataFrame:
    return gpd.GeoDataFrame({"geoid": ["06001000100", "06001000200"], "cell": [cell, cell],
                             "p25": [0.5, None]},
                            geometry=[box(0, 0, 1, 1), box(1, 0, 2, 1)], crs="EPSG:4326")


def _geojson(path, tables) -> None:
    writer = GeoJsonAppender(path, several_cells=True)
    for table in tables:
        writer.append(table)
    writer.close()


def test_a_states_geojson_joined_from_its_parts_is_the_bytes_one_part_writes(tmp_path):
    _geojson(tmp_path / "whole.geojson", [_table("a"), _table("b")])
    _geojson(tmp_path / "joined.geojson", [_table("a")])
    _geojson(tmp_path / "piece.geojson", [_table("b")])
    release_parts._append_features(tmp_path / "piece.geojson", tmp_path / "joined.geojson")
    assert (tmp_path / "joined.geojson").read_bytes() == (tmp_path / "whole.geojson").read_bytes()
    assert len(json.loads((tmp_path / "joined.geojson").read_text())["features"]) == 4


def test_a_geojson_part_opening_unlike_the_states_is_refused(tmp_path):
    _geojson(tmp_path / "joined.geojson", [_table("a")])
    other = _table("b").set_geometry([box(5, 5, 6, 6), box(6, 5, 7, 6)])
    _geojson(tmp_path / "piece.geojson", [other])  # another bbox: not the same state's
    with pytest.raises(PublishError, match="opens unlike"):
        release_parts._append_features(tmp_path / "piece.geojson", tmp_path / "joined.geojson")


def test_a_states_csv_joined_from_its_parts_has_one_header(tmp_path):
    _table("a").drop(columns="geometry").to_csv(tmp_path / "joined.csv", index=False)
    _table("b").drop(columns="geometry").to_csv(tmp_path / "piece.csv", index=False)
    release_parts._append_csv(tmp_path / "piece.csv", tmp_path / "joined.csv")
    whole = pd.concat([_table("a"), _table("b")]).drop(columns="geometry")
    assert (tmp_path / "joined.csv").read_text() == whole.to_csv(index=False)


def test_a_level_job_names_no_unit_and_its_table_holds_its_cells_alone(tmp_path, monkeypatch):
    """A level job is a parameter of the publish subflow: it names its cells, not the units
    (its task reads them from the boundaries; 74,000 tracts' units passed Prefect's 512 KiB
    limit nationally, and a level cut by cells would repeat them in every job)."""
    monkeypatch.setattr(release_parts, "LEVEL_PART_ROWS", 2)  # 2 states: a cell a job
    table = gpd.GeoDataFrame({"geoid": ["17", "18", "17", "18"], "cell": ["a", "a", "b", "b"]},
                             geometry=[box(0, 0, 1, 1), box(1, 0, 2, 1)] * 2, crs="EPSG:4326")
    tracts = [f"17{i:09d}" for i in range(500)] + [f"18{i:09d}" for i in range(500)]
    jobs = release_parts.level_jobs({"state": table}, tracts, ["a", "b"], str(tmp_path))
    assert [(j.name, j.cells) for j in jobs] == [("state-1-of-2", ("a",)),
                                                  ("state-2-of-2", ("b",))]
    for job in jobs:
        assert list(gpd.read_parquet(job.table)["cell"]) == list(job.cells) * 2
        assert "17" not in repr(job).replace(str(tmp_path), "")
