"""DDSSP against NoisyStats on the Illinois-sized synthetic state: wall time, side by side.

Builds the state as benchmarks/bench_estimators.py does (``oi_like_state``, 3,108 tracts) and
times, per estimator, one release (reps = 1) and an evaluation-sized batch (``--reps``), with
noise from os.urandom. DDSSP's time is split into its measurement (the exact discrete
Gaussian draws) and its Private-PGM post-processing (mbi's MirrorDescent, vmapped over every
(rep, tract) problem); the first DDSSP call of a table size also compiles the jax program,
which is timed separately. Also prints DDSSP's time per problem with mbi's own one-problem
``Estimator.estimate`` on a sample of tracts, for the batching speed-up.

    .venv/bin/python benchmarks/bench_ddssp.py [--tracts 3108] [--reps 10] [--seed 0]
        [--bins 4] [--one-core] [--sequential-sample 50]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import mechanisms as M
from dpatlas.evaluation.synthetic_input import StateParams, batch_of, oi_like_state
from mechanisms import ddssp  # noqa: F401  (registers DDSSP until mechanisms/__init__ does)
from mechanisms.noise import OSRandomness

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402

DELTA = 1e-6


class Seconds(float):
    """Wall seconds, with the CPU seconds of the same call (all threads: jax uses several)."""

    cpu: float = 0.0


def timed(fn):
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    secs = Seconds(time.perf_counter() - t0)
    secs.cpu = time.process_time() - c0
    return out, secs


def ddssp_parts(batch, eps: float, reps: int, hp: dict) -> tuple[float, float]:
    """(seconds measuring, seconds estimating) for one DDSSP run split into its two parts."""
    est = M.get("DDSSP")
    hp = est.hyper(hp)
    steps = {s.name: s for s in est.noise_steps(eps, DELTA, **hp)}
    tracts = np.flatnonzero(batch.n >= 2)
    noisy, t_measure = timed(lambda: ddssp.measure_marginals(
        batch, tracts, steps, OSRandomness(), reps, int(hp["bins"]), M.NO_METER))
    _, t_estimate = timed(lambda: ddssp.estimate_tables(noisy, batch.n[tracts],
                                                         int(hp["iters"])))
    return t_measure, t_estimate


def sequential_mbi(batch, eps: float, hp: dict, sample: int) -> float:
    """Seconds per tract with mbi's own ``MirrorDescent().estimate`` on one problem at a time."""
    import jax

    with jax.enable_x64(True):
        from mbi import Domain, LinearMeasurement, estimation
    est = M.get("DDSSP")
    hp = est.hyper(hp)
    bins = int(hp["bins"])
    steps = {s.name: s for s in est.noise_steps(eps, DELTA, **hp)}
    tracts = np.flatnonzero(batch.n >= 2)[:sample]
    noisy = ddssp.measure_marginals(batch, tracts, steps, OSRandomness(), 1, bins, M.NO_METER)
    dom = Domain(["x", "y"], [bins, bins])
    sd = noisy.sd

    def one(t):
        ms = [LinearMeasurement(noisy.x[0, t], ("x",), stddev=sd[ddssp.X_MARGINAL]),
              LinearMeasurement(noisy.y[0, t], ("y",), stddev=sd[ddssp.Y_MARGINAL]),
              LinearMeasurement(noisy.xy[0, t].ravel(), ("x", "y"),
                                stddev=sd[ddssp.XY_MARGINAL])]
        with jax.enable_x64(True):
            model = estimation.MirrorDescent().estimate(
                dom, ms, known_total=float(batch.n[tracts[t]]), iters=int(hp["iters"]))
            np.asarray(model.project(("x", "y")).datavector())

    one(0)  # compile
    _, secs = timed(lambda: [one(t) for t in range(tracts.size)])
    return secs / tracts.size


def main() -> None:
    with measure("bench_ddssp, whole run") as run:
        _main()
    print(run.line())


def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracts", type=int, default=3108)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bins", type=int, default=int(ddssp.DEFAULTS["bins"]))
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--one-core", action="store_true", help="pin to one core (jax threads too)")
    ap.add_argument("--sequential-sample", type=int, default=50)
    args = ap.parse_args()
    if args.one_core and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    df = oi_like_state(args.seed, StateParams(n_tracts=args.tracts))
    batch = batch_of(df)
    hp = {"bins": args.bins}
    print(f"state: {batch.n_tracts} tracts, {len(df):,} records, largest tract {batch.n.max()}; "
          f"cores {sorted(os.sched_getaffinity(0))}; eps {args.epsilon:g}, delta {DELTA:g}; "
          f"DDSSP bins {args.bins}, iters {ddssp.DEFAULTS['iters']}")

    # First DDSSP call per table size compiles the vmapped program (once per process).
    _, t_first = timed(lambda: M.estimate_batch("DDSSP", batch.subset(np.arange(8)),
                                                args.epsilon, DELTA, **hp))
    print(f"DDSSP first call (jax compile + 8 tracts): {t_first:.2f} s wall, "
          f"{t_first.cpu:.2f} s CPU")

    print(f"{'estimator':<12}{'reps':>6}{'seconds':>10}{'CPU s':>9}{'tracts/s':>12}"
          f"{'failed':>9}")
    for reps in (1, args.reps):
        for name in ("NoisyStats", "DDSSP"):
            delta = DELTA if M.get(name).needs_delta else None
            kw = hp if name == "DDSSP" else {}
            res, secs = timed(lambda: M.estimate_batch(name, batch, args.epsilon, delta,
                                                       reps=reps, **kw))
            print(f"{name:<12}{reps:>6}{secs:>10.2f}{secs.cpu:>9.2f}"
                  f"{reps * batch.n_tracts / secs:>12,.0f}"
                  f"{float(np.mean(res.failed)):>9.3f}")
    t_measure, t_estimate = ddssp_parts(batch, args.epsilon, args.reps, hp)
    print(f"DDSSP reps={args.reps} split: measurement (exact discrete Gaussian) "
          f"{t_measure:.2f} s ({t_measure.cpu:.2f} s CPU), Private-PGM estimation (mbi, "
          f"vmapped) {t_estimate:.2f} s ({t_estimate.cpu:.2f} s CPU)")
    if args.sequential_sample:
        per = sequential_mbi(batch, args.epsilon, hp, args.sequential_sample)
        batched = t_estimate / (args.reps * batch.n_tracts)
        print(f"mbi one problem at a time: {per * 1e3:.2f} ms/tract "
              f"(sample of {args.sequential_sample}); vmapped: {batched * 1e3:.3f} ms/tract "
              f"({per / batched:.0f}x)")


if __name__ == "__main__":
    main()
