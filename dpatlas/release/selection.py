"""Choosing NoisyStats or DPExpTheilSen per tract, and running the choice.

Rules (``estimators.md``: n·ε·var(x) is the paper's best single indicator):

- ``dp``: spend ``share·ε`` on a noisy ``nvar = n·var(x)`` (Laplace, sensitivity 1 − 1/n);
  choose NoisyStats where ``ε·nvar~ ≥ threshold``, else DPExpTheilSen, each with the remaining
  ``(1 − share)·ε``. Where NoisyStats is chosen it *reuses* the noisy nvar as its own (paid
  once), and splits the rest between ncov and the intercept. Since it is only chosen where the
  noisy nvar is large and positive, it cannot fail there.
- ``public``: NoisyStats where ``n ≥ threshold`` (n is public), else DPExpTheilSen; no budget.
- ``banded`` (docs/selection.md): bands of the public n, calibrated per ε, each naming
  NoisyStats, DPExpTheilSen (run with the whole budget: n settles it, nothing is spent on
  choosing) or ``dp`` (only there the ``dp`` rule's draw is spent, and the chosen mechanism
  gets the rest). One budget step holds every alternative a tract may run, so no tract pays
  for a selection it does not draw.
- ``fixed``: always the given mechanism.

Whatever the choice, each tract's guarantee is the same: every budget step's guarantee is
derived from the noise of the mechanisms it may run (``Rule.noise``: the largest composition
of their privacy maps, at most the step's budget), so it does not depend on the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import mechanisms as M
from mechanisms.batch import TractBatch
from mechanisms.privacy_filter import NO_METER
from mechanisms.noise import Randomness
from mechanisms.privacy import PROJECT_RELATION, Guarantee, parallel, sequential
from mechanisms.privacy_maps import NoiseStep, compose
from mechanisms.registry import Meter
from mechanisms.sufficient_stats import (intercept_step, ncov_step, noisy_nvar,
                                         noisy_stats_release, noisy_stats_split, nvar_step)

NOISY_STATS, EXP_THEIL_SEN = "NoisyStats", "DPExpTheilSen"
SELECTION_STEP = "selection: noisy n*var(x)"
PRIMARY_STEP = "primary: p25 and p75"
SELECTION_LABEL = "dp selection rule"
DP_BAND = "dp"  # a band of the banded rule where the dp rule's selection draw decides
BAND_CHOICES = (NOISY_STATS, EXP_THEIL_SEN, DP_BAND)
# Alternatives of the banded rule's step where the selection draw was spent first.
SELECTED_NOISY_STATS = f"{SELECTION_LABEL} + {NOISY_STATS}"
SELECTED_EXP_THEIL_SEN = f"{SELECTION_LABEL} + {EXP_THEIL_SEN}"

Bands = tuple[tuple[float, str], ...]  # (upper bound on n, exclusive; choice), increasing
Schedule = tuple[tuple[float, Bands], ...]  # (calibration ε, its bands), increasing ε

Alternatives = dict[str, list[NoiseStep]]


def _reusing_nvar_steps(rest: float) -> list[NoiseStep]:
    """NoisyStats' steps after a selection drew its nvar: ncov and the intercept, from the rest."""
    _, eps_ncov, eps_intercept = noisy_stats_split(rest, nvar_drawn=True)
    return [ncov_step(eps_ncov), intercept_step(eps_intercept)]


def worst_alternative(alternatives: Alternatives) -> Guarantee:
    """A step's guarantee when each tract runs ONE of several alternatives: the largest of
    their compositions. The choice is made from public n or a DP output, and whichever runs
    is within this bound, so adaptive sequential composition holds with it. Each draw is
    stated for the project's relation first (an add-remove draw through group privacy), so
    alternatives under different relations never compose silently."""
    return parallel([compose(steps, relation=PROJECT_RELATION)
                     for steps in alternatives.values()])


def check_schedule(schedule: Schedule) -> Schedule:
    """A banded rule's schedule, validated: ε > 0 increasing, bands with increasing upper
    bounds ending at inf, each choice one of ``BAND_CHOICES``."""
    out = []
    for eps, bands in schedule:
        eps = float(eps)
        if not (math.isfinite(eps) and eps > 0) or (out and eps <= out[-1][0]):
            raise ValueError(f"banded rule: calibration epsilons must be > 0 and increasing, "
                             f"got {[e for e, _ in schedule]}")
        bands = tuple((float(upper), str(choice)) for upper, choice in bands)
        uppers = [u for u, _ in bands]
        if not bands or uppers != sorted(set(uppers)) or uppers[-1] != math.inf:
            raise ValueError(f"banded rule at epsilon {eps:g}: band upper bounds must increase "
                             f"and end at inf, got {uppers}")
        bad = [c for _, c in bands if c not in BAND_CHOICES]
        if bad:
            raise ValueError(f"banded rule at epsilon {eps:g}: unknown choice(s) {bad}; "
                             f"allowed: {', '.join(BAND_CHOICES)}")
        out.append((eps, bands))
    if not out:
        raise ValueError("banded rule: the schedule is empty")
    return tuple(out)


