"""The national benchmark: 50 states plus DC, `dpatlas release` end to end, two runners.

Generates (once, cached under --work) a synthetic country with the project's own generator:
every state and DC with its 2010 number of census tracts and counties, scaled to ~74,000
tracts in all (about 5.2 million person records at the generator's mean of 70 per tract).
Each state is drawn by ``dpatlas.evaluation.synthetic_input.write_synthetic`` on its own, then the states'
hive partitions and boundaries are put together (a state's polygons do not depend on the
other states generated with it, see ``dpatlas.evaluation.synthetic_boundaries.synth_boundaries``).

Then it starts one Prefect server on loopback, sets the ledger's lifetime cap with
`dpatlas ledger set-cap`, and runs `dpatlas release` as a subprocess twice: with the local
runner, and with `runner: dask` on a 2-worker local Dask cluster (started here, so the
workers can be measured). Per run it reports:

- wall time of the `dpatlas release` process (the Prefect server is already up; its start-up
  is printed separately);
- peak resident memory of every process in the release's process tree and of the Dask
  workers: the kernel's high-water mark (VmHWM), sampled every 0.2 s (not ``wait4``'s
  ``ru_maxrss`` of the release, which is the largest of it and every process it reaped: its
  compute processes), and each tippecanoe's peak as its build read it;
- the share of the wall time outside the estimators: time during which no call of the plain
  selection or estimation functions (``dpatlas.release.estimate.select_partition`` /
  ``estimate_partition``, i.e. all noise and estimator arithmetic, or the flow's wait for
  them in a compute-pool worker) was running in any process;
- per stage (Prefect task), the time during which at least one of its task runs was running
  (from the Prefect server's task runs), the summed task time and the number of task runs,
  and the idle gap before it (no task running: the flow's own code between stages); the run
  fails (exit status 1, with the reason) when that table is empty or lacks a stage every
  release runs, rather than print a table that says nothing;
- CPU time beside every wall time (benchmarks/_measure.py): of the release's process tree
  (``wait4``'s rusage: the flow and what it reaped, e.g. tippecanoe), of the Dask workers
  (psutil, before and after), and, apart, of the Prefect server (not the release's work);
  and the load average at the start and end of each run;
- the floor (benchmarks/bench_floor.py: the release's arithmetic alone, CPU seconds of one
  process), run as a subprocess in the same run on the same data, and per runner the ratio
  ``release wall / floor CPU`` (issue 35's target: <= 2.0 for the local runner at one cell;
  beside each process's peak memory its target, as ``--matrix`` prints them:
  ``_matrix.target_rows``).

    .venv/bin/python benchmarks/bench_national.py [--work /tmp/dpatlas-national]
        [--runners local,dask] [--scale 1.0] [--json-out results.json] [--no-floor]

``--scale`` multiplies every state's tract count (e.g. 0.1 for a quick trial run).

``--matrix`` (issue 35 item 4) runs the whole side-by-side matrix in one run instead: per cell
count the floor, the local runner, 1 and 2 `dask worker` processes; CPU-s per stage recorded
where each task ran, the targets, and the 42-cell estimate on 10 machines × 2 workers
(benchmarks/_matrix.py; docs/measured.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # and tests/support/prefect_server.py: a loopback Prefect server
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _measure, _national

from _measure import (cpu_of, cpu_used, load_average, measure,  # noqa: E402
                      rusage_cpu_seconds, time_estimator_draws)
from _national import data_folder, floor_report_lines  # noqa: E402
import _matrix  # noqa: E402
from dpatlas.core.memory import high_water_mib  # noqa: E402
from _matrix import union_seconds  # noqa: E402

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # the release and workers inherit it

# 2010 census tracts and counties per state (FIPS code), the Opportunity Atlas' geography:
# 73,057 tracts, scaled to TARGET_TRACTS below.
TRACTS_AND_COUNTIES: dict[str, tuple[int, int]] = {
    "01": (1181, 67), "02": (167, 29), "04": (1526, 15), "05": (686, 75), "06": (8057, 58),
    "08": (1249, 64), "09": (833, 8), "10": (218, 3), "11": (179, 1), "12": (4245, 67),
    "13": (1969, 159), "15": (351, 5), "16": (298, 44), "17": (3123, 102), "18": (1511, 92),
    "19": (825, 99), "20": (770, 105), "21": (1115, 120), "22": (1148, 64), "23": (358, 16),
    "24": (1406, 24), "25": (1478, 14), "26": (2813, 83), "27": (1338, 87), "28": (664, 82),
    "29": (1393, 115), "30": (271, 56), "31": (532, 93), "32": (687, 17), "33": (295, 10),
    "34": (2010, 21), "35": (499, 33), "36": (4919, 62), "37": (2195, 100), "38": (205, 53),
    "39": (2952, 88), "40": (1046, 77), "41": (834, 36), "42": (3218, 67), "44": (244, 5),
    "45": (1103, 46), "46": (222, 66), "47": (1497, 95), "48": (5265, 254), "49": (588, 29),
    "50": (184, 14), "51": (1907, 133), "53": (1458, 39), "54": (484, 55), "55": (1409, 72),
    "56": (132, 23),
}
TARGET_TRACTS = 74_000

# Issue 22's target for the national release's wall time (issue 35's targets, the floor ratio
# and each process's memory, are _matrix's).
TARGET_WALL_S = 300.0

# Stages every release runs (their task keys: the task functions' names, tasks/*.py): a
# table without one of them is wrong. (Reading a partition is part of its validation task:
# validate_partitions on the local runner, a group of partitions each; validate_partition on
# the workers.)
# A stage is one of its alternatives: chunks staged by URL run as select_staged/estimate_staged,
# other chunks are selected and estimated by one task (select_and_estimate_chunks).
REQUIRED_STAGES = (("validate_partitions", "validate_partition"),
                   ("select_and_estimate_chunks", "select_staged"),
                   ("select_and_estimate_chunks", "estimate_staged"), "publish_release")

LEDGER_CAP_EPSILON, LEDGER_CAP_DELTA = 1000.0, 1e-3  # far above two releases at eps = 1
SAMPLE_SECONDS = 0.2
TIMINGS_ENV = "DPATLAS_BENCH_TIMINGS"  # where a release process writes its estimator intervals
TILES_SUBFOLDER = "tiles"  # under it: one jsonl file of tippecanoe peaks per process


# --- the synthetic country ------------------------------------------------------------------


def state_tracts(scale: float) -> dict[str, tuple[int, int]]:
    """Tracts and counties per state, scaled so the country has ``scale`` · 74,000 tracts."""
    factor = scale * TARGET_TRACTS / sum(t for t, _ in TRACTS_AND_COUNTIES.values())
    out = {}
    for fips, (tracts, counties) in TRACTS_AND_COUNTIES.items():
        n = max(1, round(tracts * factor))
        out[fips] = (n, max(1, min(counties, n)))
    return out


def generate_country(data: Path, scale: float, cells: int | None = None) -> dict:
    """Write ``data/microdata/state=SS/`` and ``data/tracts.parquet``; cached across runs.

    Each state is generated into a scratch folder by the project's generator with its own seed
    (its index in FIPS order) and moved into the national dataset as soon as it is complete,
    so an interrupted generation resumes with the next state.
    """
    import geopandas as gpd
    import pandas as pd

    from dpatlas.release.boundaries import load_boundaries, write_boundaries
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    summary_file = data / "country.json"
    if summary_file.exists():
        return json.loads(summary_file.read_text())
    sizes = state_tracts(scale)
    scratch, microdata, shapes = data / "scratch", data / "microdata", data / "state-tracts"
    for folder in (microdata, shapes):
        folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for seed, (fips, (tracts, counties)) in enumerate(sorted(sizes.items())):
        if (shapes / f"{fips}.parquet").exists():
            continue
        shutil.rmtree(scratch, ignore_errors=True)
        t0 = time.perf_counter()
        write_synthetic(scratch, [fips], seed, StateParams(n_tracts=tracts, counties=counties),
                        cells=cells)
        shutil.rmtree(microdata / f"state={fips}", ignore_errors=True)
        os.replace(scratch / "microdata" / f"state={fips}", microdata / f"state={fips}")
        os.replace(scratch / "tracts.parquet", shapes / f"{fips}.parquet")  # marks it done
        print(f"  state {fips}: {tracts:,} tracts in {time.perf_counter() - t0:.1f} s",
              flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    parts = [gpd.read_parquet(p) for p in sorted(shapes.glob("*.parquet"))]
    write_boundaries(gpd.GeoDataFrame(pd.concat(parts, ignore_index=True), crs=parts[0].crs),
                     data / "tracts.parquet")
    boundaries = load_boundaries(data / "tracts.parquet")  # the release's own check of them
    import pyarrow.dataset as ds

    records = ds.dataset(microdata, format="parquet", partitioning="hive").count_rows()
    summary = {"states": len(sizes), "tracts": len(boundaries), "records": records,
               "largest_state": max(sizes.items(), key=lambda kv: kv[1][0])[0],
               "scale": scale, "cells": cells, "generated_seconds": round(time.perf_counter() - started, 1)}
    summary_file.write_text(json.dumps(summary, indent=2))
    shutil.rmtree(shapes)
    return summary


# --- configs and the ledger cap -------------------------------------------------------------


def write_config(work: Path, data: Path, runner: str, dask_address: str | None,
                 cells: int | None = None) -> Path:
    """`dpatlas demo`'s release config (dpatlas/cli/demo.py) for the national data and one runner
    (``cells``: the data have a ``cell`` column, which the config names)."""
    import yaml

    from dpatlas.cli.demo import release_config

    run = work / f"run-{runner}"
    cfg = release_config(data, run / "releases", vintage="synthetic (benchmarks/bench_national.py)",
                         ledger={"url": f"sqlite:///{run / 'ledger.db'}",
                                 "dataset": "national-synthetic"},
                         runner=runner)
    if dask_address:
        cfg["dask_address"] = dask_address
    if cells is not None:
        cfg["input"]["columns"]["cell"] = "cell"
    shutil.rmtree(run, ignore_errors=True)  # a fresh publish root and ledger per run
    run.mkdir(parents=True)
    path = run / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def set_ledger_cap(config: Path) -> None:
    """The lifetime cap is the ledger's: set it the operator's way, before the release."""
    subprocess.run([sys.executable, "-m", "dpatlas.cli.commands", "ledger", "set-cap",
                    "--dataset", "national-synthetic", "--epsilon", str(LEDGER_CAP_EPSILON),
                    "--delta", str(LEDGER_CAP_DELTA), "--reason",
                    "national benchmark: synthetic data only", "-c", str(config)],
                   check=True, capture_output=True, text=True)


# --- timing the estimators inside other processes -------------------------------------------


def _timed(fn):
    """``fn``, appending each call's (start, end) wall-clock time to this process's file in
    the folder named by $DPATLAS_BENCH_TIMINGS (wall clock: comparable across processes)."""
    def wrapper(*args, **kwargs):
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            folder = Path(os.environ[TIMINGS_ENV])
            with open(folder / f"{os.getpid()}.jsonl", "a") as fh:
                fh.write(json.dumps([start, time.time()]) + "\n")
    wrapper.__wrapped__ = fn
    return wrapper


def read_intervals(folder: Path) -> list[tuple[float, float]]:
    return [tuple(json.loads(line)) for f in sorted(folder.glob("*.jsonl"))
            for line in f.read_text().splitlines() if line]


def record_tile_builds() -> None:
    """Wrap ``tiles.build_tiles`` (in this process): each build's tippecanoe pid, label and
    peak RSS (its VmHWM, read by the build while tippecanoe ran), appended to
    ``$DPATLAS_BENCH_TIMINGS/tiles/<pid>.jsonl``. The sampler alone misses a tippecanoe that
    starts and ends between two of its samples (a small cell). Idempotent."""
    import psutil

    from dpatlas.publication import tiles

    build_tiles = tiles.build_tiles
    if hasattr(build_tiles, "__wrapped__"):
        return

    def wrapper(geojson, out, **kwargs):
        build = build_tiles(geojson, out, **kwargs)
        if build.peak_rss_mib is not None:
            here = psutil.Process()
            record = {"pid": build.pid, "mib": build.peak_rss_mib,
                      "label": f"{_tippecanoe_label(out)} under {_label(here)} {here.pid}"}
            folder = Path(os.environ[TIMINGS_ENV]) / TILES_SUBFOLDER
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / f"{os.getpid()}.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
        return build
    wrapper.__wrapped__ = build_tiles
    tiles.build_tiles = wrapper


def add_tile_builds(peaks: dict[int, tuple[str, float]], timings: Path) -> None:
    """Each recorded tippecanoe (:func:`record_tile_builds`) in ``peaks``, at the larger of its
    recorded and sampled peak (a sample taken before its exec does not count)."""
    folder = timings / TILES_SUBFOLDER
    for f in sorted(folder.glob("*.jsonl")) if folder.exists() else []:
        for record in map(json.loads, f.read_text().splitlines()):
            label, sampled = peaks.get(record["pid"], (record["label"], 0.0))
            if not label.startswith("tippecanoe"):
                # sampled only before its exec, as the flow's fork: the flow's memory, not
                # tippecanoe's (at 42 cells one such row said 1,384 MiB)
                label, sampled = record["label"], 0.0
            peaks[record["pid"]] = (label, max(sampled, record["mib"]))


def install_estimator_timers() -> None:
    """Wrap the selection and estimation functions (in this process): the module attributes
    of ``dpatlas.release.estimate``, which its draw functions look up at each call (a Dask
    worker, or the local runner without a compute pool), and ``compute`` as ``tasks.draws``
    imported it, for the draws made in a compute-pool worker."""
    import dpatlas.release.estimate as estimate
    import tasks.draws as draw_tasks

    _matrix.install_task_cpu_recorder(TIMINGS_ENV)  # CPU per task run, for --matrix
    record_tile_builds()
    for name in ("select_partition", "estimate_partition"):
        fn = getattr(estimate, name)
        if not hasattr(fn, "__wrapped__"):
            setattr(estimate, name, _timed(fn))
    if not hasattr(draw_tasks.compute, "__wrapped__"):
        draw_tasks.compute = time_estimator_draws(draw_tasks.compute,
                                                  _timed(draw_tasks.compute))


def release_child(config: str, release_id: str) -> None:
    """Entry point of the release subprocess: `dpatlas release` with the timers installed."""
    from dpatlas.cli.commands import app

    install_estimator_timers()
    app(args=["release", "-c", config, "--release-id", release_id], prog_name="dpatlas")


def _on_worker(function: str):
    """Call one of this module's functions in a Dask worker, imported there by name."""
    bench_dir = str(Path(__file__).resolve().parent)

    def call(dask_worker=None):
        import importlib

        if bench_dir not in sys.path:
            sys.path.insert(0, bench_dir)
        return getattr(importlib.import_module("bench_national"), function)()
    return call


