"""The budget plan: each tract's (and cell's) budget split into named, typed steps.

Composition, stated in the manifest:
- steps of one tract and cell run on the same people: sequential composition;
- tracts of one cell hold disjoint people: parallel composition (the per-tract guarantee is the
  per-person guarantee for that cell);
- cells may share people: sequential composition across cells (conservative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import mechanisms as M
from mechanisms.privacy import (ApproxDP, Guarantee, NotDP, ZCDP, as_dict, rho_for_approx,
                                sequential, to_approx)

from .config import ReleaseConfig
from .selection import Rule


@dataclass(frozen=True)
class Step:
    name: str
    estimator: str | None
    epsilon: float  # the budget parameter handed to the estimator
    delta: float
    guarantee: Guarantee

    def as_dict(self) -> dict:
        return {"step": self.name, "estimator": self.estimator, "epsilon_param": self.epsilon,
                "delta_param": self.delta, "guarantee": as_dict(self.guarantee)}


@dataclass(frozen=True)
class BudgetPlan:
    epsilon_per_tract: float
    delta_per_tract: float
    rule: Rule
    primary_epsilon: float
    suite: tuple[tuple[str, float, float], ...]  # (estimator, epsilon, delta)
    steps: tuple[Step, ...] = field(default=())
    conversion_delta: float = 0.0  # δ spent converting concentrated steps to (ε, δ)

    def per_tract(self) -> Guarantee:
        return sequential([s.guarantee for s in self.steps], delta=self.conversion_delta or None)

    def totals(self, n_cells: int) -> dict:
        """Composed total per person over all cells, as (ε, δ) and as ρ where one exists."""
        parts = [s.guarantee for s in self.steps] * n_cells
        if any(isinstance(g, NotDP) for g in parts):
            raise ValueError("a non-private step cannot be part of a release")
        has_approx = any(isinstance(g, ApproxDP) for g in parts)
        combined = sequential(parts, delta=self.conversion_delta * n_cells or None)
        if isinstance(combined, ZCDP):
            approx = to_approx(combined, self.delta_per_tract * n_cells)
        else:
            approx = to_approx(combined, max(getattr(combined, "delta", 0.0), 1e-300))
        rho = None
        if not has_approx:
            rho = sequential([g if isinstance(g, ZCDP) else M.privacy.to_zcdp(g)
                              for g in parts]).rho
        return {"epsilon": approx.epsilon, "delta": approx.delta, "rho": rho,
                "rho_note": None if rho is not None else
                "no zCDP bound: a step has only an (epsilon, delta) guarantee",
                "guarantee": as_dict(combined), "cells": n_cells}


def plan(cfg: ReleaseConfig, threshold: float | None) -> BudgetPlan:
    eps, delta = cfg.privacy.epsilon_per_tract, cfg.privacy.delta
    sel = cfg.selection
    rule = Rule(sel.rule, threshold, sel.budget_share, sel.mechanism)
    if cfg.profile.name == "primary":
        primary_eps, suite = eps, ()
    else:
        primary_eps = (1 - cfg.profile.suite_share) * eps
        share = cfg.profile.suite_share * eps / len(cfg.profile.suite)
        suite = tuple((name, share, delta / 2 if M.get(name).needs_delta else 0.0)
                      for name in cfg.profile.suite)
    approx_d = sum(d for _, _, d in suite)
    concentrated = [name for name, _, _ in suite
                    if isinstance(M.get(name).guarantee(1.0, **M.get(name).defaults), ZCDP)]
    conversion = (delta - approx_d) if concentrated else 0.0
    if len(concentrated) > 1:
        raise ValueError("at most one zCDP estimator per suite (each would need its own delta)")
    steps = [Step(name, None, g.epsilon, 0.0, g) for name, g in rule.steps(primary_eps)]
    handed = []
    for name, e, d in suite:
        est = M.get(name)
        if name in concentrated:
            # A zCDP estimator takes ρ = ε_param²/2. Give it the ρ whose (ε, δ) conversion at
            # the conversion δ equals its share, so every tract pays exactly (ε, δ) in total.
            e = math.sqrt(2.0 * rho_for_approx(e, conversion))
        g = est.guarantee(e, d or None, **est.defaults)
        steps.append(Step(f"suite: {name}", name, e, d, g))
        handed.append((name, e, d))
    return BudgetPlan(eps, delta, rule, primary_eps, tuple(handed), tuple(steps), conversion)