def schedule_from(entry) -> Schedule:
    """A calibration file's ``rules.banded`` entry → the rule's schedule (``n_below: null``
    is the last band, up to infinity)."""
    return check_schedule(tuple(
        (float(e["epsilon"]),
         tuple((math.inf if b["n_below"] is None else float(b["n_below"]), b["choice"])
               for b in e["bands"]))
        for e in entry["schedule"]))


@dataclass(frozen=True)
class Rule:
    kind: str  # dp | public | fixed | banded
    threshold: float | None = None  # dp and banded: on ε·nvar~; public: on n
    share: float = 0.1
    mechanism: str = EXP_THEIL_SEN
    schedule: Schedule = ()  # banded: the bands per calibration ε

    def budgets(self, epsilon: float) -> tuple[float, float]:
        """(selection budget, budget left for the chosen mechanism): one place, so the plan
        and the run calibrate from the very same numbers. For the banded rule these are the
        figures of its dp band; elsewhere it hands the mechanism the whole ``epsilon``."""
        if self.kind in ("dp", "banded"):
            eps_sel = self.share * epsilon
            return eps_sel, epsilon - eps_sel
        return 0.0, epsilon

    def bands(self, epsilon: float) -> Bands:
        """The banded rule's bands at budget ``epsilon``: those calibrated at the nearest ε on
        a log scale (public: the plan's parameters only)."""
        if self.kind != "banded":
            raise ValueError(f"rule {self.kind!r} has no bands")
        schedule = check_schedule(self.schedule)
        return min(schedule, key=lambda entry: abs(math.log(entry[0] / epsilon)))[1]

    def band_choice(self, n: np.ndarray, epsilon: float) -> np.ndarray:
        """Per tract, from its public n: NoisyStats, DPExpTheilSen or ``dp`` (object array)."""
        bands = self.bands(epsilon)
        uppers = np.array([u for u, _ in bands])
        which = np.searchsorted(uppers, np.asarray(n, dtype=float), side="right")
        return np.array([c for _, c in bands], dtype=object)[which]

    def noise(self, epsilon: float) -> list[tuple[str, float, Alternatives]]:
        """Per budget step of a tract with primary budget ``epsilon``: its name, the budget it
        hands its mechanism, and the noise of each mechanism the rule may run there."""
        eps_sel, rest = self.budgets(epsilon)
        if self.kind == "dp":
            return [(SELECTION_STEP, eps_sel, {SELECTION_LABEL: [nvar_step(eps_sel)]}),
                    (PRIMARY_STEP, rest, {
                        # NoisyStats reuses the selection's noisy nvar (paid once, above).
                        NOISY_STATS: _reusing_nvar_steps(rest),
                        EXP_THEIL_SEN: M.get(EXP_THEIL_SEN).noise_steps(rest)})]
        if self.kind == "banded":
            return [(PRIMARY_STEP, epsilon, self._banded_alternatives(epsilon))]
        names = (NOISY_STATS, EXP_THEIL_SEN) if self.kind == "public" else (self.mechanism,)
        return [(PRIMARY_STEP, rest, {name: M.get(name).noise_steps(rest) for name in names})]

    def _banded_alternatives(self, epsilon: float) -> Alternatives:
        """What a tract may run under the banded rule: a mechanism with the whole budget (a
        band that names it), or the selection draw followed by the chosen mechanism with the
        rest (the dp band; NoisyStats reuses the drawn nvar, as under the dp rule)."""
        eps_sel, rest = self.budgets(epsilon)
        choices = {c for _, c in self.bands(epsilon)}
        alts: Alternatives = {name: M.get(name).noise_steps(epsilon)
                              for name in (NOISY_STATS, EXP_THEIL_SEN) if name in choices}
        if DP_BAND in choices:
            alts[SELECTED_NOISY_STATS] = [nvar_step(eps_sel)] + _reusing_nvar_steps(rest)
            alts[SELECTED_EXP_THEIL_SEN] = ([nvar_step(eps_sel)]
                                            + M.get(EXP_THEIL_SEN).noise_steps(rest))
        return alts

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
    noisy_nvar: np.ndarray  # NaN unless the dp rule (or the banded rule's dp band) drew it
    epsilon_rest: float  # budget left for the chosen mechanism after a selection draw
    # Banded rule: the whole budget (what a mechanism gets in a band that names it) and, per
    # tract, whether it lies in the dp band (a function of the public n).
    epsilon: float | None = None
    drew: np.ndarray | None = None

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
    if rule.kind == "banded":
        return _select_banded(batch, epsilon, rule, rand, reps, meter)
    if rule.kind == "public":
        return Selection(np.broadcast_to(batch.n >= rule.threshold, (reps, T)).copy(), nvar_t,
                         rest)
    if rule.kind == "fixed":
        return Selection(np.full((reps, T), rule.mechanism == NOISY_STATS), nvar_t, rest)
    raise ValueError(f"unknown selection rule {rule.kind!r}")


