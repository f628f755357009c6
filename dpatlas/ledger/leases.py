"""A release's lease: renewed, released and checked in the ledger (:class:`LeaseOperations`),
and held by a run, renewed in the background (:class:`Lease`)."""

from __future__ import annotations

import logging
import threading
from contextlib import contextmanager
from typing import Iterator, Protocol

from dpatlas.ledger.backend import LedgerBackend
from dpatlas.ledger.errors import LedgerError, LeaseLost
from dpatlas.ledger.formatting import display_text, iso_time
from dpatlas.ledger.schema import releases_table
from dpatlas.ledger.validation import (DEFAULT_LEASE_SECONDS, checked_lease_seconds,
                                       checked_release_id, nonempty_text)

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


class LeaseOperations(LedgerBackend):
    """Renewing, releasing and checking a release's lease (taken by ``begin_release``)."""

    def _lost(self, row: dict, owner: str, now: float, what: str) -> LeaseLost | None:
        """Why ``owner`` does not hold the release's lease now (None: it does).

        A lease that expired is still its owner's until another owner takes it over (that
        takes the same row lock), so expiry alone loses nothing."""
        rid, status, holder = row["release_id"], row["status"], row.get("lease_owner")
        if status in ("failed", "withdrawn"):
            why = f"the release is {status}" + (": begin_release it again to resume it"
                                                if status == "failed" else "")
        elif holder is None:
            why = "no one holds its lease (it was released): begin_release it again to resume it"
        elif holder != owner:
            expires = row.get("lease_expires")
            why = (f"{display_text(holder)} took it over (lease until {iso_time(expires)}"
                   + (f", {expires - now:.0f} s from now" if expires is not None else "") + ")")
        else:
            return None
        return LeaseLost(f"{what}: {display_text(owner)} lost the lease of release {rid}: {why}; "
                         "stop this run (another may be publishing it)")

    def renew_lease(self, release_id: str, owner: str,
                    lease_seconds: float = DEFAULT_LEASE_SECONDS) -> float:
        """Extend ``owner``'s lease to ``lease_seconds`` from now (database clock).

        Returns the new expiry (epoch seconds, database clock). Raises :class:`LeaseLost` if
        ``owner`` does not hold it."""
        nonempty_text(owner, "owner")
        lease = checked_lease_seconds(lease_seconds)

        def decide(row, now):
            lost = self._lost(row, owner, now, "renew_lease")
            if lost is not None:
                raise lost
            return {"lease_expires": now + lease}

        return self._change(release_id, "renew_lease", decide)["lease_expires"]

    def release_lease(self, release_id: str, owner: str) -> bool:
        """Give the lease up if ``owner`` holds it (then another owner may resume at once).

        Returns whether it was ``owner``'s; another owner's lease is left alone."""
        nonempty_text(owner, "owner")

        def decide(row, _db_now):
            if row.get("lease_owner") != owner:
                return None
            return {"lease_owner": None, "lease_expires": None}

        return self._change(release_id, "release_lease", decide) is not None

    def check_lease(self, release_id: str, owner: str) -> float:
        """Raise :class:`LeaseLost` unless ``owner`` holds the release's lease; read-only.

        Returns the seconds the lease has left by the database's clock (negative: it expired,
        but no one has taken it over, so it is still ``owner``'s; renew it)."""
        checked_release_id(release_id)
        nonempty_text(owner, "owner")
        if releases_table.name not in self._tables:
            raise LedgerError(f"check_lease: no ledger at {self.url} yet")
        with self._reading(f"check_lease {release_id}") as conn:
            row = conn.execute(self._release_select().where(
                releases_table.c.release_id == release_id)).mappings().first()
            now = self._db_clock(conn)
        if row is None:
            raise LedgerError(f"check_lease: no release {release_id} in the ledger at {self.url}")
        row = self._full_row(row)
        lost = self._lost(row, owner, now, "check_lease")
        if lost is not None:
            raise lost
        return (row["lease_expires"] or now) - now

    @contextmanager
    def leased(self, release_id: str, owner: str,
               lease_seconds: float = DEFAULT_LEASE_SECONDS) -> Iterator["Lease"]:
        """Hold ``owner``'s lease (taken by :meth:`begin_release`) for the ``with`` body.

        On entry the lease is renewed (:class:`LeaseLost` if it is not ``owner``'s); a daemon
        thread renews it every ``lease_seconds / 3``; on exit the thread stops and the lease is
        released. Call ``.check()`` on the yielded :class:`Lease` right before every step that
        must not happen twice (renaming the release into place, completing it)."""
        lease = Lease(self, release_id, owner, checked_lease_seconds(lease_seconds))
        lease.start()
        try:
            yield lease
        finally:
            lease.stop()
