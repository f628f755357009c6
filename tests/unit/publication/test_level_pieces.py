"""The county and state files cut by groups of cells (issue 35): a level's jobs, and its
pieces' files joined by the commit into the files one job writing every cell writes."""

from __future__ import annotations

import json

import geopandas as gpd
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.publication import release_parts
from dpatlas.publication.level_files import assemble_level, level_files, write_level_files
from dpatlas.publication.release_parts import (LevelJob, LevelResult, collect_levels,
                                               plan_level_jobs)
from dpatlas.publication.tract_files import PublishError

CELLS = ["a", "b", "c", "d", "e"]


def _geoids() -> list[str]:
    return list(tract_geoids("17", 12, 4)[0]) + list(tract_geoids("18", 9, 3)[0])


def test_a_level_is_cut_by_groups_of_cells_of_at_most_its_rows():
    # the national counties: 6 cells a job, the states whole
    counties = [f"{s:02d}{c:03d}000100" for s in range(1, 52) for c in range(64)][:3221]
    cells = [f"outcome-{k}" for k in range(1, 43)]
    jobs = plan_level_jobs(["county", "state"], counties, cells, "/p")
    county = [j for j in jobs if j.level == "county"]
    assert [len(j.cells) for j in county] == [6] * 7
    assert [c for j in county for c in j.cells] == cells  # every cell once, in order
    assert [(j.piece, j.pieces) for j in county] == [(k, 7) for k in range(7)]
    assert county[1].name == "county-2-of-7"
    assert county[1].table == "/p/level-county-2-of-7.parquet"
    [state] = [j for j in jobs if j.level == "state"]
    assert (state.name, state.cells, state.table) == ("state", tuple(cells),
                                                      "/p/level-state.parquet")
    # one cell, or few units: one job whatever the level
    assert [j.name for j in plan_level_jobs(["county"], counties, ["x"], "/p")] == ["county"]
    assert [j.name for j in plan_level_jobs(["county"], counties, [], "/p")] == ["county"]


def test_a_level_with_more_units_than_a_job_holds_gets_a_cell_a_job(monkeypatch):
    monkeypatch.setattr(release_parts, "LEVEL_PART_ROWS", 3)
    jobs = plan_level_jobs(["county"], _geoids(), CELLS, "/p")  # 7 counties > 3
    assert [j.cells for j in jobs] == [(c,) for c in CELLS]


def _level_table() -> gpd.GeoDataFrame:
    """7 counties in 5 cells; only cell "a" has a failed county (``reason`` is null in every
    other cell: the pieces' GeoParquet columns differ in type where a whole file's do not)."""
    geoids = _geoids()
    boundaries = synth_boundaries(geoids)
    units = sorted({g[:5] for g in geoids})
    rows = [{"level": "county", "geoid": u, "cell": c, "n": 40 + k, "mechanism": "NoisyStats",
             "status": "published", "reason": None, "p25_raw": 0.3 + 0.01 * k,
             "p75_raw": 0.6, "epsilon_spent": 0.5, "delta_spent": 0.0}
            for k, u in enumerate(units) for c in CELLS]
    rows[0].update(status="failed", reason="noisy nvar <= 0", p25_raw=None, p75_raw=None)
    return assemble_level(pd.DataFrame(rows), boundaries, "county", CELLS)


def _pieces(table, tmp_path, groups) -> list[LevelResult]:
    results = []
    for k, group in enumerate(groups):
        folder = tmp_path / f"piece-{k}"
        folder.mkdir()
        files = write_level_files(table[table["cell"].isin(group)], folder, "county",
                                  with_tiles=False, per_cell=True)
        results.append(LevelResult(LevelJob("county", "", tuple(group), k, len(groups)),
                                   str(folder), files, ("run", None)))
    return results


def _features(path) -> list[dict]:
    collection = json.loads(path.read_text())
    assert collection["type"] == "FeatureCollection"
    return sorted(collection["features"],
                  key=lambda f: (f["properties"]["geoid"], f["properties"]["cell"]))


def test_a_levels_pieces_are_joined_into_the_files_of_one_job(tmp_path):
    table = _level_table()
    whole = tmp_path / "whole"
    whole.mkdir()
    write_level_files(table, whole, "county", with_tiles=False)
    staging = tmp_path / "staging"
    staging.mkdir()
    # given out of order: joined in piece order
    groups = [["a", "b"], ["c", "d"], ["e"]]
    pieces = _pieces(table, tmp_path, groups)
    names = collect_levels(staging, pieces[::-1])
    assert names == level_files("county")

    parquet, geojson, csv, schema = level_files("county")
    key = ["geoid", "cell"]
    joined = gpd.read_parquet(staging / parquet)
    expected = gpd.read_parquet(whole / parquet)
    piece_of = {c: k for k, group in enumerate(groups) for c in group}
    order = [piece_of[c] for c in joined["cell"]]
    assert order == sorted(order)  # the pieces' rows, piece after piece
    pd.testing.assert_frame_equal(joined.sort_values(key, ignore_index=True),
                                  expected.sort_values(key, ignore_index=True))
    # the column null in the later pieces keeps the whole file's type; the metadata is one job's
    assert pq.read_schema(staging / parquet) == pq.read_schema(whole / parquet)
    assert (pq.read_schema(staging / parquet).metadata[b"geo"]
            == pq.read_schema(whole / parquet).metadata[b"geo"])
    pd.testing.assert_frame_equal(
        pd.read_csv(staging / csv, dtype=str).sort_values(key, ignore_index=True),
        pd.read_csv(whole / csv, dtype=str).sort_values(key, ignore_index=True))
    assert (staging / csv).read_text().count("geoid,") == 1  # one header
    assert _features(staging / geojson) == _features(whole / geojson)
    assert (staging / schema).read_bytes() == (whole / schema).read_bytes()
    # the pieces' files are copied, never linked: joining must not write into a piece
    assert (tmp_path / "piece-0" / csv).read_text().count("\n") == 1 + 7 * 2


def test_a_level_with_a_piece_missing_is_refused(tmp_path):
    pieces = _pieces(_level_table(), tmp_path, [["a", "b"], ["c", "d"], ["e"]])
    (tmp_path / "staging").mkdir()
    with pytest.raises(PublishError, match="pieces are not all there"):
        collect_levels(tmp_path / "staging", [pieces[0], pieces[2]])
