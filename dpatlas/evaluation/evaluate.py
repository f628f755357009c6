"""The paper's comparison, rebuilt: empirical error bounds of each estimator across tracts.

For a fixed synthetic state, each mechanism runs ``reps`` times per tract. The *empirical error
bound* of a tract is the 68th percentile over runs of ``|p̃25 − p̂25_OLS|`` (a failed run counts
as an infinite error, so failures are never hidden); we report its ratio to the OLS standard
error of p25, as an ECDF across tracts, per mechanism and ε.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

import mechanisms as M
from mechanisms.batch import ols, sufficient_stats

from dpatlas.evaluation.synthetic_input import StateParams, batch_of, oi_like_state

DEFAULT_MECHANISMS = (
    "NoisyStats", "NoisyIntercept", "DPExpTheilSen", "DPExpTheilSenMatch", "DPExpTheilSenkMatch",
    "DPWideTheilSen", "DPSSTheilSen", "DPGDPure", "DPGDzCDP", "DPGDApprox", "MOS",
    "BinAgg",  # rho = epsilon^2/2 zCDP, like DPGDzCDP: a weaker guarantee than epsilon-DP
    "FreeLunchSSP",  # add-remove eps/2-DP, i.e. eps-DP replace-one by group privacy (x2)
    "AdaSSP", "DDSSP",  # (epsilon, delta)-DP with delta = 1e-6, like DPGDApprox
    "ModulatedLR",  # not DP for the project's unit: local DP for x only, y public
)


@dataclass
class EvaluationResult:
    per_tract: pd.DataFrame  # one row per (mechanism, epsilon, tract)
    summary: pd.DataFrame  # one row per (mechanism, epsilon)
    crossover: dict
    params: dict


def error_ratios(est: M.BatchEstimate, ols_p25: np.ndarray, se25: np.ndarray) -> tuple:
    """Per tract: (68% empirical error bound, its ratio to the SE, failure rate)."""
    err = np.abs(est.p25 - ols_p25[None, :])
    err = np.where(est.failed, np.inf, err)
    bound = np.quantile(err, 0.68, axis=0, method="higher")
    return bound, bound / se25, est.failed.mean(axis=0)


def evaluate(mechanisms: Sequence[str] = DEFAULT_MECHANISMS, epsilons: Sequence[float] = (1.0, 8.0),
             reps: int = 100, seed: int = 0, params: StateParams = StateParams(),
             progress: Callable[[str], None] | None = None,
             extra_rows: dict[str, Callable] | None = None) -> EvaluationResult:
    """Run every mechanism ``reps`` times on every tract of one synthetic state.

    ``extra_rows``: name -> callable(batch, epsilon, reps, seed) returning a BatchEstimate-like
    object (p25, failed arrays of shape (reps, tracts)); used for selection rules.
    """
    batch = batch_of(oi_like_state(seed, params))
    truth = ols(sufficient_stats(batch)).p25
    return _evaluate_on(batch, truth, mechanisms, epsilons, reps, seed, progress, extra_rows,
                        {**params.as_dict(), "seed": seed, "reps": reps,
                         "epsilons": list(epsilons)})


# What a stress scenario's errors are measured against (dpatlas/evaluation/stress.py's estimand).
SCENARIO_ESTIMAND = ("the tract's own least-squares line (p25 of the line fitted on the "
                     "tract's records, clipped to [0, 1]), for every row; DPExpTheilSen's rows "
                     "estimate the Theil-Sen line, so their error includes its distance from "
                     "the least-squares line")


def evaluate_scenario(scenario: str, tracts: int, mechanisms: Sequence[str] = DEFAULT_MECHANISMS,
                      epsilons: Sequence[float] = (1.0, 8.0), reps: int = 100, seed: int = 0,
                      progress: Callable[[str], None] | None = None,
                      extra_rows: dict[str, Callable] | None = None) -> EvaluationResult:
    """As :func:`evaluate`, on a stress scenario of ``dpatlas/evaluation/stress.py`` (the large tracts'
    scenario with fewer tracts, as ``dpatlas evaluate-intervals`` draws it): each error is
    measured against the scenario's estimand (``SCENARIO_ESTIMAND``)."""
    from dpatlas.evaluation.interval_eval import scenario_tracts
    from dpatlas.evaluation.stress import scenario_state

    state = scenario_state(scenario, scenario_tracts(scenario, tracts), seed)
    # the census reading (the tract's own line), as SCENARIO_ESTIMAND says; the scenario's
    # expected outcome is ``state.truth`` (dpatlas/evaluation/stress.py)
    return _evaluate_on(state.batch, state.census["p25"], mechanisms, epsilons, reps, seed,
                        progress, extra_rows,
                        {**state.params, "scenario": scenario, "estimand": SCENARIO_ESTIMAND,
                         "reps": reps, "epsilons": list(epsilons)})


