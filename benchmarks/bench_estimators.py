"""Throughput and peak memory of each estimator on the Illinois-sized synthetic state.

Single process pinned to one core. Prints, per estimator: seconds, tracts/second, pairwise
estimates/second (Theil–Sen family: predictions at x = 0.25 and 0.75 per pair), and the peak of
numpy/Python allocations (tracemalloc, in a second, untimed call); then the headline (DPExpTheilSen with
all pairs + NoisyStats), and the safe sampler against numpy's textbook Laplace, side by side.

    .venv/bin/python benchmarks/bench_estimators.py [--tracts 3108] [--seed 0] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import tracemalloc

import numpy as np

import mechanisms as M
from dpatlas.synth import StateParams, batch_of, oi_like_state
from mechanisms.noise import OSRandomness, SeededRandomness, discrete_laplace, laplace_mechanism
from mechanisms.pairs import all_pairs, k_matchings


def pair_count(name: str, batch) -> int:
    est = M.get(name)
    if not name.startswith(("DP", "TheilSen")) or name.startswith("DPGD"):
        return 0
    if getattr(est, "pairing", "all") == "all":
        pairs = all_pairs(batch).i.size
    else:
        pairs = k_matchings(batch, int(est.defaults["k"]), SeededRandomness(0)).i.size
    return 2 * pairs  # one prediction at 0.25 and one at 0.75 per pair


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracts", type=int, default=3108)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    df = oi_like_state(args.seed, StateParams(n_tracts=args.tracts))
    batch = batch_of(df)
    print(f"state: {batch.n_tracts} tracts, {len(df):,} records, largest tract {batch.n.max()}; "
          f"one core (affinity {sorted(os.sched_getaffinity(0))}); noise from os.urandom")
    names = args.only or list(M.ESTIMATORS)
    print(f"{'estimator':<22}{'seconds':>9}{'tracts/s':>11}{'pair est./s':>14}{'peak MiB':>10}")
    seconds = {}
    for name in names:
        pairs = pair_count(name, batch)
        t0 = time.perf_counter()
        M.estimate_batch(name, batch, args.epsilon, rand=OSRandomness())
        secs = time.perf_counter() - t0
        # A second run measures memory: tracemalloc slows the call, so it is not timed.
        tracemalloc.start()
        M.estimate_batch(name, batch, args.epsilon, rand=OSRandomness())
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        seconds[name] = secs
        rate = f"{pairs / secs:,.0f}" if pairs else "-"
        print(f"{name:<22}{secs:>9.2f}{batch.n_tracts / secs:>11,.0f}{rate:>14}{peak:>10.0f}")
    if {"DPExpTheilSen", "NoisyStats"} <= set(seconds):
        total = seconds["DPExpTheilSen"] + seconds["NoisyStats"]
        print(f"headline: DPExpTheilSen (all pairs) + NoisyStats over {batch.n_tracts} tracts: "
              f"{total:.2f} s on one core")
    # Safe sampler against the textbook one, same number of draws, one run each.
    n = 1_000_000
    t0 = time.perf_counter()
    discrete_laplace(OSRandomness(), np.full(n, 256 * 4097), 256)
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    laplace_mechanism(OSRandomness(), np.zeros((n, 1)), 1.0, 1.0)
    t_mech = time.perf_counter() - t0
    t0 = time.perf_counter()
    np.random.default_rng().laplace(0.0, 1.0, n)
    t_numpy = time.perf_counter() - t0
    print(f"sampler, {n:,} draws: exact discrete Laplace {t_exact:.3f} s, grid Laplace "
          f"mechanism {t_mech:.3f} s, numpy textbook Laplace (unsafe) {t_numpy:.3f} s; "
          f"ratio grid/numpy {t_mech / t_numpy:.0f}x")
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak resident memory of the process: {peak_rss:.0f} MiB")


if __name__ == "__main__":
    main()
