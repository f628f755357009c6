"""The national release at 42 cells on 10 machines (20 workers), estimated from full-scale runs
of ``bench_national.py`` on this machine at two or more cell counts, with its arithmetic.

    .venv/bin/python benchmarks/bench_national.py --runners dask --dask-cluster processes \\
        --dask-workers 2 --scale 1.0 --cells N --no-floor --work WN --json-out N.json
    .venv/bin/python benchmarks/bench_task_submission.py     # the flow's CPU per task run
    .venv/bin/python benchmarks/estimate_cells.py --runs 1.json 6.json 12.json \\
        --release W1/run-dask/releases/national-dask-2w --ms-per-task-run 64

The estimate is fitted through the two runs with the most cells (each run's cells are read
from its JSON): the costs that start only past some size (states cut by their cells, more
chunks per state) are then in both points. With three runs or more, the line through the two
with the fewest cells is also priced at the largest run's cells and workers and printed beside
that run's measured wall time: the model's error where it could be checked. ``--one 1.json
--six 6.json`` is the fit through 1 and 6 cells alone (the estimate of the earlier stops).

Why two runs at full scale: the flow's serial CPU grows with the tract-cells and with the
task runs, which grow at different rates (a chunk is split by groups of cells once its records
pass ``cell_groups.TASK_RECORDS``, so a 42-cell release has 3.7 times the chunks of a 6-cell
one). Measured at one scale and one cell count, the flow's growth cannot be told apart from its
fixed part; the estimate of stop 41 took it from 0.1-scale runs, where the tract-cells were too
few to show it, and was 385 s where this gives more than 500.

The model (every figure printed):

* work on the workers: each worker stage's CPU-s, linear in the cells through the two runs,
  plus the workers' CPU outside the tasks' functions (per task run, times the task runs),
  summed and spread evenly over the workers;
* the county and state files (publish-level) and their archives (cell-tiles): proportional
  to the cells from the run with more cells, since at one cell the level archives are built
  inside publish-level and at several in cell-tiles tasks of their own; the tracts' archive
  (tract-tiles, the polygons alone: one task a release) as measured;
* the longest single task: a stage whose tasks hold one state's records in every cell grows
  with the cells; the others' tasks are bounded by design (chunks and level tasks by
  records, publish parts by tract-cells, the county and state files by unit-cells, an
  archive per cell), so their longest measured run stands;
* validation, given ``--split-json`` (``bench_split_validation.py``): the partitions of the
  release at the target are planned by the release's own grouping (a state past
  ``ingest.PARTITION_RECORDS`` records is validated in groups of whole cells), and each is
  priced c + a·g (+ b·(S − g) for a group of a split state: the records of its state it reads
  and leaves), a and c fitted through the two runs' validate stage (each less b·(S − g) of
  its own split partitions), b from the bench. Without it, validation is on the line like the
  county and state files: California's 24 M records at 42 cells as one task, which the
  release does not run;
* the flow's serial CPU = fixed + (CPU per task run) x task runs + g x tract-cells. The CPU
  per task run comes from ``bench_task_submission.py``; g and the fixed part from the two
  runs; the task runs at 42 cells from the release's own planning code (chunks, level tasks,
  publish parts) applied to the 1-cell release's n per tract, one record per person and cell,
  the chunks made per validation partition as the release makes them (a state past
  ``ingest.PARTITION_RECORDS`` is staged, then chunked, as groups of its cells).

The three terms are added: nothing of the flow's serial part or of the longest task is assumed
to overlap the rest (an upper bound, as the old estimate was).
"""

from __future__ import annotations

import argparse
import functools
import glob
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Stages whose longest task holds a state's records in every cell (grows with the cells); a
# level's files are cut by groups of cells (release_parts.LEVEL_PART_ROWS), so their longest
# task is as measured.
GROWS_WITH_CELLS = {"validate"}
# Stages whose 1-cell run does other work than at several cells: with one cell the county and
# state archives are built inside publish-level, with several each is a cell-tiles task of
# its own (release_parts.write_level_part). A line through the two runs mixes the two
# (publish-level's gave -9 CPU-s at 42 cells on 2026-12-01): proportional to the cells from
# the several-cell run instead.
SEVERAL_CELLS_ONLY = {"publish-level", "cell-tiles"}
# Stages of one task per release whose work does not grow with the cells (the overview draws
# one cell; the tracts' archive holds their polygons once, _matrix.stage_of): at any number of
# cells, the larger of the two measured runs.
ONE_PER_RELEASE = {"overview", "tract-tiles"}


