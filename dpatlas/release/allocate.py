"""The budget plan: each tract's (and cell's) budget split into named, typed steps.

Composition, stated in the manifest:
- steps of one tract and cell run on the same people: sequential composition;
- tracts of one cell hold disjoint people: parallel composition (the per-tract guarantee is the
  per-person guarantee for that cell);
- cells may share people: sequential composition across cells (conservative);
- geography levels (tract, county, state) hold the same people: each level's steps compose
  sequentially with the tract's (a person is in one tract, one county and one state), while
  the units of one level hold disjoint people (parallel). So the per-tract-and-cell guarantee
  is the per-person guarantee of every level together.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import mechanisms as M
from mechanisms import intervals as CI
from mechanisms.accounting import Accountant, agrees, charged_terms, within
from mechanisms.privacy import (ApproxDP, GDP, Guarantee, NotDP, ZCDP, as_dict,
                                rho_for_approx, to_approx)
from mechanisms.privacy_maps import NoiseStep, compose

from dpatlas.core.config import ReleaseConfig
from dpatlas.release.selection import Rule, worst_alternative



INTERVAL_STEP = "interval: p25 and p75"


def interval_kind(rule: Rule) -> str:
    """Which interval method the rule's tracts need: both mechanisms' unless the rule is fixed."""
    return rule.mechanism if rule.kind == "fixed" else "rule"


def suite_step(name: str) -> str:
    """The budget step of suite estimator ``name``."""
    return f"suite: {name}"


# A county or state publishes NoisyStats on its pooled records (its n is large, where
# NoisyStats is the better mechanism) with the interval method the tracts use for it.
LEVEL_MECHANISM = "NoisyStats"


def level_estimate_step(level: str) -> str:
    """The budget step paying a level's p25/p75, e.g. "level county: NoisyStats"."""
    return f"level {level}: {LEVEL_MECHANISM}"


def level_interval_step(level: str) -> str:
    """The budget step paying a level's intervals, e.g. "level county: interval"."""
    return f"level {level}: interval"


@dataclass(frozen=True)
class LevelPlan:
    """The budget of one level above the tract (county or state) per unit and cell: its
    share of epsilon_per_tract, split into the estimate and (with intervals) the interval."""

    level: str
    epsilon: float
    estimate_epsilon: float
    interval_epsilon: float  # 0: no intervals

    @property
    def steps(self) -> tuple[str, ...]:
        return ((level_estimate_step(self.level),)
                + ((level_interval_step(self.level),) if self.interval_epsilon else ()))


@dataclass(frozen=True)
class Step:
    """One budget step per (tract, cell): its charged guarantee and the noise that pays it.

    ``noise``: (label, noise steps) per alternative: the mechanisms the step may run in a
    tract (one for a suite step). Each alternative's composition is at most ``guarantee``, and
    the largest equals it: ``guarantee`` is derived from the noise, never declared.
    """

    name: str
    estimator: str | None
    epsilon: float  # the budget parameter handed to the estimator
    delta: float
    guarantee: Guarantee
    noise: tuple[tuple[str, tuple[NoiseStep, ...]], ...] = ()

    def alternatives(self) -> dict[str, tuple[NoiseStep, ...]]:
        return dict(self.noise)

    def composed(self, label: str) -> Guarantee:
        """The guarantee of alternative ``label``, in the step's type (a concentrated
        composition under an (ε, δ) step is converted at the step's δ)."""
        g = compose(self.alternatives()[label], relation=self.guarantee.relation)
        if isinstance(self.guarantee, ApproxDP) and isinstance(g, (ZCDP, GDP)):
            g = to_approx(g, self.delta)
        return g

    def composition_text(self) -> str:
        g = self.guarantee
        how = {"pure": "sequential composition: the epsilons add",
               "zcdp": "sequential composition: the rhos add",
               "gdp": "sequential composition: mu = sqrt(sum of mu^2)"}.get(g.kind, "")
        if isinstance(g, ApproxDP):
            how = ("sequential composition: the rhos add; the total is converted to (epsilon, "
                   f"delta) at delta = {self.delta!r} with dp-accounting's RDP accountant "
                   "(ZCDpEvent)")
        if len(self.noise) > 1:
            how += ("; each tract runs one alternative, and the step's guarantee is the "
                    "largest of theirs")
        return how

    def as_dict(self) -> dict:
        return {"step": self.name, "estimator": self.estimator, "epsilon_param": self.epsilon,
                "delta_param": self.delta, "guarantee": as_dict(self.guarantee),
                "noise": {"alternatives": {label: [s.as_dict() for s in steps]
                                           for label, steps in self.noise},
                          "composition": self.composition_text()}}


