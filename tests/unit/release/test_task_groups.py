"""Runs of consecutive units per task run (dpatlas.release.task_groups)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpatlas.release.estimate import Chunk
from dpatlas.release.levels import LevelTask
from dpatlas.release.task_groups import (chunk_records, consecutive_groups, group_label,
                                         level_records)


@pytest.mark.parametrize("n,max_groups", [(0, 4), (3, 16), (16, 16), (17, 16), (67, 16),
                                          (51, 16), (1000, 7), (5, 1)])
def test_groups_cover_every_index_once_in_order(n, max_groups):
    rng = np.random.default_rng(n)
    weights = rng.integers(1, 1_000_000, n)
    groups = consecutive_groups(list(weights), max_groups)
    assert [k for g in groups for k in g] == list(range(n))
    assert all(g for g in groups) and len(groups) <= max(max_groups, 0 if n == 0 else 1)
    if n <= max_groups:
        assert groups == [[k] for k in range(n)]


def test_groups_balance_the_weights():
    # 67 chunks of very unequal records (the national release's): no run holds much more
    # than its share plus one chunk
    rng = np.random.default_rng(1)
    weights = rng.lognormal(11, 1, 67)
    groups = consecutive_groups(list(weights), 16)
    totals = [weights[g].sum() for g in groups]
    assert len(groups) == 16
    assert max(totals) <= weights.sum() / 16 + weights.max()
    # one huge unit: it stands alone-ish, the rest still split, never more than the bound
    heavy = [1.0] * 40 + [1e6] + [1.0] * 40
    groups = consecutive_groups(heavy, 8)
    assert len(groups) <= 8 and [k for g in groups for k in g] == list(range(81))
    assert max(len(g) for g in groups) < 81


def test_groups_without_weights_split_by_count():
    groups = consecutive_groups([0] * 40, 8)
    assert [len(g) for g in groups] == [5] * 8


def test_groups_refuse_no_group():
    with pytest.raises(ValueError):
        consecutive_groups([1, 2], 0)


def _sizes():
    return pd.DataFrame({
        "geoid": ["01001000100", "01001000200", "01001000200", "02001000100", "02001000300",
                  "06001000100"],
        "cell": ["a", "a", "b", "a", "b", "a"],
        "n": [10, 20, 5, 7, 3, 100]})


def test_chunk_records_sum_each_chunks_tract_cells():
    sizes = _sizes()
    chunks = [Chunk("p1", "01001000100", "01001000200", "p1-0"),
              Chunk("p1", "01001000200", "01001000200", "p1-0-c1", ("b",)),
              Chunk("p2", "02001000100", "02001000300", "p2-0"),
              Chunk("p3", "06001000100", "06001000100", "p3-0", ("z",))]
    assert chunk_records(chunks, sizes) == [35, 5, 10, 0]


def test_level_records_sum_each_states_cells():
    sizes = _sizes()
    units = [LevelTask("01", None, "state-01"), LevelTask("02", ("b",), "state-02-c1"),
             LevelTask("06", ("a",), "state-06")]
    assert level_records(units, sizes) == [35, 3, 100]


def test_group_label_names_the_first_and_last_unit():
    assert group_label(["input-17-0"]) == "input-17-0"
    assert group_label(["input-01-0", "input-02-0", "input-04-1"]) == "input-01-0-to-input-04-1"


def test_level_records_match_each_units_rows_on_many_states_and_cells():
    """The one-pass sum (per state and cell) against each unit's rows summed directly, on 5
    states x 7 cells with the states' cells split into groups and some (state, cell) empty."""
    rng = np.random.default_rng(3)
    geoids = [f"{s:02d}001{k:06d}" for s in (1, 2, 6, 17, 56) for k in range(30)]
    cells = [f"c{k}" for k in range(7)]
    sizes = pd.DataFrame([(g, c, int(rng.integers(0, 50))) for g in geoids for c in cells
                          if rng.random() < 0.8], columns=["geoid", "cell", "n"])
    units = [LevelTask(s, None if s == "56" else tuple(cells[k:k + 3]), f"state-{s}-{k}")
             for s in ("01", "02", "06", "17", "56") for k in (0, 3, 6)] + [
        LevelTask("99", None, "state-99")]  # a state without rows: 0
    expected = [int(sizes[(sizes["geoid"].str[:2] == u.state)
                          & (True if u.cells is None else sizes["cell"].isin(u.cells))]["n"].sum())
                for u in units]
    assert level_records(units, sizes) == expected
    assert expected[-1] == 0 and len(set(expected)) > 5