# The runs read are those of two `dask worker` processes (bench_national.py's ``dask-2w``).
MEASURED_WORKERS = 2


def dask_run(path: Path) -> dict:
    """The ``dask-2w`` run of a ``bench_national.py`` JSON (plain or ``--matrix``)."""
    data = json.loads(Path(path).read_text())
    key = f"dask-{MEASURED_WORKERS}w"
    if "results" in data:
        return data["results"][key]
    (cells,) = data["matrix"]
    return data["matrix"][cells]["runs"][key]


@functools.cache
def published_n(release: Path):
    """The published release's n per tract (geoid, n), read once for every plan made of it."""
    import pandas as pd

    files = sorted(glob.glob(str(release / "tracts" / "state=*" / "*.parquet")))
    if not files:
        raise SystemExit(f"{release}: no tracts/state=*/ (a national release's GeoParquet)")
    return pd.concat([pd.read_parquet(f, columns=["geoid", "n"]) for f in files])


def planned_task_runs(release: Path, cells: int) -> dict:
    """Task runs on the workers of a release of ``cells`` cells, planned by the release's own
    code from the published 1-cell release's n per tract (every person in every cell)."""
    import pandas as pd

    from dpatlas.core.config import ReleaseConfig
    from dpatlas.publication.release_parts import plan_level_jobs, plan_parts
    from dpatlas.release import cell_groups
    from dpatlas.release.estimate import split_into_chunks, tracts_of
    from dpatlas.release.ingest import state_partitions
    from dpatlas.release.levels import level_tasks

    tracts = published_n(release)
    tracts = tracts[tracts["n"] > 0]
    names = [f"outcome-{k}" for k in range(1, cells + 1)]
    counts = {}
    for state, rows in tracts.groupby(tracts["geoid"].str[:2]):
        # a state past ingest.PARTITION_RECORDS is staged as groups of its cells, and each
        # group's partition is chunked apart (as the release does: input-06-c0, input-06-c1)
        records = int(rows["n"].sum())
        for part in state_partitions(str(state), {c: records for c in names}):
            own = list(part.cells) if part.cells is not None else names
            counts[Path(f"input-{part.key}.parquet")] = pd.DataFrame({
                "geoid": list(rows["geoid"]) * len(own),
                "cell": [c for c in own for _ in range(len(rows))],
                "n": list(rows["n"]) * len(own)}).sort_values(["geoid", "cell"],
                                                              ignore_index=True)
    chunk_tracts = ReleaseConfig.model_fields["partition_tracts"].default  # the release's
    chunks = split_into_chunks(tracts_of(counts), chunk_tracts, counts, cell_groups.TASK_RECORDS)
    sizes = pd.concat(counts.values(), ignore_index=True)
    return {"select": len(chunks), "estimate": len(chunks),
            "estimate-levels": len(level_tasks(sizes)),
            "publish-part": len(plan_parts(names, tracts["geoid"])),
            "publish-level": len(plan_level_jobs(["county", "state"],
                                                 published_n(release)["geoid"], names, "")),
            # the county and state archives of each cell (at one cell: in publish-level)
            "cell-tiles": 2 * cells if cells > 1 else 0,
            "tract_cells": len(sizes), "records": int(sizes["n"].sum())}


def validation_partitions(release: Path, cells: int) -> list[tuple[int, int]]:
    """(records validated, records of its state) of each validation partition of a release of
    ``cells`` cells, planned by the release's own grouping (``ingest.state_partitions``) from
    the published 1-cell release's n per tract, every person in every cell."""
    from dpatlas.release.ingest import state_partitions

    tracts = published_n(release)
    per_state = tracts.groupby(tracts["geoid"].str[:2])["n"].sum()
    names = [f"outcome-{k}" for k in range(1, cells + 1)]
    return [(int(part.rows), int(records) * cells)
            for state, records in per_state.items()
            for part in state_partitions(str(state), {c: int(records) for c in names})]


