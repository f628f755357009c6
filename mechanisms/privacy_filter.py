"""A privacy filter per chunk: every noise draw spends from what the ledger charged.

The ledger charges each (tract, cell) a guarantee per named budget step before any noise is
drawn. Inside a run, :class:`PrivacyFilter` holds those charges for the tracts of one chunk
and cell; each noisy release calls ``meter.spend(labels, g)`` right before it draws, with ``g``
the privacy map of that draw (``mechanisms/privacy_maps.py``). The spend is refused, with
:class:`BudgetOverrun` and before the draw, when the sequential composition of what that step
has spent for a tract would exceed the step's charge, or when the step or tract was never
charged. A mechanism that draws twice, or with more budget than its calibration said, stops
the run instead of releasing more than was accounted for.

This is a privacy filter in the sense of Rogers, Roth, Ullman & Vadhan (2016): it stops
before the composed loss passes a fixed bound. The noise parameters here are all fixed before
the run (by the plan), so plain sequential composition is the right accounting: pure ε add,
zCDP ρ add (Bun & Steinke 2016, Lemma 2.3), and (ε, δ) add; zCDP spent against an (ε, δ)
charge is converted at the charge's δ with dp-accounting (zCDP filters are valid under
adaptive composition too: Whitehouse, Ramdas, Rogers & Wu 2023).

A charge is stated for a neighbouring relation (the ledger's is replace-one). A draw whose
map is stated for another relation is converted to the charge's by
``privacy.convert_relation`` before it is counted (add-remove → replace-one by group privacy
of size 2, per draw; pure ε and ρ double and quadruple linearly, so per draw or on the total
is the same figure); a draw that cannot be converted (replace-one against an add-remove
charge) is refused like an overspend, before the draw.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from . import accounting
from .privacy import Guarantee, MixedRelations, NotDP, convert_relation


class BudgetOverrun(RuntimeError):
    """A noise draw would spend more than the ledger charged (raised before the draw)."""


class StepMeter:
    """Spending of one budget step, per tract label, against one charged guarantee."""

    def __init__(self, step: str, charged: Guarantee, labels: np.ndarray):
        if isinstance(charged, NotDP):
            raise BudgetOverrun(f"step {step!r} is charged as not private: nothing may be "
                                "drawn against it")
        self.step = step
        self.charged = charged
        self._labels = labels  # sorted, unique
        # Running sums per label: ε and δ of pure/(ε, δ) draws, ρ of concentrated draws.
        self._eps = np.zeros(labels.size)
        self._delta = np.zeros(labels.size)
        self._rho = np.zeros(labels.size)

    # -- spending ---------------------------------------------------------------------------

    def spend(self, labels: Iterable, guarantee: Guarantee, times: int = 1) -> None:
        """Record ``times`` draws of ``guarantee`` for each tract in ``labels``; refuse (raise
        :class:`BudgetOverrun`, recording nothing) if any tract would go over its charge
        (the accounting and its tolerance are ``mechanisms.accounting``'s)."""
        idx = self._positions(labels)
        if idx.size == 0:
            return
        guarantee = self._in_charged_relation(guarantee)
        eps, delta, rho = self._increment(guarantee, times)
        new_eps = self._eps[idx] + eps
        new_delta = self._delta[idx] + delta
        new_rho = self._rho[idx] + rho
        over = ~self._fits(new_eps, new_delta, new_rho)
        if over.any():
            first = int(np.nonzero(over)[0][0])
            spent = self._as_guarantee(new_eps[first], new_delta[first], new_rho[first])
            raise BudgetOverrun(
                f"step {self.step!r}: a draw of {guarantee.describe()}"
                f"{f' x{times}' if times != 1 else ''} would take tract "
                f"{self._labels[idx[first]]!r} ({int(over.sum())} tract(s) in all) to "
                f"{spent.describe()}, over the {self.charged.describe()} charged; nothing was "
                "drawn (a bug in the mechanism: report it)")
        self._eps[idx], self._delta[idx], self._rho[idx] = new_eps, new_delta, new_rho

    def _positions(self, labels: Iterable) -> np.ndarray:
        labels = np.asarray(labels)
        pos = np.searchsorted(self._labels, labels)
        known = pos < self._labels.size
        known[known] = self._labels[pos[known]] == labels[known]
        if not known.all():
            raise BudgetOverrun(f"step {self.step!r}: tract {labels[~known][0]!r} was never "
                                "charged; nothing was drawn")
        if np.unique(pos).size != pos.size:
            raise BudgetOverrun(f"step {self.step!r}: a tract appears twice in one draw")
        return pos

    def _in_charged_relation(self, g: Guarantee) -> Guarantee:
        """``g`` restated for the charge's relation by the one stated conversion, or refused."""
        if isinstance(g, NotDP):
            return g  # refused by _increment with its own message
        try:
            return convert_relation(g, self.charged.relation)
        except MixedRelations as err:
            raise BudgetOverrun(f"step {self.step!r}: a {g.describe()} draw cannot be paid from "
                                f"the {self.charged.describe()} charged "
                                f"({self.charged.relation.value}): {err}; nothing was "
                                "drawn") from None

    def _increment(self, g: Guarantee, times: int) -> tuple[float, float, float]:
        """(ε, δ, ρ) that ``times`` draws of ``g`` add, in the charge's accounting."""
        try:
            return accounting.increment(g, times, self.charged)
        except accounting.Refused as err:
            raise BudgetOverrun(f"step {self.step!r}: {err}") from None

    def _fits(self, eps: np.ndarray, delta: np.ndarray, rho: np.ndarray) -> np.ndarray:
        return accounting.fits(eps, delta, rho, self.charged)

    # -- reading ----------------------------------------------------------------------------

    def _as_guarantee(self, eps: float, delta: float, rho: float) -> Guarantee:
        return accounting.as_guarantee(eps, delta, rho, self.charged)

    def spent(self, label) -> Guarantee:
        """What this step has spent for one tract, as the charged type."""
        i = int(self._positions([label])[0])
        return self._as_guarantee(self._eps[i], self._delta[i], self._rho[i])

    def totals(self) -> dict:
        """Every charged tract's spending in this step."""
        return {lab: self._as_guarantee(e, d, r)
                for lab, e, d, r in zip(self._labels, self._eps, self._delta, self._rho)}


class NoMeter:
    """The meter of evaluation and tests: records nothing, refuses nothing."""

    step = None

    def spend(self, labels: Iterable, guarantee: Guarantee, times: int = 1) -> None:
        return None


NO_METER = NoMeter()


class PrivacyFilter:
    """The charged budget of one chunk and cell: one :class:`StepMeter` per charged step.

    ``charged``: step name → the guarantee the ledger charged each (tract, cell) for it;
    ``labels``: the tracts of the chunk and cell that were charged.
    """

    def __init__(self, charged: Mapping[str, Guarantee], labels: Iterable):
        labels = np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels)
        uniq = np.unique(labels)
        if uniq.size != labels.size:
            raise ValueError("PrivacyFilter: a tract label appears twice")
        self._labels = uniq
        self._charged = dict(charged)
        self._meters: dict[str, StepMeter] = {}

    @property
    def labels(self) -> np.ndarray:
        return self._labels

    def meter(self, step: str) -> StepMeter:
        """The meter every draw of ``step`` spends through (one per step, kept)."""
        if step not in self._charged:
            raise BudgetOverrun(f"step {step!r} was never charged (charged: "
                                f"{', '.join(self._charged) or 'none'}); nothing was drawn")
        if step not in self._meters:
            self._meters[step] = StepMeter(step, self._charged[step], self._labels)
        return self._meters[step]

    def spent(self) -> dict[str, dict]:
        """Per step that has a meter: per tract label, what was spent."""
        return {step: m.totals() for step, m in self._meters.items()}
