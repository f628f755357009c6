"""The release's arithmetic alone, in one process: the floor a release's wall time is judged by.

On the data a release reads (the national data ``bench_national.py`` generates under --work,
or a --data folder with ``microdata/`` and ``tracts.parquet``) and with its config
(``dpatlas.cli.demo.release_config``), this runs, state partition by state partition, only:

- read: the partition's records with pyarrow (geoid, ranks, cell; the release's columns);
- batch: its tracts in chunks of ``partition_tracts``, as the release plans them
  (``dpatlas.release.estimate.split_into_chunks``), each chunk's rows taken out of memory;
- select: the dp rule per chunk (``dpatlas.release.estimate.select_partition``);
- estimate: the chosen mechanisms and the intervals per chunk (``estimate_partition``); the
  intervals' own share is printed beside it (``of which intervals``);
- levels: the county and state estimates per state (``dpatlas.release.levels.estimate_levels``),
  when the config has levels;
- model fit: the small-area model (``dpatlas.publication.model_estimates``, post-processing)
  on the tract and level tables. Those tables are first assembled as publish assembles them
  (``assemble``, ``assemble_level`` with its dissolve): that assembly is printed on its own
  line and is NOT part of the floor.

No Prefect, no validation (the synthetic input is valid: the release's validation keeps every
row), no file writing (chunks are cut from the partition in memory instead of re-read from
staged files, which only makes the floor lower). Every figure is CPU seconds of this process
(time.process_time: all its threads), beside its wall seconds.

- estimator floor = read + batch + select + estimate (the issue's "16.8 CPU-seconds");
- full floor = estimator floor + levels + model fit: the arithmetic of today's release, which
  ``bench_national.py`` divides the release's wall time by (target <= 2.5 for the local runner).

    .venv/bin/python benchmarks/bench_floor.py --data /tmp/dpatlas-national/data
    .venv/bin/python benchmarks/bench_floor.py --work /tmp/dpatlas-national --scale 0.05
        [--json-out floor.json]

``floor(data)`` returns the same figures as a dict (bench_national runs this script as a
subprocess, so the floor's memory and CPU are its own).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _measure, when run as a script

from _measure import measure  # noqa: E402
from _national import data_folder as national_data_folder, floor_report_lines  # noqa: E402

ESTIMATOR_PARTS = ("read", "batch", "select", "estimate")
FULL_PARTS = ESTIMATOR_PARTS + ("levels", "model fit")
NOT_FLOOR = "assemble tables for the model fit (publish's; not floor)"
INTERVALS = "of which intervals"  # inside "estimate" (not added again)


class Clock:
    """CPU and wall seconds accumulated per component (a component may be entered often)."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str):
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            yield
        finally:
            self.cpu[name] += time.process_time() - c0
            self.wall[name] += time.perf_counter() - w0

    def timed(self, name: str, fn):
        def wrapper(*args, **kwargs):
            with self(name):
                return fn(*args, **kwargs)
        wrapper.__wrapped__ = fn
        return wrapper


def release_plan(data: Path, work: Path):
    """The config bench_national releases with (no runner: the floor has none), loaded; and
    its budget plan as the allocate task makes it."""
    import yaml

    from dpatlas.cli.demo import release_config
    from dpatlas.core.config import load_config
    from dpatlas.release.allocate import plan
    from dpatlas.release.thresholds import resolve_threshold

    cfg = release_config(data, work / "releases", vintage="synthetic (benchmarks/bench_floor.py)",
                         ledger={"url": f"sqlite:///{work / 'ledger.db'}",
                                 "dataset": "national-synthetic"})
    if _has_cells(data):  # bench_national.py --cells: the records carry a cell column
        cfg["input"]["columns"]["cell"] = "cell"
    path = work / "floor-config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    loaded = load_config(path)
    return loaded, plan(loaded, resolve_threshold(loaded.selection))


def _has_cells(data: Path) -> bool:
    """Whether the generated country has cells (bench_national.py's country.json says so)."""
    summary = data / "country.json"
    return summary.is_file() and bool(json.loads(summary.read_text()).get("cells"))


def partitions(input_path: Path) -> list[Path]:
    """The hive partitions (``state=SS`` folders), or the single input file."""
    folders = sorted(p for p in input_path.glob("state=*") if p.is_dir())
    return folders or [input_path]


def read_records(path: Path, cfg):
    """One partition's records in the release's columns (geoid, x, y, cell), sorted by geoid."""
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    c = cfg.input.columns
    names = [c.geoid, c.parent_rank, c.child_rank] + ([c.cell] if c.cell else [])
    table = pq.read_table(path, columns=names)
    scale = 100.0 if cfg.input.rank_scale == "percentile" else 1.0
    df = pd.DataFrame({
        "geoid": table.column(c.geoid).cast("string").to_numpy(zero_copy_only=False),
        "x": table.column(c.parent_rank).to_numpy().astype(np.float64) / scale,
        "y": table.column(c.child_rank).to_numpy().astype(np.float64) / scale,
        "cell": (table.column(c.cell).cast("string").to_numpy(zero_copy_only=False)
                 if c.cell else "all")})
    return df.sort_values("geoid", kind="stable", ignore_index=True)


def chunk_rows(df, chunks):
    """Each chunk's rows, cut from the partition (sorted by geoid) by its GEOID range."""
    geoids = df["geoid"].to_numpy()
    for chunk in chunks:
        lo = geoids.searchsorted(chunk.first_geoid, side="left")
        hi = geoids.searchsorted(chunk.last_geoid, side="right")
        yield chunk, df.iloc[lo:hi]


