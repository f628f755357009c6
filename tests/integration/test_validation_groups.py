"""Several input partitions checked in one run of the input contract (local runner).

A group's run must decide exactly what its partitions' own runs decide: a passing group gives
each partition the rows and report it would have had alone, and a failing one is checked
again partition by partition, so the refusal, quarantine and report name the partition.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpatlas.release import validation_report as R
from dpatlas.release.ingest import Partition
from dpatlas.release.validate import ValidationFailed, apply_policy, contract_frame
from dpatlas.release.validation_groups import (apply_policy_to_group, group_label,
                                               input_groups)

COLUMNS = {"geoid": "geoid", "x": "x", "y": "y", "cell": "cell"}  # the input has cells


def _frame(state: str, x: list[float], first_row: int = 0) -> pd.DataFrame:
    n = len(x)
    return pd.DataFrame({"row": range(first_row, first_row + n),
                         "geoid": [f"{state}001000100"] * n, "x": x,
                         "y": np.linspace(0.1, 0.9, n), "cell": "c1"})


def _parts(rows: list[int]) -> list[Partition]:
    return [Partition(f"{k:02d}", n) for k, n in enumerate(rows, start=1)]


# --- grouping ---------------------------------------------------------------------------------


def test_a_few_partitions_keep_a_run_each():
    parts = _parts([10, 5_000_000, 3])
    assert input_groups(parts, max_runs=8) == [[p] for p in parts]


def test_many_partitions_share_at_most_max_runs_runs_in_order():
    rng = np.random.default_rng(3)
    parts = _parts(list(rng.integers(1_000, 600_000, size=51)))
    groups = input_groups(parts, max_runs=8, max_rows=4_000_000)
    assert [p for g in groups for p in g] == parts  # every partition once, in order
    assert 2 <= len(groups) <= 8
    target = -(-sum(p.rows for p in parts) // 8)
    # every group but the last holds at least its share of the rows
    assert all(sum(p.rows for p in g) >= target for g in groups[:-1])


def test_a_group_never_grows_past_max_rows_and_a_large_partition_is_alone():
    parts = _parts([300, 300, 5_000, 300, 300, 300, 300, 300, 300, 300])
    groups = input_groups(parts, max_runs=2, max_rows=1_000)
    assert [[p.key for p in g] for g in groups] == [
        ["01", "02"], ["03"], ["04", "05", "06"], ["07", "08", "09"], ["10"]]
    assert all(sum(p.rows for p in g) <= 1_000 for g in groups if len(g) > 1)


def test_two_groups_in_hand_hold_at_most_one_partition_and_one_cell_is_unchanged():
    """The flow checks one group while it reads and stages the next: by default those two
    hold no more records than one partition (a national input with 6 cells, 31 M records, in
    partitions of up to 4 M, whose groups of up to 4 M took the flow to 1.8 GiB). With one
    cell (5.2 M records, no state above 0.6 M) the groups are what they were."""
    from dpatlas.release.ingest import PARTITION_RECORDS
    from dpatlas.release.validation_groups import GROUP_MAX_ROWS

    rng = np.random.default_rng(5)
    six = _parts(list(rng.integers(60_000, 1_500_000, size=51)))
    groups = input_groups(six)
    sizes = [sum(p.rows for p in g) for g in groups]
    assert all(n <= GROUP_MAX_ROWS for n, g in zip(sizes, groups) if len(g) > 1)
    together = [a + b for a, b, g, h in zip(sizes, sizes[1:], groups, groups[1:])
                if len(g) > 1 and len(h) > 1]
    assert together and max(together) <= PARTITION_RECORDS
    one = _parts(list(rng.integers(10_000, 200_000, size=50)) + [600_000])
    assert input_groups(one) == input_groups(one, max_rows=PARTITION_RECORDS)


def test_group_labels():
    assert group_label(["17"]) == "17"
    assert group_label(["01", "02", "04"]) == "01-to-04"


# --- checking a group ---------------------------------------------------------------------


def test_a_passing_group_is_one_run_and_each_partition_gets_its_own_result(tmp_path):
    frames = [("17", _frame("17", [0.2, 0.4, 1.3])), ("18", _frame("18", [0.5, -0.2], 3))]
    grouped = tmp_path / "grouped"
    got = apply_policy_to_group(frames, "clip", grouped, "/data/in", COLUMNS)
    alone = [apply_policy(df, "clip", key, tmp_path / "alone", "/data/in", COLUMNS)
             for key, df in frames]
    for (df, report), (df_alone, report_alone) in zip(got, alone):
        pd.testing.assert_frame_equal(df, df_alone)
        for field in ("partition", "rows_in", "rows_out", "clipped", "dropped", "quarantined",
                      "largest_rank", "failures"):
            assert getattr(report, field) == getattr(report_alone, field), field
    assert [r.clipped for _, r in got] == [1, 1]
    assert got[0][1].largest_rank == 1.3
    runs = R.load_runs(grouped)
    assert [(r["run_name"], r["success"]) for r in runs] == [("input-17-to-18", True)]
    assert runs[0]["asset"] == "input partitions 17, 18 of /data/in"
    assert all(r.docs_index == R.report_index(grouped) for _, r in got)


def test_a_failing_group_is_checked_again_partition_by_partition(tmp_path):
    frames = [("17", _frame("17", [0.2, 0.4])), ("18", _frame("18", [0.2, 1.7, 0.6], 2)),
              ("19", _frame("19", [0.3]))]
    with pytest.raises(ValidationFailed) as grouped:
        apply_policy_to_group(frames, "fail", tmp_path / "g", "/data/in", COLUMNS)
    apply_policy(frames[0][1], "fail", "17", tmp_path / "a", "/data/in", COLUMNS)
    with pytest.raises(ValidationFailed) as alone:
        apply_policy(frames[1][1], "fail", "18", tmp_path / "a", "/data/in", COLUMNS)
    # the same refusal as when partition 18 is checked alone (its folder aside)
    assert str(grouped.value).replace(str(tmp_path / "g"), "F") == \
        str(alone.value).replace(str(tmp_path / "a"), "F")
    assert "input partition 18 breaks its contract" in str(grouped.value)
    runs = [(r["run_name"], r["success"]) for r in R.load_runs(tmp_path / "g")]
    assert runs == [("input-17-to-19", False), ("input-17", True), ("input-18", False)]


def test_under_drop_a_failing_group_quarantines_each_partitions_rows(tmp_path):
    frames = [("17", _frame("17", [0.2, 1.4, 0.4])), ("18", _frame("18", [0.5, 0.6], 3))]
    got = apply_policy_to_group(frames, "drop", tmp_path, "/data/in", COLUMNS)
    assert [len(df) for df, _ in got] == [2, 2]
    assert [(r.dropped, r.quarantined) for _, r in got] == [(1, 1), (0, 0)]
    quarantined = pd.read_parquet(got[0][1].quarantine_file)
    assert list(quarantined["row"]) == [1] and got[1][1].quarantine_file is None
    names = [r["run_name"] for r in R.load_runs(tmp_path)]
    assert names == ["input-17-to-18", "input-17", "input-18"]


def test_a_group_of_one_is_a_partition_alone(tmp_path):
    (df, report), = apply_policy_to_group([("17", _frame("17", [0.2]))], "fail", tmp_path)
    assert report.partition == "17" and len(df) == 1
    assert [r["run_name"] for r in R.load_runs(tmp_path)] == ["input-17"]


# --- the pipeline's own cell --------------------------------------------------------------


def test_the_pipelines_cell_is_not_checked_as_the_inputs():
    """Without a cell column the reader writes one cell, ``all``: the contract checks the
    input's columns, so that column is left out (and the run is the suite without it)."""
    df = _frame("17", [0.2]).assign(cell="all", person_id="p1")
    without = {"geoid": "geoid", "x": "x", "y": "y", "person_id": "person_id"}
    assert list(contract_frame(df, without)) == ["geoid", "x", "y", "person_id"]
    assert list(contract_frame(df, COLUMNS)) == ["geoid", "x", "y", "person_id", "cell"]
    assert list(contract_frame(df)) == ["geoid", "x", "y", "person_id", "cell"]