def estimator_timer_plugin():
    """A Dask worker plugin: the same timers inside every worker process."""
    from distributed import WorkerPlugin

    install = _on_worker("install_estimator_timers")

    class EstimatorTimers(WorkerPlugin):
        def setup(self, worker) -> None:
            install()

    return EstimatorTimers()


# --- memory of every process ----------------------------------------------------------------


def _label(proc) -> str:
    try:
        argv = proc.cmdline()
    except Exception:  # the process is gone or not ours to read
        return "?"
    cmd = " ".join(argv)
    if argv and Path(argv[0]).name == "tippecanoe":
        # checked first: its arguments quote the release's text, which may say "dask"
        return _tippecanoe_label(argv[argv.index("-o") + 1] if "-o" in argv[:-1] else "?")
    if "release_child" in cmd or "dpatlas.cli.commands" in cmd:
        return "release (flow)"
    if "dask" in cmd or "distributed" in cmd:
        return "dask worker"
    if "resource_tracker" in cmd:  # multiprocessing's own helper, beside spawned workers
        return "resource tracker"
    if "multiprocessing.forkserver" in cmd:  # the compute pool's server (a child of the flow)
        try:                                   # and its workers, forks of it: one command line
            parent = " ".join(proc.parent().cmdline())
        except Exception:
            parent = ""
        return ("compute process" if "multiprocessing.forkserver" in parent
                else "compute server")
    if "multiprocessing" in cmd:  # spawned: a Dask nanny's worker, or the local runner's
        try:                        # compute pool (dpatlas.release.compute_pool)
            parent = proc.parent()
        except Exception:
            parent = None
        return ("dask worker" if parent is not None and _label(parent) == "dask worker"
                else "compute process")
    if "prefect" in cmd and "server" in cmd:
        return "prefect server"
    return cmd[:60]


