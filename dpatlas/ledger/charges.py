"""What the ledger records of a budget plan: one charge per step and cell, and the rows it
stores of them (each checked)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from mechanisms.accounting import charged_terms
from mechanisms.privacy import PROJECT_RELATION, ApproxDP, PureDP, ZCDP

from dpatlas.ledger.errors import LedgerError
from dpatlas.ledger.schema import GUARANTEE_TYPES
from dpatlas.ledger.validation import finite_number, nonempty_text


class ChargedStep(Protocol):
    name: str
    guarantee: object  # a mechanisms.privacy guarantee


class ChargedPlan(Protocol):
    """What :func:`charges` reads of a plan (dpatlas.release.allocate.BudgetPlan): stated here
    so the ledger does not import the release stages that plan a budget."""

    steps: Sequence[ChargedStep]
    conversion_delta: float


@dataclass(frozen=True)
class Charge:
    cell: str  # demographic cell ("all" if none)
    step: str  # budget step name, e.g. "primary: p25 and p75"
    guarantee_type: str  # "pure" | "approx" | "zcdp" | "gdp"
    epsilon: float  # the step's epsilon in (eps, delta) terms (for zcdp: its conversion)
    delta: float
    rho: float | None = None  # zCDP rho where the step has one


def charges(budget: ChargedPlan, cells: list[str]) -> list[Charge]:
    """One charge per budget step and cell, each with its (ε, δ) and, where it has one, ρ.

    A pure ε-DP step is charged (ε, 0) with ρ = ε²/2 (Bun & Steinke 2016, Prop. 1.4); a zCDP
    step is charged its (ε, δ) conversion at the plan's ``conversion_delta`` (ibid., Prop.
    1.3) and keeps its ρ; an (ε, δ) step is charged as it is.
    """
    out = []
    for cell in cells:
        for step in budget.steps:
            g = step.guarantee
            # The caps bound a person's loss under replace-one neighbours: a step stated for
            # another relation would be summed in other units (add-remove ε is half of it).
            if g.relation is not PROJECT_RELATION:
                raise ValueError(f"step {step.name}: {g.describe()} is stated for "
                                 f"{g.relation.value} neighbours; the ledger charges "
                                 f"{PROJECT_RELATION.value} guarantees only")
            if not isinstance(g, (PureDP, ApproxDP, ZCDP)):
                raise ValueError(f"step {step.name}: {g.describe()} cannot be charged")
            eps, delta, rho = charged_terms(g, budget.conversion_delta)
            out.append(Charge(cell, step.name, g.kind, eps, delta, rho))
    return out


def charge_rows(release_id: str, charges: Iterable[Charge]) -> list[dict]:
    """The ledger's rows of a release's charges, each checked (a text cell and step, a known
    guarantee type, finite ε, δ in [0, 1], ρ, δ 0 for pure DP): :class:`LedgerError` if
    not."""
    if isinstance(charges, Charge):
        charges = [charges]
    rows = []
    for i, ch in enumerate(charges):
        if not isinstance(ch, Charge):
            raise LedgerError(f"release {release_id}: charge {i} is not a Charge: {ch!r}")
        where = f"release {release_id}, charge {i} ({ch.cell} / {ch.step})"
        nonempty_text(ch.cell, f"{where}: cell")
        nonempty_text(ch.step, f"{where}: step")
        if ch.guarantee_type not in GUARANTEE_TYPES:
            raise LedgerError(f"{where}: guarantee_type must be one of {GUARANTEE_TYPES}, "
                              f"got {ch.guarantee_type!r}")
        eps = finite_number(ch.epsilon, f"{where}: epsilon")
        delta = finite_number(ch.delta, f"{where}: delta", hi=1.0)
        rho = None if ch.rho is None else finite_number(ch.rho, f"{where}: rho")
        if ch.guarantee_type == "pure" and delta != 0.0:
            raise LedgerError(f"{where}: a pure-DP step has delta 0, got {ch.delta!r}")
        rows.append({"seq": i, "cell": ch.cell, "step": ch.step,
                     "guarantee_type": ch.guarantee_type, "epsilon": eps, "delta": delta,
                     "rho": rho})
    if not rows:
        raise LedgerError(f"release {release_id} has no charges: nothing to record")
    return rows
