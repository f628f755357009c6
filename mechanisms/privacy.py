"""Typed privacy guarantees, their composition and conversions.

Every estimator reports its guarantee as one of these values, built by composing the
guarantees of its noisy steps, never as a free-text comment.

Every guarantee carries the neighbouring relation it is stated for (:class:`Relation`):
- ``REPLACE_ONE``: D and D' have the same size and differ in one person's record (n is public);
  the project's relation, and the default, so a guarantee built without one means what it
  always meant;
- ``ADD_REMOVE``: D' is D with one person's record added or removed (n is protected).
The same numbers mean different things under the two, so composition refuses to mix them
(:class:`MixedRelations`); :func:`convert_relation` is the one way across, and it states its
rule: a replace-one change is an add-remove path of length two (remove the old record, add the
new one), so an add-remove guarantee holds for replace-one neighbours by group privacy of size
2. The reverse has no general conversion (see :func:`convert_relation`).

Definitions (for the guarantee's relation):
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
  accountant (``ZCDpEvent``, at ``ZCDP_CONVERSION_ORDERS``), GDP through its PLD accountant
  (a Gaussian with noise multiplier 1/μ, which is exact for GDP).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterable, Union

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant


class Relation(str, enum.Enum):
    """The neighbouring relation a guarantee is stated for (its value is what manifests print)."""

    REPLACE_ONE = "replace-one"
    ADD_REMOVE = "add-remove"

    @classmethod
    def parse(cls, value: "Relation | str") -> "Relation":
        """A relation from its printed name (what a manifest or config holds)."""
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(r.value for r in cls)
            raise ValueError(f"unknown neighbouring relation {value!r}; known: {known}") from None


# The relation the ledger charges and every published guarantee is stated in (docs/privacy.md).
PROJECT_RELATION = Relation.REPLACE_ONE


class MixedRelations(ValueError):
    """Guarantees for different neighbouring relations were composed without a conversion."""


def _check_relation(value: object) -> None:
    if not isinstance(value, Relation):
        raise ValueError(f"relation must be a Relation (replace-one or add-remove), got "
                         f"{value!r}")


def _relation_note(relation: Relation) -> str:
    """What ``describe`` adds: nothing for the project's relation, else its name."""
    return "" if relation is PROJECT_RELATION else f", {relation.value}"


def _relation_suffix(relation: Relation) -> str:
    """The same for a description without a bracket of its own: `` (add-remove)``."""
    return "" if relation is PROJECT_RELATION else f" ({relation.value})"


@dataclass(frozen=True)
class PureDP:
    epsilon: float
    relation: Relation = Relation.REPLACE_ONE
    kind = "pure"

    def __post_init__(self) -> None:
        _check_nonneg("epsilon", self.epsilon)
        _check_relation(self.relation)

    def describe(self) -> str:
        return f"{self.epsilon:.6g}-DP (pure{_relation_note(self.relation)})"


@dataclass(frozen=True)
class ApproxDP:
    epsilon: float
    delta: float
    relation: Relation = Relation.REPLACE_ONE
    kind = "approx"

    def __post_init__(self) -> None:
        _check_nonneg("epsilon", self.epsilon)
        if not 0.0 <= self.delta < 1.0:
            raise ValueError(f"delta must lie in [0, 1), got {self.delta!r}")
        _check_relation(self.relation)

    def describe(self) -> str:
        return f"({self.epsilon:.6g}, {self.delta:.3g})-DP{_relation_suffix(self.relation)}"


@dataclass(frozen=True)
class ZCDP:
    rho: float
    relation: Relation = Relation.REPLACE_ONE
    kind = "zcdp"

    def __post_init__(self) -> None:
        _check_nonneg("rho", self.rho)
        _check_relation(self.relation)

    def describe(self) -> str:
        return f"{self.rho:.6g}-zCDP{_relation_suffix(self.relation)}"


@dataclass(frozen=True)
class GDP:
    mu: float
    relation: Relation = Relation.REPLACE_ONE
    kind = "gdp"

    def __post_init__(self) -> None:
        _check_nonneg("mu", self.mu)
        _check_relation(self.relation)

    def describe(self) -> str:
        return f"{self.mu:.6g}-GDP{_relation_suffix(self.relation)}"


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
# Relations