def _tippecanoe_label(archive: str | Path) -> str:
    """The label of the tippecanoe writing ``archive`` or its partial file (``tracts.pmtiles``,
    ``.tracts.pmtiles.partial.pmtiles``): "tippecanoe (tracts)"."""
    return f"tippecanoe ({Path(archive).name.strip('.').split('.')[0]})"


def _label_with_parent(proc) -> str:
    """:func:`_label`, and for tippecanoe the process that started it (the flow today, a
    worker when the tiles are built there): "tippecanoe (tracts) under dask worker 1234"."""
    label = _label(proc)
    if not label.startswith("tippecanoe"):
        return label
    try:
        parent = proc.parent()
    except Exception:  # gone
        parent = None
    return label if parent is None else f"{label} under {_label(parent)} {parent.pid}"


# A child sampled between its fork and its exec (its command line is still the flow's).
FORK_LABEL = "fork of the flow, before its exec"


@dataclass
class MemorySampler:
    """Samples the peak RSS of the release's process tree and of extra processes."""

    roots: list[int]
    extra: list[int] = field(default_factory=list)
    peaks: dict[int, tuple[str, float]] = field(default_factory=dict)
    # (epoch seconds, resident MiB) of the first root (the flow), to find which stage holds
    # the peak: the high-water mark says how much, not when
    flow_rss: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self) -> None:
        import psutil

        try:
            self.flow_rss.append((time.time(),
                                  psutil.Process(self.roots[0]).memory_info().rss / 2**20))
        except (psutil.NoSuchProcess, IndexError):
            pass
        pids = set()
        for root in [*self.roots, *self.extra]:  # a worker's children too: its tippecanoe
            try:
                proc = psutil.Process(root)
                pids.add(root)
                pids.update(c.pid for c in proc.children(recursive=True))
            except psutil.NoSuchProcess:
                continue
        for pid in pids:
            self._record(pid)

    def _record(self, pid: int) -> None:
        """One process's peak, under its label. The label is read first: a child that execs
        between the two reads would otherwise have its fork's memory (the flow's) under the
        program's name, as a 1,077 MiB "tippecanoe" at 6 cells did; and a tippecanoe's mark
        is read only while the process runs tippecanoe. A fork's label is read again at the
        next sample, and what it had as a fork is not the program's."""
        import psutil

        label, peak = self.peaks.get(pid, (None, 0.0))
        if label in (None, FORK_LABEL):
            try:
                read = _label_with_parent(psutil.Process(pid))
            except psutil.NoSuchProcess:
                return
            if read == "release (flow)" and pid != self.roots[0]:
                # a child caught between its fork and its exec: the flow's command line
                # and the memory it shares with the flow, not a second flow
                read = FORK_LABEL
            if read != label:  # new, or exec'd since: a fork's figure was the flow's memory
                label, peak = read, 0.0
        now = high_water_mib(pid, "tippecanoe" if label.startswith("tippecanoe") else None)
        if now is not None:
            self.peaks[pid] = (label, max(now, peak))

    def run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_SECONDS)

    def __enter__(self):
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# --- per-stage times from the Prefect server ------------------------------------------------


