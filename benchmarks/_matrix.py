"""Issue 35 item 4, the side-by-side matrix of bench_national.py (``--matrix``): CPU seconds per
Prefect task run (recorded inside the processes that run them), the item's targets, and the
estimate for the Atlas's 42 cells on 10 machines × 2 workers from the per-unit costs measured.

The arithmetic (:func:`stage_cpu_table`, :func:`serial_cpu`, :func:`cluster_estimate`,
:func:`target_rows`) is pure: tests/unit/test_bench_estimate.py checks it.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

GIB = 1024.0

# The item's targets.
TARGET_LOCAL_1CELL_FLOOR_RATIO = 2.0  # release wall / floor CPU-s, local runner, 1 cell
TARGET_FLOW_MIB = 1.5 * GIB
TARGET_TIPPECANOE_MIB = 300.0
TARGET_WORKER_MIB = 4 * GIB

# Tasks whose runs spread over workers (Prefect task names, tasks/*.py). The lead's publish on
# the workers adds `publish-part` (one per state) and `cell-tiles` (one per cell); the commit
# stays `publish`. Without them, today's `publish` is one serial step of the flow.
PARALLEL_TASKS = ("validate", "select", "estimate", "estimate-levels", "publish-part",
                  "cell-tiles")
# Of those, the tasks whose NUMBER grows with the cells (a chunk and a level task hold a bounded
# group of cells, a tile task one cell): their longest run stays as measured. The others (a
# state's validation or publish part) hold every cell of their unit: their runs grow with cells.
COUNT_GROWS_WITH_CELLS = ("select", "estimate", "estimate-levels", "cell-tiles")

TASKS_SUBFOLDER = "tasks"  # under the run's timings folder: one jsonl file per process


# --- recording CPU per task run, inside the release and the workers -------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def install_task_cpu_recorder(timings_env: str) -> None:
    """Wrap Prefect's sync task engine's call of a task function (in this process): per task
    run, its name, run name, pid, wall span, CPU of the calling thread, of the process and of
    the children it reaped (tippecanoe) meanwhile, appended to
    ``$timings_env/tasks/<pid>.jsonl``. Idempotent."""
    from prefect.task_engine import SyncTaskRunEngine

    original = SyncTaskRunEngine.call_task_fn
    if getattr(original, "_records_cpu", False):
        return

    def call_task_fn(self, transaction):
        start, thread0, proc0, child0 = (time.time(), time.thread_time(), time.process_time(),
                                         _children_cpu())
        try:
            return original(self, transaction)
        finally:
            run = getattr(self, "task_run", None)
            record = {"task": self.task.name, "name": getattr(run, "name", None) or "",
                      "pid": os.getpid(), "start": start, "end": time.time(),
                      "thread_cpu": time.thread_time() - thread0,
                      "process_cpu": time.process_time() - proc0,
                      "children_cpu": _children_cpu() - child0}
            folder = Path(os.environ[timings_env]) / TASKS_SUBFOLDER
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"{os.getpid()}.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")

    call_task_fn._records_cpu = True
    SyncTaskRunEngine.call_task_fn = call_task_fn


def read_task_cpu(timings: Path) -> list[dict]:
    folder = timings / TASKS_SUBFOLDER
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl"))
            for line in f.read_text().splitlines() if line] if folder.exists() else []


# --- the arithmetic -------------------------------------------------------------------------


def task_cpu(record: dict, flow_pid: int) -> float:
    """A task run's CPU seconds: on a worker (one thread) the process's, library threads
    included; in the flow (several task threads at once) its own thread's, plus the children
    reaped meanwhile (tippecanoe), which misses the library threads it started."""
    if record["pid"] != flow_pid:
        return record["process_cpu"] + record["children_cpu"]
    return record["thread_cpu"] + record["children_cpu"]


def union_seconds(intervals) -> float:
    """Time during which at least one interval was open (tasks may run concurrently)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def stage_cpu_table(records: list[dict], flow_pid: int) -> list[dict]:
    """Per Prefect task name: runs, wall (any run running), summed task wall, CPU-s, the
    longest run's CPU-s and where it ran (flow, workers or both); in order of first start."""
    by_task: dict[str, list[dict]] = {}
    for r in records:
        by_task.setdefault(r["task"], []).append(r)
    rows = []
    for task, rs in by_task.items():
        cpus = [task_cpu(r, flow_pid) for r in rs]
        places = {"flow" if r["pid"] == flow_pid else "workers" for r in rs}
        rows.append({"stage": task, "runs": len(rs),
                     "wall": union_seconds([(r["start"], r["end"]) for r in rs]),
                     "task_wall": sum(r["end"] - r["start"] for r in rs),
                     "cpu": sum(cpus), "longest_cpu": max(cpus),
                     "where": "+".join(sorted(places)),
                     "first_start": min(r["start"] for r in rs)})
    rows.sort(key=lambda row: row["first_start"])
    return rows


