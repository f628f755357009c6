"""The one accountant: guarantees in, a composed guarantee out, and whether it fits a cap.

In the manner of dp-accounting's ``PrivacyAccountant``: :class:`Accountant` takes events
(``compose(guarantee, count)``) and answers ``spent()`` and ``fits(guarantee, count, cap)``.
The budget plan (``dpatlas.release.allocate``), the in-run privacy filter
(``mechanisms.privacy_filter``), the ledger (``dpatlas.ledger``: what a step is charged, the cap check,
the lifetime spend, :func:`lifetime_epsilon`) and the manifest's checks all account through
this module; the audit (``dpatlas.audit.accounting``) keeps its own copy on purpose.

Accounting state, against a cap (the rules of :func:`increment`): pure ε parts add as ε,
(ε, δ) parts add as (ε, δ) (basic composition), concentrated parts (zCDP, GDP, and pure ε under
a concentrated cap) add as ρ (Bun & Steinke 2016, Lemma 2.3) and are converted to (ε, δ) once,
at the end, by ``privacy.to_approx`` at the δ the cap leaves (:func:`fits`). Without a cap,
:meth:`Accountant.spent` is ``privacy.sequential`` of the events.

Tolerance policy (:data:`REL_TOL`): one relative tolerance for every comparison of a float sum
with the cap or figure it must not exceed or must equal.
"""

from __future__ import annotations

import math

import numpy as np

from .privacy import (GDP, ZCDP, ApproxDP, Guarantee, NotDP, PureDP, relation_of, sequential,
                      to_approx)

# Why 1e-9, relative: budgets are split into float shares (ε/3, a suite share, a calibrated ρ)
# and summed back; the rounding of such a sum is a few ulps (~1e-16 relative) per term, and
# dp-accounting's (ε, δ) conversion of a bisected ρ agrees with its target to ~1e-12. 1e-9
# admits every such rounding with room to spare, and a real overspend (a draw too many, a
# wrong share: relative 1e-6 and far above) is still refused. Used by the plan, the filter,
# the ledger's cap check and the manifest's consistency check alike.
REL_TOL = 1e-9


class Refused(ValueError):
    """A guarantee cannot be paid from a cap (incompatible types, or not private at all)."""


def within(total, cap):
    """``total`` is at most ``cap`` under the tolerance policy (floats or numpy arrays)."""
    return total <= cap + REL_TOL * abs(cap)


def agrees(a: float, b: float) -> bool:
    """``a`` and ``b`` are the same figure under the tolerance policy."""
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-300)


def rho_of(g: Guarantee) -> float:
    """The ρ a concentrated or pure guarantee composes as (Bun & Steinke 2016, Prop. 1.4 for
    pure ε: ρ = ε²/2; μ-GDP: ρ = μ²/2)."""
    if isinstance(g, ZCDP):
        return g.rho
    if isinstance(g, PureDP):
        return g.epsilon**2 / 2.0
    if isinstance(g, GDP):
        return g.mu**2 / 2.0
    raise TypeError(f"{g.describe()} has no zCDP bound")


def increment(g: Guarantee, count: int, cap: Guarantee) -> tuple[float, float, float]:
    """(ε, δ, ρ) that ``count`` runs of ``g`` add, in ``cap``'s accounting; :class:`Refused`
    when ``g`` cannot be paid from ``cap`` at all. ``g`` must be stated in ``cap``'s relation."""
    if isinstance(g, NotDP):
        raise Refused(f"a non-private draw ({g.reason}) cannot be paid from a privacy budget")
    if isinstance(cap, PureDP):
        if not isinstance(g, PureDP):
            raise Refused(f"a {g.describe()} draw cannot be paid from the pure "
                          f"{cap.describe()} charged")
        return g.epsilon * count, 0.0, 0.0
    if isinstance(cap, (ZCDP, GDP)):
        if isinstance(g, ApproxDP):
            raise Refused(f"an (epsilon, delta) draw cannot be paid from the concentrated "
                          f"{cap.describe()} charged")
        return 0.0, 0.0, rho_of(g) * count
    # (ε, δ) cap: pure and (ε, δ) parts add linearly; concentrated parts add ρ, converted at
    # the δ left over (basic composition of the two parts).
    if isinstance(g, PureDP):
        return g.epsilon * count, 0.0, 0.0
    if isinstance(g, ApproxDP):
        return g.epsilon * count, g.delta * count, 0.0
    return 0.0, 0.0, rho_of(g) * count


def _converted_rho(delta: np.ndarray, rho: np.ndarray, cap: ApproxDP) -> np.ndarray:
    """ε of each ρ converted once, at the δ the cap leaves after the (ε, δ) parts' δ."""
    out = np.zeros(rho.shape)
    conc = rho > 0
    if conc.any():
        # One conversion per distinct (δ used, ρ) pair: in a run they are all equal.
        pairs = np.unique(np.stack([delta[conc], rho[conc]], axis=1), axis=0)
        conv = {}
        for d_used, r in pairs:
            left = cap.delta - d_used
            conv[(d_used, r)] = to_approx(ZCDP(float(r)), left).epsilon if left > 0 else np.inf
        out[conc] = [conv[(d, r)] for d, r in zip(delta[conc], rho[conc])]
    return out


