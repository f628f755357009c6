"""The privacy-budget ledger: every release's charges, in a real database, capped per dataset.

One ledger serves every release of a deployment. It lives in a SQLite file by default
(``sqlite:///ledger.db``) or in PostgreSQL (``postgresql+psycopg://...``) when several machines
share it.

Rules the ledger enforces:

- a dataset (the population whose privacy is protected) has a lifetime cap per privacy unit,
  ``(cap_epsilon, cap_delta)``. The cap is the ledger's: only :meth:`Ledger.set_cap` writes it,
  always with a reason, and every change is kept in ``ledger_cap_changes`` (time, old -> new,
  reason, actor). No release of a dataset without one; a config that states a cap must state
  the ledger's (``begin_release(..., expected_cap=...)``);
- the spend of a dataset composes every charge of every release of it, whatever the release's
  status: noise may have been drawn before a release failed or was withdrawn, so spent budget
  is never refunded. δ is the sum of the charges' δ; ε is the sum of their ε (basic sequential
  composition, Dwork & Roth 2014, Thm 3.16), or, when tighter, the zCDP charges' ρ summed and
  converted once at the sum of their δ plus the other charges' ε (``Ledger._spent``);
- :meth:`Ledger.begin_release` checks the cap and records the release with all its charges in
  one transaction, serialized per ledger (SQLite: ``BEGIN IMMEDIATE`` and a busy timeout) or per
  dataset (PostgreSQL: ``SELECT ... FOR UPDATE`` on the dataset's cap row), so two processes can
  never both spend the last of a budget, and the same release id is charged once;
- one charge, one release, across hosts: the release's row is its lock. It carries a lease
  (``lease_owner``, ``lease_expires``) that the running process renews (:meth:`Ledger.leased`).
  Another owner may take an unfinished release over only once the lease has expired, and the
  process that lost it learns so (:class:`LeaseLost`) before it renames its folder into place or
  completes the release.

Lease times come from the DATABASE's clock, for writing and for comparing, so that hosts whose
clocks disagree still agree on who holds a release: PostgreSQL's ``clock_timestamp()`` (the
server's wall clock; not ``now()``, which is frozen at the start of the transaction and would be
stale after a wait for a lock), SQLite's ``julianday('now')`` (SQLite runs in the calling
process, so this is that host's clock: share a ledger between hosts through PostgreSQL). They are
stored as seconds since the Unix epoch (double precision); every other time is a UTC ISO-8601
string.

Tables (schema.py; created if missing, and migrated in place from the previous version by adding
what it lacked): ``ledger_caps`` (one row per dataset), ``ledger_cap_changes`` (one row per cap
change), ``ledger_releases`` (one row per release id, its primary key), ``ledger_charges`` (one
row per charged budget step), ``ledger_release_plans`` (the budget plan a release was charged
under, canonical JSON and sha256, and the code version that charged it: a resume must draw under
the same plan, see :meth:`Ledger.begin_release`). ``Ledger(url, create=False)`` opens a ledger
for reading only: it never writes, not even the tables.

The ledger by concern: its database (backend.py), tables (schema.py), caps and spend (caps.py),
releases and their charges (releases.py, charges.py), leases (leases.py), reads (reading.py),
checks of its inputs (validation.py) and what it prints (formatting.py). :class:`Ledger` is
all of them.
"""

from __future__ import annotations

from dpatlas.ledger.reading import LedgerReading
from dpatlas.ledger.releases import ReleaseOperations


class Ledger(ReleaseOperations, LedgerReading):
    """The privacy-budget ledger in the database at ``url`` (a SQLite or PostgreSQL URL, or a
    bare file path: a SQLite file).

    ``create``: True (the default, for writers) creates the tables if missing and migrates a
    ledger of the previous version; False opens it for reading only and never writes: without
    tables it reads as an empty ledger, and every write raises :class:`LedgerError`.
    ``lock_timeout``: seconds to wait for another process's ledger transaction before giving
    up with :class:`ReleaseBusy`.

    Any failure to open it (bad URL, unreachable server, SQLite file that cannot be opened or
    created) is a :class:`LedgerError` with a one-line message that never shows the password.
    """