def test_a_run_without_a_cell_column_reports_no_cell_expectation(tmp_path):
    without = {"geoid": "geoid", "x": "x", "y": "y"}
    apply_policy(_frame("17", [0.2]).assign(cell="all"), "fail", "17", tmp_path, None,
                 without)
    (run,) = R.load_runs(tmp_path)
    assert run["suite"] == "input_microdata-without-cell-without-person_id"
    assert not [e for e in run["expectations"] if "cell" in json.dumps(e)]


# --- a release whose partitions share runs --------------------------------------------------


@pytest.fixture(scope="module")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


def test_a_release_checked_in_groups_publishes_what_one_checked_by_partition_does(
        tmp_path, monkeypatch, prefect_server):
    """Three states, two runs of the contract (``MAX_INPUT_RUNS`` lowered to 2), against the
    same release with a run per state: the same staged rows, the same published table (same
    seed), and the runs named for their partitions."""
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
    from flows import validation
    from flows.release import release
    from tests.support.inputs import basic_release_config, write_config

    data = tmp_path / "data"
    write_synthetic(data, ["17", "18", "19"], seed=9, params=StateParams(n_tracts=30, counties=2))

    def release_in(folder, groups):
        monkeypatch.setattr(validation, "input_groups", groups)
        folder.mkdir()
        cfg = write_config(folder / "config.yaml",
                           basic_release_config(data, folder, partition_tracts=60))
        return Path(release(str(cfg), "r1", 7)), folder / "internal" / "r1"

    real = validation.input_groups
    alone, alone_internal = release_in(tmp_path / "alone", real)
    grouped, grouped_internal = release_in(
        tmp_path / "grouped", lambda parts: real(parts, max_runs=2))
    runs = sorted((r["run_name"], r["success"]) for r in R.load_runs(grouped_internal)
                  if r["run_name"].startswith("input-"))  # two groups at a time: any order
    assert runs == [("input-17-to-18", True), ("input-19", True)]
    assert sorted(r["run_name"] for r in R.load_runs(alone_internal)
                  if r["run_name"].startswith("input-")) == ["input-17", "input-18", "input-19"]
    for key in ("17", "18", "19"):
        name = f"staged/input-{key}.parquet"
        pd.testing.assert_frame_equal(pd.read_parquet(grouped_internal / name),
                                      pd.read_parquet(alone_internal / name))
    files = sorted(p.relative_to(alone) for p in alone.rglob("tracts*.csv"))
    assert files and files == sorted(p.relative_to(grouped) for p in grouped.rglob("tracts*.csv"))
    for name in files:
        pd.testing.assert_frame_equal(pd.read_csv(grouped / name), pd.read_csv(alone / name))