def relation_of(g: Guarantee) -> Relation | None:
    """The relation ``g`` is stated for (None for :class:`NotDP`, which has no guarantee)."""
    return None if isinstance(g, NotDP) else g.relation


def with_relation(g: Guarantee, relation: Relation) -> Guarantee:
    """``g``'s numbers restated for ``relation``: NOT a conversion. Only for a map whose
    sensitivity was computed for ``relation`` (``privacy_maps.NoiseStep``), never to move a
    guarantee from one relation to another (that is :func:`convert_relation`)."""
    _check_relation(relation)
    return g if isinstance(g, NotDP) else replace(g, relation=relation)


GROUP_PRIVACY_RULES = {
    "pure": "epsilon -> 2 epsilon (Dwork & Roth 2014, Thm 2.2, group size 2)",
    "approx": "(epsilon, delta) -> (2 epsilon, (1 + e^epsilon) delta) (the (epsilon, delta) "
              "inequality applied twice along the path D, D minus x, D minus x plus x')",
    "zcdp": "rho -> 4 rho (Bun & Steinke 2016, Prop. 1.9: groups of k get k^2 rho)",
    "gdp": "mu -> 2 mu (Dong, Roth & Su 2022, Sec. 2.3: groups of k get k mu)",
}
CONVERSION_TEXT = ("add-remove -> replace-one by group privacy of size 2: replacing a record is "
                   "removing it and adding the new one, two add-remove steps")
NO_REVERSE_CONVERSION = (
    "a replace-one guarantee cannot be restated for add-remove: replace-one neighbours have "
    "the same n, so such a mechanism may depend on n without limit (e.g. release n, or scale "
    "its noise by 1/n), and adding or removing one record changes n; no bound follows in "
    "general. Derive the add-remove guarantee from the mechanism's add-remove sensitivities")


def convert_relation(g: Guarantee, to: Relation) -> Guarantee:
    """``g`` stated for the relation ``to``; the only conversion between relations.

    add-remove → replace-one, group privacy of size 2 (``GROUP_PRIVACY_RULES``): a replace-one
    change D → D' is the add-remove path D → D∖{x} → D∖{x}∪{x'}, so a guarantee that holds
    for each add-remove step holds for the pair with the group-of-2 parameters:
    pure ε → 2ε; (ε, δ) → (2ε, (1 + e^ε)δ) [P(D) ≤ e^ε(e^ε P(D') + δ) + δ]; ρ-zCDP → 4ρ;
    μ-GDP → 2μ. Tight for a sum of vectors of L1 norm 1 under Laplace noise (the replace-one L1
    sensitivity of such a sum is exactly twice the add-remove one), loose for Gaussian noise on
    the same sum (the L2 sensitivity grows by √2, ρ by 2, not 4).

    replace-one → add-remove: refused (:class:`MixedRelations`), see ``NO_REVERSE_CONVERSION``.
    """
    _check_relation(to)
    if isinstance(g, NotDP) or g.relation is to:
        return g
    if to is Relation.ADD_REMOVE:
        raise MixedRelations(NO_REVERSE_CONVERSION)
    if isinstance(g, PureDP):
        return PureDP(2.0 * g.epsilon, to)
    if isinstance(g, ApproxDP):
        delta = (1.0 + math.exp(g.epsilon)) * g.delta
        if not delta < 1.0:
            raise ValueError(f"{g.describe()} gives delta {delta:.3g} >= 1 for replace-one "
                             "neighbours: no guarantee; use a smaller delta")
        return ApproxDP(2.0 * g.epsilon, delta, to)
    if isinstance(g, ZCDP):
        return ZCDP(4.0 * g.rho, to)
    if isinstance(g, GDP):
        return GDP(2.0 * g.mu, to)
    raise TypeError(f"unknown guarantee {g!r}")


def common_relation(parts: Iterable[Guarantee]) -> Relation | None:
    """The one relation of ``parts`` (NotDP ignored); :class:`MixedRelations` if they differ."""
    found = {relation_of(g) for g in parts} - {None}
    if len(found) > 1:
        raise MixedRelations(
            "cannot compose guarantees for different neighbouring relations ("
            + " and ".join(sorted(r.value for r in found)) + "): convert them first with "
            "convert_relation (" + CONVERSION_TEXT + ")")
    return found.pop() if found else None


