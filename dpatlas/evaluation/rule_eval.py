"""Does a three-way selection rule beat today's two-way rule? (issue 9, item 7)

A three-way rule is today's ``dp`` rule (``dpatlas/release/selection.py``) with one more region: it
spends ``share·ε`` of the tract budget on a noisy ``nvar = n·var(x)`` (Laplace, sensitivity
1 − 1/n), computes the indicator ``ε·nvar~`` and runs, with the remaining ``(1 − share)·ε``,

- ``low``    where ε·nvar~ <  ``lower``,
- ``middle`` where ``lower`` ≤ ε·nvar~ < ``upper``,
- ``high``   where ε·nvar~ ≥ ``upper``.

``lower == upper`` empties the middle region and ``upper = inf`` the high one: the two-way
rules are special cases, so calibrating over a grid that contains them can only tie or beat
them on the calibration states. NoisyStats, wherever it runs, reuses the selection's noisy
nvar (paid once, as in the two-way rule) and splits the rest between ncov and the intercept.

Guarantee (derived, never declared). The indicator is a DP output, so which mechanism runs is
post-processing of it, and by adaptive sequential composition (Dwork & Roth 2014, Thm 3.16
for pure ε and basic (ε, δ) composition) each tract's people get the selection step composed
with the *largest* guarantee among the alternatives the rule may run there (a tract runs one
of them; each alternative's guarantee is the composition of its own noise steps' privacy maps,
``Estimator.guarantee`` / ``privacy_maps.compose``). Tracts hold disjoint people: parallel
composition over tracts (McSherry 2009, Thm 4). A rule mixing pure-ε alternatives with an
(ε, δ) one has an (ε, δ) guarantee only: pure ε is read as (ε, 0) and the worst alternative
is the coordinate-wise largest (ε, δ). Hence two candidate families, compared separately:

- ``pure``: {NoisyStats, DPExpTheilSen, FreeLunchSSP}, ε-DP like today's rule;
- ``approx``: {NoisyStats, DPExpTheilSen, DDSSP}, (ε, δ = 1e-6)-DP.

Thresholds are calibrated on synthetic states with seeds 101–103 (never the evaluation's
seed-0 state nor released data), with ``dpatlas/evaluation/calibrate.py``'s objective: the geometric mean
over ε of the pooled median over tracts of (68% empirical error bound of p25 / OLS SE).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd

import mechanisms as M
from mechanisms.batch import TractBatch, ols, sufficient_stats
from mechanisms.privacy_filter import NO_METER
from mechanisms.noise import Randomness, SeededRandomness
from mechanisms.privacy import (ApproxDP, Guarantee, NotDP, PureDP, parallel, sequential,
                                to_approx)
from mechanisms.privacy_maps import NoiseStep, compose
from mechanisms.registry import MIN_RECORDS, Meter
from mechanisms.sufficient_stats import (intercept_step, ncov_step, noisy_nvar,
                                         noisy_stats_release, nvar_step)

from dpatlas.evaluation.synthetic_input import StateParams, batch_of, oi_like_state

NOISY_STATS, EXP_THEIL_SEN = "NoisyStats", "DPExpTheilSen"
FREE_LUNCH, DDSSP = "FreeLunchSSP", "DDSSP"
SELECTION_STEP = "selection: noisy n*var(x)"
PRIMARY_STEP = "primary: p25 and p75"
DEFAULT_SHARE = 0.1  # today's dp rule spends 10% of the tract budget on selection
DEFAULT_DELTA = 1e-6  # DDSSP's default δ
CALIBRATION_SEEDS = (101, 102, 103)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "pure": (NOISY_STATS, EXP_THEIL_SEN, FREE_LUNCH),
    "approx": (NOISY_STATS, EXP_THEIL_SEN, DDSSP),
}
REGIONS = ("low", "middle", "high")


# ---------------------------------------------------------------------------------------------
# The rule and its derived guarantee


def _check_threshold(name: str, value: float, allow_inf: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise ValueError(f"three-way rule: {name} must be a number > 0, got {value!r}")
    value = float(value)
    if not (value > 0 and (allow_inf or math.isfinite(value))) or math.isnan(value):
        raise ValueError(f"three-way rule: {name} must be a number > 0"
                         f"{' (inf: region unused)' if allow_inf else ''}, got {value!r}")
    return value


@dataclass(frozen=True)
class ThreeWayRule:
    """Choose ``low`` / ``middle`` / ``high`` by the noisy indicator ε·nvar~ (module doc)."""

    low: str
    middle: str
    high: str
    lower: float  # on ε·nvar~; the middle region starts here
    upper: float  # the high region starts here (inf: never)
    share: float = DEFAULT_SHARE
    delta: float | None = None  # needed iff some alternative is (ε, δ)-DP

    def __post_init__(self):
        names = self.mechanisms
        if len(set(names)) != 3:
            raise ValueError(f"three-way rule: the three regions need three different "
                             f"mechanisms, got {list(names)}")
        for name in names:
            est = M.get(name)  # KeyError names the known estimators
            if not est.private:
                raise ValueError(f"three-way rule: {name} is not differentially private")
            if est.needs_delta and self.delta is None:
                raise ValueError(f"three-way rule: {name} is (epsilon, delta)-DP; give delta "
                                 "(e.g. 1e-6)")
        if self.delta is not None and not 0 < self.delta < 1:
            raise ValueError(f"three-way rule: delta must lie in (0, 1), got {self.delta!r}")
        lower = _check_threshold("lower", self.lower, allow_inf=False)
        upper = _check_threshold("upper", self.upper, allow_inf=True)
        if lower > upper:
            raise ValueError(f"three-way rule: lower ({lower:g}) must be <= upper ({upper:g})")
        if isinstance(self.share, bool) or not 0 < self.share < 1:
            raise ValueError(f"three-way rule: share must lie in (0, 1), got {self.share!r}")

    @property
    def mechanisms(self) -> tuple[str, str, str]:
        return (self.low, self.middle, self.high)

    def label(self) -> str:
        """The rule in one line, unused regions left out (e.g. ``A < 4.4 <= B``)."""
        text = self.low
        if self.lower < self.upper:
            text += f" < {self.lower:.3g} <= {self.middle}"
        if math.isfinite(self.upper):
            text += f" < {self.upper:.3g} <= {self.high}"
        return text

    def budgets(self, epsilon: float) -> tuple[float, float]:
        """(selection budget, budget of the chosen mechanism): one place for plan and run."""
        eps_sel = self.share * epsilon
        return eps_sel, epsilon - eps_sel

    def region(self, indicator: np.ndarray) -> np.ndarray:
        """0 (low), 1 (middle), 2 (high) per entry; NaN (n < 2: no indicator) is low."""
        ind = np.asarray(indicator, dtype=float)
        return (ind >= self.lower).astype(np.int8) + (ind >= self.upper).astype(np.int8)

    # -- privacy ----------------------------------------------------------------------------

    def selection_noise(self, epsilon: float) -> list[NoiseStep]:
        return [nvar_step(self.budgets(epsilon)[0])]

    def alternative_guarantee(self, name: str, epsilon: float) -> Guarantee:
        """What running ``name`` in the primary step of a tract with budget ``epsilon``
        guarantees: the composition of the privacy maps of the noise it draws there."""
        _, rest = self.budgets(epsilon)
        if name == NOISY_STATS:
            # It reuses the selection's noisy nvar (paid in the selection step).
            return compose([ncov_step(rest / 2), intercept_step(rest / 2)])
        est = M.get(name)
        return est.guarantee(rest, self.delta if est.needs_delta else None)

    def steps(self, epsilon: float) -> list[tuple[str, Guarantee]]:
        """(step name, guarantee) per budget step of a tract: what a ledger would charge."""
        alternatives = [self.alternative_guarantee(n, epsilon) for n in self.mechanisms]
        return [(SELECTION_STEP, compose(self.selection_noise(epsilon))),
                (PRIMARY_STEP, worst_alternative(alternatives, self.delta))]

    def guarantee(self, epsilon: float) -> Guarantee:
        return sequential([g for _, g in self.steps(epsilon)])


def worst_alternative(alternatives: Sequence[Guarantee], delta: float | None) -> Guarantee:
    """The guarantee of a step that runs ONE of ``alternatives`` per tract (the choice being
    post-processing of a DP output): the largest of them. With an (ε, δ) alternative, pure ones
    are read as (ε, 0) (``to_approx``) so that the largest is taken coordinate-wise."""
    if any(isinstance(g, NotDP) for g in alternatives):
        raise ValueError("three-way rule: an alternative is not differentially private")
    if any(isinstance(g, ApproxDP) for g in alternatives):
        if delta is None:
            raise ValueError("three-way rule: an (epsilon, delta) alternative needs delta")
        alternatives = [to_approx(g, delta) for g in alternatives]
    return parallel(alternatives)


def fits_budget(rule: ThreeWayRule, epsilon: float, *, tol: float = 1e-9) -> Guarantee:
    """The rule's derived guarantee at ``epsilon``, refused if it exceeds (ε, δ): for a pure
    family ε-DP, for an (ε, δ) family (ε, δ)-DP."""
    g = rule.guarantee(epsilon)
    if isinstance(g, PureDP):
        ok = g.epsilon <= epsilon * (1 + tol)
    elif isinstance(g, ApproxDP):
        ok = (rule.delta is not None and g.epsilon <= epsilon * (1 + tol)
              and g.delta <= rule.delta * (1 + tol))
    else:
        ok = False
    if not ok:
        target = f"{epsilon:g}-DP" if rule.delta is None else f"({epsilon:g}, {rule.delta:g})-DP"
        raise ValueError(f"three-way rule {rule.label()} guarantees {g.describe()} at "
                         f"epsilon={epsilon:g}, more than the budget {target}")
    return g


# ---------------------------------------------------------------------------------------------
# Running a rule (a plain function over a batch)


@dataclass
class ThreeWayOutcome:
    """Arrays (reps, tracts); ``region`` indexes ``rule.mechanisms``."""

    region: np.ndarray
    p25: np.ndarray
    p75: np.ndarray
    failed: np.ndarray
    indicator: np.ndarray  # ε·nvar~ (internal, never published)
    mechanisms: tuple[str, str, str]

    @property
    def mechanism(self) -> np.ndarray:
        return np.asarray(self.mechanisms, dtype=object)[self.region]


def _run_alternative(name: str, batch: TractBatch, rule: ThreeWayRule, rest: float,
                     nvar_released: np.ndarray, rand: Randomness, reps: int,
                     meter: Meter) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p25, p75, failed) of ``name`` with the primary budget ``rest`` on ``batch``."""
    if name == NOISY_STATS:
        out = noisy_stats_release(batch, 0.0, rest / 2, rest / 2, rand, reps,
                                  nvar_released=nvar_released, meter=meter)
        return out.p25, out.p75, out.failed
    est = M.get(name)
    res = M.estimate_batch(name, batch, rest, rule.delta if est.needs_delta else None,
                           rand=rand, reps=reps, meter=meter)
    return res.p25, res.p75, res.failed