def _evaluate_on(batch, truth_p25: np.ndarray, mechanisms: Sequence[str],
                 epsilons: Sequence[float], reps: int, seed: int,
                 progress: Callable[[str], None] | None, extra_rows: dict[str, Callable] | None,
                 params: dict) -> EvaluationResult:
    """Every mechanism's error against ``truth_p25`` on the usable tracts of ``batch``."""
    st = sufficient_stats(batch)
    fit = ols(st)
    usable = (fit.ok & (batch.n >= 3) & np.isfinite(fit.se25) & (fit.se25 > 0)
              & np.isfinite(truth_p25))
    var_x = np.where(batch.n > 0, st.nvar / np.maximum(batch.n, 1), np.nan)
    rows = []
    runners: dict[str, Callable] = {
        name: (lambda b, e, r, s, _n=name: M.estimate_batch(_n, b, e, seed=s, reps=r))
        for name in mechanisms
    }
    runners.update(extra_rows or {})
    for eps in epsilons:
        for i, (name, run) in enumerate(runners.items()):
            t0 = time.perf_counter()
            est = run(batch, eps, reps, seed * 1000 + i)
            bound, ratio, fail = error_ratios(est, truth_p25, fit.se25)
            secs = time.perf_counter() - t0
            if progress:
                progress(f"eps={eps:g} {name}: {secs:.1f}s")
            rows.append(pd.DataFrame({
                "mechanism": name, "epsilon": eps, "geoid": batch.labels, "n": batch.n,
                "var_x": var_x, "n_eps_var": batch.n * eps * var_x, "se25": fit.se25,
                "error_bound": bound, "ratio": ratio, "failure_rate": fail, "usable": usable,
                "seconds": secs,
            }))
    per_tract = pd.concat(rows, ignore_index=True)
    per_tract = per_tract[per_tract["usable"]].drop(columns="usable")
    summary = (per_tract.groupby(["mechanism", "epsilon"], sort=False)
               .agg(tracts=("ratio", "size"),
                    share_below_se=("ratio", lambda r: float(np.mean(r < 1.0))),
                    median_ratio=("ratio", "median"),
                    mean_failure_rate=("failure_rate", "mean"),
                    seconds=("seconds", "first"))
               .reset_index())
    return EvaluationResult(per_tract, summary, find_crossover(per_tract), params)


def find_crossover(per_tract: pd.DataFrame, a: str = "NoisyStats", b: str = "DPExpTheilSen",
                   bins: int = 12) -> dict:
    """Where NoisyStats starts to beat DPExpTheilSen, as a function of n·ε·var(x).

    Tracts of all ε are pooled and binned by log n·ε·var(x); in each bin we compare the median
    error ratio of the two. The crossover is the geometric midpoint of the first bin, from which
    on NoisyStats is better in every bin above, and the bin below it.
    """
    pa = per_tract[per_tract.mechanism == a].set_index(["epsilon", "geoid"])
    pb = per_tract[per_tract.mechanism == b].set_index(["epsilon", "geoid"])
    both = pa[["n_eps_var", "ratio"]].join(pb[["ratio"]], rsuffix="_b", how="inner")
    both = both[np.isfinite(both.n_eps_var) & (both.n_eps_var > 0)]
    if both.empty:
        return {"threshold": None, "bins": []}
    edges = np.quantile(np.log(both.n_eps_var), np.linspace(0, 1, bins + 1))
    idx = np.clip(np.searchsorted(edges, np.log(both.n_eps_var), side="right") - 1, 0, bins - 1)
    table = []
    for k in range(bins):
        sel = both[idx == k]
        if sel.empty:
            continue
        table.append({"lo": float(np.exp(edges[k])), "hi": float(np.exp(edges[k + 1])),
                      "tracts": int(len(sel)),
                      f"median_ratio_{a}": float(np.median(sel.ratio)),
                      f"median_ratio_{b}": float(np.median(sel.ratio_b))})
    better = [r[f"median_ratio_{a}"] < r[f"median_ratio_{b}"] for r in table]
    threshold = None
    for k in range(len(table)):
        if all(better[k:]) and (k == 0 or not better[k - 1]):
            threshold = float(np.sqrt(table[k]["lo"] * (table[k - 1]["hi"] if k else table[k]["lo"])))
            break
    return {"threshold": threshold, "bins": table}