class StageTableError(RuntimeError):
    """The Prefect server's task runs cannot give the per-stage table: the reason why."""


def _read_task_runs(api_url: str, since: float) -> list:
    from datetime import datetime, timezone

    os.environ["PREFECT_API_URL"] = api_url
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterStartTime

    after = datetime.fromtimestamp(since, timezone.utc)
    flt = TaskRunFilter(start_time=TaskRunFilterStartTime(after_=after))
    runs, offset = [], 0
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_task_runs(task_run_filter=flt, limit=200, offset=offset)
            runs.extend(page)
            offset += len(page)
            if len(page) < 200:
                break
    return runs


def _task_name(run) -> str:
    return run.task_key.rsplit("-", 1)[0]


def missing_stages(seen: set[str]) -> list[str]:
    """The stages every release runs that ``seen`` lacks (alternatives joined by "/")."""
    return ["/".join(s) if isinstance(s, tuple) else s for s in REQUIRED_STAGES
            if not seen.intersection(s if isinstance(s, tuple) else (s,))]


def task_runs_since(api_url: str, since: float, settle_seconds: float = 60.0) -> list[dict]:
    """Every finished task run that started after ``since`` (epoch seconds) on the
    benchmark's server.

    The server records task runs from the events their processes send (Prefect 3's task run
    recorder), a moment after the fact (longer on a busy machine), and a Dask worker's events
    travel on their own: read right after the release exits, the newest runs may be missing
    or still lack their end. So the runs are read again, a second apart, until two readings
    agree, none lacks its end and every stage a release runs is there, for at most
    ``settle_seconds`` (then :func:`check_stage_table` says what is missing)."""
    deadline, previous = time.time() + settle_seconds, None
    while True:
        runs = _read_task_runs(api_url, since)
        shape = (len(runs), sum(1 for r in runs if r.end_time is None))
        complete = not missing_stages({_task_name(r) for r in runs})
        if (shape == previous and shape[1] == 0 and complete) or time.time() > deadline:
            break
        previous = shape
        time.sleep(1.0)
    return [{"task": _task_name(r), "name": r.name,
             "start": r.start_time.timestamp(), "end": r.end_time.timestamp()}
            for r in runs if r.start_time and r.end_time]


def stage_table(runs: list[dict]) -> list[dict]:
    """Per stage: wall seconds with a run running, summed seconds, runs, and the idle gap
    before its first run (since the last end of every earlier-starting run: the flow's own
    time between stages; 0 when it started while another stage ran)."""
    stages: dict[str, list[dict]] = {}
    for r in runs:
        stages.setdefault(r["task"], []).append(r)
    rows = [{"stage": task, "seconds": union_seconds([(r["start"], r["end"]) for r in rs]),
             "task_seconds": sum(r["end"] - r["start"] for r in rs), "runs": len(rs),
             "first_start": min(r["start"] for r in rs),
             "last_end": max(r["end"] for r in rs)}
            for task, rs in stages.items()]
    rows.sort(key=lambda row: row["first_start"])
    ends = sorted(r["end"] for r in runs)
    for row in rows:
        before = [e for e in ends if e <= row["first_start"]]
        started_before = [r for r in runs if r["start"] < row["first_start"]]
        busy = any(r["end"] > row["first_start"] for r in started_before)
        row["gap_before"] = 0.0 if busy or not before else row["first_start"] - before[-1]
    return rows


def add_stage_rss(stages: list[dict], samples: list[tuple[float, float]]) -> None:
    """Each stage's largest sampled resident memory of the flow process while it ran
    (``flow_rss_max``, MiB; None without a sample in its window): which stage holds the
    flow's peak. Samples are (epoch seconds, MiB), as the task runs' times."""
    for row in stages:
        inside = [mib for t, mib in samples
                  if row["first_start"] - SAMPLE_SECONDS <= t <= row["last_end"] + SAMPLE_SECONDS]
        row["flow_rss_max"] = max(inside) if inside else None


def check_stage_table(stages: list[dict], runner: str, runs_read: int) -> None:
    """Refuse a table that says nothing: empty, or without a stage every release runs."""
    if not stages:
        raise StageTableError(
            f"runner {runner}: the Prefect server returned no finished task runs for the "
            f"release ({runs_read} read): its processes did not report to the benchmark's "
            "server (PREFECT_API_URL not set where the tasks ran?) or the server had not "
            "recorded them yet; the per-stage table would be empty")
    missing = missing_stages({row["stage"] for row in stages})
    if missing:
        raise StageTableError(
            f"runner {runner}: no task runs of stage(s) {', '.join(missing)} on the Prefect "
            f"server (stages seen: {', '.join(r['stage'] for r in stages)}): the processes "
            "that ran them reported elsewhere or not at all; the per-stage table would be "
            "incomplete")


def flow_overhead(stages: list[dict], start: float, wall: float) -> dict:
    """The flow's time outside every task: before the first, between stages, after the last."""
    if not stages:
        return {"before_first_task": wall, "between_stages": 0.0, "after_last_task": 0.0}
    first = min(r["first_start"] for r in stages)
    last = max(r["last_end"] for r in stages)
    return {"before_first_task": first - start,
            "between_stages": sum(r["gap_before"] for r in stages),
            "after_last_task": start + wall - last}


# --- one release ----------------------------------------------------------------------------


def timings_folder(work: Path, runner: str) -> Path:
    """An empty folder for the estimator timers of one run, named in $DPATLAS_BENCH_TIMINGS
    for this process and every process started after this call (Dask workers included)."""
    folder = work / f"timings-{runner}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ[TIMINGS_ENV] = str(folder)
    return folder


def prefect_server_pids() -> list[int]:
    """The Prefect server (started by this process) and its own children."""
    import psutil

    pids = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "prefect" in cmd and "server" in cmd:
            pids.append(proc.pid)
            pids.extend(c.pid for c in proc.children(recursive=True))
    return sorted(set(pids))


