"""The arithmetic of bench_national.py --matrix (issue 35 item 4; benchmarks/_matrix.py): CPU
per stage, the flow's serial part, the 42-cell 20-worker estimate and the targets."""

from __future__ import annotations

import importlib
import sys

import pytest

from tests.support.paths import REPO

FLOW, W1, W2 = 100, 201, 202


@pytest.fixture(scope="module")
def matrix():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        yield importlib.import_module("_matrix")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def _run(task, pid, start, end, thread=0.0, process=0.0, children=0.0, name=""):
    return {"task": task, "name": name or task, "pid": pid, "start": start, "end": end,
            "thread_cpu": thread, "process_cpu": process, "children_cpu": children}


def test_stage_cpu_counts_a_workers_process_and_the_flows_own_thread(matrix):
    records = [_run("select", W1, 0.0, 2.0, thread=0.5, process=1.5),
               _run("select", W2, 1.0, 3.0, thread=0.5, process=1.0),
               # in the flow, other task threads run at once: its thread, plus tippecanoe
               _run("publish", FLOW, 4.0, 9.0, thread=2.0, process=6.0, children=3.0)]
    rows = {r["stage"]: r for r in matrix.stage_cpu_table(records, FLOW)}
    assert rows["select"]["cpu"] == pytest.approx(2.5)
    assert rows["select"]["wall"] == pytest.approx(3.0)  # union of 0-2 and 1-3
    assert rows["select"]["task_wall"] == pytest.approx(4.0)
    assert rows["select"]["longest_cpu"] == pytest.approx(1.5)
    assert rows["select"]["where"] == "workers"
    assert rows["publish"]["cpu"] == pytest.approx(5.0) and rows["publish"]["where"] == "flow"
    assert rows["publish"]["process_cpu"] == pytest.approx(9.0)  # the whole process's
    assert [r["stage"] for r in matrix.stage_cpu_table(records, FLOW)] == ["select", "publish"]


def test_a_task_that_ran_in_both_places_has_a_row_for_each(matrix):
    records = [_run("estimate-levels", FLOW, 0, 1, thread=1.0),
               _run("estimate-levels", W1, 0, 1, process=2.0)]
    rows = {(r["stage"], r["where"]): r["cpu"] for r in matrix.stage_cpu_table(records, FLOW)}
    assert rows == {("estimate-levels", "flow"): 1.0, ("estimate-levels", "workers"): 2.0}


def test_serial_part_is_the_flow_tree_plus_the_commit_wherever_it_ran(matrix):
    # today's publish submitted to a worker is still one serial step; a chunk is not
    dask = matrix.stage_cpu_table([_run("select", W1, 0, 1, process=4.0),
                                   _run("publish", W1, 1, 2, process=3.0)], FLOW)
    assert matrix.serial_cpu(dask, flow_tree_cpu=2.0) == pytest.approx(5.0)
    local = matrix.stage_cpu_table([_run("select", FLOW, 0, 1, thread=4.0)], FLOW)
    assert matrix.serial_cpu(local, flow_tree_cpu=10.0) == pytest.approx(10.0)


def _stage(name, runs, cpu, longest, where="workers"):
    return {"stage": name, "where": where, "runs": runs, "cpu": cpu, "longest_cpu": longest}


def test_estimate_is_work_over_workers_plus_longest_task_plus_scaled_serial_part(matrix):
    # measured at 6 cells: 60 chunks' selection 120 CPU-s (longest 3), 51 states' validation
    # 102 CPU-s (longest 6: a state's records in every cell, so it grows 7x), the commit on a
    # worker (serial: in the serial CPU-s given), the flow's serial part 30 CPU-s
    stages = [_stage("select", 60, 120.0, 3.0), _stage("validate", 51, 102.0, 6.0),
              _stage("publish", 1, 20.0, 20.0), _stage("plan-chunks", 51, 9.0, 1.0, "flow")]
    est = matrix.cluster_estimate(stages, serial=30.0, measured_cells=6)
    assert est["scale"] == pytest.approx(7.0) and est["workers"] == 20
    assert est["work_cpu"] == pytest.approx((120.0 + 102.0) * 7)
    assert est["on_workers"] == pytest.approx(222.0 * 7 / 20)
    assert est["longest"] == pytest.approx(42.0) and est["longest_task"] == "validate"
    assert est["serial"] == pytest.approx(210.0)
    assert est["total"] == pytest.approx(222.0 * 7 / 20 + 42.0 + 210.0)
    assert est["limited_by"] == "the flow's serial part"
    text = "\n".join(est["lines"])
    assert "1554.0 CPU-s / 20 workers = 77.7 s" in text
    assert "estimate: 77.7 + 42.0 + 210.0 = 329.7 s" in text
    assert "0.00 fixed + (30.00 - 0.00) CPU-s × 7.00 = 210.0 s" in text
    assert "plan-chunks (flow): 51 runs, 9.00 CPU-s (0.176 per run)" in text