# ---------------------------------------------------------------------------------------------
# Conversions between accounting types (within one relation)


def to_zcdp(g: Guarantee) -> ZCDP:
    """The tightest zCDP implied by ``g`` (only pure, zCDP and GDP imply one); same relation."""
    if isinstance(g, ZCDP):
        return g
    if isinstance(g, PureDP):
        return ZCDP(g.epsilon**2 / 2.0, g.relation)
    if isinstance(g, GDP):
        return ZCDP(g.mu**2 / 2.0, g.relation)
    raise TypeError(f"{g.describe()} implies no zCDP bound")


# RDP orders for zCDP → (ε, δ): dp-accounting's default orders (up to 1024), then a geometric
# grid of ratio 1.02 up to 1e7. A small ρ converts best at a large order, α* ≈ 1 + √(ln(1/δ)/ρ),
# and with orders only up to 1024 ε(ρ) cannot fall below about ln(1/δ)/1023 (0.0057 at
# δ = 1e-6) whatever ρ: budgets of ε = 0.001 then calibrated ρ to ~δ² (rho_for_approx). The
# added orders change no conversion whose best order is a default one (ρ above ~1e-5 at
# δ ≤ 1e-5: the same figures as before), and near α* a grid of ratio r loses at most
# (ln r)²/2 ≈ 2e-4 of ε. dpatlas/audit/accounting.py builds the same list (it imports nothing from here).
ZCDP_CONVERSION_ORDERS = tuple(
    float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS) + tuple(
    1024.0 * 1.02 ** k for k in range(1, 1000) if 1024.0 * 1.02 ** k <= 1e7)


def to_approx(g: Guarantee, delta: float) -> ApproxDP:
    """An (ε, δ) guarantee implied by ``g`` at the given δ (for ApproxDP: its own δ if smaller);
    same relation."""
    if isinstance(g, NotDP):
        raise TypeError(f"{g.describe()} implies no (epsilon, delta) bound")
    if isinstance(g, PureDP):
        return ApproxDP(g.epsilon, 0.0, g.relation)
    if isinstance(g, ApproxDP):
        if g.delta > delta:
            raise ValueError(f"{g.describe()} cannot be stated at the smaller delta={delta}")
        return g
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1) to convert {g.describe()}")
    if isinstance(g, ZCDP):
        if g.rho == 0:
            return ApproxDP(0.0, delta, g.relation)
        acc = rdp_privacy_accountant.RdpAccountant(ZCDP_CONVERSION_ORDERS)
        acc.compose(dp_accounting.ZCDpEvent(g.rho))
        return ApproxDP(float(acc.get_epsilon(delta)), delta, g.relation)
    if isinstance(g, GDP):
        if g.mu == 0:
            return ApproxDP(0.0, delta, g.relation)
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
        acc.compose(dp_accounting.GaussianDpEvent(1.0 / g.mu))
        return ApproxDP(float(acc.get_epsilon(delta)), delta, g.relation)
    raise TypeError(f"unknown guarantee {g!r}")


@lru_cache(maxsize=256)
def rho_for_approx(epsilon: float, delta: float) -> float:
    """The largest ρ whose zCDP → (ε, δ) conversion (:func:`to_approx`) stays within ``epsilon``.

    The conversion ρ ↦ ε(ρ) is non-decreasing and continuous (a minimum over the RDP orders α
    of ρα + ln(1 − 1/α) − ln(δα)/(α − 1); Canonne, Kamath & Steinke 2020, Prop. 12), apart
    from dp-accounting's jump from 0 where ρ is so small that the KL bound gives (0, δ). The
    largest fitting ρ is found by bisection on ln ρ, so its precision is relative (about
    1e-12 of ρ) for every budget: halving an absolute bracket [0, max(ε, 1)] stops at
    2⁻⁶⁰ ≈ 1e-18 absolute, and with only dp-accounting's default orders (at most 1024) no
    ρ above ~δ² converts below ln(1/δ)/1023, so ε = 0.001 and 0.003 at δ = 1e-6 both gave
    ρ ≈ 9.1e-13 (that is :data:`ZCDP_CONVERSION_ORDERS`' reason).
    """
    _check_nonneg("epsilon", epsilon)
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must lie in (0, 1) to calibrate rho, got {delta!r}")

    def fits(rho: float) -> bool:
        return to_approx(ZCDP(rho), delta).epsilon <= epsilon

    # Bracket: lo fits, hi does not (both > 0, so the bisection can run on a log scale).
    hi = max(epsilon, 1.0)
    while fits(hi):
        hi *= 2.0
    lo = hi / 2.0
    while not fits(lo):
        lo /= 2.0
        if lo < 1e-300:  # nothing representable fits (dp-accounting's KL bound fits ρ < δ²)
            return 0.0
    # Geometric bisection: each step halves ln(hi/lo), from ln 2 to a relative precision of
    # 1e-12 in about 40 steps.
    while hi / lo > 1.0 + 1e-12:
        mid = math.sqrt(lo * hi)
        if not lo < mid < hi:  # no float strictly between them
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------------------------------------
# Composition (all parts must be stated for one relation: MixedRelations otherwise)