def run_release(api_url: str, config: Path, rid: str, timings: Path, client=None,
                runner: str = "local") -> dict:
    """`dpatlas release` in a subprocess; wall and CPU time, memory per process, estimator
    time, the per-stage table (checked: StageTableError when it would say nothing)."""
    env = {**os.environ, "PREFECT_API_URL": api_url, TIMINGS_ENV: str(timings),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-c",
           "import sys; sys.path.insert(0, %r); import bench_national as b; "
           "b.release_child(%r, %r)" % (str(Path(__file__).parent), str(config), rid)]
    workers = []
    if client is not None:
        client.register_plugin(estimator_timer_plugin(), name="estimator-timers")
        workers = list(client.run(os.getpid).values())
    server = prefect_server_pids()
    workers_before, server_before = cpu_of(workers), cpu_of(server)
    load_start = load_average()
    start = time.time()
    with measure(f"bench process during the {runner} release (sampler, Dask scheduler)") as own:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=config.parent)
        with MemorySampler(roots=[proc.pid], extra=workers) as sampler:
            output = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    workers_cpu = cpu_used(workers_before, cpu_of(workers))
    server_cpu = cpu_used(server_before, cpu_of(server))
    own.cpu_children = 0.0  # the release reaped by wait4 is counted below, not here
    if status != 0:
        hint = ("\nThe select-and-estimate subflow's parameters exceed the Prefect server's "
                "limit: rerun with --max-parameter-size 0 (see docs/national.md)."
                if "Flow run parameters must be less than" in output else "")
        raise SystemExit(f"release failed (status {status}):\n{output[-4000:]}{hint}")
    intervals = read_intervals(timings)
    peaks = dict(sampler.peaks)
    add_tile_builds(peaks, timings)
    # The flow's peak is its own high-water mark, sampled. wait4's ru_maxrss is the largest
    # of the flow and every process it reaped (its compute processes: at 42 cells it said
    # 1,729 MiB, a compute process's figure, where the flow's VmHWM was 1,375): kept apart.
    if proc.pid not in peaks:  # never sampled (a release of under 0.2 s): the bound only
        peaks[proc.pid] = ("release (flow) and its reaped children", usage.ru_maxrss / 1024)
    inside = union_seconds(intervals)
    runs = task_runs_since(api_url, start)
    stages = stage_table(runs)
    check_stage_table(stages, runner, len(runs))
    add_stage_rss(stages, sampler.flow_rss)
    release_cpu = rusage_cpu_seconds(usage)
    task_stages = _matrix.stage_cpu_table(_matrix.read_task_cpu(timings), proc.pid)
    return {"flow_pid": proc.pid, "task_stages": task_stages,
            "serial_cpu": _matrix.serial_cpu(task_stages, release_cpu),
            "wall": wall, "inside": inside, "peaks": peaks, "stages": stages,
            # the flow's resident memory over the run: (seconds from the start, MiB)
            "flow_rss": [(round(t - start, 1), round(mib)) for t, mib in sampler.flow_rss],
            "tasks_union": union_seconds([(r["start"], r["end"]) for r in runs]),
            "overhead": flow_overhead(stages, start, wall),
            "release_tree_maxrss_mib": usage.ru_maxrss / 1024,  # flow or a reaped child
            "cpu": {"release_tree": release_cpu, "dask_workers": workers_cpu,
                    "release_total": release_cpu + workers_cpu,
                    "prefect_server": server_cpu, "bench_process": own.cpu_process},
            "load_start": load_start, "load_end": load_average(),
            "output_tail": output[-600:]}


# --- the floor, in the same run -------------------------------------------------------------


def run_floor(data: Path, work: Path) -> dict:
    """bench_floor.py on ``data`` as a subprocess (its memory and CPU its own): its figures,
    with the CPU time of the whole subprocess from ``wait4``."""
    out = work / "floor.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "bench_floor.py"),
           "--data", str(data), "--json-out", str(out)]
    load_start = load_average()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=work)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"the floor (bench_floor.py) failed (status {status}):\n"
                         f"{output[-4000:]}")
    res = json.loads(out.read_text())
    res["subprocess"] = {"wall": wall, "cpu": rusage_cpu_seconds(usage),
                         "peak_rss_mib": usage.ru_maxrss / 1024,
                         "load_start": load_start, "load_end": load_average()}
    return res


def floor_ratios(results: dict, floor: dict | None) -> dict:
    """Per runner: release wall / floor CPU (the issue's ratio), and release CPU / floor CPU."""
    if not floor or floor["floor_cpu"] <= 0:
        return {}
    return {name: {"wall_over_floor": res["wall"] / floor["floor_cpu"],
                   "cpu_over_floor": res["cpu"]["release_total"] / floor["floor_cpu"],
                   "wall_over_estimator_floor": res["wall"] / floor["estimator_floor_cpu"]}
            for name, res in results.items()}


# --- a Dask cluster of separate processes ---------------------------------------------------


def staged_cluster_config(work: Path, data: Path, address: str,
                          cells: int | None = None) -> Path:
    """The dask runner's config pointed at ``address``, its chunks staged at a file:// URL (what
    a cluster of machines would share; dpatlas.release.staging)."""
    import yaml

    config = write_config(work, data, "dask", address, cells)
    cfg = yaml.safe_load(config.read_text())
    cfg["staging_url"] = f"file://{config.parent / 'staging'}"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return config


def chunk_costs(runs: list[dict], staging: Path) -> list[dict]:
    """Per chunk: its select and estimate task runs' wall seconds (from the Prefect server) and
    its size (records and tract-cells, from its estimates at the staging URL)."""
    import pandas as pd

    seconds: dict[str, dict[str, float]] = {}
    for run in runs:
        stage, _, chunk = run["name"].partition("-")
        if stage in ("select", "estimate") and not chunk.startswith("levels-"):
            seconds.setdefault(chunk, {})[stage] = run["end"] - run["start"]
    rows = []
    for chunk, by_stage in sorted(seconds.items()):
        results = pd.read_parquet(staging / "results" / f"{chunk}.parquet", columns=["n"])
        rows.append({"chunk": chunk, "select_s": by_stage.get("select"),
                     "estimate_s": by_stage.get("estimate"), "records": int(results["n"].sum()),
                     "tract_cells": len(results)})
    if not rows:
        raise SystemExit("error: no select/estimate task runs found for the cluster run")
    return rows