def serial_cpu(stages: list[dict], flow_tree_cpu: float) -> float:
    """The flow machine's serial CPU-s: the release process tree's (wait4: the flow and what it
    reaped) less the parallel tasks it ran itself (local runner), plus the serial tasks that ran
    on workers (e.g. today's `publish` submitted to Dask)."""
    parallel_in_flow = sum(s["cpu"] for s in stages
                           if s["stage"] in PARALLEL_TASKS and s["where"] == "flow")
    serial_on_workers = sum(s["cpu"] for s in stages
                            if s["stage"] not in PARALLEL_TASKS and s["where"] == "workers")
    return max(0.0, flow_tree_cpu - parallel_in_flow) + serial_on_workers


def cluster_estimate(stages: list[dict], serial: float, measured_cells: int,
                     cells: int = 42, machines: int = 10, workers_per_machine: int = 2) -> dict:
    """Seconds for ``cells`` cells on ``machines`` × ``workers_per_machine`` workers.

    Every cost grows linearly with the cells (each person has a record in each cell). Work on
    the workers = Σ parallel tasks' CPU-s × cells / measured cells, spread evenly over the
    workers; the critical path adds the longest single task (as measured where the number of
    its runs grows with the cells, scaled with the cells where its runs hold every cell); the
    flow's serial part (scaled with the cells) runs alone. The largest term limits it."""
    scale = cells / measured_cells
    workers = machines * workers_per_machine
    parallel = [s for s in stages if s["stage"] in PARALLEL_TASKS]
    lines = [f"measured at {measured_cells} cell(s); target {cells} cells: scale "
             f"{cells} / {measured_cells} = {scale:.2f}"]
    work = 0.0
    longest, longest_task = 0.0, "-"
    for s in parallel:
        grows = s["stage"] in COUNT_GROWS_WITH_CELLS
        unit = s["cpu"] / s["runs"]
        task_long = s["longest_cpu"] * (1.0 if grows else scale)
        work += s["cpu"] * scale
        lines.append(f"  {s['stage']}: {s['runs']} runs, {s['cpu']:.2f} CPU-s "
                     f"({unit:.3f} per run) × {scale:.2f} = {s['cpu'] * scale:.1f} CPU-s; "
                     f"longest run {s['longest_cpu']:.2f}"
                     + ("" if grows else f" × {scale:.2f}") + f" = {task_long:.2f} s")
        if task_long > longest:
            longest, longest_task = task_long, s["stage"]
    on_workers = work / workers
    serial_scaled = serial * scale
    total = on_workers + longest + serial_scaled
    terms = {"work on the workers": on_workers, "longest single task": longest,
             "the flow's serial part": serial_scaled}
    limit = max(terms, key=terms.get)
    lines += [f"work on the workers: {work:.1f} CPU-s / {workers} workers = {on_workers:.1f} s",
              f"critical path: longest single task ({longest_task}) = {longest:.1f} s",
              f"flow's serial part: {serial:.2f} CPU-s × {scale:.2f} = {serial_scaled:.1f} s",
              f"estimate: {on_workers:.1f} + {longest:.1f} + {serial_scaled:.1f} = "
              f"{total:.1f} s; limited by {limit} ({100 * terms[limit] / total:.0f}%)"
              if total > 0 else "estimate: 0 s (nothing measured)"]
    return {"cells": cells, "measured_cells": measured_cells, "workers": workers,
            "scale": scale, "work_cpu": work, "on_workers": on_workers,
            "longest_task": longest_task, "longest": longest, "serial_cpu": serial,
            "serial": serial_scaled, "total": total, "limited_by": limit, "lines": lines}


def target_rows(run: dict, floor_cpu: float | None, local_one_cell: bool) -> list[tuple]:
    """(figure, value text, target text, met) for one run's item-4 targets. ``run``: its
    ``wall`` and ``peaks`` ({pid: (label, MiB)}); the floor ratio only for the 1-cell local
    run."""
    rows = []
    if local_one_cell and floor_cpu:
        ratio = run["wall"] / floor_cpu
        rows.append(("release wall / floor CPU-s", f"{ratio:.2f}",
                     f"≤ {TARGET_LOCAL_1CELL_FLOOR_RATIO:g}",
                     ratio <= TARGET_LOCAL_1CELL_FLOOR_RATIO))
    for pid, (label, mib) in sorted(run["peaks"].items(), key=lambda kv: str(kv[1][0])):
        if label.startswith("tippecanoe"):
            limit = TARGET_TIPPECANOE_MIB
        elif label == "release (flow)":
            limit = TARGET_FLOW_MIB
        elif label == "dask worker":
            limit = TARGET_WORKER_MIB
        else:
            continue
        rows.append((f"peak RSS, {label} (pid {pid})", f"{mib:,.0f} MiB",
                     f"≤ {limit:,.0f} MiB", mib <= limit))
    return rows