def sequential(parts: Iterable[Guarantee], delta: float | None = None) -> Guarantee:
    """Guarantee of running all ``parts`` on the same people.

    ``delta``: the δ at which to convert concentrated parts when an (ε, δ) part forces the
    result into (ε, δ) form; it is added to the total δ. The parts must share one relation
    (:class:`MixedRelations` otherwise); the result is stated for it.
    """
    parts = list(parts)
    if not parts:
        return PureDP(0.0)
    for g in parts:
        if isinstance(g, NotDP):
            return NotDP(g.reason)
    rel = common_relation(parts)
    kinds = {g.kind for g in parts}
    if kinds == {"pure"}:
        return PureDP(math.fsum(g.epsilon for g in parts), rel)
    if kinds == {"gdp"}:
        return GDP(math.sqrt(math.fsum(g.mu**2 for g in parts)), rel)
    if "approx" not in kinds:
        return ZCDP(math.fsum(to_zcdp(g).rho for g in parts), rel)
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
    return ApproxDP(eps, dlt, rel)


def parallel(parts: Iterable[Guarantee]) -> Guarantee:
    """Guarantee of running each part on a disjoint set of people (e.g. one per tract).

    The parts must share one relation (:class:`MixedRelations` otherwise). McSherry's
    parallel composition holds for both: a replace-one or add-remove change touches one part.
    """
    parts = list(parts)
    if not parts:
        return PureDP(0.0)
    for g in parts:
        if isinstance(g, NotDP):
            return NotDP(g.reason)
    rel = common_relation(parts)
    kinds = {g.kind for g in parts}
    if kinds == {"pure"}:
        return PureDP(max(g.epsilon for g in parts), rel)
    if kinds == {"gdp"}:
        return GDP(max(g.mu for g in parts), rel)
    if kinds == {"approx"}:
        return ApproxDP(max(g.epsilon for g in parts), max(g.delta for g in parts), rel)
    if "approx" not in kinds:
        return ZCDP(max(to_zcdp(g).rho for g in parts), rel)
    raise ValueError("parallel composition of (epsilon, delta) with other types needs a delta: "
                     "convert the parts with to_approx first")


def as_dict(g: Guarantee) -> dict:
    """A JSON-ready form, for manifests and reports (with the relation it is stated for)."""
    d = {"type": g.kind, "text": g.describe()}
    for f in ("epsilon", "delta", "rho", "mu", "reason"):
        if hasattr(g, f):
            d[f] = getattr(g, f)
    if not isinstance(g, NotDP):
        d["relation"] = g.relation.value
    return d


def from_dict(d: dict) -> Guarantee:
    """A guarantee from its :func:`as_dict` form (a dict without ``relation`` is replace-one,
    the project's relation, as manifests written before relations were typed)."""
    kind = d.get("type")
    if kind == "none":
        return NotDP(str(d.get("reason", "")))
    rel = Relation.parse(d.get("relation", PROJECT_RELATION.value))
    if kind == "pure":
        return PureDP(float(d["epsilon"]), rel)
    if kind == "approx":
        return ApproxDP(float(d["epsilon"]), float(d["delta"]), rel)
    if kind == "zcdp":
        return ZCDP(float(d["rho"]), rel)
    if kind == "gdp":
        return GDP(float(d["mu"]), rel)
    raise ValueError(f"unknown guarantee type {kind!r} (expected pure, approx, zcdp, gdp, none)")