def apply_three_way(batch: TractBatch, epsilon: float, rule: ThreeWayRule, rand: Randomness,
                    reps: int = 1, *, selection_meter: Meter = NO_METER,
                    primary_meter: Meter = NO_METER) -> ThreeWayOutcome:
    """Draw the selection statistic, choose per tract and rep, run each chosen mechanism on
    the tracts where some rep chose it (every draw spends its step's meter first)."""
    eps_sel, rest = rule.budgets(epsilon)
    nvar_t = noisy_nvar(batch, eps_sel, rand, reps, meter=selection_meter)
    indicator = epsilon * nvar_t
    region = rule.region(indicator)
    shape = (reps, batch.n_tracts)
    p25, p75 = np.full(shape, np.nan), np.full(shape, np.nan)
    failed = np.zeros(shape, dtype=bool)
    for k, name in enumerate(rule.mechanisms):
        chosen = region == k
        tracts = np.flatnonzero(chosen.any(axis=0))
        if tracts.size == 0:
            continue
        a25, a75, afail = _run_alternative(name, batch.subset(tracts), rule, rest,
                                           nvar_t[:, tracts], rand, reps, primary_meter)
        pick = chosen[:, tracts]
        for dst, src in ((p25, a25), (p75, a75), (failed, afail)):
            block = dst[:, tracts]
            block[pick] = np.asarray(src).reshape(block.shape)[pick]
            dst[:, tracts] = block
    failed |= (batch.n < MIN_RECORDS)[None, :]
    return ThreeWayOutcome(region, np.where(failed, np.nan, p25), np.where(failed, np.nan, p75),
                           failed, indicator, rule.mechanisms)