def fits(eps, delta, rho, cap: Guarantee) -> np.ndarray:
    """Whether each accounting state (ε, δ, ρ; arrays or floats) is within ``cap``."""
    eps, delta, rho = (np.atleast_1d(np.asarray(x, dtype=float)) for x in (eps, delta, rho))
    if isinstance(cap, PureDP):
        return within(eps, cap.epsilon)
    if isinstance(cap, ZCDP):
        return within(rho, cap.rho)
    if isinstance(cap, GDP):
        return within(rho, cap.mu**2 / 2.0)
    return within(delta, cap.delta) & within(eps + _converted_rho(delta, rho, cap), cap.epsilon)


def as_guarantee(eps: float, delta: float, rho: float, cap: Guarantee) -> Guarantee:
    """An accounting state stated as ``cap``'s type (and relation)."""
    rel = cap.relation
    if isinstance(cap, PureDP):
        return PureDP(float(eps), rel)
    if isinstance(cap, ZCDP):
        return ZCDP(float(rho), rel)
    if isinstance(cap, GDP):
        return GDP(float(np.sqrt(2.0 * rho)), rel)
    if rho > 0:
        left = cap.delta - delta
        conv = to_approx(ZCDP(float(rho)), left).epsilon if left > 0 else np.inf
        return ApproxDP(float(eps + conv), float(cap.delta), rel)
    return ApproxDP(float(eps), float(delta), rel)


def charged_terms(g: Guarantee, conversion_delta: float) -> tuple[float, float, float | None]:
    """(ε, δ, ρ or None) a step is charged as in the ledger, whose cap sums ε and δ: pure ε is
    (ε, 0) with ρ = ε²/2; (ε, δ) as it is; a concentrated step its (ε, δ) conversion at
    ``conversion_delta`` (Bun & Steinke 2016, Prop. 1.3), keeping its ρ."""
    if isinstance(g, PureDP):
        return g.epsilon, 0.0, g.epsilon ** 2 / 2
    if isinstance(g, ApproxDP):
        return g.epsilon, g.delta, None
    if isinstance(g, (ZCDP, GDP)):
        conv = to_approx(g, conversion_delta)
        return conv.epsilon, conv.delta, rho_of(g)
    raise Refused(f"{g.describe()} cannot be charged")


def lifetime_epsilon(summed_epsilon: float, other_epsilon: float, zcdp_rho: float,
                     zcdp_delta: float) -> float:
    """ε of a set of ledger charges (whose δ is summed): the tighter of two bounds on the same
    total δ, ``summed_epsilon`` (every charge's ε added: basic composition) and the zCDP
    charges' ρ summed and converted once at the sum of their δ (Bun & Steinke 2016, Lemma 2.3,
    then :func:`privacy.to_approx`) plus ``other_epsilon``, the other charges' ε. Converting
    each zCDP charge on its own and adding the ε over-counts: ε of a conversion grows like √ρ.
    """
    if zcdp_rho > 0 and 0 < zcdp_delta < 1:
        return min(summed_epsilon, other_epsilon + to_approx(ZCDP(zcdp_rho), zcdp_delta).epsilon)
    return summed_epsilon


class Accountant:
    """Events in, a guarantee out: the composition of everything run on the same people.

    ``conversion_delta``: the δ at which concentrated parts are converted when an (ε, δ)
    part forces the total into (ε, δ) form (as ``privacy.sequential``'s ``delta``).
    """

    def __init__(self, conversion_delta: float | None = None):
        self.conversion_delta = conversion_delta
        self._events: list[tuple[Guarantee, int]] = []

    def compose(self, guarantee: Guarantee, count: int = 1) -> "Accountant":
        """Record ``count`` runs of ``guarantee``; returns self (calls chain)."""
        if count < 0 or int(count) != count:
            raise ValueError(f"count must be a whole number >= 0, got {count!r}")
        self._events.append((guarantee, int(count)))
        return self

    def spent(self) -> Guarantee:
        """The sequential composition of every event (``privacy.sequential``)."""
        # Each run is its own part: sequential lifts mixed parts one by one (n pure ε runs
        # are ρ = n·ε²/2, not (n·ε)²/2).
        return sequential([g for g, n in self._events for _ in range(n)],
                          delta=self.conversion_delta)

    def _state(self, cap: Guarantee, extra: tuple[Guarantee, int] | None):
        events = self._events + ([extra] if extra else [])
        for g, _ in events:
            if relation_of(g) not in (None, cap.relation):
                raise Refused(f"a {g.describe()} event cannot be paid from the "
                              f"{cap.describe()} cap: convert it first (privacy."
                              "convert_relation)")
        terms = [increment(g, n, cap) for g, n in events]
        return tuple(math.fsum(t[i] for t in terms) for i in range(3))

    def refusal(self, guarantee: Guarantee, count: int, cap: Guarantee) -> str | None:
        """Why ``count`` more runs of ``guarantee`` would not fit ``cap`` (None: they fit)."""
        try:
            eps, delta, rho = self._state(cap, (guarantee, count))
        except Refused as err:
            return str(err)
        if bool(fits(eps, delta, rho, cap)[0]):
            return None
        return (f"{as_guarantee(eps, delta, rho, cap).describe()} would be over the "
                f"{cap.describe()} cap")

    def fits(self, guarantee: Guarantee, count: int, cap: Guarantee) -> bool:
        """Whether ``count`` more runs of ``guarantee`` keep the total within ``cap``."""
        return self.refusal(guarantee, count, cap) is None
