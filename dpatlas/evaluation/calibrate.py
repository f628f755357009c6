"""Calibrating the selection threshold on synthetic data (never on the data being released).

For the ``dp`` rule the threshold is on the noisy indicator ``ε·nvar~`` (the paper's n·ε·var(x)
computed from the selection's own noisy release); for the ``public`` rule it is on ``n``. For
each candidate threshold we run the rule as it runs in a release (same budget split, NoisyStats
reusing the selection's noisy nvar) many times on every tract of several synthetic states, and
pick the threshold with the smallest geometric mean, over the calibration ε values, of the
median across tracts of the 68% empirical error bound of p25 over the OLS standard error (each
ε weighs the same, whatever its error scale). The synthetic states use seeds of their own, so the default
demo state (seed 0) is never seen by the calibration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import yaml

import mechanisms as M
from mechanisms.batch import ols, sufficient_stats
from mechanisms.noise import SeededRandomness
from mechanisms.sufficient_stats import noisy_nvar, noisy_stats_release

from dpatlas.core.files import now_utc
from dpatlas.evaluation.synthetic_input import StateParams, batch_of, oi_like_state

CALIBRATION_SEEDS = (101, 102, 103)


def _bound_ratio(p25: np.ndarray, failed: np.ndarray, ols_p25, se25) -> np.ndarray:
    err = np.where(failed | ~np.isfinite(p25), np.inf, np.abs(p25 - ols_p25[None, :]))
    return np.quantile(err, 0.68, axis=0, method="higher") / se25


def calibrate(epsilons: Sequence[float] = (1.0, 8.0), seeds: Sequence[int] = CALIBRATION_SEEDS,
              tracts: int = 1000, reps: int = 50, share: float = 0.1,
              progress: Callable[[str], None] | None = None) -> dict:
    dp_grid = np.geomspace(1.0, 3000.0, 40)
    n_grid = np.unique(np.geomspace(2, 1000, 40).astype(int))
    dp_ratios = {t: {e: [] for e in epsilons} for t in dp_grid}
    n_ratios = {t: {e: [] for e in epsilons} for t in n_grid}
    for seed in seeds:
        batch = batch_of(oi_like_state(seed, StateParams(n_tracts=tracts)))
        fit = ols(sufficient_stats(batch))
        keep = fit.ok & (batch.n >= 3) & np.isfinite(fit.se25) & (fit.se25 > 0)
        for eps in epsilons:
            rand = SeededRandomness(seed * 7919 + int(eps * 1000))
            # dp rule: one selection draw, both mechanisms with the remaining budget.
            eps_rest = (1 - share) * eps
            nvar_t = noisy_nvar(batch, share * eps, rand, reps)
            ns = noisy_stats_release(batch, 0.0, eps_rest / 2, eps_rest / 2, rand, reps,
                                     nvar_released=nvar_t)
            ex = M.estimate_batch("DPExpTheilSen", batch, eps_rest, rand=rand, reps=reps)
            for t in dp_grid:
                use = eps * nvar_t >= t
                p25 = np.where(use, ns.p25, ex.p25)
                failed = np.where(use, ns.failed, ex.failed)
                dp_ratios[t][eps].append(_bound_ratio(p25, failed, fit.p25, fit.se25)[keep])
            # public rule on n: the mechanisms with the whole budget.
            ns_full = M.estimate_batch("NoisyStats", batch, eps, rand=rand, reps=reps)
            ex_full = M.estimate_batch("DPExpTheilSen", batch, eps, rand=rand, reps=reps)
            r_ns = _bound_ratio(ns_full.p25, ns_full.failed, fit.p25, fit.se25)
            r_ex = _bound_ratio(ex_full.p25, ex_full.failed, fit.p25, fit.se25)
            for t in n_grid:
                n_ratios[t][eps].append(np.where(batch.n >= t, r_ns, r_ex)[keep])
            if progress:
                progress(f"calibration state seed={seed} eps={eps:g} done")

    def best(ratios: dict) -> tuple[float, list[dict]]:
        curve = []
        for t, by_eps in ratios.items():
            med = {f"{e:g}": float(np.median(np.concatenate(r))) for e, r in by_eps.items()}
            score = float(np.exp(np.mean(np.log(list(med.values())))))
            curve.append({"threshold": float(t), "score": score, "median_ratio_by_epsilon": med})
        top = min(curve, key=lambda c: (c["score"], c["threshold"]))
        return top["threshold"], curve

    dp_t, dp_curve = best(dp_ratios)
    n_t, n_curve = best(n_ratios)
    return {
        "created": now_utc(),
        "method": "minimise the geometric mean over epsilons of the median over tracts (pooled "
                  "over synthetic states) of (68% empirical error bound of p25 / OLS standard "
                  "error)",
        "synthetic_states": {"seeds": list(seeds), "tracts": tracts,
                             "params": StateParams(n_tracts=tracts).as_dict()},
        "epsilons": list(epsilons), "reps": reps, "selection_budget_share": share,
        "rules": {
            "dp": {"threshold": dp_t, "indicator": "epsilon * noisy n*var(x)",
                   "curve": dp_curve},
            "public": {"threshold": n_t, "indicator": "n", "curve": n_curve},
        },
    }


def write_thresholds(result: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# written by `dpatlas calibrate`; name this file in selection.threshold_file\n"
                    + yaml.safe_dump(result, sort_keys=False))
    return path