class ThreeWayEstimate:
    """Adapter so a rule can stand as a row of ``dpatlas.evaluation.evaluate.evaluate(extra_rows=...)``."""

    def __init__(self, rule: ThreeWayRule):
        self.rule = rule

    def __call__(self, batch: TractBatch, epsilon: float, reps: int, seed: int):
        return apply_three_way(batch, epsilon, self.rule, SeededRandomness(seed), reps)


# ---------------------------------------------------------------------------------------------
# Calibration on synthetic states


def bound_ratio(p25: np.ndarray, failed: np.ndarray, ols_p25: np.ndarray,
                se25: np.ndarray) -> np.ndarray:
    """Per tract: the 68% empirical error bound of p25 (failures infinite) over the OLS SE,
    exactly as ``dpatlas.evaluation.evaluate.error_ratios`` computes it."""
    err = np.where(failed | ~np.isfinite(p25), np.inf, np.abs(p25 - ols_p25[None, :]))
    return np.quantile(err, 0.68, axis=0, method="higher") / se25


def threshold_grid(points: int = 28, lo: float = 1.0, hi: float = 3000.0) -> np.ndarray:
    """Candidate thresholds on ε·nvar~: today's calibration grid's range, plus inf (unused)."""
    return np.r_[np.geomspace(lo, hi, points), np.inf]