def floor(data: Path, work: Path | None = None, seed: int | None = None) -> dict:
    """The floor's figures on ``data``; ``work``: where its config goes (a temporary folder
    by default). ``seed``: repeatable noise (None: the operating system's, as a release)."""
    import pandas as pd

    import dpatlas.release.estimate as estimate
    from dpatlas.release.boundaries import load_boundaries
    from dpatlas.publication.level_files import assemble_level, unit_of
    from dpatlas.publication.model_estimates import add_model_estimates
    from dpatlas.publication.tract_files import assemble
    from dpatlas.release.levels import estimate_levels, states_of
    from mechanisms.noise import default_randomness

    data = Path(data).resolve()
    owned = work is None
    work = Path(tempfile.mkdtemp(prefix="dpatlas-floor-")) if owned else Path(work)
    work.mkdir(parents=True, exist_ok=True)
    cfg, budget = release_plan(data, work)
    min_n, clock = cfg.publish.min_n, Clock()
    rand = default_randomness(seed)
    # The intervals' share of estimate_partition, where the estimation module has them as
    # a helper of their own (the module looks the name up at each call).
    had_intervals = hasattr(estimate, "_intervals")
    if had_intervals:
        estimate._intervals = clock.timed(INTERVALS, estimate._intervals)
    results, level_results, records, n_chunks = [], [], 0, 0
    with measure("floor (this process)") as span:
        try:
            for part in partitions(Path(cfg.input.path)):
                with clock("read"):
                    df = read_records(part, cfg)
                records += len(df)
                with clock("batch"):
                    geoids = {part: sorted(df["geoid"].unique())}
                    chunks = estimate.split_into_chunks(geoids, cfg.partition_tracts)
                n_chunks += len(chunks)
                for chunk, rows in chunk_rows(df, chunks):
                    with clock("select"):
                        selection = estimate.select_partition(rows, budget, rand, min_n)
                    with clock("estimate"):
                        results.append(estimate.estimate_partition(rows, selection, budget,
                                                                   rand, min_n))
                if budget.levels:
                    for state in states_of(df["geoid"]):
                        with clock("batch"):
                            rows = df[unit_of(df["geoid"], "state") == state]
                        with clock("levels"):
                            level_results.append(estimate_levels(rows, budget, rand, min_n))
                del df
            model_fits = 0
            if cfg.small_area.model:
                with clock(NOT_FLOOR):
                    boundaries = load_boundaries(cfg.boundaries.path,
                                                 cfg.boundaries.geoid_column)
                    tracts = pd.concat(results, ignore_index=True)
                    table = assemble(tracts, boundaries)
                    levels = {}
                    if budget.levels:
                        by_unit = pd.concat(level_results, ignore_index=True)
                        cells = sorted(str(c) for c in table["cell"].unique())
                        levels = {lp.level: assemble_level(by_unit, boundaries, lp.level, cells)
                                  for lp in budget.levels}
                with clock("model fit"):
                    _, fits = add_model_estimates(table, levels, None,
                                                  [s.as_dict() for s in budget.steps])
                model_fits = sum(1 for f in fits if f.get("fitted"))
        finally:
            if had_intervals:
                estimate._intervals = estimate._intervals.__wrapped__
            if owned:  # the temporary folder held only the config written above
                shutil.rmtree(work, ignore_errors=True)
    return summary(clock, span, records, n_chunks, sum(len(r) for r in results), model_fits,
                   bool(budget.levels), bool(cfg.small_area.model))


def summary(clock: Clock, span, records: int, chunks: int, tract_cells: int, model_fits: int,
            has_levels: bool, has_model: bool) -> dict:
    parts = [p for p in FULL_PARTS if (p != "levels" or has_levels)
             and (p != "model fit" or has_model)]
    shown = [*ESTIMATOR_PARTS, INTERVALS, *parts[len(ESTIMATOR_PARTS):], NOT_FLOOR]
    components = {name: {"cpu": clock.cpu[name], "wall": clock.wall[name]}
                  for name in shown if name in clock.cpu}
    return {
        "records": records, "chunks": chunks, "tract_cells": tract_cells,
        "model_fits": model_fits, "components": components,
        "estimator_floor_cpu": sum(clock.cpu[p] for p in ESTIMATOR_PARTS),
        "floor_cpu": sum(clock.cpu[p] for p in parts),
        "floor_wall": sum(clock.wall[p] for p in parts),
        "process": span.as_dict(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def data_folder(args) -> Path:
    if args.data is not None:
        return args.data
    if args.work is None:
        raise SystemExit("error: give --data DIR, or --work DIR (with --scale) as for "
                         "bench_national.py")
    return national_data_folder(args.work.resolve(), args.scale)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=None,
                    help="a folder with microdata/ (hive partitions) and tracts.parquet")
    ap.add_argument("--work", type=Path, default=None,
                    help="bench_national.py's --work: its generated data (with --scale)")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=None, help="repeatable noise (tests)")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()
    data = data_folder(args)
    if not (data / "microdata").is_dir() or not (data / "tracts.parquet").is_file():
        raise SystemExit(f"error: {data} has no microdata/ and tracts.parquet")
    res = floor(data, seed=args.seed)
    print(f"floor on {data}:")
    print("\n".join(floor_report_lines(res)))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(res, indent=2))
        print(f"floor results: {args.json_out}")


if __name__ == "__main__":
    main()