def test_the_flow_holds_two_small_groups_at_once_and_a_large_one_alone(monkeypatch):
    """RowsInHand: the validation tasks together hold at most a partition's records; groups
    of half that go two at a time, a larger one waits until it is alone, and they are let in
    in the order they asked. Each task holds until the test lets it go, and the next asks
    only once the one before has taken its turn, so nothing depends on timing."""
    import threading
    import time

    from dpatlas.release.validation_groups import RowsInHand

    monkeypatch.setattr("dpatlas.release.ingest.PARTITION_RECORDS", 100)
    hand, lock = RowsInHand(), threading.Lock()
    held, order, seen = [0], [], {}
    done = {}

    def task(name: str, rows: int) -> None:
        with hand.holding(rows):
            with lock:
                order.append(name)
                held[0] += rows
                seen[name] = held[0]
            done[name].wait(10)
            with lock:
                held[0] -= rows

    def until(condition) -> None:
        deadline = time.monotonic() + 10
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.005)

    threads = {}

    def ask(name: str, rows: int) -> None:
        asked = hand._tickets
        done[name] = threading.Event()
        threads[name] = threading.Thread(target=task, args=(name, rows))
        threads[name].start()
        until(lambda: hand._tickets == asked + 1)  # in the queue

    ask("a", 50)
    until(lambda: "a" in order)
    ask("b", 50)
    until(lambda: "b" in order)
    assert seen["b"] == 100  # a and b together: two halves
    ask("big", 90)
    ask("c", 40)
    ask("huge", 250)
    time.sleep(0.05)
    assert order == ["a", "b"]  # big waits for room; c and huge wait behind it
    done["a"].set()
    time.sleep(0.05)
    assert order == ["a", "b"]  # 50 + 90 > 100: still waiting
    done["b"].set()
    until(lambda: "big" in order)
    time.sleep(0.05)
    assert order == ["a", "b", "big"]  # 90 + 40 > 100: c waits, and huge behind it
    done["big"].set()
    until(lambda: "c" in order)
    time.sleep(0.05)
    assert "huge" not in order  # above the limit: only alone
    done["c"].set()
    until(lambda: "huge" in order)
    done["huge"].set()
    for t in threads.values():
        t.join(10)
    assert not any(t.is_alive() for t in threads.values())
    assert order == ["a", "b", "big", "c", "huge"]  # first come, first in
    assert seen == {"a": 50, "b": 100, "big": 90, "c": 40, "huge": 250}
    assert held[0] == 0