def _select_banded(batch: TractBatch, epsilon: float, rule: Rule, rand: Randomness,
                   reps: int, meter: Meter) -> Selection:
    """The band of each tract's public n decides, except in the dp band, where the noisy
    nvar is drawn (for those tracts only) and compared with the threshold."""
    eps_sel, rest = rule.budgets(epsilon)
    band = rule.band_choice(batch.n, epsilon)
    drew = band == DP_BAND
    nvar_t = np.full((reps, batch.n_tracts), np.nan)
    if drew.any():
        idx = np.nonzero(drew)[0]
        nvar_t[:, idx] = noisy_nvar(batch.subset(idx), eps_sel, rand, reps, meter=meter)
    use_ns = np.where(drew[None, :], epsilon * nvar_t >= rule.threshold,
                      (band == NOISY_STATS)[None, :])
    return Selection(use_ns, nvar_t, rest, epsilon, drew)


def record_selection_spend(rule: Rule, sel: Selection, labels: np.ndarray,
                           meter: Meter) -> None:
    """Banded rule: the selection draw was spent, in an earlier stage, from the same budget
    step the mechanism now spends from; record it on this stage's ``meter`` first, so the
    step's filter counts both draws of a dp-band tract."""
    if rule.kind == "banded" and sel.drew is not None and sel.drew.any():
        eps_sel, _ = rule.budgets(sel.epsilon)
        meter.spend(np.asarray(labels)[sel.drew], nvar_step(eps_sel).guarantee)


def run_selected(batch: TractBatch, rule: Rule, sel: Selection, rand: Randomness,
                 reps: int = 1, *, meter: Meter = NO_METER,
                 publishable_only: bool = False) -> RuleOutcome:
    """Run the chosen mechanism in each tract with the budget left after selection; every
    draw spends ``meter`` (the primary step's) first."""
    T = batch.n_tracts
    eps_rest = sel.epsilon_rest
    out_p25, out_p75 = np.full((reps, T), np.nan), np.full((reps, T), np.nan)
    failed = np.zeros((reps, T), dtype=bool)
    reason = np.full((reps, T), "", dtype=object)
    nvar_out = np.full((reps, T), np.nan)
    # Run each mechanism only on the tracts where some rep chose it.
    for name, chosen, run in _branches(batch, rule, sel, rand, reps, meter, publishable_only):
        tracts = np.nonzero(chosen.any(axis=0))[0]
        if tracts.size == 0:
            continue
        res = run(batch.subset(tracts), tracts)
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
    indicator = (sel.noisy_nvar * (eps_rest / (1 - rule.share))
                 if rule.kind in ("dp", "banded")
                 else np.full((reps, T), np.nan))
    return RuleOutcome(sel.mechanism, np.where(failed, np.nan, out_p25),
                       np.where(failed, np.nan, out_p75), failed, reason, indicator, nvar_out)


def _branches(batch, rule: Rule, sel: Selection, rand: Randomness, reps: int, meter: Meter,
              publishable_only: bool):
    """(mechanism, where it runs (reps, tracts), runner(sub-batch, tract indices)) per branch
    of the rule: the dp rule's NoisyStats reuses the selection's nvar; the banded rule runs a
    mechanism with the whole budget outside its dp band and like the dp rule inside it."""
    use_ns = sel.use_noisy_stats

    def mechanism(name, epsilon):
        return lambda sub, tracts: M.estimate_batch(name, sub, epsilon, rand=rand, reps=reps,
                                                    meter=meter,
                                                    publishable_only=publishable_only)

    def reusing_nvar(sub, tracts):
        _, eps_ncov, eps_intercept = noisy_stats_split(sel.epsilon_rest, nvar_drawn=True)
        return noisy_stats_release(sub, 0.0, eps_ncov, eps_intercept, rand, reps,
                                   nvar_released=sel.noisy_nvar[:, tracts], meter=meter)

    if rule.kind == "banded":
        drew = sel.drew[None, :]
        return [(NOISY_STATS, use_ns & ~drew, mechanism(NOISY_STATS, sel.epsilon)),
                (EXP_THEIL_SEN, ~use_ns & ~drew, mechanism(EXP_THEIL_SEN, sel.epsilon)),
                (NOISY_STATS, use_ns & drew, reusing_nvar),
                (EXP_THEIL_SEN, ~use_ns & drew, mechanism(EXP_THEIL_SEN, sel.epsilon_rest))]
    ns_run = reusing_nvar if rule.kind == "dp" else mechanism(NOISY_STATS, sel.epsilon_rest)
    return [(NOISY_STATS, use_ns, ns_run),
            (EXP_THEIL_SEN, ~use_ns, mechanism(EXP_THEIL_SEN, sel.epsilon_rest))]


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
