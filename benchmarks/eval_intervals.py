"""Coverage of the DP confidence intervals (mechanisms/intervals.py) on synthetic states.

Per mechanism (NoisyStats, DPExpTheilSen, the dp selection rule) and total ε per tract, the
mechanism runs at (1 − share)·ε and its interval at share·ε; over R runs per tract, prints the
share of published intervals that cover the tract's TRUE prediction α + β·x* (the generator's
population line), overall and by tract-size quintile, the share of tract-runs with nothing
published, and the median width relative to the OLS 95% interval of the same tract.

    python benchmarks/eval_intervals.py --tracts 300 --reps 30
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mechanisms as M  # noqa: E402
from dpatlas.selection import Rule, run_selected, select  # noqa: E402
from dpatlas.synth import StateParams, batch_of, oi_like_state  # noqa: E402
from mechanisms.batch import X_HIGH, X_LOW, ols, sufficient_stats  # noqa: E402
from mechanisms.intervals import Released, intervals  # noqa: E402
from mechanisms.noise import SeededRandomness  # noqa: E402
from mechanisms.sufficient_stats import noisy_stats_release  # noqa: E402

DEFAULT_THRESHOLD = 2.7911602803274804  # dpatlas/defaults: the calibrated dp-rule threshold


def released_by(mechanism: str, batch, eps: float, rand, reps: int, threshold: float):
    if mechanism == "NoisyStats":
        third = eps / 3
        out = noisy_stats_release(batch, third, third, third, rand, reps)
        p25 = np.where(out.failed, np.nan, out.p25)
        p75 = np.where(out.failed, np.nan, out.p75)
        return Released(p25, p75, out.extras["noisy_nvar"], third, third, third)
    if mechanism == "DPExpTheilSen":
        out = M.estimate_batch("DPExpTheilSen", batch, eps, rand=rand, reps=reps)
        return Released(out.p25, out.p75)
    rule = Rule("dp", threshold=threshold)
    sel = select(batch, eps, rule, rand, reps)
    out = run_selected(batch, rule, sel, rand, reps)
    eps_sel, rest = rule.budgets(eps)
    return Released(out.p25, out.p75, sel.noisy_nvar, eps_sel, rest / 2, rest / 2,
                    out.mechanism)


def summarise(res, truth: dict, n: np.ndarray, ols_width: dict, quintile: np.ndarray) -> dict:
    row = {}
    cov_all, pub_all, width_all = [], [], []
    for name in ("p25", "p75"):
        lo, hi = getattr(res, f"{name}_lo"), getattr(res, f"{name}_hi")
        published = np.isfinite(lo) & np.isfinite(hi)
        covered = (lo <= truth[name]) & (truth[name] <= hi)
        cov_all.append(np.where(published, covered, np.nan))
        pub_all.append(published)
        width_all.append(np.where(published, (hi - lo) / ols_width[name], np.nan))
    cov = np.stack(cov_all)  # (2, reps, T)
    row["coverage"] = np.nanmean(cov)
    for q in range(5):
        row[f"Q{q + 1}"] = np.nanmean(cov[..., quintile == q])
    row["unpublished"] = 1 - np.mean(np.stack(pub_all))
    w = np.stack(width_all)
    row["width/OLS"] = np.nanmedian(w[np.isfinite(w)]) if np.isfinite(w).any() else np.nan
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tracts", type=int, default=300)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=21, help="synthetic state seed (not the demo's 0)")
    ap.add_argument("--epsilons", default="1,8")
    ap.add_argument("--share", type=float, default=0.25,
                    help="share of each tract's epsilon spent on the interval")
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    ap.add_argument("--mechanisms", default="NoisyStats,DPExpTheilSen,rule")
    args = ap.parse_args(argv)
    if args.tracts < 5 or args.reps < 1 or not 0 < args.share < 1:
        print("error: need --tracts >= 5, --reps >= 1 and 0 < --share < 1", file=sys.stderr)
        return 2
    df = oi_like_state(args.seed, StateParams(n_tracts=args.tracts))
    batch = batch_of(df)
    truth_df = df.attrs["truth"].set_index("geoid").loc[batch.labels]
    slope, icpt = truth_df["slope"].to_numpy(), truth_df["intercept"].to_numpy()
    truth = {"p25": icpt + slope * X_LOW, "p75": icpt + slope * X_HIGH}
    n = batch.n
    fit = ols(sufficient_stats(batch))
    tq = student_t.ppf(0.5 + args.level / 2, np.maximum(n - 2, 1))
    ols_width = {"p25": 2 * tq * fit.se25, "p75": 2 * tq * fit.se75}
    quintile = pd.qcut(pd.Series(n).rank(method="first"), 5, labels=False).to_numpy()
    edges = [int(n[quintile == q].max()) for q in range(5)]
    print(f"seed {args.seed}, {args.tracts} tracts, {args.reps} runs per tract, level "
          f"{args.level}, interval share {args.share}; size quintiles up to n = {edges}")
    rows = []
    for eps in (float(e) for e in args.epsilons.split(",")):
        for mech in args.mechanisms.split(","):
            t0 = time.perf_counter()
            rand = SeededRandomness(zlib.crc32(f"{args.seed}/{eps}/{mech}".encode()))
            rel = released_by(mech, batch, (1 - args.share) * eps, rand, args.reps,
                              args.threshold)
            res = intervals(mech, batch, rel, args.share * eps, rand, args.level, args.reps)
            rows.append({"mechanism": mech, "epsilon": eps,
                         **summarise(res, truth, n, ols_width, quintile),
                         "seconds": time.perf_counter() - t0})
    table = pd.DataFrame(rows)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
