"""Choosing NoisyStats or DPExpTheilSen per tract, and running the choice.

Rules (``estimators.md``: n·ε·var(x) is the paper's best single indicator):

- ``dp``: spend ``share·ε`` on a noisy ``nvar = n·var(x)`` (Laplace, sensitivity 1 − 1/n);
  choose NoisyStats where ``ε·nvar~ ≥ threshold``, else DPExpTheilSen, each with the remaining
  ``(1 − share)·ε``. Where NoisyStats is chosen it *reuses* the noisy nvar as its own (paid
  once), and splits the rest between ncov and the intercept. Since it is only chosen where the
  noisy nvar is large and positive, it cannot fail there.
- ``public``: NoisyStats where ``n ≥ threshold`` (n is public), else DPExpTheilSen; no budget.
- ``fixed``: always the given mechanism.

Whatever the choice, each tract's guarantee is the same: every budget step's guarantee is
derived from the noise of the mechanisms it may run (``Rule.noise``: the largest composition
of their privacy maps, at most the step's budget), so it does not depend on the data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import mechanisms as M
from mechanisms.batch import TractBatch
from mechanisms.budget import NO_METER
from mechanisms.noise import Randomness
from mechanisms.privacy import PROJECT_RELATION, Guarantee, parallel, sequential
from mechanisms.privacy_maps import NoiseStep, compose
from mechanisms.registry import Meter
from mechanisms.sufficient_stats import (intercept_step, ncov_step, noisy_nvar,
                                         noisy_stats_release, nvar_step)

NOISY_STATS, EXP_THEIL_SEN = "NoisyStats", "DPExpTheilSen"
SELECTION_STEP = "selection: noisy n*var(x)"
PRIMARY_STEP = "primary: p25 and p75"
SELECTION_LABEL = "dp selection rule"

Alternatives = dict[str, list[NoiseStep]]


def worst_alternative(alternatives: Alternatives) -> Guarantee:
    """A step's guarantee when each tract runs ONE of several alternatives: the largest of
    their compositions. The choice is made from public n or a DP output, and whichever runs
    is within this bound, so adaptive sequential composition holds with it. Each draw is
    stated for the project's relation first (an add-remove draw through group privacy), so
    alternatives under different relations never compose silently."""
    return parallel([compose(steps, relation=PROJECT_RELATION)
                     for steps in alternatives.values()])


@dataclass(frozen=True)
class Rule:
    kind: str  # dp | public | fixed
    threshold: float | None = None
    share: float = 0.1
    mechanism: str = EXP_THEIL_SEN

    def budgets(self, epsilon: float) -> tuple[float, float]:
        """(selection budget, budget left for the chosen mechanism): one place, so the plan
        and the run calibrate from the very same numbers."""
        if self.kind == "dp":
            eps_sel = self.share * epsilon
            return eps_sel, epsilon - eps_sel
        return 0.0, epsilon

    def noise(self, epsilon: float) -> list[tuple[str, float, Alternatives]]:
        """Per budget step of a tract with primary budget ``epsilon``: its name, the budget it
        hands its mechanism, and the noise of each mechanism the rule may run there."""
        eps_sel, rest = self.budgets(epsilon)
        if self.kind == "dp":
            return [(SELECTION_STEP, eps_sel, {SELECTION_LABEL: [nvar_step(eps_sel)]}),
                    (PRIMARY_STEP, rest, {
                        # NoisyStats reuses the selection's noisy nvar (paid once, above).
                        NOISY_STATS: [ncov_step(rest / 2), intercept_step(rest / 2)],
                        EXP_THEIL_SEN: M.get(EXP_THEIL_SEN).noise_steps(rest)})]
        names = (NOISY_STATS, EXP_THEIL_SEN) if self.kind == "public" else (self.mechanism,)
        return [(PRIMARY_STEP, rest, {name: M.get(name).noise_steps(rest) for name in names})]

    def steps(self, epsilon: float) -> list[tuple[str, Guarantee]]:
        """Named budget steps per tract for a primary budget ``epsilon``, each with the
        guarantee derived from its noise."""
        return [(name, worst_alternative(alts)) for name, _, alts in self.noise(epsilon)]

    def guarantee(self, epsilon: float) -> Guarantee:
        return sequential([g for _, g in self.steps(epsilon)])


@dataclass
class RuleOutcome:
    """Arrays (reps, tracts)."""

    mechanism: np.ndarray
    p25: np.ndarray
    p75: np.ndarray
    failed: np.ndarray
    reason: np.ndarray
    indicator: np.ndarray  # ε·nvar~ for the dp rule (internal: never published), else NaN
    # NoisyStats' released noisy n·var(x) where it ran (NaN elsewhere): a DP output, reused
    # for free by its confidence interval.
    noisy_nvar: np.ndarray | None = None


@dataclass
class Selection:
    """The per-tract choice, arrays (reps, tracts). ``noisy_nvar`` is a paid DP release."""

    use_noisy_stats: np.ndarray
    noisy_nvar: np.ndarray  # NaN unless the dp rule drew it
    epsilon_rest: float  # budget left for the chosen mechanism

    @property
    def mechanism(self) -> np.ndarray:
        return np.where(self.use_noisy_stats, NOISY_STATS, EXP_THEIL_SEN).astype(object)


def select(batch: TractBatch, epsilon: float, rule: Rule, rand: Randomness,
           reps: int = 1, *, meter: Meter = NO_METER) -> Selection:
    """Choose a mechanism per tract (the dp rule draws its noise here, spending ``meter``)."""
    T = batch.n_tracts
    nvar_t = np.full((reps, T), np.nan)
    eps_sel, rest = rule.budgets(epsilon)
    if rule.kind == "dp":
        nvar_t = noisy_nvar(batch, eps_sel, rand, reps, meter=meter)
        return Selection(epsilon * nvar_t >= rule.threshold, nvar_t, rest)
    if rule.kind == "public":
        return Selection(np.broadcast_to(batch.n >= rule.threshold, (reps, T)).copy(), nvar_t,
                         rest)
    if rule.kind == "fixed":
        return Selection(np.full((reps, T), rule.mechanism == NOISY_STATS), nvar_t, rest)
    raise ValueError(f"unknown selection rule {rule.kind!r}")


def run_selected(batch: TractBatch, rule: Rule, sel: Selection, rand: Randomness,
                 reps: int = 1, *, meter: Meter = NO_METER,
                 publishable_only: bool = False) -> RuleOutcome:
    """Run the chosen mechanism in each tract with the budget left after selection; every
    draw spends ``meter`` (the primary step's) first."""
    T = batch.n_tracts
    use_ns = sel.use_noisy_stats
    eps_rest = sel.epsilon_rest
    out_p25, out_p75 = np.full((reps, T), np.nan), np.full((reps, T), np.nan)
    failed = np.zeros((reps, T), dtype=bool)
    reason = np.full((reps, T), "", dtype=object)
    nvar_out = np.full((reps, T), np.nan)
    # Run each mechanism only on the tracts where some rep chose it.
    for name, chosen in ((NOISY_STATS, use_ns), (EXP_THEIL_SEN, ~use_ns)):
        tracts = np.nonzero(chosen.any(axis=0))[0]
        if tracts.size == 0:
            continue
        sub = batch.subset(tracts)
        if name == NOISY_STATS and rule.kind == "dp":
            res = noisy_stats_release(sub, 0.0, eps_rest / 2, eps_rest / 2, rand, reps,
                                      nvar_released=sel.noisy_nvar[:, tracts], meter=meter)
        else:
            res = M.estimate_batch(name, sub, eps_rest, rand=rand, reps=reps, meter=meter,
                                   publishable_only=publishable_only)
        pick = chosen[:, tracts]
        pairs = [(out_p25, res.p25), (out_p75, res.p75), (failed, res.failed),
                 (reason, res.reason)]
        if name == NOISY_STATS:
            pairs.append((nvar_out, res.extras["noisy_nvar"]))
        for dst, src in pairs:
            block = dst[:, tracts]
            block[pick] = np.asarray(src).reshape(block.shape)[pick]
            dst[:, tracts] = block
    small = batch.n < M.registry.MIN_RECORDS
    failed |= small[None, :]
    reason = np.where(small[None, :], "fewer than 2 records", reason)
    indicator = (sel.noisy_nvar * (eps_rest / (1 - rule.share)) if rule.kind == "dp"
                 else np.full((reps, T), np.nan))
    return RuleOutcome(sel.mechanism, np.where(failed, np.nan, out_p25),
                       np.where(failed, np.nan, out_p75), failed, reason, indicator, nvar_out)


def apply_rule(batch: TractBatch, epsilon: float, rule: Rule, rand: Randomness,
               reps: int = 1) -> RuleOutcome:
    """Select a mechanism per tract and run it, with total budget ``epsilon`` per tract."""
    return run_selected(batch, rule, select(batch, epsilon, rule, rand, reps), rand, reps)


class RuleEstimate:
    """Adapter so a rule can stand as a row of ``dpatlas evaluate``."""

    def __init__(self, rule: Rule):
        self.rule = rule

    def __call__(self, batch: TractBatch, epsilon: float, reps: int, seed: int):
        from mechanisms.noise import SeededRandomness

        out = apply_rule(batch, epsilon, self.rule, SeededRandomness(seed), reps)
        return out
