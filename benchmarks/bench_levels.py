"""The county/state levels and the small-area model of a national release, before and after
issue 22, side by side in one process: CPU seconds (``time.process_time``) beside wall time and
the load average, so that the figures hold on a busy machine.

It reads what a national release left in its run folder (``bench_national.py --work W`` keeps
``W/run-local``: its config, the staged partitions, the chunk results and the per-state level
results in the release's internal folder) and re-runs, without Prefect, each step of the lane:

- ``levels read``: every state's records. Before: each state reads every staged partition
  (51 × 51 reads). After: only the partitions that hold it (``partitions_holding``).
- ``levels estimate``: NoisyStats and intervals of every county and state. Before: units
  grouped by object-string labels (main's ``unit_of``). After: by fixed-width text labels
  (``unit_labels``).
- ``assemble levels``: the county and state tables, geometries dissolved from the tracts
  (coverage union; unchanged).
- ``model fit``: the Fay–Herriot model per state (``fit_published``). Before: the kernel
  neighbour pairs queried afresh for each of a fit's 16 kernel means (main's
  ``kernel_mean``, kept below as ``reference_kernel_mean``). After: found once per state
  and bandwidth (``KernelPairs``).
- ``level checks``: the county and state output contracts (Great Expectations; its import
  left out, as publish has imported it for the tract table already; unchanged).

Before and after must give identical values (checked: the records frame by frame, the model
columns exactly); the script fails otherwise.

    .venv/bin/python benchmarks/bench_levels.py [--run /tmp/nat-base/run-local] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/support/reference_kernel.py: the before path

from tests.support.reference_kernel import reference_kernel_mean  # noqa: E402

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@contextmanager
def fresh_kernel_pairs():
    """The model's ``before`` path: every kernel mean queries its neighbour pairs afresh
    (``reference_kernel_mean``)."""
    from dpatlas.small_area import model

    class FreshPairs:
        def __init__(self, xy, bandwidth_km):
            self.xy, self.bandwidth_km = xy, bandwidth_km

        def mean(self, values, weights):
            return reference_kernel_mean(self.xy, values, weights, self.bandwidth_km)

    shared = model.neighbour_kernels
    model.neighbour_kernels = lambda xy: {h: FreshPairs(xy, h) for h in model.BANDWIDTHS_KM}
    try:
        yield
    finally:
        model.neighbour_kernels = shared


@contextmanager
def object_unit_labels():
    """The level estimation's ``before`` path: units labelled by object strings, as main's
    ``estimate_level`` did (``unit_of`` of the GEOIDs)."""
    from dpatlas.publication.level_files import unit_of
    from dpatlas.release import levels

    fixed_width = levels.unit_labels
    levels.unit_labels = lambda geoids, level: unit_of(geoids.to_numpy(), level)
    try:
        yield
    finally:
        levels.unit_labels = fixed_width


def timed(fn):
    """(result, CPU seconds, wall seconds) of ``fn()``."""
    cpu, wall = time.process_time(), time.perf_counter()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=Path("/tmp/nat-base/run-local"),
                    help="a national release's run folder (bench_national.py --work W: "
                         "W/run-local)")
    ap.add_argument("--repeats", type=int, default=1, help="best of this many runs per figure")
    args = ap.parse_args()

    import pandas as pd

    from dpatlas.core.config import load_config
    from dpatlas.release.boundaries import load_boundaries
    from dpatlas.publication.model_estimates import add_model_estimates
    from dpatlas.publication.tract_files import assemble
    from dpatlas.release.allocate import plan
    from dpatlas.release.estimate import split_into_chunks, staged_tracts
    from dpatlas.release.levels import (estimate_levels, partitions_holding, read_state,
                                        states_of)
    from dpatlas.release.thresholds import resolve_threshold
    from mechanisms.noise import default_randomness
    from dpatlas.publication.level_files import unit_of
    from tasks.publish import _check_contract, assemble_levels

    cfg = load_config(args.run / "config.yaml")
    (internal,) = [p for p in (args.run / "releases-internal").iterdir() if p.is_dir()]
    budget = plan(cfg, resolve_threshold(cfg.selection))
    staged = sorted((internal / "staged").glob("*.parquet"))
    geoids, sizes = staged_tracts(staged)
    chunks = split_into_chunks(geoids, cfg.partition_tracts)
    states = states_of(sizes["geoid"])
    rows = []

    def compare(step, before, after, same):
        b = min((timed(before) for _ in range(args.repeats)), key=lambda r: r[1])
        a = min((timed(after) for _ in range(args.repeats)), key=lambda r: r[1])
        if before is not after and not same(b[0], a[0]):
            raise SystemExit(f"{step}: the results before and after differ")
        rows.append((step, b[1], a[1], b[2], a[2]))
        return a[0]

    read_all = lambda: {s: read_state(staged, s) for s in states}
    read_own = lambda: {s: read_state(partitions_holding(staged, chunks, s), s) for s in states}
    records = compare("levels read", read_all, read_own,
                      lambda b, a: all(b[s].equals(a[s]) for s in states))
    estimate = lambda: [estimate_levels(records[s], budget, default_randomness(k),
                                        cfg.publish.min_n) for k, s in enumerate(states)]

    def estimate_before():
        with object_unit_labels():
            return estimate()
    compare("levels estimate", estimate_before, estimate,
            lambda b, a: all(x.equals(y) for x, y in zip(b, a)))

    boundaries = load_boundaries(cfg.boundaries.path, cfg.boundaries.geoid_column)
    results = pd.concat([pd.read_parquet(p) for p in sorted((internal / "results")
                                                            .glob("*.parquet"))],
                        ignore_index=True)
    table = assemble(results, boundaries)
    level_files = sorted((internal / "levels").glob("*.parquet"))
    cells = sorted(str(c) for c in table["cell"].unique())
    assemble_all = lambda: assemble_levels(level_files, boundaries, budget, cells)
    levels = compare("assemble levels", assemble_all, assemble_all, None)

    steps = [s.as_dict() for s in budget.steps]
    fit = lambda: add_model_estimates(table, levels, None, steps)[0]

    def fit_before():
        with fresh_kernel_pairs():
            return fit()
    compare("model fit", fit_before, fit, lambda b, a: b.drop(columns="geometry")
            .equals(a.drop(columns="geometry")))

    import data_contracts  # noqa: F401  (publish imported it for the tract table already)

    with tempfile.TemporaryDirectory() as docs:
        geoids = list(boundaries["geoid"])
        check = lambda: [_check_contract(lv, pd.DataFrame(t.drop(columns="geometry")),
                                         list(unit_of(geoids, lv)), cfg, Path(docs))
                         for lv, t in levels.items()]
        compare("level checks", check, check, None)

    print(f"load average {os.getloadavg()[0]:.1f} (1 min) at the end; "
          f"{len(sizes['geoid'].unique()):,} tracts, {len(states)} states, "
          f"{len(staged)} staged partitions")
    print(f"{'step':<18}{'CPU before':>12}{'CPU after':>11}{'wall before':>13}{'wall after':>12}")
    for step, cb, ca, wb, wa in rows:
        print(f"{step:<18}{cb:>11.2f}s{ca:>10.2f}s{wb:>12.2f}s{wa:>11.2f}s")
    total = [sum(r[k] for r in rows) for k in (1, 2, 3, 4)]
    print(f"{'total':<18}{total[0]:>11.2f}s{total[1]:>10.2f}s{total[2]:>12.2f}s{total[3]:>11.2f}s")


if __name__ == "__main__":
    main()