@pytest.mark.parametrize("stage", ["publish-part", "publish-level"])
def test_a_publish_part_or_level_jobs_longest_run_stays_as_measured(matrix, stage):
    """A publish part holds at most PART_ROWS tract-cells (a larger state is cut by its
    cells), a level's job at most LEVEL_PART_ROWS unit-cells, so at more cells there are more
    of them, not longer ones."""
    est = matrix.cluster_estimate([_stage(stage, 4, 40.0, 12.0)], serial=0.0,
                                  measured_cells=1, cells=42)
    assert est["longest"] == pytest.approx(12.0)
    assert est["work_cpu"] == pytest.approx(40.0 * 42)


def test_estimate_without_the_new_publish_tasks_keeps_todays_publish_serial(matrix):
    stages = [_stage("estimate", 10, 40.0, 5.0), _stage("publish", 1, 50.0, 50.0, "flow"),
              _stage("estimate-levels", 51, 30.0, 1.0, "flow")]
    est = matrix.cluster_estimate(stages, serial=60.0, measured_cells=1, cells=42)
    assert est["work_cpu"] == pytest.approx(40.0 * 42)  # neither publish nor flow levels
    assert est["longest"] == pytest.approx(5.0)  # a chunk's size does not grow with cells
    assert est["serial"] == pytest.approx(60.0 * 42)


def test_targets_beside_the_figures(matrix):
    run = {"wall": 9.0, "peaks": {1: ("release (flow)", 1600.0), 2: ("dask worker", 900.0),
                                  3: ("tippecanoe (tracts) under dask worker 2", 301.0),
                                  4: ("prefect server", 9999.0),
                                  5: ("compute process", 4097.0)}}
    rows = {figure: (value, target, met)
            for figure, value, target, met in matrix.target_rows(run, 5.0, True)}
    assert rows["release wall / floor CPU-s"] == ("1.80", "≤ 2", True)
    assert rows["peak RSS, release (flow) (pid 1)"][2] is False  # > 1.5 GiB
    assert rows["peak RSS, dask worker (pid 2)"][2] is True
    # the local runner's workers have the workers' bound
    assert rows["peak RSS, compute process (pid 5)"] == ("4,097 MiB", "≤ 4,096 MiB", False)
    assert rows["peak RSS, tippecanoe (tracts) under dask worker 2 (pid 3)"] == (
        "301 MiB", "≤ 300 MiB", False)
    assert not any("prefect" in f for f in rows)
    assert "release wall / floor CPU-s" not in {
        f for f, *_ in matrix.target_rows(run, 5.0, local_one_cell=False)}


def test_the_serial_parts_fixed_share_is_not_scaled_with_the_cells(matrix):
    # 10 CPU-s at 1 cell, 35 at 6: 5 per cell on 5 fixed
    assert matrix.serial_fixed_part({1: 10.0, 6: 35.0}) == pytest.approx(5.0)
    assert matrix.serial_fixed_part({6: 35.0}) == 0.0
    assert matrix.serial_fixed_part({1: 10.0, 6: 5.0}) == pytest.approx(10.0)  # noise: <= lo
    assert matrix.serial_fixed_part({1: 10.0, 6: 100.0}) == 0.0  # never below 0
    est = matrix.cluster_estimate([], serial=35.0, measured_cells=6, serial_fixed=5.0)
    assert est["serial"] == pytest.approx(5.0 + 30.0 * 7)
