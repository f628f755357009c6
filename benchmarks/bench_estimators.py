"""Throughput and peak memory of each estimator on the Illinois-sized synthetic state.

Single process pinned to one core. Prints, per estimator: seconds, tracts/second, pairwise
estimates/second (Theil–Sen family: predictions at x = 0.25 and 0.75 per pair), and the peak of
numpy/Python allocations (tracemalloc, in a second, untimed call); then the headline (DPExpTheilSen with
all pairs + NoisyStats), and the safe sampler against numpy's textbook Laplace, side by side.
With ``--previous-exp``, DPExpTheilSen is also timed with the previous float64 exponential
mechanism (kept here only, for the ratio: it is not DP, see docs/privacy.md).

    .venv/bin/python benchmarks/bench_estimators.py [--tracts 3108] [--seed 0] [--only NAME ...]
        [--previous-exp]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

import mechanisms as M
from dpatlas.evaluation.synthetic_input import StateParams, batch_of, oi_like_state
from mechanisms import median, theil_sen
from mechanisms.noise import OSRandomness, SeededRandomness, discrete_laplace, laplace_mechanism
from mechanisms.pairs import all_pairs, k_matchings
from mechanisms.privacy_maps import GridLaplace

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402


def pair_count(name: str, batch) -> int:
    est = M.get(name)
    if not name.startswith(("DP", "TheilSen")) or name.startswith("DPGD"):
        return 0
    if getattr(est, "pairing", "all") == "all":
        pairs = all_pairs(batch).i.size
    else:
        pairs = k_matchings(batch, int(est.defaults["k"]), SeededRandomness(0)).i.size
    return 2 * pairs  # one prediction at 0.25 and one at 0.75 per pair


def previous_unsafe_exp_median(seg, epsilon, k, lo, hi, rand, reps=1, widen=0.0):
    """The PREVIOUS, UNSAFE exponential-mechanism median, for the speed ratio only.

    It picks an interval by inverting float64 cumulative weights with a 53-bit uniform: weights
    below ~2^-53 of the total get probability 0 or ~2^-52 (not pure DP), and a uniform of 1.0
    forces the last interval even when it is empty (a crash). Never use it for releases.
    """
    T = seg.n_tracts
    m = seg.m
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (T,))
    k = np.broadcast_to(np.asarray(k, dtype=np.float64), (T,))
    step = (hi - lo) / median.GRID_POINTS
    zoff = seg.offsets
    boff = zoff[:-1] + 2 * np.arange(T)
    size = int(zoff[-1] + 2 * T)
    tract_of_z = np.repeat(np.arange(T), m)
    rank = np.arange(zoff[-1]) - zoff[tract_of_z] + 1
    z = seg.z
    if widen > 0:
        z = np.clip(np.where(rank <= m[tract_of_z] / 2.0, z - widen, z + widen), lo, hi)
    c = np.empty(size, dtype=np.int64)
    c[np.arange(zoff[-1]) + 2 * tract_of_z + 1] = np.clip(
        np.floor((z - lo) / step).astype(np.int64) + 1, 0, median.GRID_POINTS + 1)
    c[boff] = 0
    c[boff + m + 1] = median.GRID_POINTS + 1
    n_int = m + 1
    tract_of_int = np.repeat(np.arange(T), n_int)
    pos = np.arange(size - T) + tract_of_int
    j = pos - boff[tract_of_int]
    count = c[pos + 1] - c[pos]
    utility = -np.abs(j - m[tract_of_int] / 2.0)
    with np.errstate(divide="ignore"):
        logw = (np.log(count.astype(np.float64))
                + eps[tract_of_int] * utility / (2.0 * k[tract_of_int]))
    u = ((rand.words(reps * T) >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    u = u.reshape(reps, T)
    chosen = np.empty((reps, T), dtype=np.int64)
    int_off = np.concatenate([[0], np.cumsum(n_int)])
    for t in range(T):
        lw = logw[int_off[t]:int_off[t + 1]]
        cum = np.cumsum(np.exp(lw - lw.max()))
        idx = np.searchsorted(cum, u[:, t] * cum[-1], side="right")
        chosen[:, t] = int_off[t] + np.minimum(idx, lw.size - 1)
    start = c[pos[chosen]]
    width = count[chosen]
    grid_index = start + rand.below(width.astype(np.uint64)).astype(np.int64)
    return lo + grid_index * step


@contextlib.contextmanager
def previous_exp_median():
    exact = theil_sen.exp_median
    theil_sen.exp_median = previous_unsafe_exp_median
    try:
        yield
    finally:
        theil_sen.exp_median = exact


def main() -> None:
    with measure("bench_estimators, whole run") as run:
        _main()
    print(run.line())


def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracts", type=int, default=3108)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--previous-exp", action="store_true",
                    help="also time DPExpTheilSen with the previous (unsafe) float sampler")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    df = oi_like_state(args.seed, StateParams(n_tracts=args.tracts))
    batch = batch_of(df)
    print(f"state: {batch.n_tracts} tracts, {len(df):,} records, largest tract {batch.n.max()}; "
          f"one core (affinity {sorted(os.sched_getaffinity(0))}); noise from os.urandom")
    names = args.only or list(M.ESTIMATORS)
    print(f"{'estimator':<22}{'seconds':>9}{'CPU s':>8}{'tracts/s':>11}{'pair est./s':>14}"
          f"{'peak MiB':>10}")
    seconds = {}
    for name in names:
        pairs = pair_count(name, batch)
        c0, t0 = time.process_time(), time.perf_counter()
        M.estimate_batch(name, batch, args.epsilon, rand=OSRandomness())
        secs, cpu = time.perf_counter() - t0, time.process_time() - c0
        # A second run measures memory: tracemalloc slows the call, so it is not timed.
        tracemalloc.start()
        M.estimate_batch(name, batch, args.epsilon, rand=OSRandomness())
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        seconds[name] = secs
        rate = f"{pairs / secs:,.0f}" if pairs else "-"
        print(f"{name:<22}{secs:>9.2f}{cpu:>8.2f}{batch.n_tracts / secs:>11,.0f}{rate:>14}"
              f"{peak:>10.0f}")
    if {"DPExpTheilSen", "NoisyStats"} <= set(seconds):
        total = seconds["DPExpTheilSen"] + seconds["NoisyStats"]
        print(f"headline: DPExpTheilSen (all pairs) + NoisyStats over {batch.n_tracts} tracts: "
              f"{total:.2f} s on one core")
    if args.previous_exp and "DPExpTheilSen" in seconds:
        with previous_exp_median():
            t0 = time.perf_counter()
            M.estimate_batch("DPExpTheilSen", batch, args.epsilon, rand=OSRandomness())
            previous = time.perf_counter() - t0
        print(f"DPExpTheilSen with the exact sampler {seconds['DPExpTheilSen']:.2f} s, with the "
              f"previous float64 sampler (unsafe, not DP) {previous:.2f} s; ratio "
              f"{seconds['DPExpTheilSen'] / previous:.2f}")
    # Safe sampler against the textbook one, same number of draws, one run each.
    n = 1_000_000
    t0 = time.perf_counter()
    discrete_laplace(OSRandomness(), np.full(n, 256 * 4097), 256)
    t_exact = time.perf_counter() - t0
    t0 = time.perf_counter()
    laplace_mechanism(OSRandomness(), np.zeros((n, 1)), 1.0, GridLaplace.calibrate(1.0))
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
