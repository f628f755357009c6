"""The ledger's refusals: every one is a :class:`LedgerError`."""

from __future__ import annotations

from dpatlas.core.ids import InvalidReason, InvalidReleaseId
from dpatlas.core.errors import ReleaseRefused


class LedgerError(RuntimeError, ReleaseRefused):
    """A ledger operation refused (unknown release, mismatched config, no cap, bad charge...)."""


class InvalidLedgerId(LedgerError, InvalidReleaseId):
    """A release id the ledger refuses (both a LedgerError and an ids.InvalidReleaseId)."""


class InvalidLedgerReason(LedgerError, InvalidReason):
    """A reason the ledger refuses (both a LedgerError and an ids.InvalidReason)."""


class BudgetExceeded(LedgerError):
    """The release's charges would take the dataset over its lifetime cap."""

    def __init__(self, message: str, *, release_id: str, dataset: str,
                 spent_epsilon: float, spent_delta: float, charge_epsilon: float,
                 charge_delta: float, cap_epsilon: float, cap_delta: float):
        super().__init__(message)
        self.release_id = release_id
        self.dataset = dataset
        self.spent_epsilon = spent_epsilon
        self.spent_delta = spent_delta
        self.charge_epsilon = charge_epsilon
        self.charge_delta = charge_delta
        self.cap_epsilon = cap_epsilon
        self.cap_delta = cap_delta
        self.left_epsilon = max(cap_epsilon - spent_epsilon, 0.0)
        self.left_delta = max(cap_delta - spent_delta, 0.0)


class CapBelowSpent(LedgerError):
    """A new cap below what the dataset has already spent (refused unless forced)."""


class ReleaseBusy(LedgerError):
    """Another process holds this release's lease (or the ledger's lock) now; try again later.

    For a lease, ``holder`` is its owner and ``lease_expires`` its end (epoch seconds, by the
    database's clock); both are None when the ledger's lock timed out instead."""

    def __init__(self, message: str, *, holder: str | None = None,
                 lease_expires: float | None = None):
        super().__init__(message)
        self.holder = holder
        self.lease_expires = lease_expires


class LeaseLost(LedgerError):
    """This owner no longer holds the release's lease: another owner took it over after it
    expired, or the release was failed or withdrawn meanwhile. Stop: do not publish."""
