"""Coverage of the DP confidence intervals (mechanisms/intervals.py) on synthetic states.

Per mechanism (NoisyStats, DPExpTheilSen, the calibrated dp selection rule) and total ε per
tract, the mechanism runs at (1 − share)·ε and its interval at share·ε, as in a release; over
R runs per tract: the share of published intervals that cover the tract's TRUE prediction
α + β·x* (the generator's population line), overall and by tract-size quintile, the share of
tract-runs with nothing published, and the median width relative to the OLS 95% interval of
the same tract. The synthetic state's seed is never the demo's (0).
"""

from __future__ import annotations

import time
import warnings
import zlib
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

import mechanisms as M
from mechanisms.batch import X_HIGH, X_LOW, ols, sufficient_stats
from mechanisms.intervals import Released, intervals
from mechanisms.noise import SeededRandomness
from mechanisms.sufficient_stats import noisy_stats_release

from .selection import Rule, run_selected, select
from .synth import StateParams, batch_of, oi_like_state

MECHANISMS = ("NoisyStats", "DPExpTheilSen", "rule")


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


def summarise(res, truth: dict, n: np.ndarray, ols_width: dict, quintile: np.ndarray,
              per_tract: list | None = None, label: tuple = ()) -> dict:
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
    if per_tract is not None:
        with warnings.catch_warnings():  # a tract with nothing published: NaN, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            tract_cov = np.nanmean(cov.reshape(-1, cov.shape[-1]), axis=0)
        per_tract.append(pd.DataFrame({"mechanism": label[0], "epsilon": label[1], "n": n,
                                       "coverage": tract_cov}))
    row["coverage"] = np.nanmean(cov)
    for q in range(5):
        row[f"Q{q + 1}"] = np.nanmean(cov[..., quintile == q])
    row["unpublished"] = 1 - np.mean(np.stack(pub_all))
    w = np.stack(width_all)
    row["width/OLS"] = np.nanmedian(w[np.isfinite(w)]) if np.isfinite(w).any() else np.nan
    return row


def evaluate_intervals(tracts: int = 3108, reps: int = 100, seed: int = 21,
                       epsilons: Sequence[float] = (1.0, 8.0), share: float = 0.25,
                       level: float = 0.95, threshold: float | None = None,
                       mechanisms: Sequence[str] = MECHANISMS,
                       progress: Callable[[str], None] = lambda m: None):
    """(summary table, per-tract coverage table, quintile upper edges)."""
    if seed == 0:
        raise ValueError("seed 0 is the demo state's: evaluate on another synthetic state")
    if tracts < 5 or reps < 1 or not 0 < share < 1:
        raise ValueError("need tracts >= 5, reps >= 1 and 0 < share < 1")
    if threshold is None:
        from .calibrate import DEFAULT_THRESHOLDS, resolve_threshold
        from .config import SelectionConfig

        threshold = resolve_threshold(SelectionConfig(rule="dp",
                                                      threshold_file=DEFAULT_THRESHOLDS))
    df = oi_like_state(seed, StateParams(n_tracts=tracts))
    batch = batch_of(df)
    truth_df = df.attrs["truth"].set_index("geoid").loc[batch.labels]
    slope, icpt = truth_df["slope"].to_numpy(), truth_df["intercept"].to_numpy()
    truth = {"p25": icpt + slope * X_LOW, "p75": icpt + slope * X_HIGH}
    n = batch.n
    fit = ols(sufficient_stats(batch))
    tq = student_t.ppf(0.5 + level / 2, np.maximum(n - 2, 1))
    ols_width = {"p25": 2 * tq * fit.se25, "p75": 2 * tq * fit.se75}
    quintile = pd.qcut(pd.Series(n).rank(method="first"), 5, labels=False).to_numpy()
    edges = [int(n[quintile == q].max()) for q in range(5)]
    rows, per_tract = [], []
    for eps in epsilons:
        for mech in mechanisms:
            t0 = time.perf_counter()
            rand = SeededRandomness(zlib.crc32(f"{seed}/{eps}/{mech}".encode()))
            rel = released_by(mech, batch, (1 - share) * eps, rand, reps, threshold)
            res = intervals(mech, batch, rel, share * eps, rand, level, reps)
            rows.append({"mechanism": mech, "epsilon": eps,
                         **summarise(res, truth, n, ols_width, quintile, per_tract,
                                     (mech, eps)),
                         "seconds": time.perf_counter() - t0})
            progress(f"{mech} at epsilon {eps:g}: coverage {rows[-1]['coverage']:.3f}")
    return pd.DataFrame(rows), pd.concat(per_tract, ignore_index=True), edges


def _markdown(df: pd.DataFrame) -> str:
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
             for row in df.itertuples(index=False)]
    head = "| " + " | ".join(df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    return "\n".join([head, rule] + ["| " + " | ".join(c) + " |" for c in cells])


def write_interval_report(summary: pd.DataFrame, per_tract: pd.DataFrame, edges: list[int],
                          out: Path) -> list[Path]:
    """summary.csv, summary.md, per_tract.csv and coverage_by_n.png in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.csv", out / "summary.md", out / "per_tract.csv",
             out / "coverage_by_n.png"]
    summary.to_csv(paths[0], index=False)
    paths[1].write_text(f"Tract-size quintiles up to n = {edges}\n\n"
                        + _markdown(summary) + "\n")
    per_tract.to_csv(paths[2], index=False)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    bins = np.unique(np.quantile(per_tract["n"], np.linspace(0, 1, 11)))
    for ax, (eps, grp) in zip(axes, per_tract.groupby("epsilon")):
        for mech, g in grp.groupby("mechanism"):
            cut = pd.cut(g["n"], bins, include_lowest=True)
            mean = g.groupby(cut, observed=True)["coverage"].mean()
            mid = [iv.mid for iv in mean.index]
            ax.plot(mid, mean.to_numpy(), marker="o", label=mech)
        ax.axhline(0.95, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"epsilon = {eps:g} per tract")
        ax.set_xlabel("records in the tract (n)")
    axes[0].set_ylabel("coverage of the 95% interval")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(paths[3], dpi=110)
    plt.close(fig)
    return paths
