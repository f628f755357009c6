"""Coverage of the DP confidence intervals (mechanisms/intervals.py) on synthetic states.

Per scenario (dpatlas/evaluation/stress.py: the demo generator and the stress scenarios), mechanism
(NoisyStats, DPExpTheilSen, the calibrated dp selection rule) and total ε per tract, the
mechanism runs at (1 − share)·ε and its interval at share·ε, as in a release; over R runs per
tract: the share of published intervals that cover the row's estimand (``ESTIMAND``; the
tract's least-squares line for NoisyStats), overall, by tract-size quintile, by
interval-width quintile and among the intervals counted reliable (width at most the
config's ``low_reliability_width``), the shares of reliable and of [0, 1] intervals, of
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
from mechanisms.sufficient_stats import noisy_stats_release, noisy_stats_split

from dpatlas.release.selection import Rule, run_selected, select

MECHANISMS = ("NoisyStats", "DPExpTheilSen", "rule")


def released_by(mechanism: str, batch, eps: float, rand, reps: int, threshold: float):
    if mechanism == "NoisyStats":
        eps_nvar, eps_ncov, eps_intercept = noisy_stats_split(eps)
        out = noisy_stats_release(batch, eps_nvar, eps_ncov, eps_intercept, rand, reps)
        p25 = np.where(out.failed, np.nan, out.p25)
        p75 = np.where(out.failed, np.nan, out.p75)
        return Released(p25, p75, out.extras["noisy_nvar"], eps_nvar, eps_ncov, eps_intercept)
    if mechanism == "DPExpTheilSen":
        out = M.estimate_batch("DPExpTheilSen", batch, eps, rand=rand, reps=reps)
        return Released(out.p25, out.p75, eps_theil_sen=eps)
    rule = Rule("dp", threshold=threshold)
    sel = select(batch, eps, rule, rand, reps)
    out = run_selected(batch, rule, sel, rand, reps)
    eps_sel, rest = rule.budgets(eps)
    return Released(out.p25, out.p75, sel.noisy_nvar, eps_sel, rest / 2, rest / 2,
                    out.mechanism, nvar_floor=threshold / eps,  # NoisyStats where eps·nvar~ >= t
                    eps_theil_sen=rest)  # DPExpTheilSen ran with what the selection left


# Which line each mechanism's published p25/p75 estimates (its estimand; docs/uncertainty.md).
LEAST_SQUARES, THEIL_SEN = "least-squares line", "Theil-Sen line"
ESTIMAND = {"NoisyStats": LEAST_SQUARES, "DPExpTheilSen": THEIL_SEN}
RELIABLE_WIDTH = 0.5  # the config's default intervals.low_reliability_width: wider is not reliable
# Large tracts have ~30 times the records (and ~700 times the pairs) of the others: the
# evaluation keeps their records, not their tract count, comparable.
TRACT_SHARE = {"large": 1 / 6}


def scenario_tracts(scenario: str, tracts: int) -> int:
    return max(10, int(round(tracts * TRACT_SHARE.get(scenario, 1.0))))


ESTIMANDS = ("expected", "census")  # what coverage is scored against (module doc)
SE_Z = 1.959963984540054  # value ± SE_Z·se: the normal 95% reading of a standard error
USABLE_WIDTHS = (0.2, 0.5)


def _truth_lines(state) -> dict[str, dict[str, np.ndarray]]:
    """The census readings: each mechanism's line of the tract's own records."""
    from dpatlas.evaluation.stress import theil_sen_line

    lines = {LEAST_SQUARES: state.census}
    if THEIL_SEN in ESTIMAND.values():
        lines[THEIL_SEN] = theil_sen_line(state.batch)
    return lines


def truth_of(mech: str, lines: dict, rel: Released, shape: tuple) -> dict[str, np.ndarray]:
    """The estimand of every published row, arrays (reps, tracts): the rule's rows take the
    estimand of the mechanism each chose."""
    out = {}
    for name in ("p25", "p75"):
        if mech != "rule":
            out[name] = np.broadcast_to(lines[ESTIMAND[mech]][name], shape)
            continue
        chose_ns = np.asarray(rel.mechanism) == "NoisyStats"
        out[name] = np.where(chose_ns, lines[ESTIMAND["NoisyStats"]][name],
                             lines[ESTIMAND["DPExpTheilSen"]][name])
    return out


def _quintile_of(values: np.ndarray) -> np.ndarray:
    """Quintile 0..4 of each value by rank (ties split by position, so five equal groups)."""
    return pd.qcut(pd.Series(values).rank(method="first"), 5, labels=False).to_numpy()


def _share(hits: np.ndarray, mask: np.ndarray) -> float:
    return float(hits[mask].mean()) if mask.any() else np.nan


def _extreme(t: np.ndarray) -> np.ndarray:
    """Entries whose true value is in the bottom or top decile (of the finite ones)."""
    finite = t[np.isfinite(t)]
    if finite.size == 0:
        return np.zeros(t.shape, dtype=bool)
    low, high = np.quantile(finite, [0.1, 0.9])
    return np.isfinite(t) & ((t <= low) | (t >= high))


def _se_calibration(err: np.ndarray, se: np.ndarray, size_q: np.ndarray) -> dict:
    """Share of value ± SE_Z·se covering the truth, overall and per size quintile; RMSE and
    RMSE over the root mean square SE (1 where the SEs have the errors' size). ``err``:
    value − truth where both and the SE are defined, else NaN."""
    ok = np.isfinite(err) & np.isfinite(se)
    hit, e, s, q = np.abs(err[ok]) <= SE_Z * se[ok], err[ok], se[ok], size_q[ok]
    row = {"SE cover": _share(hit, np.ones_like(hit))}
    for k in range(5):
        row[f"SE Q{k + 1}"] = _share(hit, q == k)
    row["worst SE Q"] = np.nanmin([row[f"SE Q{k + 1}"] for k in range(5)])
    rmse = float(np.sqrt(np.mean(e ** 2))) if e.size else np.nan
    row["RMSE"] = rmse
    row["RMSE/SE"] = rmse / float(np.sqrt(np.mean(s ** 2))) if e.size else np.nan
    return row


def summarise(res, truth: dict, n: np.ndarray, ols_width: dict, quintile: np.ndarray,
              per_tract: list | None = None, label: tuple = (),
              reliable_width: float = RELIABLE_WIDTH, values: dict | None = None,
              ses: dict | None = None) -> dict:
    """Coverage of the published intervals whose estimand is defined, pooled over p25 and
    p75: overall, per tract-size quintile (Q1..Q5), per interval-width quintile (W1..W5, over
    the published intervals), in the extreme deciles of the true value, among the intervals
    the map shows as reliable (width <= ``reliable_width``); the median width, the usable
    shares (width <= 0.2, 0.5) and the shares of reliable and of [0, 1] intervals. With the
    published ``values`` and their ``ses`` (dicts of (reps, tracts) arrays): the SE
    calibration (``_se_calibration``)."""
    cov, pub, wid, rel_w, size_q, ext, err, se = [], [], [], [], [], [], [], []
    for name in ("p25", "p75"):
        lo, hi = getattr(res, f"{name}_lo"), getattr(res, f"{name}_hi")
        t = np.broadcast_to(truth[name], lo.shape)
        published = np.isfinite(lo) & np.isfinite(hi)
        cov.append(np.where(published & np.isfinite(t), (lo <= t) & (t <= hi), np.nan))
        pub.append(published)
        wid.append(np.where(published, hi - lo, np.nan))
        rel_w.append(np.where(published, (hi - lo) / ols_width[name], np.nan))
        size_q.append(np.broadcast_to(quintile, lo.shape))
        ext.append(_extreme(t))
        if values is not None and ses is not None:
            v = np.clip(values[name], 0.0, 1.0)  # the published value is clipped to [0, 1]
            err.append(np.where(published, v - t, np.nan))
            se.append(np.where(published, ses[name], np.nan))
    cov, pub, wid, size_q, ext = (np.stack(a) for a in (cov, pub, wid, size_q, ext))
    if per_tract is not None:
        with warnings.catch_warnings():  # a tract with nothing published: NaN, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            tract_cov = np.nanmean(cov.reshape(-1, cov.shape[-1]), axis=0)
        per_tract.append(pd.DataFrame({"scenario": label[0], "mechanism": label[1],
                                       "epsilon": label[2], "n": n, "coverage": tract_cov}))
    counted = np.isfinite(cov)
    hits, width, sq = cov[counted] == 1, wid[counted], size_q[counted]
    row = {"coverage": _share(hits, np.ones_like(hits))}
    row["extreme deciles"] = _share(hits, ext[counted])
    for q in range(5):
        row[f"Q{q + 1}"] = _share(hits, sq == q)
    wq = _quintile_of(width) if width.size >= 5 else np.zeros(width.size, dtype=int)
    for q in range(5):
        row[f"W{q + 1}"] = _share(hits, wq == q)
    row["worst Q"] = np.nanmin([row[f"Q{q + 1}"] for q in range(5)])
    row["worst W"] = np.nanmin([row[f"W{q + 1}"] for q in range(5)])
    reliable = width <= reliable_width
    row["reliable"] = _share(hits, reliable)
    row["reliable share"] = float(reliable.mean()) if width.size else np.nan
    row["reliable intervals"] = int(reliable.sum())
    row["median width"] = float(np.median(width)) if width.size else np.nan
    for w in USABLE_WIDTHS:
        row[f"width<={w:g}"] = float(np.mean(width <= w)) if width.size else np.nan
    row["[0,1] share"] = float(np.mean(width >= 1.0)) if width.size else np.nan
    row["unpublished"] = 1 - float(np.mean(pub))
    w = np.stack(rel_w)
    row["width/OLS"] = np.nanmedian(w[np.isfinite(w)]) if np.isfinite(w).any() else np.nan
    row["intervals"] = int(counted.sum())
    if err:
        row.update(_se_calibration(np.stack(err), np.stack(se), size_q))
    return row


def evaluate_intervals(tracts: int = 3108, reps: int = 100, seed: int = 21,
                       epsilons: Sequence[float] = (1.0, 8.0), share: float = 0.25,
                       level: float = 0.95, threshold: float | None = None,
                       mechanisms: Sequence[str] = MECHANISMS,
                       progress: Callable[[str], None] = lambda m: None,
                       scenarios: Sequence[str] = ("demo",),
                       reliable_width: float = RELIABLE_WIDTH, estimand: str = "expected"):
    """(summary table, per-tract coverage table, quintile upper edges per scenario); coverage
    and SEs scored against ``estimand`` (``ESTIMANDS``, module doc)."""
    from dpatlas.evaluation.stress import SCENARIOS, scenario_state

    if seed == 0:
        raise ValueError("seed 0 is the demo state's: evaluate on another synthetic state")
    if tracts < 5 or reps < 1 or not 0 < share < 1:
        raise ValueError("need tracts >= 5, reps >= 1 and 0 < share < 1")
    if estimand not in ESTIMANDS:
        raise ValueError(f"unknown estimand {estimand!r}; known: {', '.join(ESTIMANDS)}")
    bad = [s for s in scenarios if s not in SCENARIOS]
    if bad or not scenarios:
        raise ValueError(f"unknown scenario(s) {bad}; known: {', '.join(SCENARIOS)}")
    if threshold is None:
        from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_threshold
        from dpatlas.core.config import SelectionConfig

        threshold = resolve_threshold(SelectionConfig(rule="dp",
                                                      threshold_file=DEFAULT_THRESHOLDS))
    rows, per_tract, edges = [], [], {}
    for scenario in scenarios:
        state = scenario_state(scenario, scenario_tracts(scenario, tracts), seed)
        batch, n = state.batch, state.batch.n
        lines = _truth_lines(state)
        fit = ols(sufficient_stats(batch))
        tq = student_t.ppf(0.5 + level / 2, np.maximum(n - 2, 1))
        ols_width = {"p25": 2 * tq * fit.se25, "p75": 2 * tq * fit.se75}
        quintile = _quintile_of(n)
        edges[scenario] = [int(n[quintile == q].max()) for q in range(5)]
        for eps in epsilons:
            for mech in mechanisms:
                t0 = time.perf_counter()
                rand = SeededRandomness(zlib.crc32(f"{scenario}/{seed}/{eps}/{mech}".encode()))
                rel = released_by(mech, batch, (1 - share) * eps, rand, reps, threshold)
                res = intervals(mech, batch, rel, share * eps, rand, level, reps)
                census = truth_of(mech, lines, rel, (reps, batch.n_tracts))
                scored, other = ((state.truth, census) if estimand == "expected"
                                 else (census, state.truth))
                row = summarise(res, scored, n, ols_width, quintile, per_tract,
                                (scenario, mech, eps), reliable_width,
                                {"p25": rel.p25, "p75": rel.p75},
                                {"p25": res.p25_se, "p75": res.p75_se})
                # for the record: coverage of the other reading
                row["coverage of " + ESTIMANDS[estimand == "expected"]] = summarise(
                    res, other, n, ols_width, quintile)["coverage"]
                rows.append({"scenario": scenario, "mechanism": mech, "epsilon": eps,
                             "estimand": estimand, **row,
                             "seconds": time.perf_counter() - t0})
                r = rows[-1]
                progress(f"{scenario}: {mech} at epsilon {eps:g}: coverage {r['coverage']:.3f}, "
                         f"SE cover {r['SE cover']:.3f}, reliable {r['reliable']:.3f} "
                         f"({r['seconds']:.0f}s)")
    return pd.DataFrame(rows), pd.concat(per_tract, ignore_index=True), edges


def _markdown(df: pd.DataFrame) -> str:
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row]
             for row in df.itertuples(index=False)]
    head = "| " + " | ".join(df.columns) + " |"
    rule = "| " + " | ".join("---" for _ in df.columns) + " |"
    return "\n".join([head, rule] + ["| " + " | ".join(c) + " |" for c in cells])


# The issue 32 table: what a reader of a value and its SE relies on, one row per scenario and
# mechanism, one table per ε.
KEY_COLUMNS = ("coverage", "worst Q", "worst W", "extreme deciles", "SE cover", "SE Q1",
               "SE Q2", "SE Q3", "SE Q4", "SE Q5", "RMSE/SE", "median width", "width<=0.2",
               "width<=0.5")


def key_tables(summary: pd.DataFrame) -> str:
    """The key columns (``KEY_COLUMNS`` and the other reading's coverage) as one markdown
    table per ε."""
    other = [c for c in summary.columns if c.startswith("coverage of ")]
    parts = []
    for eps, part in summary.groupby("epsilon", sort=True):
        cols = ["scenario", "mechanism", *[c for c in KEY_COLUMNS if c in part], *other]
        parts.append(f"### ε = {eps:g} (scored against: {part['estimand'].iloc[0]})\n\n"
                     + _markdown(part[cols]))
    return "\n\n".join(parts)


def write_interval_report(summary: pd.DataFrame, per_tract: pd.DataFrame, edges: dict,
                          out: Path) -> list[Path]:
    """summary.csv, summary.md (the key tables, then every column), per_tract.csv and
    coverage_by_n.png in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.csv", out / "summary.md", out / "per_tract.csv",
             out / "coverage_by_n.png"]
    summary.to_csv(paths[0], index=False)
    sizes = "\n".join(f"- {s}: tract-size quintiles up to n = {e}" for s, e in edges.items())
    paths[1].write_text(sizes + "\n\n" + key_tables(summary) + "\n\n### Every column\n\n"
                        + _markdown(summary) + "\n")
    per_tract.to_csv(paths[2], index=False)
    groups = list(per_tract.groupby(["scenario", "epsilon"], sort=False))
    cols = 2
    rows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(10, 3.2 * rows), sharey=True, squeeze=False)
    for ax, ((scenario, eps), grp) in zip(axes.ravel(), groups):
        bins = np.unique(np.quantile(grp["n"], np.linspace(0, 1, 11)))
        for mech, g in grp.groupby("mechanism"):
            cut = pd.cut(g["n"], bins, include_lowest=True)
            mean = g.groupby(cut, observed=True)["coverage"].mean()
            ax.plot([iv.mid for iv in mean.index], mean.to_numpy(), marker="o", label=mech)
        ax.axhline(0.95, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_title(f"{scenario}, epsilon = {eps:g} per tract", fontsize=9)
        ax.set_xlabel("records in the tract (n)")
    for ax in axes.ravel()[len(groups):]:
        ax.set_visible(False)
    axes[0, 0].set_ylabel("coverage of the 95% interval")
    axes[0, 0].legend()
    fig.tight_layout()
    fig.savefig(paths[3], dpi=90)
    plt.close(fig)
    return paths
