"""Typed privacy guarantees, their composition and conversions.

Every estimator reports its guarantee as one of these values, built by composing the
guarantees of its noisy steps, never as a free-text comment.

Definitions (for a fixed neighbouring relation, by default replace-one):
- ``PureDP(eps)``: ε-differential privacy.
- ``ApproxDP(eps, delta)``: (ε, δ)-differential privacy.
- ``ZCDP(rho)``: ρ-zero-concentrated DP (Bun & Steinke 2016, Def. 1.1).
- ``GDP(mu)``: μ-Gaussian DP (Dong, Roth & Su 2022).
- ``NotDP(reason)``: no formal guarantee (non-private baselines, the MOS heuristic).

Composition rules used here (all standard):
- sequential: pure ε add (Dwork et al. 2006); ρ add (Bun & Steinke 2016, Lemma 2.3); μ
  compose as sqrt(Σμ²) (Dong, Roth & Su 2022, Cor. 3.3); (ε, δ) add (basic composition).
  Mixed types are first lifted to a common type: pure ε ⇒ ρ = ε²/2 zCDP (Bun & Steinke 2016,
  Prop. 1.4); μ-GDP ⇒ ρ = μ²/2 zCDP (its Rényi divergences are those of a Gaussian with
  sensitivity/σ = μ; Dong, Roth & Su 2022, Cor. B.6); anything with a δ is composed as (ε, δ)
  after converting the rest at a δ share given by the caller.
- parallel (disjoint inputs, e.g. the people of different tracts): the maximum of the parts
  (McSherry 2009, Thm 4), after lifting to a common type.
- conversions to (ε, δ) use Google's ``dp-accounting`` library: zCDP through its RDP
  accountant (``ZCDpEvent``), GDP through its PLD accountant (a Gaussian with noise multiplier
  1/μ, which is exact for GDP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Union

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant


@dataclass(frozen=True)
class PureDP:
    epsilon: float
    kind = "pure"

    def __post_init__(self) -> None:
        _check_nonneg("epsilon", self.epsilon)

    def describe(self) -> str:
        return f"{self.epsilon:.6g}-DP (pure)"


@dataclass(frozen=True)
class ApproxDP:
    epsilon: float
    delta: float
    kind = "approx"

    def __post_init__(self) -> None:
        _check_nonneg("epsilon", self.epsilon)
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must lie in [0, 1), got {self.delta!r}")

    def describe(self) -> str:
        return f"({self.epsilon:.6g}, {self.delta:.3g})-DP"


@dataclass(frozen=True)
class ZCDP:
    rho: float
    kind = "zcdp"

    def __post_init__(self) -> None:
        _check_nonneg("rho", self.rho)

    def describe(self) -> str:
        return f"{self.rho:.6g}-zCDP"


@dataclass(frozen=True)
class GDP:
    mu: float
    kind = "gdp"

    def __post_init__(self) -> None:
        _check_nonneg("mu", self.mu)

    def describe(self) -> str:
        return f"{self.mu:.6g}-GDP"


@dataclass(frozen=True)
class NotDP:
    reason: str
    kind = "none"

    def describe(self) -> str:
        return f"not differentially private ({self.reason})"


Guarantee = Union[PureDP, ApproxDP, ZCDP, GDP, NotDP]


def _check_nonneg(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Conversions


def to_zcdp(g: Guarantee) -> ZCDP:
    """The tightest zCDP implied by ``g`` (only pure, zCDP and GDP imply one)."""
    if isinstance(g, ZCDP):
        return g
    if isinstance(g, PureDP):
        return ZCDP(g.epsilon**2 / 2.0)
    if isinstance(g, GDP):
        return ZCDP(g.mu**2 / 2.0)
    raise TypeError(f"{g.describe()} implies no zCDP bound")


def to_approx(g: Guarantee, delta: float) -> ApproxDP:
    """An (ε, δ) guarantee implied by ``g`` at the given δ (for ApproxDP: its own δ if smaller)."""
    if isinstance(g, NotDP):
        raise TypeError(f"{g.describe()} implies no (epsilon, delta) bound")
    if isinstance(g, PureDP):
        return ApproxDP(g.epsilon, 0.0)
    if isinstance(g, ApproxDP):
        if g.delta > delta:
            raise ValueError(f"{g.describe()} cannot be stated at the smaller delta={delta}")
        return g
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1) to convert {g.describe()}")
    if isinstance(g, ZCDP):
        if g.rho == 0:
            return ApproxDP(0.0, delta)
        acc = rdp_privacy_accountant.RdpAccountant()
        acc.compose(dp_accounting.ZCDpEvent(g.rho))
        return ApproxDP(float(acc.get_epsilon(delta)), delta)
    if isinstance(g, GDP):
        if g.mu == 0:
            return ApproxDP(0.0, delta)
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
        acc.compose(dp_accounting.GaussianDpEvent(1.0 / g.mu))
        return ApproxDP(float(acc.get_epsilon(delta)), delta)
    raise TypeError(f"unknown guarantee {g!r}")


@lru_cache(maxsize=256)
def rho_for_approx(epsilon: float, delta: float) -> float:
    """The largest ρ whose zCDP→(ε, δ) conversion (dp-accounting) stays within ``epsilon``."""
    lo, hi = 0.0, max(epsilon, 1.0)
    while to_approx(ZCDP(hi), delta).epsilon < epsilon:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if to_approx(ZCDP(mid), delta).epsilon <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------------------------------------
# Composition


def sequential(parts: Iterable[Guarantee], delta: float | None = None) -> Guarantee:
    """Guarantee of running all ``parts`` on the same people.

    ``delta``: the δ at which to convert concentrated parts when an (ε, δ) part forces the
    result into (ε, δ) form; it is added to the total δ.
    """
    parts = list(parts)
    if not parts:
        return PureDP(0.0)
    for g in parts:
        if isinstance(g, NotDP):
            return NotDP(g.reason)
    kinds = {g.kind for g in parts}
    if kinds == {"pure"}:
        return PureDP(math.fsum(g.epsilon for g in parts))
    if kinds == {"gdp"}:
        return GDP(math.sqrt(math.fsum(g.mu**2 for g in parts)))
    if "approx" not in kinds:
        return ZCDP(math.fsum(to_zcdp(g).rho for g in parts))
    approx = [g for g in parts if isinstance(g, ApproxDP)]
    pure = [g for g in parts if isinstance(g, PureDP)]
    rest = [g for g in parts if isinstance(g, (ZCDP, GDP))]
    eps = math.fsum(g.epsilon for g in approx) + math.fsum(g.epsilon for g in pure)
    dlt = math.fsum(g.delta for g in approx)
    if rest:
        if delta is None:
            raise ValueError("composing concentrated with (epsilon, delta) parts needs a delta")
        conv = to_approx(sequential(rest), delta)
        eps += conv.epsilon
        dlt += conv.delta
    return ApproxDP(eps, dlt)


def parallel(parts: Iterable[Guarantee]) -> Guarantee:
    """Guarantee of running each part on a disjoint set of people (e.g. one per tract)."""
    parts = list(parts)
    if not parts:
        return PureDP(0.0)
    for g in parts:
        if isinstance(g, NotDP):
            return NotDP(g.reason)
    kinds = {g.kind for g in parts}
    if kinds == {"pure"}:
        return PureDP(max(g.epsilon for g in parts))
    if kinds == {"gdp"}:
        return GDP(max(g.mu for g in parts))
    if kinds == {"approx"}:
        return ApproxDP(max(g.epsilon for g in parts), max(g.delta for g in parts))
    if "approx" not in kinds:
        return ZCDP(max(to_zcdp(g).rho for g in parts))
    raise ValueError("parallel composition of (epsilon, delta) with other types needs a delta: "
                     "convert the parts with to_approx first")


def as_dict(g: Guarantee) -> dict:
    """A JSON-ready form, for manifests and reports."""
    d = {"type": g.kind, "text": g.describe()}
    for f in ("epsilon", "delta", "rho", "mu", "reason"):
        if hasattr(g, f):
            d[f] = getattr(g, f)
    return d
