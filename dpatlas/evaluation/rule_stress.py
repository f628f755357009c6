"""Does the selection rule lose to a fixed mechanism? (issue 18, item 4). Research code: the
release path never imports this module.

On every scenario of ``dpatlas/evaluation/stress.py`` (the demo generator among them) and each ε, per
tract: the 68% empirical error bound over repetitions of p25 against the tract's expected
outcome (the scenario's estimand, issue 32; ``census=True``: the tract's own least-squares
p25, the estimand before it), over the OLS standard error (failures count as infinite error),
exactly as ``dpatlas/evaluation/evaluate.py`` computes it; the median over all tracts and per tract-size
quintile, for fixed NoisyStats, fixed DPExpTheilSen, today's ``dp`` rule and the ``banded``
rule. Requirement: the rule's median over all tracts is no worse than the better fixed
mechanism's, and in every quintile no worse than 1.05 times the better one's in that quintile.
The evaluation also scores the RMSE of the published (clipped) p25 against the same truth,
over all tract-runs and per quintile, a failure scored as 0.5 (the centre of [0, 1], all a
reader knows without a value), with the same requirement (``rmse_summary``).

Common random numbers. Where the banded rule runs a mechanism with the whole budget (a band
that names it; a function of the public n only), its release has exactly the law of that
fixed mechanism's, so the evaluation reuses the fixed mechanism's draws there (as
``dpatlas/evaluation/calibrate.py`` scores the public rule); only the dp band draws its own noise (the
selection's nvar, NoisyStats reusing it, DPExpTheilSen with the rest). The comparison is then
not swamped by Monte Carlo noise in the tracts where rule and mechanism are the same.
``tests/test_rule_stress.py`` checks that this simulation and ``selection.apply_rule`` agree
in law.

Calibration (``calibrate_bands``): per ε, every rule with up to three bands of n (bounds from
a grid) whose choices are NoisyStats, DPExpTheilSen or the dp band (threshold from a grid),
scored on the calibration seeds' scenarios by its worst violation of the requirement over
scenarios (then by the mean ratio of its overall median to the better fixed mechanism's).
The evaluation runs on other seeds.
"""

from __future__ import annotations

import itertools
import math
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd

import mechanisms as M
from mechanisms.batch import ols, sufficient_stats
from mechanisms.noise import SeededRandomness
from mechanisms.sufficient_stats import noisy_nvar, noisy_stats_release

from dpatlas.release.selection import DP_BAND, EXP_THEIL_SEN, NOISY_STATS, Bands, Rule
from dpatlas.evaluation.stress import RULE_CALIBRATION_SCENARIOS, SCENARIOS, scenario_state

CALIBRATION_SEEDS = (101, 102)  # the evaluation's default seed is 0 (never calibrated on)
EVALUATION_SEED = 0
EPSILONS = (1.0, 8.0)
QUINTILES = ("Q1", "Q2", "Q3", "Q4", "Q5")
SLACK = 1.05  # a quintile may be this much worse than the better fixed mechanism's
N_GRID = (10, 15, 20, 30, 45, 70, 100, 150, 250, 400, 700, 1200)
THRESHOLD_GRID = (1.0, 2.79, 5.0, 10.0, 20.0)
FIXED = (NOISY_STATS, EXP_THEIL_SEN)


@dataclass
class Draws:
    """One scenario at one ε: what every branch a rule may take released, on usable tracts."""

    n: np.ndarray
    truth: np.ndarray
    se25: np.ndarray
    epsilon: float
    full: dict[str, np.ndarray]  # mechanism -> p25 (reps, tracts) with the whole budget
    nvar_sel: np.ndarray  # the dp band's selection draw (share·ε)
    selected: dict[str, np.ndarray]  # mechanism -> p25 after the selection draw
    share: float


def draw(scenario: str, seed: int, tracts: int, reps: int, epsilon: float,
         share: float = 0.1, census: bool = False) -> Draws:
    """Each fixed mechanism with the whole budget, and the dp band's draws, on every tract;
    the truth is the expected outcome (``census``: the tract's own least-squares line)."""
    state = scenario_state(scenario, tracts, seed)
    batch = state.batch
    truth = (state.census if census else state.truth)["p25"]
    fit = ols(sufficient_stats(batch))
    keep = (fit.ok & (batch.n >= 3) & np.isfinite(fit.se25) & (fit.se25 > 0)
            & np.isfinite(truth))
    rand = SeededRandomness(zlib.crc32(f"rule/{scenario}/{seed}/{epsilon}".encode()))

    def published(out):
        return np.where(out.failed, np.nan, out.p25)[:, keep]

    full = {name: published(M.estimate_batch(name, batch, epsilon, rand=rand, reps=reps))
            for name in FIXED}
    rest = (1 - share) * epsilon
    nvar = noisy_nvar(batch, share * epsilon, rand, reps)
    selected = {
        NOISY_STATS: published(noisy_stats_release(batch, 0.0, rest / 2, rest / 2, rand, reps,
                                                   nvar_released=nvar)),
        EXP_THEIL_SEN: published(M.estimate_batch(EXP_THEIL_SEN, batch, rest, rand=rand,
                                                  reps=reps))}
    return Draws(batch.n[keep], truth[keep], fit.se25[keep], epsilon, full,
                 nvar[:, keep], selected, share)


