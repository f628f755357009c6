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

# Where a task ran is measured (the flow's pid or a worker's): a task that ran on a worker is
# work that spreads over workers, one that ran in the flow is the flow machine's serial work
# (today validation, levels and publish; the lead's publish on the workers runs `publish-part`,
# one per state, and `cell-tiles`, one per cell, there). The commit stays serial wherever it
# runs: `publish` (today's whole publish, one serial step, even if submitted to Dask) and `feed`.
SERIAL_TASKS = ("publish", "feed")
# The tasks whose NUMBER grows with the cells (a chunk and a level task hold a bounded group of
# cells, a tile task one cell, a publish part at most PART_ROWS tract-cells and a level's files
# at most LEVEL_PART_ROWS unit-cells: a larger one is cut by its cells): their longest run
# stays as measured. Any other task (a state's validation) holds every cell of its unit: its
# longest run grows with the cells.
COUNT_GROWS_WITH_CELLS = ("select", "estimate", "estimate-levels", "cell-tiles", "publish-part",
                          "publish-level", "tract-tiles")
# The run of the `cell-tiles` task that builds the tracts' polygons' archive (one a release,
# whatever the cells: dpatlas.publication.tract_values), reported as a stage of its own,
# `tract-tiles`; the task's other runs are the county and state archives, one a cell each.
TRACT_TILES_RUN = "cell-tiles-all"


def stage_of(record: dict) -> str:
    """The stage a task run is counted in: its task's name, but ``tract-tiles`` for the
    tracts' archive (:data:`TRACT_TILES_RUN`)."""
    return "tract-tiles" if record.get("name") == TRACT_TILES_RUN else record["task"]

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
    """Per Prefect task name and place (``flow`` or ``workers``): runs, wall (any run
    running), summed task wall, CPU-s, the longest run's CPU-s and the process's CPU-s while
    its runs ran; in order of first start."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in records:
        groups.setdefault((stage_of(r), "flow" if r["pid"] == flow_pid else "workers"),
                          []).append(r)
    rows = []
    for (task, where), rs in groups.items():
        cpus = [task_cpu(r, flow_pid) for r in rs]
        rows.append({"stage": task, "where": where, "runs": len(rs),
                     "wall": union_seconds([(r["start"], r["end"]) for r in rs]),
                     "task_wall": sum(r["end"] - r["start"] for r in rs),
                     "cpu": sum(cpus), "longest_cpu": max(cpus),
                     # the process's CPU while each run ran: exact for a run alone in its
                     # process (a worker; publish), an upper bound beside other task threads
                     "process_cpu": sum(r["process_cpu"] + r["children_cpu"] for r in rs),
                     "first_start": min(r["start"] for r in rs)})
    rows.sort(key=lambda row: row["first_start"])
    return rows


def is_parallel(stage: dict) -> bool:
    """Runs that spread over workers: on a worker, and not the serial commit."""
    return stage["where"] == "workers" and stage["stage"] not in SERIAL_TASKS


def serial_cpu(stages: list[dict], flow_tree_cpu: float) -> float:
    """The flow machine's serial CPU-s: all of the release process tree's (wait4: the flow's
    tasks, its own code between them, what it reaped, e.g. tippecanoe), plus the serial tasks
    that ran on workers (today's `publish` if submitted to Dask)."""
    return flow_tree_cpu + sum(s["cpu"] for s in stages
                               if s["where"] == "workers" and not is_parallel(s))


def serial_fixed_part(serial_by_cells: dict[int, float]) -> float:
    """The part of the flow's serial CPU-s that does not grow with the cells (start-up, Prefect,
    the ledger): the intercept of the line through the fewest and the most cells measured
    (0 with one cell count, or when the line would go below 0)."""
    if len(serial_by_cells) < 2:
        return 0.0
    lo, hi = min(serial_by_cells), max(serial_by_cells)
    per_cell = (serial_by_cells[hi] - serial_by_cells[lo]) / (hi - lo)
    return max(0.0, min(serial_by_cells[lo], serial_by_cells[lo] - per_cell * lo))


def cluster_estimate(stages: list[dict], serial: float, measured_cells: int,
                     cells: int = 42, machines: int = 10, workers_per_machine: int = 2,
                     serial_fixed: float = 0.0) -> dict:
    """Seconds for ``cells`` cells on ``machines`` × ``workers_per_machine`` workers.

    Every cost grows linearly with the cells (each person has a record in each cell). Work on
    the workers = Σ parallel tasks' CPU-s × cells / measured cells, spread evenly over the
    workers; the critical path adds the longest single task (as measured where the number of
    its runs grows with the cells, scaled with the cells where its runs hold every cell); the
    flow's serial part (:func:`serial_cpu`: the machine that runs the flow; its share that
    grows scaled with the cells, plus ``serial_fixed``) runs alone, on one core. The largest
    term limits it."""
    scale = cells / measured_cells
    workers = machines * workers_per_machine
    parallel = [s for s in stages if is_parallel(s)]
    lines = [f"measured at {measured_cells} cell(s); target {cells} cells: scale "
             f"{cells} / {measured_cells} = {scale:.2f}", "on the workers (per unit):"]
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
    serial_scaled = serial_fixed + (serial - serial_fixed) * scale
    lines.append("on the flow machine (serial; its largest stages, per unit):")
    for s in sorted((s for s in stages if not is_parallel(s)), key=lambda s: -s["cpu"])[:6]:
        lines.append(f"  {s['stage']} ({s['where']}): {s['runs']} runs, {s['cpu']:.2f} CPU-s "
                     f"({s['cpu'] / s['runs']:.3f} per run) × {scale:.2f} = "
                     f"{s['cpu'] * scale:.1f} s")
    on_workers = work / workers
    total = on_workers + longest + serial_scaled
    terms = {"work on the workers": on_workers, "longest single task": longest,
             "the flow's serial part": serial_scaled}
    limit = max(terms, key=terms.get)
    lines += [f"work on the workers: {work:.1f} CPU-s / {workers} workers = {on_workers:.1f} s",
              f"critical path: longest single task ({longest_task}) = {longest:.1f} s",
              f"flow's serial part: {serial_fixed:.2f} fixed + ({serial:.2f} - "
              f"{serial_fixed:.2f}) CPU-s × {scale:.2f} = {serial_scaled:.1f} s",
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
        elif label in ("dask worker", "compute process", "compute server"):  # local runner's
            limit = TARGET_WORKER_MIB
        else:
            continue
        rows.append((f"peak RSS, {label} (pid {pid})", f"{mib:,.0f} MiB",
                     f"≤ {limit:,.0f} MiB", mib <= limit))
    return rows