def cluster_projection(chunks: list[dict], worker_cpu: float, machines: int = 10,
                       cells: int = 42) -> dict:
    """The select+estimate work of the national release with ``cells`` cells on ``machines``
    one-worker machines, from this run's costs: the workers' CPU seconds (an upper bound: see
    run_on_processes) per tract-cell ×
    tract-cells × cells ÷ machines (the summed task wall time beside it: on a busy machine it
    includes waiting for a core). Assumes each tract-cell costs the same whatever its cell
    (fewer records per tract-cell make it cheaper, not dearer) and leaves out the stages the
    flow runs itself (ingest, validation, levels, publish), which do not spread over workers."""
    busy = sum((c["select_s"] or 0.0) + (c["estimate_s"] or 0.0) for c in chunks)
    tract_cells = sum(c["tract_cells"] for c in chunks)
    records = sum(c["records"] for c in chunks)
    per_tract_cell = worker_cpu / tract_cells
    work = per_tract_cell * tract_cells * cells
    return {"task_seconds": busy, "worker_cpu_seconds": worker_cpu, "tract_cells": tract_cells,
            "records": records, "cpu_seconds_per_tract_cell": per_tract_cell,
            "cpu_seconds_per_record": worker_cpu / records, "cells": cells,
            "machines": machines, "work_seconds": work, "seconds_on_machines": work / machines,
            "largest_chunk_s": max((c["select_s"] or 0.0) + (c["estimate_s"] or 0.0)
                                   for c in chunks)}