def error_ratio(d: Draws, p25: np.ndarray) -> np.ndarray:
    """Per tract: 68% empirical error bound of p25 (failures infinite) / OLS SE."""
    err = np.where(np.isfinite(p25), np.abs(p25 - d.truth[None, :]), np.inf)
    return np.quantile(err, 0.68, axis=0, method="higher") / d.se25


def quintiles(n: np.ndarray) -> np.ndarray:
    """Tract-size quintile 0..4 of each tract (ties broken by order, as interval_eval does)."""
    return pd.qcut(pd.Series(n).rank(method="first"), 5, labels=False).to_numpy()


def dp_band_p25(d: Draws, threshold: float) -> np.ndarray:
    """What the dp rule (and the banded rule's dp band) publishes, from the same draws."""
    use_ns = d.epsilon * d.nvar_sel >= threshold
    return np.where(use_ns, d.selected[NOISY_STATS], d.selected[EXP_THEIL_SEN])


def banded_p25(d: Draws, bands: Bands, threshold: float) -> np.ndarray:
    """The banded rule's release: the fixed draws where a band names a mechanism (common
    random numbers, see the module doc), the dp band's own draws elsewhere."""
    rule = Rule("banded", threshold, d.share, schedule=((d.epsilon, bands),))
    choice = rule.band_choice(d.n, d.epsilon)
    out = dp_band_p25(d, threshold)
    for name in FIXED:
        out = np.where((choice == name)[None, :], d.full[name], out)
    return out


def summary(d: Draws, p25: np.ndarray) -> np.ndarray:
    """[median over all tracts, median per quintile Q1..Q5] of the error ratio."""
    r = error_ratio(d, p25)
    q = quintiles(d.n)
    return np.array([np.median(r)] + [np.median(r[q == i]) for i in range(5)])


def rmse_summary(d: Draws, p25: np.ndarray) -> np.ndarray:
    """[RMSE over all tract-runs, RMSE per quintile Q1..Q5] of the published p25 (clipped to
    [0, 1]) against the truth; a failure (nothing published) is scored as 0.5."""
    value = np.where(np.isfinite(p25), np.clip(p25, 0.0, 1.0), 0.5)
    sq = (value - d.truth[None, :]) ** 2
    q = quintiles(d.n)
    return np.sqrt([sq.mean()] + [sq[:, q == i].mean() for i in range(5)])


def violation(rule: np.ndarray, best: np.ndarray) -> float:
    """How far a rule's summary is from the requirement: ≤ 1 where it meets it."""
    with np.errstate(invalid="ignore", divide="ignore"):
        parts = np.r_[rule[0] / best[0], rule[1:] / (SLACK * best[1:])]
    parts = np.where(np.isnan(parts), 1.0, parts)  # inf / inf: both fail everywhere there
    return float(np.max(parts))


# ---------------------------------------------------------------------------------------------
# Calibration


def _candidates(choices: Sequence[str]):
    """(bands, uses dp) for up to three bands of n from the grid."""
    seen = set()
    bounds = (0,) + N_GRID
    for a_i, a in enumerate(bounds):
        for b in bounds[a_i:]:
            for x, y, z in itertools.product(choices, repeat=3):
                bands = tuple((u, c) for u, c in ((a, x), (b, y), (math.inf, z))
                              if u == math.inf or u > 0)
                # drop empty bands and merge neighbours with the same choice
                merged: list[tuple[float, str]] = []
                lower = 0
                for u, c in bands:
                    if u <= lower:
                        continue
                    if merged and merged[-1][1] == c:
                        merged[-1] = (u, c)
                    else:
                        merged.append((u, c))
                    lower = u
                key = tuple(merged)
                if key not in seen:
                    seen.add(key)
                    yield key