def validation_at(release: Path, low: dict, high: dict, split: dict, cells: tuple[int, int],
                  target: int):
    """The validate stage at ``target`` cells from its partitions: (CPU-s in all, the longest
    partition's CPU-s, partitions, the printed arithmetic). ``low``, ``high``: the validate
    stage of the runs at ``cells`` (lower, higher); a and c are fitted through them, each
    run's CPU less b x the records its split partitions read and leave."""
    lo, hi = cells
    plans = {c: validation_partitions(release, c) for c in (lo, hi, target)}
    b = float(split["per_record_left"])
    records = {c: sum(g for g, _ in plans[c]) for c in (lo, hi)}
    left = {c: sum(s - g for g, s in plans[c] if g != s) for c in (lo, hi)}
    tasks = {c: len(plans[c]) for c in (lo, hi)}
    own = {lo: low["cpu"] - b * left[lo], hi: high["cpu"] - b * left[hi]}
    # own[c] = tasks[c] x c_task + a x records[c], for both runs
    det = tasks[lo] * records[hi] - tasks[hi] * records[lo]
    if det == 0:
        raise SystemExit(f"the runs at {lo} and {hi} cells validate in proportion: "
                         "a and c cannot be fitted")
    a = (tasks[lo] * own[hi] - tasks[hi] * own[lo]) / det
    c = (own[lo] * records[hi] - own[hi] * records[lo]) / det
    costs = [c + a * g + (b * (s - g) if g != s else 0.0) for g, s in plans[target]]
    split_parts = sum(g != s for g, s in plans[target])
    text = (f"  validate, by partition: a = {1e6 * a:.3f} µs per record validated, c = "
            f"{c:.2f} CPU-s per task (the two runs), b = {1e6 * b:.3f} µs per record of its "
            f"state a split partition reads and leaves (bench_split_validation.py, state "
            f"{split['state']}); at {target} cells {len(costs)} partitions ({split_parts} "
            f"of split states, at most {max(g for g, _ in plans[target]):,} records): "
            f"{sum(costs):.0f} CPU-s, the longest {max(costs):.1f}")
    return sum(costs), max(costs), len(costs), text


def run_cells(path: Path) -> int:
    """The cells of a ``bench_national.py`` run (its synthetic country's; one when unset)."""
    data = json.loads(Path(path).read_text())
    if "results" in data:
        return int((data.get("country") or {}).get("cells") or 1)
    (cells,) = data["matrix"]
    return int(cells)