def run_on_processes(api_url: str, work: Path, data: Path, workers: int,
                     cells: int | None = None, tag: str = "") -> dict:
    """One release on `dask scheduler` + ``workers`` × `dask worker` started as processes;
    per-chunk costs written to ``chunks-dask-<n>w<tag>.json`` under --work."""
    from distributed import Client

    from tests.support.dask_cluster import dask_processes

    import signal

    # `timeout` or kill sends SIGTERM: exit through the context managers below, so the
    # scheduler and workers (in sessions of their own) are stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    key = f"dask-{workers}w{tag}"
    timings = timings_folder(work, key)
    env = {"PREFECT_API_URL": api_url, TIMINGS_ENV: str(timings),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with dask_processes(work / f"cluster-{key}", workers, env) as cluster, \
            Client(cluster.address) as client:
        config = staged_cluster_config(work, data, cluster.address, cells)
        set_ledger_cap(config)
        start = time.time()
        cpu_before = client.run(time.process_time)
        result = run_release(api_url, config, f"national-{key}", timings, client, runner=key)
        cpu_after = client.run(time.process_time)
    # The workers run only select and estimate: their CPU time is that work's cost however busy
    # the machine, plus Prefect's task engine per task run, Dask's bookkeeping while the flow
    # runs its own stages, and one-off imports (at --scale 0.05 these dominate: see the report).
    worker_cpu = sum(cpu_after[w] - cpu_before[w] for w in cpu_after)
    chunks = chunk_costs(task_runs_since(api_url, start),
                         config.parent / "staging" / f"national-{key}")
    projection = cluster_projection(chunks, worker_cpu)
    (work / f"chunks-{key}.json").write_text(json.dumps(
        {"workers": workers, "worker_cpu_s": worker_cpu, "chunks": chunks,
         "projection": projection}, indent=2))
    return {**result, "chunks": len(chunks), "projection": projection}


def print_projection(key: str, projection: dict) -> None:
    p = projection
    print(f"\n{key}: select+estimate {p['worker_cpu_seconds']:.1f} worker CPU-s "
          f"({p['task_seconds']:.1f} task wall-s) over {p['tract_cells']:,} tract-cells = "
          f"{1e3 * p['cpu_seconds_per_tract_cell']:.3f} CPU-ms each; × {p['cells']} cells = "
          f"{p['work_seconds']:.0f} CPU-s, ÷ {p['machines']} machines = "
          f"{p['seconds_on_machines']:.0f} s (largest chunk {p['largest_chunk_s']:.1f} wall-s; "
          "the flow's own stages not included)")


# --- the report -----------------------------------------------------------------------------


def _load(load) -> str:
    return "/".join(f"{v:.2f}" for v in load)


def print_report(name: str, res: dict, targets: bool, ratio: dict | None = None,
                 one_cell: bool = True) -> None:
    """One run's figures; ``targets``: say whether each target is met (the local runner's
    run; issue 35's floor ratio only at ``one_cell``)."""
    wall, inside, cpu = res["wall"], res["inside"], res["cpu"]
    ok = lambda good: ("meets" if good else "MISSES") if targets else "-"  # noqa: E731
    print(f"\n### runner: {name}\n")
    print(f"load average (1/5/15 min): {_load(res['load_start'])} at the start, "
          f"{_load(res['load_end'])} at the end\n")
    print("| figure | value | target |")
    print("| --- | ---: | --- |")
    print(f"| wall time of `dpatlas release` | {wall:.1f} s | ≤ {TARGET_WALL_S:.0f} s (issue "
          f"22): {ok(wall <= TARGET_WALL_S)} |")
    print(f"| CPU time of the release's process tree (wait4: flow + reaped children) | "
          f"{cpu['release_tree']:.1f} s | |")
    if cpu["dask_workers"]:
        print(f"| CPU time of the Dask workers during the release | {cpu['dask_workers']:.1f} s "
              "| |")
    print(f"| CPU time of the release, all processes | {cpu['release_total']:.1f} s | |")
    print(f"| CPU time of the Prefect server during the release (not the release's) | "
          f"{cpu['prefect_server']:.1f} s | |")
    if ratio:
        limit = _matrix.TARGET_LOCAL_1CELL_FLOOR_RATIO
        print(f"| **release wall / floor CPU** | **{ratio['wall_over_floor']:.2f}** | "
              + (f"≤ {limit:g} (one cell, local): {ok(ratio['wall_over_floor'] <= limit)}"
                 if one_cell else "") + " |")
        print(f"| release CPU / floor CPU | {ratio['cpu_over_floor']:.2f} | |")
        print(f"| release wall / estimator floor CPU | "
              f"{ratio['wall_over_estimator_floor']:.2f} | |")
    limits = {figure: (target, met) for figure, _, target, met
              in _matrix.target_rows(res, None, local_one_cell=False)}
    for pid, (label, mib) in sorted(res["peaks"].items(), key=lambda kv: -kv[1][1]):
        figure = f"peak RSS, {label} (pid {pid})"
        target, met = limits.get(figure, ("", None))  # a Prefect server has none
        print(f"| {figure} | {mib:,.0f} MiB | "
              + (f"{target}: {ok(met)}" if target else "") + " |")
    print(f"| inside the estimators (select + estimate functions, any process) | "
          f"{inside:.1f} s | |")
    print(f"| outside the estimators | {wall - inside:.1f} s = "
          f"{100 * (wall - inside) / wall:.0f}% | |")
    over = res["overhead"]
    print(f"| outside every Prefect task (start-up, flow code between tasks) | "
          f"{wall - res['tasks_union']:.1f} s: {over['before_first_task']:.1f} before the "
          f"first task, {over['between_stages']:.1f} between stages, "
          f"{over['after_last_task']:.1f} after the last | |")
    print("\n| stage (Prefect task) | wall s (any run) | task s (sum) | runs | idle gap before "
          "(s) | flow RSS max (MiB) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for row in res["stages"]:
        rss = row.get("flow_rss_max")
        print(f"| {row['stage']} | {row['seconds']:.1f} | {row['task_seconds']:.1f} | "
              f"{row['runs']} | {row['gap_before']:.2f} | "
              f"{'-' if rss is None else f'{rss:,.0f}'} |")


def print_floor(floor: dict) -> None:
    sub = floor["subprocess"]
    print("\n### the floor (benchmarks/bench_floor.py, one process, same data)\n")
    print("\n".join(floor_report_lines(floor)))
    print(f"floor subprocess: wall {sub['wall']:.1f} s | CPU {sub['cpu']:.1f} s (wait4) | "
          f"load average {_load(sub['load_start'])} -> {_load(sub['load_end'])}", flush=True)


# --- issue 35 item 4: the whole matrix in one run (--matrix) --------------------------------


def print_matrix_run(key: str, res: dict, floor: dict | None, local_one_cell: bool) -> None:
    """Per stage (Prefect task name) wall and CPU-s, and the item's targets beside the run's
    figures."""
    print(f"\n#### {key}: per stage (CPU per task run, recorded where it ran)\n")
    print(f"load average (1/5/15 min): {_load(res['load_start'])} at the start, "
          f"{_load(res['load_end'])} at the end; wall {res['wall']:.1f} s, CPU "
          f"{res['cpu']['release_total']:.1f} s (flow tree {res['cpu']['release_tree']:.1f}, "
          f"workers {res['cpu']['dask_workers']:.1f})\n")
    print("CPU-s: a worker's process CPU while the run ran; in the flow, the run's own thread's "
          "(not the library threads it started) + children it reaped (tippecanoe). Process "
          "CPU-s: the whole process's while the runs ran (an upper bound in the flow, where "
          "task threads overlap).\n")
    print("| stage (task name) | runs | wall s (any run) | task wall s (sum) | CPU-s | "
          "longest run CPU-s | process CPU-s | where |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in res["task_stages"]:
        print(f"| {row['stage']} | {row['runs']} | {row['wall']:.1f} | {row['task_wall']:.1f} | "
              f"{row['cpu']:.1f} | {row['longest_cpu']:.2f} | {row['process_cpu']:.1f} | "
              f"{row['where']} |")
    print(f"\nthe flow machine's serial CPU-s (the flow's process tree, plus the serial "
          f"commit if it ran on a worker): {res['serial_cpu']:.1f}")
    floor_cpu = floor["floor_cpu"] if floor else None
    print("\n| figure | value | target | |")
    print("| --- | ---: | --- | --- |")
    for figure, value, target, met in _matrix.target_rows(res, floor_cpu, local_one_cell):
        print(f"| {figure} | {value} | {target} | {'meets' if met else 'MISSES'} |")


def run_matrix(args, work: Path) -> None:
    """The floor, then the local runner and `dask scheduler` + 1 and 2 `dask worker` processes,
    at each cell count; the runs of one cell count back to back (load drift hits all sides
    alike); then the estimate for 42 cells on 10 machines × 2 workers."""
    from tests.support.prefect_server import prefect_server

    cell_counts = [int(c) for c in args.matrix_cells.split(",")]
    worker_counts = [int(w) for w in args.matrix_workers.split(",")]
    matrix: dict[int, dict] = {}
    home = work / "prefect-home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    out = args.json_out.resolve() if args.json_out else work / "matrix.json"
    with prefect_server(home) as api_url:
        os.environ["PREFECT_API_URL"] = api_url
        for cells in cell_counts:
            data = data_folder(work, args.scale, cells)
            data.mkdir(parents=True, exist_ok=True)
            country = generate_country(data, args.scale, cells)
            print(f"\n## {cells} cell(s): {country['tracts']:,} tracts, "
                  f"{country['records']:,} records", flush=True)
            floor = run_floor(data, work)
            print_floor(floor)
            runs: dict[str, dict] = {}
            tag = f"-{cells}c"
            config = write_config(work, data, "local", None, cells)
            set_ledger_cap(config)
            runs["local"] = run_release(api_url, config, f"national-local{tag}",
                                        timings_folder(work, f"local{tag}"), runner="local")
            print_matrix_run(f"local, {cells} cell(s)", runs["local"], floor, cells == 1)
            for workers in worker_counts:
                runs[f"dask-{workers}w"] = run_on_processes(api_url, work, data, workers,
                                                            cells, tag)
                print_matrix_run(f"dask, {workers} worker process(es), {cells} cell(s)",
                                 runs[f"dask-{workers}w"], floor, False)
            matrix[cells] = {"country": country, "floor": floor, "runs": runs,
                             "ratios": floor_ratios(runs, floor)}
    basis_cells = max(matrix)
    runs = matrix[basis_cells]["runs"]
    basis = max(runs, key=lambda k: int(k[5:-1]) if k.startswith("dask-") else 0)  # most workers
    fixed = _matrix.serial_fixed_part({c: m["runs"][basis]["serial_cpu"]
                                       for c, m in matrix.items() if basis in m["runs"]})
    estimate = _matrix.cluster_estimate(runs[basis]["task_stages"], runs[basis]["serial_cpu"],
                                        basis_cells, serial_fixed=fixed)
    print_matrix_summary(matrix)
    print(f"\n### estimate: 42 cells on 10 machines × 2 workers, from the {basis} run at "
          f"{basis_cells} cell(s)\n")
    print("\n".join(estimate["lines"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"matrix": {str(c): {**m, "runs": _jsonable(m["runs"])}
                                          for c, m in matrix.items()},
                               "estimate": {**estimate, "basis": basis}},
                              indent=2, default=str))
    print(f"\nresults: {out}")


def print_matrix_summary(matrix: dict) -> None:
    print("\n### the matrix\n")
    print("| cells | run | wall s | CPU s | wall / floor CPU | flow peak MiB | worker peaks MiB "
          "| tippecanoe peak MiB | load (1 min) start → end |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for cells, m in matrix.items():
        for key, res in m["runs"].items():
            peaks = list(res["peaks"].values())
            flow = max((mib for label, mib in peaks if label == "release (flow)"), default=0.0)
            workers = ", ".join(f"{mib:,.0f}" for label, mib in peaks if label == "dask worker")
            tiles = max((mib for label, mib in peaks if label.startswith("tippecanoe")),
                        default=0.0)
            ratio = m["ratios"].get(key, {}).get("wall_over_floor")
            print(f"| {cells} | {key} | {res['wall']:.1f} | {res['cpu']['release_total']:.1f} | "
                  f"{'-' if ratio is None else f'{ratio:.2f}'} | {flow:,.0f} | "
                  f"{workers or '-'} | {tiles:,.0f} | {res['load_start'][0]:.2f} → "
                  f"{res['load_end'][0]:.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/dpatlas-national"))
    ap.add_argument("--runners", default="local,dask",
                    help="comma-separated: local, dask (a 2-worker local cluster)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiplies every state's tract count (1.0: ~74,000 tracts)")
    ap.add_argument("--cells", type=int, default=None,
                    help="every person has a record in each of N cells (the generator's "
                         "outcome-1 ... outcome-N); default: no cells")
    ap.add_argument("--max-parameter-size", type=int, default=None,
                    help="the benchmark's Prefect server's limit on a flow run's parameters, "
                         "in bytes (0: none); default: Prefect's (512 KiB)")
    ap.add_argument("--json-out", type=Path, default=None,
                    help="where the results go as JSON (default: WORK/results.json)")
    ap.add_argument("--no-floor", action="store_true",
                    help="skip the floor (bench_floor.py) and the ratios")
    ap.add_argument("--dask-cluster", choices=("local", "processes"), default="local",
                    help="dask runner: a LocalCluster in this process (local), or `dask "
                         "scheduler` and `dask worker` processes with staged chunks "
                         "(processes; per-chunk costs in chunks-dask-<n>w.json)")
    ap.add_argument("--dask-workers", default="2",
                    help="with --dask-cluster processes: comma-separated worker counts, one "
                         "release each (e.g. 1,2)")
    ap.add_argument("--matrix", action="store_true",
                    help="issue 35 item 4 in one run: per cell count (--matrix-cells) the "
                         "floor, the local runner and `dask worker` processes "
                         "(--matrix-workers), then the 42-cell 20-worker estimate; JSON to "
                         "--json-out (default WORK/matrix.json)")
    ap.add_argument("--matrix-cells", default="1,6", help="with --matrix: cell counts")
    ap.add_argument("--matrix-workers", default="1,2",
                    help="with --matrix: `dask worker` process counts")
    args = ap.parse_args()
    if args.matrix:
        if args.scale <= 0:
            raise SystemExit("error: --scale must be > 0")
        run_matrix(args, args.work.resolve())
        return
    runners = [r.strip() for r in args.runners.split(",") if r.strip()]
    if not set(runners) <= {"local", "dask"} or not runners:
        raise SystemExit("error: --runners takes local, dask or both (comma-separated)")
    if args.scale <= 0:
        raise SystemExit("error: --scale must be > 0")
    if args.cells is not None and args.cells < 1:
        raise SystemExit("error: --cells must be >= 1")
    work = args.work.resolve()
    data = data_folder(work, args.scale, args.cells)
    data.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    print(f"synthetic country in {data} ...", flush=True)
    country = generate_country(data, args.scale, args.cells)
    print(f"country: {country['states']} states (incl. DC), {country['tracts']:,} tracts, "
          f"{country['records']:,} records (generated in {country['generated_seconds']} s; "
          f"ready in {time.perf_counter() - t0:.0f} s)", flush=True)

    floor = None
    if not args.no_floor:
        floor = run_floor(data, work)
        print_floor(floor)

    from tests.support.prefect_server import prefect_server

    if args.max_parameter_size is not None:
        # A chunk is a GEOID range now (O(chunks) parameters); the option is kept to try the
        # limit, which the release checks before its charge (docs/national.md).
        os.environ["PREFECT_SERVER_API_MAX_PARAMETER_SIZE"] = str(args.max_parameter_size)
        print(f"Prefect server: flow run parameters limited to {args.max_parameter_size} bytes "
              "(0: no limit)", flush=True)

    home = work / "prefect-home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    results, failure = {}, None
    t_server = time.perf_counter()
    try:
        with prefect_server(home) as api_url:
            print(f"Prefect server start-up (not in the wall times): "
                  f"{time.perf_counter() - t_server:.1f} s", flush=True)
            # The processes started from here on name this server in their environment
            # (prefect-dask also sends each task its flow's settings, the API URL among them).
            os.environ["PREFECT_API_URL"] = api_url
            if "local" in runners:
                config = write_config(work, data, "local", None, args.cells)
                set_ledger_cap(config)
                results["local"] = run_release(api_url, config, "national-local",
                                               timings_folder(work, "local"), runner="local")
                print_report("local (threads, 2 at a time)", results["local"], targets=True,
                             ratio=floor_ratios(results, floor).get("local"),
                             one_cell=args.cells in (None, 1))
            if "dask" in runners and args.dask_cluster == "processes":
                for workers in [int(w) for w in args.dask_workers.split(",")]:
                    key = f"dask-{workers}w"
                    results[key] = run_on_processes(api_url, work, data, workers, args.cells)
                    print_report(f"dask ({workers} `dask worker` processes, staged by URL)",
                                 results[key], targets=False,
                                 ratio=floor_ratios(results, floor).get(key))
                    print_projection(key, results[key]["projection"])
            elif "dask" in runners:
                from dask.distributed import Client, LocalCluster

                timings = timings_folder(work, "dask")  # before the workers start: inherited
                with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, Client(cluster) as client:
                    config = write_config(work, data, "dask", cluster.scheduler_address,
                                          args.cells)
                    set_ledger_cap(config)
                    results["dask"] = run_release(api_url, config, "national-dask", timings,
                                                  client, runner="dask")
                print_report("dask (2-worker local cluster)", results["dask"], targets=False,
                             ratio=floor_ratios(results, floor).get("dask"))
    except StageTableError as err:
        failure = str(err)
    out = args.json_out.resolve() if args.json_out else work / "results.json"
    write_results(out, country, floor, results, failure)
    print(f"\nresults: {out}")
    if failure:
        raise SystemExit(f"error: {failure}")


def write_results(path: Path, country: dict, floor: dict | None, results: dict,
                  failure: str | None) -> None:
    summary = {"country": country, "floor": floor, "ratios": floor_ratios(results, floor),
               "failure": failure, "results": _jsonable(results)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, default=str))


def _jsonable(results: dict) -> dict:
    return {k: {**v, "peaks": {str(p): list(lm) for p, lm in v["peaks"].items()}}
            for k, v in results.items()}


if __name__ == "__main__":
    main()