def load_report(out: Path) -> EvaluationResult:
    """Read back what ``write_report`` wrote (to re-plot without re-running)."""
    data = json.loads((out / "crossover.json").read_text())
    return EvaluationResult(pd.read_csv(out / "per_tract.csv", dtype={"geoid": str}),
                            pd.read_csv(out / "summary.csv"), data["crossover"], data["params"])


def write_report(result: EvaluationResult, out: Path) -> list[Path]:
    """Table (CSV + Markdown), per-tract CSV, JSON with the crossover, and PNG plots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    result.summary.to_csv(out / "summary.csv", index=False)
    result.per_tract.to_csv(out / "per_tract.csv", index=False)
    (out / "summary.md").write_text(result.summary.to_markdown(index=False, floatfmt=".3f")
                                    if _has_tabulate() else result.summary.to_string(index=False))
    (out / "crossover.json").write_text(json.dumps(
        {"crossover": result.crossover, "params": result.params}, indent=2, default=float))
    paths += [out / "summary.csv", out / "per_tract.csv", out / "summary.md", out / "crossover.json"]
    names = list(dict.fromkeys(result.per_tract["mechanism"]))
    colours = dict(zip(names, plt.cm.tab20(np.linspace(0, 1, max(len(names), 2)))))
    for eps, grp in result.per_tract.groupby("epsilon"):
        fig, ax = plt.subplots(figsize=(8, 5))
        for name, g in grp.groupby("mechanism", sort=False):
            r = np.sort(np.where(np.isfinite(g.ratio), g.ratio, 1e9))
            private = name in M.REGISTRY and M.get(name).private or name.startswith("Selection")
            ax.step(r, np.arange(1, r.size + 1) / r.size, where="post", color=colours[name],
                    ls="-" if private else ":", label=name if private else f"{name} (not DP)")
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlim(1e-2, 1e2)
        ax.set_xlabel("68% empirical error bound / OLS standard error of p25")
        ax.set_ylabel("share of tracts (ECDF)")
        ax.set_title(f"{_state_title(result.params)}, epsilon = {eps:g} per tract")
        ax.legend(fontsize=7, loc="lower right")
        p = out / f"ecdf_eps{eps:g}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    bins = result.crossover.get("bins", [])
    if bins:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        mid = [np.sqrt(b["lo"] * b["hi"]) for b in bins]
        for key in [k for k in bins[0] if k.startswith("median_ratio_")]:
            ax.plot(mid, [b[key] for b in bins], marker="o", label=key.replace("median_ratio_", ""))
        if result.crossover.get("threshold"):
            ax.axvline(result.crossover["threshold"], color="k", ls="--", lw=0.8,
                       label=f"crossover ~ {result.crossover['threshold']:.3g}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n * epsilon * var(x)")
        ax.set_ylabel("median error bound / SE")
        ax.legend()
        p = out / "crossover.png"
        fig.tight_layout()
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def _state_title(params: dict) -> str:
    scenario = params.get("scenario")
    return f"Stress scenario '{scenario}'" if scenario else "Synthetic Illinois-like state"


def scenario_summary(results: dict[str, EvaluationResult]) -> pd.DataFrame:
    """The scenarios' summaries in one table, the scenario as its first column."""
    return pd.concat([r.summary.assign(scenario=name) for name, r in results.items()],
                     ignore_index=True).pipe(lambda df: df[["scenario", *df.columns[:-1]]])


def write_scenario_reports(results: dict[str, EvaluationResult], out: Path) -> list[Path]:
    """Each scenario's report in ``out/<scenario>/`` (as :func:`write_report`), and all their
    summaries in ``out/summary.csv`` and ``out/summary.md`` (headed by the estimand)."""
    paths = []
    for name, result in results.items():
        paths += write_report(result, out / name)
    table = scenario_summary(results)
    table.to_csv(out / "summary.csv", index=False)
    first = next(iter(results.values())).params
    body = (table.to_markdown(index=False, floatfmt=".3f") if _has_tabulate()
            else table.to_string(index=False))
    (out / "summary.md").write_text(
        "# dpatlas evaluate: stress scenarios\n\n"
        f"Error of each row's p25 measured against {SCENARIO_ESTIMAND}. Per tract: the 68% "
        "empirical error bound over runs (a failed run is an infinite error), over the OLS "
        "standard error of p25; share_below_se and median_ratio over the usable tracts.\n\n"
        f"reps {first['reps']}, seed {first['seed']}, tracts per scenario: "
        + ", ".join(f"{n} {r.params['tracts']}" for n, r in results.items()) + "\n\n"
        + body + "\n")
    return paths + [out / "summary.csv", out / "summary.md"]


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False