def estimate(low: dict, high: dict, cells: tuple[int, int], target: int, workers: int,
             release: Path, ms_per_task_run: float, split: dict | None, say=print) -> float:
    """The wall time of a release of ``target`` cells on ``workers`` workers, from the runs
    ``low`` and ``high`` at ``cells`` (lower, higher), every figure and step given to
    ``say``; returns the estimate in seconds."""
    from dpatlas.publication.release_parts import LEVEL_PART_ROWS

    lo, hi = cells
    step = (target - lo) / (hi - lo)

    def line(a: float, b: float) -> float:  # through (lo, a) and (hi, b), at the target
        return a + (b - a) * step

    stages_lo = {s["stage"]: s for s in low["task_stages"] if s["where"] == "workers"}
    stages_hi = {s["stage"]: s for s in high["task_stages"] if s["where"] == "workers"}
    say(f"## {target} cells on {workers} workers, from full-scale runs at {lo} and {hi} "
        "cells\n")
    say(f"work on the workers (CPU-s: {lo} cell{'s' if lo > 1 else ''}, {hi} cells -> the "
        f"line at {target} cells):")
    work, longest, longest_stage = 0.0, 0.0, "-"
    validate_runs = None
    # a stage of the larger run alone (the county and state archives' cell-tiles, which a
    # 1-cell run builds inside publish-level) counts as nothing in the smaller
    absent = {"cpu": 0.0, "longest_cpu": 0.0, "runs": 0}
    for name in dict.fromkeys([*stages_lo, *stages_hi]):
        s, s_hi = stages_lo.get(name, absent), stages_hi.get(name, absent)
        if name == "validate" and split is not None:
            cpu, long, validate_runs, text = validation_at(release, s, s_hi, split, (lo, hi),
                                                           target)
            say(text)
        elif name in SEVERAL_CELLS_ONLY:
            cpu = s_hi["cpu"] * target / hi
            long = s_hi["longest_cpu"]
            bound = ("a county or state archive a cell" if name == "cell-tiles" else
                     f"a job of at most {LEVEL_PART_ROWS:,} unit-cells")
            say(f"  {name}: {s['cpu']:.1f}, {s_hi['cpu']:.1f} -> {cpu:.0f} ({hi} cells' x "
                f"{target}/{hi}: the level archives are built in publish-level at one "
                f"cell, in cell-tiles at several); longest run {s_hi['longest_cpu']:.2f} -> "
                f"{long:.1f} (bounded by design: {bound})")
        elif name in ONE_PER_RELEASE:
            cpu = long = max(s["cpu"], s_hi["cpu"])
            say(f"  {name}: {s['cpu']:.1f}, {s_hi['cpu']:.1f} -> {cpu:.1f} (one task a release, "
                "whatever the cells: the larger measured)")
        else:
            cpu = line(s["cpu"], s_hi["cpu"])
            grows = name in GROWS_WITH_CELLS
            long = line(s["longest_cpu"], max(s_hi["longest_cpu"], s["longest_cpu"])) if grows \
                else max(s["longest_cpu"], s_hi["longest_cpu"])
            say(f"  {name}: {s['cpu']:.1f}, {s_hi['cpu']:.1f} -> {cpu:.0f}; longest run "
                f"{s['longest_cpu']:.2f}, {s_hi['longest_cpu']:.2f} -> {long:.1f}"
                + (" (a state's records in every cell: on the line)" if grows else
                   " (bounded by design: the largest measured)"))
        work += cpu
        if long > longest:
            longest, longest_stage = long, name

    plan_lo, plan_hi, plan = (planned_task_runs(release, c) for c in (lo, hi, target))
    fixed_runs = sum(stages_lo[n]["runs"] for n in ("contribution-bucket", *ONE_PER_RELEASE)
                     if n in stages_lo)
    planned = ["select", "estimate", "estimate-levels", "publish-part", "cell-tiles"]
    planned += ["publish-level"] if "publish-level" in stages_lo else []
    # validation: a task per partition, planned by the release's grouping with --split-json
    # (a state past ingest.PARTITION_RECORDS is split by its cells), else as at the lower run
    validations = ([len(validation_partitions(release, c)) for c in (lo, hi)] + [validate_runs]
                   if validate_runs is not None else [stages_lo["validate"]["runs"]] * 3)
    runs = [fixed_runs + v + sum(p[k] for k in planned)
            for v, p in zip(validations, (plan_lo, plan_hi, plan))]
    measured = [sum(s["runs"] for s in stages_lo.values()),
                sum(s["runs"] for s in stages_hi.values())]
    # The workers' CPU outside the tasks' functions (Prefect's task engine on the worker,
    # Dask's own work): per task run, the mean of the two runs', times the task runs.
    outside = [run["cpu"]["dask_workers"] - sum(s["cpu"] for s in st.values())
               for run, st in ((low, stages_lo), (high, stages_hi))]
    per_run_worker = (outside[0] / measured[0] + outside[1] / measured[1]) / 2
    say(f"  outside the tasks' functions: {outside[0]:.1f}, {outside[1]:.1f} CPU-s over "
        f"{measured[0]}, {measured[1]} task runs = {per_run_worker:.3f} per task run (mean) "
        f"x {runs[2]} task runs at {target} cells = {per_run_worker * runs[2]:.0f}")
    work += per_run_worker * runs[2]
    on_workers = work / workers
    say(f"  sum {work:,.0f} CPU-s / {workers} workers = {on_workers:.1f} s\n")

    per_run = ms_per_task_run / 1000.0
    flow_lo, flow_hi = low["serial_cpu"], high["serial_cpu"]
    cells_lo, cells_hi, cells = plan_lo["tract_cells"], plan_hi["tract_cells"], plan["tract_cells"]
    g = ((flow_hi - flow_lo) - per_run * (runs[1] - runs[0])) / (cells_hi - cells_lo)
    fixed = flow_lo - per_run * runs[0] - g * cells_lo
    flow = fixed + per_run * runs[2] + g * cells
    say("the flow's serial CPU-s = fixed + per task run x task runs + g x tract-cells:")
    say(f"  measured: {flow_lo:.1f} at {lo} cell{'s' if lo > 1 else ''}, {flow_hi:.1f} at {hi} "
        f"cells; task runs on the workers planned {runs[0]}, {runs[1]} (measured "
        f"{measured[0]}, {measured[1]}); tract-cells {cells_lo:,}, {cells_hi:,}")
    say(f"  per task run {ms_per_task_run:.1f} ms (bench_task_submission.py); "
        f"g = {1e6 * g:.1f} µs per tract-cell; fixed {fixed:.1f} CPU-s")
    say(f"  at {target} cells: {plan['select']} chunks (select and estimate each), "
        f"{plan['estimate-levels']} level tasks, {plan['publish-part']} publish parts, "
        f"{plan['publish-level']} county and state file jobs, "
        f"{plan['cell-tiles']} county and state archives and the tracts': {runs[2]} task "
        f"runs; {cells:,} tract-cells, "
        f"{plan['records']:,} records")
    say(f"  {fixed:.1f} + {per_run:.3f} x {runs[2]} + {1e6 * g:.1f} µs x {cells:,} = "
        f"{fixed:.1f} + {per_run * runs[2]:.1f} + {g * cells:.1f} = {flow:.1f} s\n")
    total = on_workers + longest + flow
    terms = {"the work on the workers": on_workers, "the longest task": longest,
             "the flow's serial part": flow}
    limit = max(terms, key=terms.get)
    say(f"estimate: {on_workers:.1f} (workers) + {longest:.1f} (longest task: "
        f"{longest_stage}) + {flow:.1f} (flow) = {total:.0f} s = {total / 60:.1f} minutes; "
        f"limited by {limit} ({100 * terms[limit] / total:.0f}%)")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+",
                        help="two or more runs' JSONs at different cells (each run's cells "
                             "from its JSON): the estimate is fitted through the two with "
                             "the most cells; with three or more, the line through the two "
                             "with the fewest is also priced at the largest run's cells and "
                             "workers, beside that run's measured wall time")
    parser.add_argument("--one", type=Path, help="the 1-cell run's JSON (with --six)")
    parser.add_argument("--six", type=Path, help="the 6-cell run's JSON (with --one)")
    parser.add_argument("--release", type=Path, required=True,
                        help="the 1-cell run's published release (its n per tract)")
    parser.add_argument("--ms-per-task-run", type=float, required=True,
                        help="the flow's CPU per task run (bench_task_submission.py)")
    parser.add_argument("--split-json", type=Path,
                        help="bench_split_validation.py's JSON: validation priced by partition")
    parser.add_argument("--cells", type=int, default=42)
    parser.add_argument("--workers", type=int, default=20)
    args = parser.parse_args()
    if args.runs and (args.one or args.six):
        parser.error("give --runs, or --one and --six, not both")
    if args.runs:
        paths = sorted(args.runs, key=run_cells)
    elif args.one and args.six:
        paths = [args.one, args.six]
    else:
        parser.error("give --runs, or --one and --six")
    at = [run_cells(p) for p in paths]
    if len(paths) < 2 or len(set(at)) != len(at):
        parser.error(f"two or more runs at different cells are needed (given: {at})")
    if args.one and not args.runs and at != [1, 6]:
        parser.error(f"--one and --six are runs at 1 and 6 cells (given: {at})")
    runs = [dask_run(p) for p in paths]
    split = json.loads(args.split_json.read_text()) if args.split_json else None
    common = dict(release=args.release, ms_per_task_run=args.ms_per_task_run, split=split)
    estimate(runs[-2], runs[-1], (at[-2], at[-1]), args.cells, args.workers, **common)
    if len(runs) > 2:  # the model checked where it was measured
        workers = MEASURED_WORKERS
        quiet: list[str] = []
        predicted = estimate(runs[0], runs[1], (at[0], at[1]), at[-1], workers,
                             say=quiet.append, **common)
        at_target = estimate(runs[0], runs[1], (at[0], at[1]), args.cells, args.workers,
                             say=quiet.append, **common)
        wall = runs[-1]["wall"]
        print(f"\ncheck: the line through {at[0]} and {at[1]} cells gives {predicted:.0f} s at "
              f"{at[-1]} cells on {workers} workers, where the run took {wall:.1f} s "
              f"({100 * (predicted - wall) / wall:+.0f}%); at {args.cells} cells on "
              f"{args.workers} workers it gives {at_target:.0f} s")

if __name__ == "__main__":
    main()