@dataclass
class _StateDraws:
    """One calibration state at one ε: the selection draw and every alternative's output."""

    keep: np.ndarray
    ols_p25: np.ndarray
    se25: np.ndarray
    indicator: np.ndarray
    p25: dict[str, np.ndarray]
    failed: dict[str, np.ndarray]


def _draw_state(batch: TractBatch, epsilon: float, names: Sequence[str], share: float,
                delta: float | None, rand: Randomness, reps: int) -> _StateDraws:
    """The rule's draws on a whole state: one selection draw, each alternative on every tract
    with the remaining budget (which tracts a rule then takes from which is free to vary)."""
    fit = ols(sufficient_stats(batch))
    keep = fit.ok & (batch.n >= 3) & np.isfinite(fit.se25) & (fit.se25 > 0)
    probe = ThreeWayRule(*names, lower=1.0, upper=1.0, share=share, delta=delta)
    _, rest = probe.budgets(epsilon)
    nvar_t = noisy_nvar(batch, share * epsilon, rand, reps)
    p25, failed = {}, {}
    for name in names:
        a25, _, afail = _run_alternative(name, batch, probe, rest, nvar_t, rand, reps, NO_METER)
        p25[name], failed[name] = a25, afail | (batch.n < MIN_RECORDS)[None, :]
    return _StateDraws(keep, fit.p25, fit.se25, epsilon * nvar_t, p25, failed)


