"""The default demo release end to end: wall time, and the share spent outside the estimators.

Generates the default synthetic state (unless --out holds it) and writes `dpatlas demo`'s
config and ledger cap (dpatlas/cli/demo.py), then runs the release flow in-process (Prefect's
ephemeral server). Time inside the estimators is the time spent in the plain selection and
estimation functions (all noise drawing and estimator arithmetic; the union of their running
intervals, since chunks run concurrently); the rest is orchestration, I/O, validation and
publishing. Prints one line per figure.

    .venv/bin/python benchmarks/bench_release.py [--profile primary|full-suite] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure, time_estimator_draws  # noqa: E402


def main() -> None:
    with measure("bench_release, whole run") as run:
        _main()
    print(run.line())


def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="primary", choices=["primary", "full-suite"])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dpatlas-bench-"))

    import dpatlas.release.estimate as est
    import tasks.draws as draw_tasks
    from dpatlas.cli.demo import (demo_data_current, ensure_demo_cap, generate_demo_data,
                                  write_demo_config)

    t0 = time.perf_counter()
    data = out / "data"
    if not demo_data_current(data):
        generate_demo_data(data)
    t_synth = time.perf_counter() - t0
    config = write_demo_config(out, args.profile)  # the demo's own config and ledger cap
    ensure_demo_cap(config)

    intervals: list[tuple[float, float]] = []

    def timed(fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                intervals.append((t, time.perf_counter()))
        return wrapper

    def union_seconds() -> float:
        """Time during which at least one estimator call ran (chunks may run concurrently)."""
        total, end = 0.0, -1.0
        for a, b in sorted(intervals):
            if b > end:
                total += b - max(a, end)
                end = b
        return total

    # the estimation module's functions, which its draw functions look up at each call, and
    # `compute` as the drawing tasks call it (tasks/draws.py), for a selection or estimates:
    # its call spans a draw made in a compute-pool worker (dpatlas.release.compute_pool),
    # whose functions are not wrapped
    est.select_partition = timed(est.select_partition)
    est.estimate_partition = timed(est.estimate_partition)
    draw_tasks.compute = time_estimator_draws(draw_tasks.compute, timed(draw_tasks.compute))

    from prefect.testing.utilities import prefect_test_harness

    t_server = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=180):
        t_server = time.perf_counter() - t_server
        from flows.release import release

        with measure("release (in this process; the test server's CPU is not in it)") as span:
            folder = release(str(config), None, None).folder
        wall = span.wall
    print(f"profile: {args.profile}; data: {data} (generated in {t_synth:.1f} s)")
    print(f"Prefect test server start-up (not counted below): {t_server:.1f} s")
    print(f"release wall time: {wall:.2f} s -> {folder}")
    print(span.line())
    inside = union_seconds()
    print(f"inside the estimators (selection + estimation functions running): {inside:.2f} s")
    print(f"outside the estimators (orchestration, I/O, validation, publish): "
          f"{wall - inside:.2f} s = {100 * (wall - inside) / wall:.0f}% of the wall time")


if __name__ == "__main__":
    main()