def _step(name: str, estimator: str | None, epsilon: float, delta: float,
          alternatives: Mapping[str, Sequence[NoiseStep]],
          guarantee: Guarantee | None = None) -> Step:
    """A step whose guarantee is derived from its noise (``guarantee``, when the estimator
    gives one, must agree with it)."""
    derived = worst_alternative({k: list(v) for k, v in alternatives.items()})
    step = Step(name, estimator, epsilon, delta, guarantee if guarantee is not None else derived,
                tuple((label, tuple(steps)) for label, steps in alternatives.items()))
    _check_alternatives(step)
    return step


def _measure(g: Guarantee) -> tuple[float, ...]:
    """The numbers that order guarantees of one type."""
    return {"pure": lambda: (g.epsilon,), "zcdp": lambda: (g.rho,), "gdp": lambda: (g.mu,),
            "approx": lambda: (g.epsilon, g.delta)}[g.kind]()


def _check_alternatives(step: Step) -> None:
    """Every alternative composes to at most the step's guarantee and the largest to it
    exactly: what the manifest states an auditor can recompute."""
    if not step.noise:
        raise ValueError(f"budget step {step.name!r} draws no noise")
    target = _measure(step.guarantee)
    found = []
    for label, _ in step.noise:
        g = step.composed(label)
        if g.kind != step.guarantee.kind:
            raise ValueError(f"budget step {step.name!r}: alternative {label} composes to "
                             f"{g.describe()}, not a {step.guarantee.kind} guarantee")
        m = _measure(g)
        if not all(within(a, b) for a, b in zip(m, target)):
            raise ValueError(f"budget step {step.name!r}: alternative {label} composes to "
                             f"{g.describe()}, over the step's {step.guarantee.describe()}")
        found.append(m)
    if not any(all(agrees(a, b) for a, b in zip(m, target))
               for m in found):
        raise ValueError(f"budget step {step.name!r}: no alternative composes to the step's "
                         f"{step.guarantee.describe()} (the guarantee must be derived from "
                         "the noise)")


@dataclass(frozen=True)
class SuiteShare:
    """What one suite estimator is handed per tract and cell: its (ε, δ) parameters (for a
    zCDP estimator ``epsilon`` is the ε whose ρ = ε²/2 converts to its share)."""

    estimator: str
    epsilon: float
    delta: float


@dataclass(frozen=True)
class BudgetPlan:
    epsilon_per_tract: float
    delta_per_tract: float
    rule: Rule
    primary_epsilon: float
    suite: tuple[SuiteShare, ...]  # the full-suite profile's estimators
    steps: tuple[Step, ...] = field(default=())
    conversion_delta: float = 0.0  # δ spent converting concentrated steps to (ε, δ)
    interval_epsilon: float = 0.0  # the interval step's budget (0: no intervals)
    interval_level: float = 0.95
    levels: tuple[LevelPlan, ...] = ()  # counties, states: steps of their own in ``steps``

    def level(self, name: str) -> LevelPlan:
        for lp in self.levels:
            if lp.level == name:
                return lp
        raise KeyError(f"no level {name!r} in the plan; levels: "
                       f"{[lp.level for lp in self.levels]}")

    def per_tract(self) -> Guarantee:
        return self._accountant(1).spent()

    def _accountant(self, n_cells: int) -> Accountant:
        """Every step of every cell composed (cells may share people: sequential)."""
        acc = Accountant(conversion_delta=self.conversion_delta * n_cells or None)
        for s in self.steps:
            acc.compose(s.guarantee, n_cells)
        return acc

    def charged(self, names: Sequence[str] | None = None) -> tuple[float, float]:
        """The (ε, δ) the ledger charges one tract and cell: the steps' figures summed (pure
        and (ε, δ) as stated, concentrated steps converted at the conversion δ; basic
        sequential composition). ``names``: only those steps (e.g. a level's own, what its
        county or state table says it spent)."""
        eps, dlt = [], []
        wanted = None if names is None else set(names)
        for s in self.steps:
            if wanted is not None and s.name not in wanted:
                continue
            try:
                e, d, _ = charged_terms(s.guarantee, self.conversion_delta)
            except ValueError as err:
                raise ValueError(f"budget step {s.name!r}: {err}") from None
            eps.append(e)
            dlt.append(d)
        return math.fsum(eps), math.fsum(dlt)

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no budget step {name!r}; steps: {[s.name for s in self.steps]}")

    def totals(self, n_cells: int) -> dict:
        """Composed total per person over all cells, as (ε, δ) and as ρ where one exists."""
        parts = [s.guarantee for s in self.steps] * n_cells
        if any(isinstance(g, NotDP) for g in parts):
            raise ValueError("a non-private step cannot be part of a release")
        has_approx = any(isinstance(g, ApproxDP) for g in parts)
        combined = self._accountant(n_cells).spent()
        if isinstance(combined, ZCDP):
            approx = to_approx(combined, self.delta_per_tract * n_cells)
        else:
            approx = to_approx(combined, max(getattr(combined, "delta", 0.0), 1e-300))
        rho = None
        if not has_approx:
            as_rho = Accountant()
            for g in parts:
                as_rho.compose(M.privacy.to_zcdp(g))
            rho = as_rho.spent().rho
        return {"epsilon": approx.epsilon, "delta": approx.delta, "rho": rho,
                "rho_note": None if rho is not None else
                "no zCDP bound: a step has only an (epsilon, delta) guarantee",
                "guarantee": as_dict(combined), "cells": n_cells}