def calibrate_bands(draws: Sequence[Draws], thresholds: Sequence[float] = THRESHOLD_GRID
                    ) -> dict:
    """The best bands and dp threshold (from ``thresholds``) for the ε of ``draws`` (one ε,
    many scenarios)."""
    best_fixed = [np.minimum(summary(d, d.full[NOISY_STATS]), summary(d, d.full[EXP_THEIL_SEN]))
                  for d in draws]
    ratios = [{name: error_ratio(d, d.full[name]) for name in FIXED} for d in draws]
    dp_ratios = [{t: error_ratio(d, dp_band_p25(d, t)) for t in thresholds} for d in draws]
    qs = [quintiles(d.n) for d in draws]
    scored = []
    for bands in _candidates(FIXED + (DP_BAND,)):
        uses_dp = any(c == DP_BAND for _, c in bands)
        for t in (thresholds if uses_dp else thresholds[:1]):
            worst, overall = 0.0, []
            for d, fixed, dp, q, best in zip(draws, ratios, dp_ratios, qs, best_fixed):
                rule = Rule("banded", t, d.share, schedule=((d.epsilon, bands),))
                choice = rule.band_choice(d.n, d.epsilon)
                r = np.select([choice == NOISY_STATS, choice == EXP_THEIL_SEN],
                              [fixed[NOISY_STATS], fixed[EXP_THEIL_SEN]], dp[t])
                s = np.array([np.median(r)] + [np.median(r[q == i]) for i in range(5)])
                worst = max(worst, violation(s, best))
                overall.append(s[0] / best[0] if np.isfinite(best[0]) else 1.0)
            scored.append((worst, float(np.mean(overall)), bands, t))
    scored.sort(key=lambda s: (round(s[0], 6), s[1], len(s[2])))
    worst, mean_overall, bands, t = scored[0]
    return {"epsilon": draws[0].epsilon,
            "bands": [{"n_below": None if math.isinf(u) else u, "choice": c} for u, c in bands],
            "threshold": t, "worst_violation": worst, "mean_overall_ratio": mean_overall}


def calibrate(seeds: Sequence[int] = CALIBRATION_SEEDS, epsilons: Sequence[float] = EPSILONS,
              scenarios: Sequence[str] = RULE_CALIBRATION_SCENARIOS, tracts: int = 400,
              large_tracts: int = 150,
              reps: int = 40, share: float = 0.1,
              progress: Callable[[str], None] | None = None) -> dict:
    """Bands per ε from the calibration seeds' scenarios (module doc); a dict for
    thresholds.yaml's ``rules.banded``. One dp threshold serves every ε: for each candidate
    the bands are calibrated per ε, and the threshold whose worst violation over the ε values
    is smallest (then the smallest mean overall ratio) is kept."""
    draws: dict[float, list[Draws]] = {}
    for eps in epsilons:
        for seed in seeds:
            for sc in scenarios:
                t0 = time.perf_counter()
                draws.setdefault(eps, []).append(
                    draw(sc, seed, large_tracts if sc == "large" else tracts, reps, eps, share))
                if progress:
                    progress(f"calibration {sc} seed={seed} eps={eps:g} "
                             f"({time.perf_counter() - t0:.0f}s)")
    options = []
    for t in THRESHOLD_GRID:
        per_eps = [calibrate_bands(draws[eps], (t,)) for eps in epsilons]
        options.append((max(c["worst_violation"] for c in per_eps),
                        float(np.mean([c["mean_overall_ratio"] for c in per_eps])), t, per_eps))
    _, _, threshold, per_eps = min(options, key=lambda o: (round(o[0], 6), o[1]))
    return {"threshold": threshold, "indicator": "epsilon * noisy n*var(x), in the dp band only",
            "selection_budget_share": share,
            "schedule": [{"epsilon": c["epsilon"], "bands": c["bands"]} for c in per_eps],
            "calibration": {"seeds": list(seeds), "scenarios": list(scenarios),
                            "tracts": tracts, "large_tracts": large_tracts, "reps": reps,
                            "per_epsilon": per_eps,
                            "method": "per epsilon, the bands (up to three, bounds on n from "
                                      f"{list(N_GRID)}) and dp threshold (from "
                                      f"{list(THRESHOLD_GRID)}, one for every epsilon) with "
                                      "the smallest worst violation over scenarios of: overall "
                                      "median ratio <= "
                                      "the better fixed mechanism's, every size quintile <= "
                                      f"{SLACK} x it (ties: the smallest mean overall ratio)"}}


# ---------------------------------------------------------------------------------------------
# Evaluation