def _candidates(names: Sequence[str], grid: np.ndarray):
    """(low, middle, high, lower, upper) over every order of the three and lower ≤ upper."""
    finite = grid[np.isfinite(grid)]
    for order in itertools.permutations(names):
        for i, lower in enumerate(finite):
            for upper in grid[i:]:
                yield (*order, float(lower), float(upper))


def calibrate_three_way(family: str, epsilons: Sequence[float] = (1.0, 8.0),
                        seeds: Sequence[int] = CALIBRATION_SEEDS, tracts: int = 1000,
                        reps: int = 50, share: float = DEFAULT_SHARE,
                        delta: float = DEFAULT_DELTA, grid: np.ndarray | None = None,
                        reference: Mapping[str, tuple] | None = None,
                        progress: Callable[[str], None] | None = None) -> dict:
    """Best three-way rule of ``family`` (``FAMILIES``) on synthetic states ``seeds``.

    Every order of the three mechanisms over the regions and every pair lower ≤ upper of the
    grid is scored from the same draws (the draws of a tract do not depend on the thresholds):
    score = geometric mean over ε of the median over tracts, pooled over states, of the
    error-bound ratio (``dpatlas/evaluation/calibrate.py``'s objective). Returns the best rule's fields,
    its score, the best score of each order, the best two-way rule inside the grid, and the
    score of each ``reference`` candidate (name -> (low, middle, high, lower, upper), scored
    from the same draws, e.g. today's two-way rule).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown rule family {family!r}; known: {', '.join(FAMILIES)}")
    names = FAMILIES[family]
    rule_delta = delta if any(M.get(n).needs_delta for n in names) else None
    grid = threshold_grid() if grid is None else np.asarray(grid, dtype=float)
    reference = dict(reference or {})
    cands = list(_candidates(names, grid)) + [tuple(c) for c in reference.values()]
    ratios = np.empty((len(cands), len(epsilons)), dtype=object)
    for s_i, seed in enumerate(seeds):
        batch = batch_of(oi_like_state(seed, StateParams(n_tracts=tracts)))
        for e_i, eps in enumerate(epsilons):
            t0 = time.perf_counter()
            rand = SeededRandomness(seed * 7919 + int(eps * 1000) + 17)
            d = _draw_state(batch, eps, names, share, rule_delta, rand, reps)
            for c_i, (lo_m, mid_m, hi_m, lower, upper) in enumerate(cands):
                region = (d.indicator >= lower).astype(np.int8) + (d.indicator >= upper)
                p25 = np.select([region == 0, region == 1], [d.p25[lo_m], d.p25[mid_m]],
                                d.p25[hi_m])
                failed = np.select([region == 0, region == 1],
                                   [d.failed[lo_m], d.failed[mid_m]], d.failed[hi_m])
                r = bound_ratio(p25, failed, d.ols_p25, d.se25)[d.keep].astype(np.float32)
                if s_i == 0:
                    ratios[c_i, e_i] = [r]
                else:
                    ratios[c_i, e_i].append(r)
            if progress:
                progress(f"{family}: state seed={seed} eps={eps:g} "
                         f"({time.perf_counter() - t0:.0f}s)")
    scored = []
    for c_i, cand in enumerate(cands):
        med = [float(np.median(np.concatenate(ratios[c_i, e_i])))
               for e_i in range(len(epsilons))]
        scored.append((float(np.exp(np.mean(np.log(med)))), med, cand))
    key = lambda s: (s[0], s[2][3], s[2][4])  # noqa: E731  ties: the smaller thresholds

    def entry(s) -> dict:
        score, med, (lo_m, mid_m, hi_m, lower, upper) = s
        unused = (["middle"] if lower == upper else []) + (["high"] if math.isinf(upper) else [])
        return {"low": lo_m, "middle": mid_m, "high": hi_m, "lower": lower,
                "upper": None if math.isinf(upper) else upper, "unused_regions": unused,
                "score": score,
                "median_ratio_by_epsilon": {f"{e:g}": m for e, m in zip(epsilons, med)}}

    best = min(scored, key=key)
    by_order = {}
    for s in scored:
        order = " / ".join(s[2][:3])
        if order not in by_order or key(s) < key(by_order[order]):
            by_order[order] = s
    two_way = [s for s in scored if s[2][3] == s[2][4] or math.isinf(s[2][4])]
    # Today's order extended: DPExpTheilSen (which never fails) keeps the low-signal tracts.
    ets_low = [s for s in scored if s[2][0] == EXP_THEIL_SEN and s[2][3] < s[2][4] < math.inf]
    return {"family": family, "mechanisms": list(names), "delta": rule_delta,
            "selection_budget_share": share, "seeds": list(seeds), "tracts": tracts,
            "reps": reps, "epsilons": list(epsilons),
            "grid": [None if math.isinf(g) else float(g) for g in grid],
            "best": entry(best), "best_two_way_in_grid": entry(min(two_way, key=key)),
            "best_exp_theil_sen_low": entry(min(ets_low, key=key)),
            "best_by_order": [entry(s) for s in sorted(by_order.values(), key=key)],
            "reference": {name: entry(scored[len(cands) - len(reference) + i])
                          for i, name in enumerate(reference)}}


def rule_from_calibration(cal: Mapping, which: str = "best") -> ThreeWayRule:
    """The rule of a calibration entry (``best`` or ``best_exp_theil_sen_low``)."""
    b = cal[which]
    return ThreeWayRule(b["low"], b["middle"], b["high"], b["lower"],
                        math.inf if b["upper"] is None else b["upper"],
                        share=cal["selection_budget_share"], delta=cal["delta"])


# ---------------------------------------------------------------------------------------------
# Evaluation on the evaluation's state and the report


def evaluate_rules(rules: Mapping[str, ThreeWayRule], two_way_threshold: float,
                   epsilons: Sequence[float] = (1.0, 8.0), reps: int = 100, seed: int = 0,
                   mechanisms: Sequence[str] = (NOISY_STATS, EXP_THEIL_SEN, FREE_LUNCH, DDSSP),
                   params: StateParams = StateParams(),
                   progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    """``dpatlas.evaluation.evaluate.evaluate`` on the evaluation's state (seed 0, 3,108 tracts) with the
    mechanisms alone, today's two-way rule and ``rules``; the summary with a guarantee column
    (each row's derived guarantee at that ε)."""
    from dpatlas.evaluation.evaluate import evaluate
    from dpatlas.release.selection import Rule, RuleEstimate

    today = Rule("dp", two_way_threshold, DEFAULT_SHARE)
    extra = {"SelectionRule(dp)": RuleEstimate(today)}
    extra.update({name: ThreeWayEstimate(rule) for name, rule in rules.items()})
    result = evaluate(tuple(mechanisms), tuple(epsilons), reps, seed, params,
                      progress=progress, extra_rows=extra)
    guarantee = {name: (lambda e, _n=name: M.get(_n).guarantee(e)) for name in mechanisms}
    guarantee["SelectionRule(dp)"] = today.guarantee
    guarantee.update({name: rule.guarantee for name, rule in rules.items()})
    summary = result.summary.copy()
    summary["guarantee"] = [guarantee[m](e).describe()
                            for m, e in zip(summary.mechanism, summary.epsilon)]
    return summary


def write_comparison(summary: pd.DataFrame, calibrations: Mapping[str, dict], out: Path,
                     params: Mapping) -> list[Path]:
    """summary.csv, summary.md (the table) and calibration.json into ``out``."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    table = summary[["mechanism", "epsilon", "guarantee", "tracts", "share_below_se",
                     "median_ratio", "mean_failure_rate", "seconds"]]
    table.to_csv(out / "summary.csv", index=False)
    lines = ["| mechanism | ε | guarantee | tracts | share below SE | median ratio | "
             "failure rate | seconds |", "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in table.itertuples():
        lines.append(f"| {r.mechanism} | {r.epsilon:g} | {r.guarantee} | {r.tracts} | "
                     f"{r.share_below_se:.3f} | {r.median_ratio:.3f} | "
                     f"{r.mean_failure_rate:.3f} | {r.seconds:.1f} |")
    head = (f"Evaluation state: seed {params['seed']}, {params['n_tracts']} tracts, "
            f"{params['reps']} runs per tract and row; usable tracts only (OLS SE finite, "
            "n >= 3). Ratio = 68% empirical error bound of p25 / OLS SE (failures infinite). "
            "Written by `dpatlas.evaluation.rule_eval` (docs/selection-3way.md).\n\n")
    rules = "".join(f"- `{name}`: {label}\n" for name, label in params.get("labels", {}).items())
    if rules:
        rules = ("\nRules (indicator ε·noisy n·var(x), selection share "
                 f"{DEFAULT_SHARE:g} of the tract budget):\n\n" + rules)
    (out / "summary.md").write_text(head + "\n".join(lines) + "\n" + rules)
    (out / "calibration.json").write_text(json.dumps(
        {"calibrations": calibrations, "evaluation": dict(params)}, indent=2, default=float))
    return [out / "summary.csv", out / "summary.md", out / "calibration.json"]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m dpatlas.evaluation.rule_eval [--reps 100] [--out docs/evaluation-rule3]``."""
    import argparse
    import json

    from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_threshold
    from dpatlas.core.config import SelectionConfig

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("docs/evaluation-rule3"))
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--cal-reps", type=int, default=50)
    ap.add_argument("--cal-tracts", type=int, default=1000)
    ap.add_argument("--tracts", type=int, default=3108)
    ap.add_argument("--families", default="pure,approx")
    args = ap.parse_args(argv)
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", flush=True)  # noqa: E731
    two_way = resolve_threshold(SelectionConfig(rule="dp", threshold_file=DEFAULT_THRESHOLDS))
    cals, rules = {}, {}
    for family in args.families.split(","):
        third = FAMILIES[family][2]  # unused (upper = inf): today's rule, same draws
        today = {"today_two_way": (EXP_THEIL_SEN, NOISY_STATS, third, two_way, math.inf)}
        cal = calibrate_three_way(family, tracts=args.cal_tracts, reps=args.cal_reps,
                                  reference=today, progress=log)
        cals[family] = cal
        rule = rule_from_calibration(cal)
        rules[f"Rule3({family})"] = rule
        if cal["best"]["low"] != EXP_THEIL_SEN or cal["best"]["unused_regions"]:
            # Also the best three-way rule that keeps today's low region (it never fails).
            rules[f"Rule3({family}, ExpTS low)"] = rule_from_calibration(
                cal, "best_exp_theil_sen_low")
        log(f"{family}: {rule.label()} score {cal['best']['score']:.4f}; "
            f"best two-way in grid {json.dumps(cal['best_two_way_in_grid'])}; "
            f"today's rule {json.dumps(cal['reference']['today_two_way'])}")
    for name, rule in rules.items():
        log(f"{name}: {rule.label()}")
        for eps in (1.0, 8.0):
            log(f"  guarantee at eps={eps:g}: {fits_budget(rule, eps).describe()}")
    params = StateParams(n_tracts=args.tracts)
    summary = evaluate_rules(rules, two_way, reps=args.reps, params=params, progress=log)
    paths = write_comparison(summary, cals, args.out,
                             {"seed": 0, "n_tracts": args.tracts, "reps": args.reps,
                              "two_way_threshold": two_way,
                              "labels": {"SelectionRule(dp)": f"{EXP_THEIL_SEN} < {two_way:.3g}"
                                         f" <= {NOISY_STATS} (today's rule)",
                                         **{k: r.label() for k, r in rules.items()}},
                              "rules": {k: asdict(r) for k, r in rules.items()}})
    print(summary.to_string(index=False))
    log(f"wrote {', '.join(map(str, paths))}")


if __name__ == "__main__":
    main()