def _level_steps(cfg: ReleaseConfig) -> tuple[list[Step], tuple[LevelPlan, ...]]:
    """The steps and budgets of the levels above the tract, in config order."""
    shares, steps, levels = cfg.shares(), [], []
    for level in cfg.levels:
        if level == "tract":
            continue
        eps = shares[level] * cfg.privacy.epsilon_per_tract
        ci_eps = cfg.intervals.share * eps if cfg.intervals.enabled else 0.0
        est_eps = eps - ci_eps
        est = M.get(LEVEL_MECHANISM)
        steps.append(_step(level_estimate_step(level), None, est_eps, 0.0,
                           {LEVEL_MECHANISM: est.noise_steps(est_eps, None, **est.defaults)}))
        if ci_eps:
            steps.append(_step(level_interval_step(level), None, ci_eps, 0.0,
                               {LEVEL_MECHANISM: CI.interval_noise_steps(LEVEL_MECHANISM,
                                                                         ci_eps)}))
        levels.append(LevelPlan(level, eps, est_eps, ci_eps))
    return steps, tuple(levels)


def plan(cfg: ReleaseConfig, threshold: float | None) -> BudgetPlan:
    delta = cfg.privacy.delta
    # The tracts' share of the per-person budget (all of it unless counties or states are
    # published); the levels' steps below take the rest.
    eps = cfg.privacy.epsilon_per_tract
    tract_share = cfg.shares()["tract"]
    if tract_share != 1.0:
        eps = tract_share * eps
    sel = cfg.selection
    schedule = ()
    if sel.rule == "banded":
        from dpatlas.release.thresholds import resolve_schedule

        schedule = resolve_schedule(sel)
    rule = Rule(sel.rule, threshold, sel.budget_share, sel.mechanism, schedule)
    if cfg.profile.name == "primary":
        primary_eps, suite = eps, ()
    else:
        primary_eps = (1 - cfg.profile.suite_share) * eps
        share = cfg.profile.suite_share * eps / len(cfg.profile.suite)
        suite = tuple(SuiteShare(name, share, delta / 2 if M.get(name).needs_delta else 0.0)
                      for name in cfg.profile.suite)
    approx_d = sum(s.delta for s in suite)
    concentrated = [s.estimator for s in suite
                    if isinstance(M.get(s.estimator).guarantee(1.0, **M.get(s.estimator).defaults),
                                  ZCDP)]
    conversion = (delta - approx_d) if concentrated else 0.0
    if len(concentrated) > 1:
        raise ValueError("at most one zCDP estimator per suite (each would need its own delta)")
    interval_eps = 0.0
    if cfg.intervals.enabled:
        interval_eps = cfg.intervals.share * primary_eps
        primary_eps -= interval_eps
    steps = [_step(name, None, budget, 0.0, alts)
             for name, budget, alts in rule.noise(primary_eps)]
    if interval_eps:
        labels = ((rule.mechanism,) if rule.kind == "fixed"
                  else ("NoisyStats", "DPExpTheilSen"))
        steps.append(_step(INTERVAL_STEP, None, interval_eps, 0.0,
                           {label: CI.interval_noise_steps(label, interval_eps)
                            for label in labels}))
    handed = []
    for share_ in suite:
        name, e, d = share_.estimator, share_.epsilon, share_.delta
        est = M.get(name)
        if name in concentrated:
            # A zCDP estimator takes ρ = ε_param²/2. Give it the ρ whose (ε, δ) conversion at
            # the conversion δ equals its share, so no tract pays more than (ε, δ) in total.
            e = math.sqrt(2.0 * rho_for_approx(e, conversion))
        g = est.guarantee(e, d or None, **est.defaults)
        steps.append(_step(suite_step(name), name, e, d,
                           {name: est.noise_steps(e, d or None, **est.defaults)}, g))
        handed.append(SuiteShare(name, e, d))
    level_steps, levels = _level_steps(cfg)
    return BudgetPlan(cfg.privacy.epsilon_per_tract, delta, rule, primary_eps, tuple(handed),
                      tuple(steps + level_steps), conversion, interval_eps,
                      cfg.intervals.level, levels)