def evaluate(rule: Rule, dp_threshold: float, seed: int = EVALUATION_SEED,
             epsilons: Sequence[float] = EPSILONS, scenarios: Sequence[str] = SCENARIOS,
             tracts: int = 3108, large_tracts: int = 300, reps: int = 50,
             progress: Callable[[str], None] | None = None,
             census: bool = False) -> pd.DataFrame:
    """One row per (scenario, ε, rule or mechanism): median error ratio over all tracts and
    per size quintile, and the requirement's verdict for the two rules; the same for the RMSE
    (``rmse_summary``). Against the expected outcome (``census``: the own line)."""
    rows = []
    for sc in scenarios:
        for eps in epsilons:
            t0 = time.perf_counter()
            d = draw(sc, seed, large_tracts if sc == "large" else tracts, reps, eps, rule.share,
                     census)
            released = {NOISY_STATS: d.full[NOISY_STATS], EXP_THEIL_SEN: d.full[EXP_THEIL_SEN],
                        "dp rule (today)": dp_band_p25(d, dp_threshold),
                        "banded rule": banded_p25(d, rule.bands(eps), rule.threshold)}
            table = {name: summary(d, p25) for name, p25 in released.items()}
            rmse = {name: rmse_summary(d, p25) for name, p25 in released.items()}
            best = np.minimum(table[NOISY_STATS], table[EXP_THEIL_SEN])
            best_rmse = np.minimum(rmse[NOISY_STATS], rmse[EXP_THEIL_SEN])
            edges = [int(d.n[quintiles(d.n) == i].max()) for i in range(5)]
            for name, s in table.items():
                r = rmse[name]
                rows.append({"scenario": sc, "epsilon": eps, "row": name, "all": s[0],
                             **dict(zip(QUINTILES, s[1:])),
                             "requirement": _verdict(name, s, best),
                             "rmse all": r[0],
                             **{f"rmse {q}": v for q, v in zip(QUINTILES, r[1:])},
                             "rmse requirement": _verdict(name, r, best_rmse),
                             "truth": "census" if census else "expected",
                             "quintile_n_max": "/".join(map(str, edges)),
                             "tracts": int(d.n.size)})
            if progress:
                progress(f"{sc} eps={eps:g}: {time.perf_counter() - t0:.0f}s")
    return pd.DataFrame(rows)


def _verdict(name: str, s: np.ndarray, best: np.ndarray) -> str:
    if name in FIXED:
        return ""
    v = violation(s, best)
    return "meets" if v <= 1.0 else f"fails ({v:.2f})"


def to_markdown(table: pd.DataFrame) -> str:
    lines = []
    rmse = "rmse all" in table.columns
    for (sc, eps), grp in table.groupby(["scenario", "epsilon"], sort=False):
        first = grp.iloc[0]
        lines += [f"**{sc}, ε = {eps:g}** ({first.tracts} usable tracts; quintiles up to n = "
                  f"{first.quintile_n_max})", "",
                  "| row | all | Q1 | Q2 | Q3 | Q4 | Q5 | requirement |"
                  + (" RMSE all | RMSE Q1 | Q2 | Q3 | Q4 | Q5 | RMSE requirement |"
                     if rmse else ""),
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
                  + (" ---: | ---: | ---: | ---: | ---: | ---: | --- |" if rmse else "")]
        for _, r in grp.iterrows():
            vals = " | ".join(f"{r[c]:.3g}" for c in ("all",) + QUINTILES)
            line = f"| {r['row']} | {vals} | {r['requirement']} |"
            if rmse:
                line += " " + " | ".join(f"{r['rmse ' + c]:.3f}" for c in ("all",) + QUINTILES)
                line += f" | {r['rmse requirement']} |"
            lines.append(line)
        lines.append("")
    return "\n".join(lines)


def write_banded(entry: dict, path) -> None:
    """Put ``entry`` as ``rules.banded`` into the calibration file ``path``, keeping the rest
    (the dp and public rules' calibrations and their provenance)."""
    import yaml

    from dpatlas.core.files import now_utc, write_atomic

    data = yaml.safe_load(path.read_text()) if path.exists() else {}
    data = data or {}
    data.setdefault("rules", {})["banded"] = {"created": now_utc(), **entry}
    head = "# written by `dpatlas calibrate`; name this file in selection.threshold_file\n"
    write_atomic(path, lambda tmp: tmp.write_text(head + yaml.safe_dump(data, sort_keys=False)))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m dpatlas.evaluation.rule_stress --into dpatlas/defaults/thresholds.yaml``: calibrate
    the banded rule (seeds 101, 102) and store it in the calibration file."""
    import argparse
    from pathlib import Path

    ap = argparse.ArgumentParser(description="Calibrate the banded selection rule.")
    ap.add_argument("--into", type=Path, required=True)
    args = ap.parse_args(argv)
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)  # noqa: E731
    entry = calibrate(progress=log)
    write_banded(entry, args.into)
    for e in entry["schedule"]:
        log(f"eps {e['epsilon']:g}: {e['bands']}")
    log(f"threshold {entry['threshold']}; wrote {args.into}")


if __name__ == "__main__":
    main()
