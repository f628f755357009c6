"""Tasks over groups of cells (issue 22, item 3): with many cells a chunk, or a state's level
task, takes a group of whole cells so that it reads at most a bounded number of records; what
it reads, and so what it estimates, is the records of its cells and nothing else."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpatlas.core.config import parse_config
from dpatlas.release.allocate import plan
from dpatlas.release.cell_groups import greedy_groups, group_cells, group_suffix
from dpatlas.release.estimate import (all_sizes, estimate_partition, read_chunk,
                                      select_partition, split_into_chunks, staged_counts,
                                      tracts_of)
from dpatlas.release.levels import estimate_levels, level_tasks, read_state
from mechanisms.noise import SeededRandomness

CELLS = ["outcome-1", "outcome-2", "outcome-3"]


def counts(**per_cell: int) -> pd.Series:
    return pd.Series(per_cell)


def test_cells_that_fit_are_one_task_named_as_before():
    assert group_cells(counts(a=3, b=4), bound=7) == [None]
    assert group_suffix(0, [None]) == ""


def test_cells_are_grouped_greedily_in_sorted_order_under_the_bound():
    assert group_cells(counts(c=3, a=4, b=3, d=5), bound=7) == [("a", "b"), ("c",), ("d",)]
    assert [group_suffix(j, [("a",), ("b",)]) for j in range(2)] == ["-c0", "-c1"]


def test_a_cell_above_the_bound_is_a_group_of_its_own():
    assert group_cells(counts(a=2, b=50, c=2), bound=10) == [("a",), ("b",), ("c",)]
    assert group_cells(counts(b=50), bound=10) == [None]  # one cell: nothing to split
    with pytest.raises(ValueError, match="at least 1"):
        group_cells(counts(a=1), bound=0)


def test_validation_partitions_and_tasks_share_one_grouping_with_a_null_cell_last():
    """Validation splits a large state by the same greedy rule (with the records of a null
    cell, which only the input can have, grouped last)."""
    assert greedy_groups({None: 2, "b": 3, "a": 4}, 7) == [(("a", "b"), 7), ((None,), 2)]
    assert greedy_groups({"a": 9}, 7) == [(("a",), 9)]
    assert greedy_groups({}, 7) == []


def staged_partition(folder: Path, state: str = "17") -> Path:
    """Records of 6 tracts × 3 cells (different sizes per cell), as a staged file is sorted."""
    rng = np.random.default_rng(3)
    frames = []
    for t in range(6):
        for k, cell in enumerate(CELLS):
            n = 40 + 10 * k + t
            x = rng.uniform(size=n)
            frames.append(pd.DataFrame({"geoid": f"{state}{t:09d}", "cell": cell, "x": x,
                                        "y": np.clip(0.3 + 0.4 * x + rng.normal(0, .1, n), 0, 1),
                                        "person_id": [f"p{i}" for i in range(n)]}))
    df = pd.concat(frames, ignore_index=True).sort_values(["geoid", "cell"], kind="stable")
    path = folder / f"input-{state}.parquet"
    df.to_parquet(path, index=False)
    return path


def sorted_records(df: pd.DataFrame) -> pd.DataFrame:
    return (df[["geoid", "cell", "x", "y"]].sort_values(["geoid", "cell", "x"])
            .reset_index(drop=True))


def test_a_chunk_over_the_bound_is_split_by_cells_and_reads_only_its_cells(tmp_path):
    path = staged_partition(tmp_path)
    found = staged_counts([path])
    # 3 tracts a chunk: 123, 153 and 183 records per cell in the first (132, 162, 192 in the
    # second): under a bound of 250 no two cells fit together.
    chunks = split_into_chunks(tracts_of(found), 3, found, record_bound=250)
    assert [c.name for c in chunks] == ["input-17-0-c0", "input-17-0-c1", "input-17-0-c2",
                                        "input-17-1-c0", "input-17-1-c1", "input-17-1-c2"]
    assert [c.cells for c in chunks[:3]] == [(cell,) for cell in CELLS]
    for chunk in chunks:
        read = read_chunk(chunk)
        assert set(read["cell"]) == set(chunk.cells)
        assert read["geoid"].between(chunk.first_geoid, chunk.last_geoid).all()
    together = pd.concat([read_chunk(c) for c in chunks])
    pd.testing.assert_frame_equal(sorted_records(together),
                                  sorted_records(pd.read_parquet(path)))


def test_chunks_under_the_bound_keep_their_names_and_every_cell(tmp_path):
    path = staged_partition(tmp_path)
    found = staged_counts([path])
    chunks = split_into_chunks(tracts_of(found), 3, found)  # the default bound: no split
    assert [(c.name, c.cells) for c in chunks] == [("input-17-0", None), ("input-17-1", None)]
    assert chunks == split_into_chunks(tracts_of(found), 3)
    assert len(all_sizes(found)) == 6 * len(CELLS)


def test_a_cell_group_estimates_what_the_whole_chunk_estimates_for_its_cells(tmp_path):
    """Cells are drawn in sorted order from the chunk's random stream: the first group's
    chunk, under the same seed, gives exactly the rows the unsplit chunk gives its cells."""
    path = staged_partition(tmp_path)
    found = staged_counts([path])
    whole = split_into_chunks(tracts_of(found), 6, found)[0]
    first = split_into_chunks(tracts_of(found), 6, found, record_bound=300)[0]
    assert first.cells == ("outcome-1",)
    budget = plan(parse_config({"input": {"path": "x"}, "boundaries": {"path": "b"},
                                "selection": {"rule": "dp", "threshold": 3.0}}), 3.0)

    def estimates(chunk):
        df = read_chunk(chunk)
        sel = select_partition(df, budget, SeededRandomness(5), min_n=20)
        return estimate_partition(df, sel, budget, SeededRandomness(6), min_n=20)

    got, every = estimates(first), estimates(whole)
    assert (got["status"] == "released").all()
    pd.testing.assert_frame_equal(got.reset_index(drop=True),
                                  every[every["cell"] == "outcome-1"].reset_index(drop=True))


def test_level_tasks_split_a_large_state_by_cells_and_read_only_them(tmp_path):
    staged = [staged_partition(tmp_path, "17"), staged_partition(tmp_path, "06")]
    sizes = all_sizes(staged_counts(staged))
    assert [(u.name, u.cells) for u in level_tasks(sizes)] == [("state-06", None),
                                                               ("state-17", None)]
    units = level_tasks(sizes, record_bound=600)  # a state: 255 + 315 + 375 records
    assert [(u.name, u.cells) for u in units] == [
        ("state-06-c0", ("outcome-1", "outcome-2")), ("state-06-c1", ("outcome-3",)),
        ("state-17-c0", ("outcome-1", "outcome-2")), ("state-17-c1", ("outcome-3",))]
    budget = plan(parse_config({"input": {"path": "x"}, "boundaries": {"path": "b"},
                                "selection": {"rule": "dp", "threshold": 3.0},
                                "levels": ["tract", "county", "state"]}), 3.0)
    parts = [estimate_levels(read_state(staged, u.state, u.cells), budget,
                             SeededRandomness(1), 5) for u in units if u.state == "17"]
    assert [set(p["cell"]) for p in parts] == [{"outcome-1", "outcome-2"}, {"outcome-3"}]
    split = pd.concat(parts, ignore_index=True)
    whole = estimate_levels(read_state(staged, "17"), budget, SeededRandomness(1), 5)
    key = ["level", "geoid", "cell"]
    pd.testing.assert_frame_equal(split[key + ["n"]].sort_values(key).reset_index(drop=True),
                                  whole[key + ["n"]].sort_values(key).reset_index(drop=True))


def test_a_chunk_of_a_group_of_cells_reads_the_same_rows_from_a_staging_url(tmp_path):
    """On Dask workers a chunk reads its partition by URL (``staging_url``): its cell group
    is filtered there as it is locally."""
    from dpatlas.release import staging
    from dpatlas.release.estimate import stage_chunks

    path = staged_partition(tmp_path)
    found = staged_counts([path])
    chunks = split_into_chunks(tracts_of(found), 3, found, record_bound=250)
    urls = staging.stage_files([path], staging.release_location("memory://bucket/cells", "r9"))
    for local, remote in zip(chunks, stage_chunks(chunks, urls)):
        assert remote.cells == local.cells and isinstance(remote.staged, str)
        pd.testing.assert_frame_equal(sorted_records(read_chunk(remote)),
                                      sorted_records(read_chunk(local)))
