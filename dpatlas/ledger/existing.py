"""Opening a ledger that must already exist: for the commands that act on releases it
recorded (withdraw, purge). Opening a mistyped path created an empty ledger (withdraw) or
read as one (purge: every release "never charged"); here it is refused, naming the URL."""

from __future__ import annotations

from dpatlas.ledger.errors import LedgerError
from dpatlas.ledger.store import Ledger


def open_existing_ledger(url: str, *, write: bool = False) -> Ledger:
    """The ledger at ``url``, refused with :class:`LedgerError` if no ledger is there (no
    SQLite file, or a database without the ledger's tables): nothing is created. ``write``:
    opened for writing (a ledger of the previous version is migrated, as every writer does)."""
    reading = Ledger(url, create=False)
    try:
        if not reading._has_ledger():
            raise LedgerError(f"there is no privacy-budget ledger at {reading.url} (no file, or "
                              "no ledger tables in it): check ledger.url in the config (a "
                              "relative SQLite path is relative to the config's folder); "
                              "nothing was changed")
    except BaseException:
        reading.close()
        raise
    if not write:
        return reading
    reading.close()
    return Ledger(url)
