"""A release's lease, renewed in the background while a run holds it."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from dpatlas.ledger.errors import LedgerError, LeaseLost

log = logging.getLogger(__name__)


class LeaseStore(Protocol):
    """What a lease needs of the ledger (dpatlas.ledger.store.Ledger, which creates leases)."""

    lock_timeout: float

    def renew_lease(self, release_id: str, owner: str, lease_seconds: float) -> float: ...

    def release_lease(self, release_id: str, owner: str) -> bool: ...


class Lease:
    """A release lease held for a ``with`` body (see :meth:`Ledger.leased`).

    A daemon thread renews it every ``lease_seconds / 3``, so two renewals may fail before it
    expires. :meth:`check` raises :class:`LeaseLost` when a renewal found it taken over, and
    otherwise renews it once more synchronously, so that the step right after a successful
    check has a whole lease period before anyone can take the release over."""

    def __init__(self, ledger: LeaseStore, release_id: str, owner: str, lease_seconds: float):
        self.ledger = ledger
        self.release_id = release_id
        self.owner = owner
        self.lease_seconds = lease_seconds
        self.renewals = 0  # successful renewals, for tests and logs
        self.expires: float | None = None  # epoch seconds, database clock
        self._lost: LeaseLost | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew_loop, daemon=True,
                                        name=f"lease {release_id}")

    def _renew(self) -> None:
        self.expires = self.ledger.renew_lease(self.release_id, self.owner, self.lease_seconds)
        self.renewals += 1

    def start(self) -> None:
        self._renew()  # not ours: LeaseLost now, before the body runs
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            try:
                self._renew()
            except LeaseLost as e:
                self._lost = e
                return
            except Exception as e:  # the database unreachable for a moment: the next try may do
                log.warning("renewing the lease of release %s failed: %s", self.release_id, e)

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless this run still holds the lease (and renew it)."""
        if self._lost is not None:
            raise self._lost
        try:
            self._renew()
        except LeaseLost as e:
            self._lost = e
            raise

    def stop(self) -> None:
        """Stop renewing and release the lease (it expires by itself if that fails)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.ledger.lock_timeout + 5)
        try:
            self.ledger.release_lease(self.release_id, self.owner)
        except LedgerError as e:
            log.warning("releasing the lease of release %s failed (it will expire): %s",
                        self.release_id, e)
