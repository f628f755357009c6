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

Tables (created if missing, and migrated in place from the previous version by adding what it
lacked): ``ledger_caps`` (one row per dataset), ``ledger_cap_changes`` (one row per cap change),
``ledger_releases`` (one row per release id, its primary key), ``ledger_charges`` (one row per
charged budget step), ``ledger_release_plans`` (the budget plan a release was charged under,
canonical JSON and sha256, and the code version that charged it: a resume must draw under the
same plan, see :meth:`Ledger.begin_release`). ``Ledger(url, create=False)`` opens a ledger
for reading only: it never writes, not even the tables.
"""

from __future__ import annotations

import getpass
import json
import logging
import math
import re
import socket
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pandas as pd
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc

from mechanisms.accounting import lifetime_epsilon, within

from dpatlas.core.files import now_utc
from dpatlas.core.plan_record import (PlanChanged, canonical_plan, describe_changes,
                                      plan_changes)
from dpatlas.core.ids import (InvalidDatasetName, InvalidReason, InvalidReleaseId,
                              validate_dataset_name, validate_reason, validate_release_id)

from dpatlas.ledger.charges import Charge
from dpatlas.ledger.errors import (BudgetExceeded, CapBelowSpent, InvalidLedgerId,
                                   InvalidLedgerReason, LeaseLost, LedgerError, ReleaseBusy)
from dpatlas.ledger.leases import Lease

log = logging.getLogger(__name__)

GUARANTEE_TYPES = ("pure", "approx", "zcdp", "gdp")
STATUSES = ("in_progress", "published", "failed", "withdrawn")
CAP_MATCH_TOL = 1e-12  # relative tolerance when comparing a config's stated cap to the ledger's
DEFAULT_LOCK_TIMEOUT = 30.0  # seconds to wait for another process's ledger transaction
DEFAULT_LEASE_SECONDS = 60.0
MAX_LEASE_SECONDS = 86400.0
MAX_FAILURE_REASON = 500  # characters of a failure reason kept (they come from exceptions)
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
SET_CAP_COMMAND = ("dpatlas ledger set-cap --dataset {dataset} --epsilon E --delta X "
                   "--reason TEXT")

ENTRY_COLUMNS = ["release_id", "dataset", "status", "cell", "step", "guarantee_type",
                 "epsilon", "delta", "rho", "charged_at"]


# --- schema -------------------------------------------------------------------------------------

metadata = sa.MetaData()
_Double = sa.Double(asdecimal=False)

caps_table = sa.Table(
    "ledger_caps", metadata,
    sa.Column("dataset", sa.String(200), primary_key=True),
    sa.Column("cap_epsilon", _Double, nullable=False),
    sa.Column("cap_delta", _Double, nullable=False),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
    sa.CheckConstraint("cap_epsilon >= 0", name="ck_ledger_caps_epsilon"),
    sa.CheckConstraint("cap_delta >= 0 AND cap_delta <= 1", name="ck_ledger_caps_delta"),
)

cap_changes_table = sa.Table(
    "ledger_cap_changes", metadata,
    sa.Column("change_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dataset", sa.String(200), sa.ForeignKey("ledger_caps.dataset"), nullable=False,
              index=True),
    sa.Column("old_epsilon", _Double),  # NULL: the dataset had no cap before
    sa.Column("old_delta", _Double),
    sa.Column("new_epsilon", _Double, nullable=False),
    sa.Column("new_delta", _Double, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("actor", sa.Text, nullable=False),  # who: host:user unless told otherwise
    sa.Column("changed_at", sa.String(40), nullable=False),
)

releases_table = sa.Table(
    "ledger_releases", metadata,
    sa.Column("release_id", sa.String(200), nullable=False),
    sa.Column("dataset", sa.String(200), sa.ForeignKey("ledger_caps.dataset"), nullable=False,
              index=True),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("owner", sa.Text, nullable=False),  # the owner of the last begin_release
    sa.Column("config_sha256", sa.String(128), nullable=False),
    sa.Column("manifest_sha256", sa.String(128)),
    sa.Column("reason", sa.Text),  # the last failure or withdrawal reason
    sa.Column("attempts", sa.Integer, nullable=False),  # begin_release calls: 1 + resumes
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
    sa.Column("published_at", sa.String(40)),
    sa.Column("withdrawn_at", sa.String(40)),
    sa.Column("lease_owner", sa.Text),  # NULL: no one runs it now
    sa.Column("lease_expires", _Double),  # epoch seconds by the DATABASE's clock
    sa.PrimaryKeyConstraint("release_id", name="pk_ledger_releases"),  # unique release ids
    sa.CheckConstraint("status IN ('in_progress', 'published', 'failed', 'withdrawn')",
                       name="ck_ledger_releases_status"),
)

# Columns added since the first version; a ledger without them is migrated by ALTER TABLE.
ADDED_RELEASE_COLUMNS = ("lease_owner", "lease_expires")

charges_table = sa.Table(
    "ledger_charges", metadata,
    sa.Column("charge_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("release_id", sa.String(200), sa.ForeignKey("ledger_releases.release_id"),
              nullable=False, index=True),
    sa.Column("seq", sa.Integer, nullable=False),  # position in the release's charge list
    sa.Column("cell", sa.Text, nullable=False),
    sa.Column("step", sa.Text, nullable=False),
    sa.Column("guarantee_type", sa.String(16), nullable=False),
    sa.Column("epsilon", _Double, nullable=False),
    sa.Column("delta", _Double, nullable=False),
    sa.Column("rho", _Double),
    sa.Column("charged_at", sa.String(40), nullable=False),
    sa.UniqueConstraint("release_id", "seq", name="uq_ledger_charges_release_seq"),
    sa.CheckConstraint("epsilon >= 0", name="ck_ledger_charges_epsilon"),
    sa.CheckConstraint("delta >= 0 AND delta <= 1", name="ck_ledger_charges_delta"),
    sa.CheckConstraint("guarantee_type IN ('pure', 'approx', 'zcdp', 'gdp')",
                       name="ck_ledger_charges_type"),
)

# The plan each release was charged under (issue 31). Releases charged before it have no row:
# their first resume compares the charges per step and cell instead, then records the plan.
plans_table = sa.Table(
    "ledger_release_plans", metadata,
    sa.Column("release_id", sa.String(200), sa.ForeignKey("ledger_releases.release_id"),
              primary_key=True),
    sa.Column("plan_sha256", sa.String(64), nullable=False),
    sa.Column("plan", sa.Text, nullable=False),  # canonical JSON (dpatlas.core.plan_record)
    sa.Column("code_version", sa.Text, nullable=False),  # JSON: recorded, never compared
    sa.Column("recorded_at", sa.String(40), nullable=False),
    sa.Column("recorded_by", sa.String(20), nullable=False),  # "charge" or "resume"
)

TABLES = frozenset(t.name for t in metadata.sorted_tables)
_PG_SCHEMA_LOCK = 0x64706C6564676572 & 0x7FFFFFFFFFFFFFFF  # "dpledger": advisory lock for DDL

# The database's clock in epoch seconds (see the module doc for why this one per backend).
_DB_CLOCK = {
    "postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}


# --- helpers ------------------------------------------------------------------------------------

def _now() -> str:
    return now_utc("microseconds")


def _iso(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")


def _fmt(x: float | None) -> str:
    """Short float: 9.5, 0.1 (not 0.1000000001), 1e-5 (not 1e-05)."""
    if x is None:
        return "none"
    s = f"{x:.10g}"
    if "e" in s:
        mant, exp = s.split("e")
        s = f"{mant}e{'-' if exp.startswith('-') else ''}{exp.lstrip('+-').lstrip('0') or '0'}"
    return s


def display_text(text) -> str:
    """Stored text made safe to print on one line: every non-printable character (newline,
    carriage return, tab, escape, bidi override...) is shown as its escape, so a stored reason
    or id can never forge a line, or a colour, of ``ledger show``."""
    s = "" if text is None else str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                    if ord(c) < 0x10000 else f"\\U{ord(c):08x}") for c in s)


def _is_zcdp(row: dict) -> bool:
    return row["guarantee_type"] == "zcdp" and row["rho"] is not None


def _within(total: float, cap: float) -> bool:
    """The cap check, under the one tolerance policy (``mechanisms.accounting.REL_TOL``)."""
    return bool(within(total, cap))


def _finite(x, name: str, lo: float = 0.0, hi: float = math.inf) -> float:
    if isinstance(x, bool):
        raise LedgerError(f"{name} must be a number, got {x!r}")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise LedgerError(f"{name} must be a number, got {x!r}") from None
    if not math.isfinite(v) or v < lo or v > hi:
        raise LedgerError(f"{name} must be finite and in [{_fmt(lo)}, {_fmt(hi)}], got {x!r}")
    return v


def _text(x, name: str) -> str:
    if not isinstance(x, str) or not x.strip():
        raise LedgerError(f"{name} must be a non-empty string, got {x!r}")
    return x


def _dataset(value) -> str:
    try:
        return validate_dataset_name(value)
    except InvalidDatasetName as e:
        raise LedgerError(str(e)) from None


def check_cap(dataset: str, cap_epsilon: float, cap_delta: float) -> tuple[str, float, float]:
    """A cap's dataset, epsilon and delta, checked before any ledger is opened or created:
    epsilon finite and >= 0, delta in [0, 1) (a delta of 1 guarantees nothing)."""
    name = _dataset(dataset)
    eps = _finite(cap_epsilon, "the cap's epsilon")
    delta = _finite(cap_delta, "the cap's delta", hi=1.0)
    if delta >= 1.0:
        raise LedgerError(f"the cap's delta must be below 1 (a delta of 1 allows anything), "
                          f"got {cap_delta!r}")
    return name, eps, delta


def _release_id(value) -> str:
    try:
        return validate_release_id(value)
    except InvalidReleaseId as e:
        raise InvalidLedgerId(str(e)) from None


def _reason(value, what: str) -> str:
    try:
        return validate_reason(value, what)
    except InvalidReason as e:
        raise InvalidLedgerReason(str(e)) from None


def _lease_seconds(value) -> float:
    v = _finite(value, "lease_seconds", hi=MAX_LEASE_SECONDS)
    if v <= 0:
        raise LedgerError(f"lease_seconds must be positive, got {value!r}")
    return v


def default_actor() -> str:
    """host:user of this process, the default actor of a cap change."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without a passwd entry): the uid will do
        import os
        user = f"uid {os.getuid()}"
    return f"{socket.gethostname()}:{user}"


def _one_line(text: str, limit: int = 300) -> str:
    s = " ".join(str(text).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


# libpq takes a password as a query parameter too (``?password=``, ``&sslpassword=``).
_SECRET_KEY = r"(?:ssl)?pass(?:word|wd)?"
_QUERY_SECRET = re.compile(rf"(?i)([?&]{_SECRET_KEY}=)[^&#\s]*")


def _redact_url_text(text: str) -> str:
    """Hide a password in any URL-looking text, even one SQLAlchemy cannot parse: the
    userinfo's and a ``password=`` query parameter's."""
    return _QUERY_SECRET.sub(r"\1***", re.sub(r"://([^:@/\s]*):[^\s]*@", r"://\1:***@",
                                                str(text)))


def redact_url(url: "str | sa.URL") -> str:
    """A database URL as shown to people (``config check``, ``ledger show``, every message):
    no password, whether in the userinfo or given as a query parameter."""
    try:
        text = (url if isinstance(url, sa.URL) else sa.make_url(str(url))
                ).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - unparseable: scrub the text as it is
        text = str(url)
    return _redact_url_text(text)


def _url_secrets(url: sa.URL) -> list[str]:
    """The URL's password and any password given in its query, to scrub from error text."""
    found = [url.password] if url.password else []
    for key, value in url.query.items():
        if re.fullmatch(_SECRET_KEY, key, re.IGNORECASE):
            found.extend([value] if isinstance(value, str) else value)
    return [str(s) for s in found if len(str(s)) >= 3]


def _sqlstate(e: BaseException) -> str | None:
    orig = getattr(e, "orig", None)
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


def _is_lock_timeout(e: BaseException) -> bool:
    if _sqlstate(e) == "55P03":  # PostgreSQL lock_not_available (lock_timeout)
        return True
    msg = str(getattr(e, "orig", e)).lower()
    return any(s in msg for s in ("database is locked", "database is busy",
                                  "database table is locked", "lock wait timeout"))


def _is_retryable(e: BaseException) -> bool:
    # deadlock, serialization failure: the transaction was rolled back and may simply be rerun
    return _sqlstate(e) in ("40P01", "40001")


@dataclass(frozen=True)
class _CapRow:
    cap_epsilon: float
    cap_delta: float


# --- the ledger ---------------------------------------------------------------------------------

class Ledger:
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

    def __init__(self, url: str, *, create: bool = True,
                 lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
                 clock: Callable[[], float] | None = None):
        self.read_only = not create
        self.lock_timeout = float(lock_timeout)
        # The lease clock (epoch seconds): the database's unless a test injects one.
        self._clock = clock
        # Called while the charge holds the cap's lock, between the cap check and the insert:
        # nothing in production; a test injects a pause here to race two charges.
        self.after_cap_check: Callable[[], None] | None = None
        self._url = self._parse_url(url)
        self._backend = self._url.get_backend_name()
        if self._backend not in SUPPORTED_BACKENDS:
            raise LedgerError(f"the ledger at {self.url}: {self._backend} is not supported "
                              f"(use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB: "
                              "leases need the database's clock, implemented for those two)")
        self._tables: set[str] = set()
        self._release_columns: set[str] = set()
        try:
            self._engine = self._make_engine()
            if self._engine is not None:
                self._open_schema()
        except LedgerError:
            self.close()
            raise
        except (sa_exc.SQLAlchemyError, OSError, ImportError, sqlite3.Error) as e:
            self.close()
            if isinstance(e, sa_exc.DBAPIError) and _is_lock_timeout(e):
                raise self._busy(e, "opening the ledger") from None
            hint = ""
            if (self._backend == "sqlite" and self._sqlite_file() is not None
                    and (isinstance(e, OSError) or "unable to open" in str(e))):
                hint = (f" (check that {self._sqlite_file().parent} exists"
                        + (" and is writable by this user)" if create else ")"))
            raise LedgerError(f"cannot open the privacy-budget ledger at {self.url}: "
                              f"{self._describe(e)}{hint}") from None

    # engine and transactions

    @staticmethod
    def _parse_url(url) -> sa.URL:
        text = str(url)
        if "://" not in text:  # a bare file path: a SQLite file
            text = "sqlite:///" + str(Path(text).expanduser().resolve())
        try:
            return sa.make_url(text)
        except Exception:
            raise LedgerError(f"not a database URL: {_redact_url_text(text)!r} (expected e.g. "
                              "sqlite:///path/ledger.db or postgresql+psycopg://user@host/db)"
                              ) from None

    def _describe(self, e: BaseException) -> str:
        """One line about a failure, with the password scrubbed out of it."""
        text = f"{e.__class__.__name__}: {getattr(e, 'orig', None) or e}"
        for secret in _url_secrets(self._url):
            text = text.replace(secret, "***")
        return _one_line(_redact_url_text(text))

    def _sqlite_file(self) -> Path | None:
        db = self._url.database
        if not db or db == ":memory:" or db.startswith("file:"):
            return None
        return Path(db).expanduser()

    def _make_engine(self) -> sa.Engine | None:
        if self._backend == "sqlite":
            return self._sqlite_engine()
        args: dict = {}
        if self._url.drivername in ("postgresql", "postgresql+psycopg", "postgresql+psycopg2"):
            if "connect_timeout" not in self._url.query:
                args["connect_timeout"] = 10  # an unreachable host fails in seconds, not minutes
            if self.read_only:  # the server itself refuses any write on these connections
                args["options"] = "-c default_transaction_read_only=on"
        return sa.create_engine(self._url, pool_pre_ping=True, connect_args=args)

    def _sqlite_engine(self) -> sa.Engine | None:
        path = self._sqlite_file()
        if self.read_only:
            if path is None or not path.exists():
                return None  # nothing to read, and connecting would create the file
            uri = path.resolve().as_uri() + "?mode=ro"  # SQLite itself refuses writes
            engine = sa.create_engine(
                "sqlite://", poolclass=sa.pool.NullPool,
                creator=lambda: sqlite3.connect(uri, uri=True, timeout=self.lock_timeout,
                                                check_same_thread=False))
        else:
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine(self._url, connect_args={"timeout": self.lock_timeout})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            # sqlite3 must not issue its own BEGIN (it would be a deferred one): we do it below.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys = ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            # A write transaction takes SQLite's write lock at once (waiting up to the busy
            # timeout), so a check-then-insert is serialized across processes; reads are deferred.
            write = conn.get_execution_options().get("ledger_write", False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN DEFERRED")

        return engine

    @contextmanager
    def _tx(self, write: bool) -> Iterator[sa.Connection]:
        with self._engine.connect() as conn:
            if self._backend == "sqlite":
                conn.execution_options(ledger_write=write)
            elif not write and self._backend == "postgresql":
                conn.execution_options(isolation_level="REPEATABLE READ")  # one snapshot
            with conn.begin():
                if write and self._backend == "postgresql":
                    conn.execute(sa.select(sa.func.set_config(
                        "lock_timeout", f"{int(self.lock_timeout * 1000)}ms", True)))
                yield conn

    @contextmanager
    def _reading(self, what: str) -> Iterator[sa.Connection]:
        """A read transaction; a database failure becomes a one-line LedgerError."""
        try:
            with self._tx(write=False) as conn:
                yield conn
        except sa_exc.DBAPIError as e:
            raise LedgerError(f"{what}: the ledger at {self.url} failed: "
                              f"{self._describe(e)}") from None

    def _inspect(self, conn: sa.Connection) -> tuple[set[str], set[str]]:
        insp = sa.inspect(conn)
        tables = set(insp.get_table_names()) & TABLES
        columns = ({c["name"] for c in insp.get_columns(releases_table.name)}
                   if releases_table.name in tables else set())
        return tables, columns

    def _current(self) -> bool:
        return (self._tables == TABLES
                and set(ADDED_RELEASE_COLUMNS) <= self._release_columns)

    def _open_schema(self) -> None:
        """See which tables exist; a writer creates the missing ones and adds missing columns."""
        with self._engine.connect() as conn:
            self._tables, self._release_columns = self._inspect(conn)
        if self.read_only or self._current():
            return
        with self._tx(write=True) as conn:
            if self._backend == "postgresql":  # two processes migrating at once
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_SCHEMA_LOCK)))
            metadata.create_all(conn)  # checkfirst: only the missing tables
            _, have = self._inspect(conn)
            for name in ADDED_RELEASE_COLUMNS:
                if name not in have:  # additive: the previous version's rows keep their values
                    col = releases_table.c[name]
                    conn.exec_driver_sql(f"ALTER TABLE {releases_table.name} ADD COLUMN {name} "
                                         f"{col.type.compile(dialect=conn.dialect)}")
            self._tables, self._release_columns = self._inspect(conn)

    def close(self) -> None:
        """Close the pooled connections (the ledger may still be used: they reopen)."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.dispose()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def url(self) -> str:
        return redact_url(self._url)

    def __repr__(self) -> str:
        return f"Ledger({self.url!r}{', read-only' if self.read_only else ''})"

    def _busy(self, e: BaseException, what: str) -> ReleaseBusy:
        return ReleaseBusy(f"{what}: the ledger at {self.url} stayed locked by another process "
                           f"for {_fmt(self.lock_timeout)} s; try again ({e.__class__.__name__})")

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise LedgerError(f"{what}: the ledger at {self.url} was opened read-only "
                              "(create=False); open it with create=True to write")

    def _run_write(self, fn, what: str, attempts: int = 3):
        """Run fn(conn) in a write transaction; rerun it after deadlocks and lost insert races."""
        self._writable(what)
        last: BaseException | None = None
        for _ in range(attempts):
            try:
                with self._tx(write=True) as conn:
                    return fn(conn)
            except sa_exc.IntegrityError as e:
                last = e  # another process inserted the same key first: look again
            except sa_exc.DBAPIError as e:
                if _is_lock_timeout(e):
                    raise self._busy(e, what) from None
                if not _is_retryable(e):
                    raise LedgerError(f"{what}: the ledger at {self.url} failed: "
                                      f"{self._describe(e)}") from None
                last = e
            time.sleep(0.05)
        raise ReleaseBusy(f"{what}: kept conflicting with another process "
                          f"({self._describe(last)})") from None

    def _db_clock(self, conn: sa.Connection) -> float:
        """Now, in epoch seconds, by the database's clock (see the module doc), or by the
        clock the ledger was given."""
        if self._clock is not None:
            return float(self._clock())
        return float(conn.execute(sa.text(f"SELECT {_DB_CLOCK[self._backend]}")).scalar_one())

    def _release_select(self):
        """All columns of ledger_releases that this database has (an old one may lack some)."""
        return sa.select(*[c for c in releases_table.c
                           if not self._release_columns or c.name in self._release_columns])

    @staticmethod
    def _full_row(row) -> dict:
        return {**{name: None for name in ADDED_RELEASE_COLUMNS}, **dict(row)}

    # caps

    def set_cap(self, dataset: str, cap_epsilon: float, cap_delta: float, reason: str,
                actor: str | None = None, force: bool = False) -> bool:
        """Set (or change) the lifetime cap per privacy unit of a dataset, with a reason.

        The only code path that writes a cap. The change (time, old -> new, reason, actor:
        ``host:user`` by default) is kept in ``ledger_cap_changes`` and shown by
        :meth:`summary_text`. Returns False (and writes nothing) if the cap already is this one.
        Raises :class:`InvalidLedgerReason` for a blank or multi-line reason, and
        :class:`CapBelowSpent` for a cap below what the dataset has already spent, unless
        ``force`` (then no release of it can be charged until the cap is raised again).
        """
        dataset, eps, delta = check_cap(dataset, cap_epsilon, cap_delta)
        why = _reason(reason, "reason for the cap change")
        who = _text(actor, "actor") if actor is not None else default_actor()

        def upsert(conn: sa.Connection) -> bool:
            now = _now()
            c = caps_table.c
            old = conn.execute(sa.select(c.cap_epsilon, c.cap_delta).where(c.dataset == dataset)
                               .with_for_update()).first()
            if old is not None and (old.cap_epsilon, old.cap_delta) == (eps, delta):
                return False
            spent_eps, spent_delta, _ = self._spent(conn, dataset)
            if not force and not (_within(spent_eps, eps) and _within(spent_delta, delta)):
                raise CapBelowSpent(
                    f"a cap of eps={_fmt(eps)} delta={_fmt(delta)} for dataset {dataset} is "
                    f"below what it has already spent (eps={_fmt(spent_eps)} "
                    f"delta={_fmt(spent_delta)}; spent budget is never refunded): no release of "
                    "it could be charged until the cap is raised again. Nothing was changed; "
                    "to do this on purpose (e.g. to stop all releases), add --force")
            if old is None:
                conn.execute(caps_table.insert().values(
                    dataset=dataset, cap_epsilon=eps, cap_delta=delta, created_at=now,
                    updated_at=now))
            else:
                conn.execute(caps_table.update().where(c.dataset == dataset).values(
                    cap_epsilon=eps, cap_delta=delta, updated_at=now))
            conn.execute(cap_changes_table.insert().values(
                dataset=dataset, old_epsilon=None if old is None else old.cap_epsilon,
                old_delta=None if old is None else old.cap_delta, new_epsilon=eps,
                new_delta=delta, reason=why, actor=who, changed_at=now))
            return True

        return self._run_write(upsert, f"set_cap {dataset}")

    def cap(self, dataset: str) -> tuple[float, float] | None:
        """The dataset's lifetime cap (epsilon, delta) in this ledger, or None."""
        if caps_table.name not in self._tables:
            return None
        c = caps_table.c
        with self._reading(f"cap of {dataset}") as conn:
            row = conn.execute(sa.select(c.cap_epsilon, c.cap_delta)
                               .where(c.dataset == dataset)).first()
        return None if row is None else (float(row.cap_epsilon), float(row.cap_delta))

    def cap_changes(self, dataset: str | None = None) -> list[dict]:
        """The cap's history, oldest first: changed_at, dataset, old/new eps and delta, reason,
        actor."""
        if cap_changes_table.name not in self._tables:
            return []
        q = sa.select(cap_changes_table).order_by(cap_changes_table.c.change_id)
        if dataset is not None:
            q = q.where(cap_changes_table.c.dataset == dataset)
        with self._reading("cap history") as conn:
            return [dict(r) for r in conn.execute(q).mappings().all()]

    def check_stated_cap(self, dataset: str, expected) -> None:
        """:class:`LedgerError` if the config's stated cap (``expected``: (eps, delta), None
        parts not compared) is not this ledger's cap of ``dataset`` (read only)."""
        cap = self.cap(dataset)
        if cap is not None:
            self._check_expected_cap(dataset, _CapRow(*cap), expected)

    def _check_expected_cap(self, dataset: str, cap, expected) -> None:
        """The config's stated cap, if it states one, must be the ledger's (which rules)."""
        if expected is None:
            return
        exp_eps, exp_delta = expected
        for name, want, have in (("epsilon", exp_eps, cap.cap_epsilon),
                                 ("delta", exp_delta, cap.cap_delta)):
            if want is None:
                continue
            want = _finite(want, f"the config's cap {name}", hi=1.0 if name == "delta" else
                           math.inf)
            if not math.isclose(want, have, rel_tol=CAP_MATCH_TOL, abs_tol=0.0):
                raise LedgerError(
                    f"the config states a lifetime cap for dataset {dataset} of "
                    f"eps={_fmt(exp_eps)} delta={_fmt(exp_delta)}, but the ledger at {self.url} "
                    f"has eps={_fmt(cap.cap_epsilon)} delta={_fmt(cap.cap_delta)}: the cap is "
                    f"the ledger's; fix the config, or change the cap with "
                    f"`{SET_CAP_COMMAND.format(dataset=dataset)}`")

    # releases

    def begin_release(self, release_id: str, dataset: str, charges: list[Charge],
                      config_sha256: str, owner: str,
                      lease_seconds: float = DEFAULT_LEASE_SECONDS,
                      expected_cap: tuple[float | None, float | None] | None = None,
                      plan: dict | None = None) -> str:
        """Record a release and its charges if the dataset's cap allows, and take its lease.

        Returns
        - "new": recorded and charged, ``owner`` holds the lease for ``lease_seconds``;
        - "resume": this id exists unfinished (in progress or failed) with the same config hash
          and dataset, and its lease had expired, was released, or already is ``owner``'s: no
          new charge; ``owner`` now holds the lease and resumes it;
        - "published": already completed: no new charge, no lease, nothing to do.

        ``expected_cap``: the cap the config states, if any ((eps, delta); None parts are not
        compared); checked when the release is charged (a resume charges nothing).

        ``plan``: the plan entry (``{"plan", "plan_sha256", "code_version"}``), recorded with a
        new charge; a resume whose plan is not the recorded one raises :class:`PlanChanged`
        naming what changed, and writes nothing (no attempt, no lease). A release charged
        before plans were recorded is compared by its charges (each step's and cell's type,
        ε, δ, ρ), and its plan recorded when they agree.

        Raises :class:`ReleaseBusy` (another owner's lease is live: the message names it and
        when it expires; or the ledger stayed locked past ``lock_timeout``),
        :class:`BudgetExceeded` (nothing written), :class:`LedgerError` (no cap: the message
        gives the command that sets one; the config's cap is not the ledger's; the id exists
        with another config hash or dataset, or was withdrawn; an invalid charge or id).
        """
        _release_id(release_id)
        _dataset(dataset)
        _text(config_sha256, "config_sha256")
        _text(owner, "owner")
        lease = _lease_seconds(lease_seconds)
        rows = self._check_charges(release_id, charges)
        charge_eps = math.fsum(r["epsilon"] for r in rows)
        charge_delta = math.fsum(r["delta"] for r in rows)

        def attempt(conn: sa.Connection) -> str:
            c, r = caps_table.c, releases_table.c
            # Lock the dataset's cap row first (PostgreSQL: FOR UPDATE; SQLite holds the whole
            # database since BEGIN IMMEDIATE), then look at the release and the spend: every
            # insert of a charge of this dataset happens under this same lock.
            cap = conn.execute(sa.select(c.cap_epsilon, c.cap_delta).where(c.dataset == dataset)
                               .with_for_update()).first()
            row = conn.execute(self._release_select().where(r.release_id == release_id)
                               .with_for_update()).mappings().first()
            now = self._db_clock(conn)  # after the locks: a wait does not age it
            if row is not None:
                return self._existing(conn, row, dataset, config_sha256, owner, now, lease,
                                      plan, rows)
            if cap is None:
                raise LedgerError(
                    f"no lifetime budget cap is set for dataset {dataset!r} in the ledger at "
                    f"{self.url}, so release {release_id} cannot be charged: set one with "
                    f"`{SET_CAP_COMMAND.format(dataset=dataset)}`")
            self._check_expected_cap(dataset, cap, expected_cap)
            spent_eps, spent_delta, _ = self._spent(conn, dataset)
            after_eps, after_delta, _ = self._spent(conn, dataset, rows)
            if not (_within(after_eps, cap.cap_epsilon)
                    and _within(after_delta, cap.cap_delta)):
                left_eps = max(cap.cap_epsilon - spent_eps, 0.0)
                left_delta = max(cap.cap_delta - spent_delta, 0.0)
                raise BudgetExceeded(
                    f"release {release_id} would spend eps={_fmt(charge_eps)} "
                    f"(delta={_fmt(charge_delta)}) on dataset {dataset}: already spent "
                    f"eps={_fmt(spent_eps)} of the lifetime cap {_fmt(cap.cap_epsilon)} "
                    f"(delta {_fmt(spent_delta)} of {_fmt(cap.cap_delta)}); "
                    f"left eps={_fmt(left_eps)} (delta {_fmt(left_delta)})",
                    release_id=release_id, dataset=dataset, spent_epsilon=spent_eps,
                    spent_delta=spent_delta, charge_epsilon=charge_eps,
                    charge_delta=charge_delta, cap_epsilon=cap.cap_epsilon,
                    cap_delta=cap.cap_delta)
            if self.after_cap_check is not None:
                self.after_cap_check()
            stamp = _now()
            conn.execute(releases_table.insert().values(
                release_id=release_id, dataset=dataset, status="in_progress", owner=owner,
                config_sha256=config_sha256, manifest_sha256=None, reason=None, attempts=1,
                created_at=stamp, updated_at=stamp, published_at=None, withdrawn_at=None,
                lease_owner=owner, lease_expires=now + lease))
            conn.execute(charges_table.insert(),
                         [{**x, "release_id": release_id, "charged_at": stamp} for x in rows])
            if plan is not None:
                self._record_plan(conn, release_id, plan, "charge")
            return "new"

        return self._run_write(attempt, f"release {release_id}")

    def _existing(self, conn: sa.Connection, row, dataset: str, config_sha256: str,
                  owner: str, now: float, lease: float, plan: dict | None = None,
                  rows: list[dict] = ()) -> str:
        rid = row["release_id"]
        if row["dataset"] != dataset:
            raise LedgerError(f"release {rid} exists for dataset {row['dataset']!r}, "
                              f"not {dataset!r}: use a new release id")
        if row["config_sha256"] != config_sha256:
            raise LedgerError(
                f"release {rid} exists with another configuration (config sha256 "
                f"{row['config_sha256'][:12]}..., this run {config_sha256[:12]}...): a release "
                f"id is resumed only with its own configuration; use a new release id")
        if row["status"] == "published":
            return "published"
        if row["status"] == "withdrawn":
            raise LedgerError(f"release {rid} was withdrawn ({display_text(row['reason'])}): its "
                              "budget stays spent and it cannot be resumed; use a new release id")
        holder, expires = row.get("lease_owner"), row.get("lease_expires")
        if holder is not None and holder != owner and expires is not None and expires > now:
            raise ReleaseBusy(
                f"release {rid} is being run by {display_text(holder)}: its lease in the ledger at "
                f"{self.url} lasts until {_iso(expires)} (in {expires - now:.0f} s, by the "
                "database's clock); wait for that run to finish, or, if it died, for the lease "
                "to expire, then run again",
                holder=holder, lease_expires=expires)
        if plan is not None:
            self._check_plan(conn, rid, plan, rows)
        r = releases_table.c
        conn.execute(releases_table.update().where(r.release_id == rid).values(
            status="in_progress", owner=owner, attempts=r.attempts + 1, updated_at=_now(),
            lease_owner=owner, lease_expires=now + lease))
        return "resume"

    def _check_plan(self, conn: sa.Connection, rid: str, plan: dict, rows: list[dict]) -> None:
        """A resume draws under the plan its release was charged under (refused otherwise,
        before anything is written); one charged before plans were recorded must have the
        same charges, and then records this plan."""
        p = plans_table.c
        stored = conn.execute(sa.select(p.plan_sha256, p.plan, p.code_version)
                              .where(p.release_id == rid)).mappings().first()
        if stored is not None:
            if stored["plan_sha256"] == plan["plan_sha256"]:
                return  # the code version may differ: recorded, never compared
            changes = plan_changes(json.loads(stored["plan"]), plan["plan"])
            code = json.loads(stored["code_version"])
            raise PlanChanged(
                f"release {rid} was charged in the ledger at {self.url} under another budget "
                f"plan than this run's ({describe_changes(changes)}): its draws must be made "
                "under the plan it was charged for; finish it with the version that charged it "
                f"(dpatlas {code.get('package', '?')}, git {code.get('git_commit') or 'unknown'})"
                " or start a new release id (the charge is unchanged)", changes)
        changes = self._charge_changes(conn, rid, rows)
        if changes:
            raise PlanChanged(
                f"release {rid} was charged in the ledger at {self.url} (before plans were "
                f"recorded) for other budget steps than this run's ({describe_changes(changes)})"
                ": its draws must be made under the plan it was charged for; finish it with "
                "the version that charged it or start a new release id (the charge is "
                "unchanged)", changes)
        self._record_plan(conn, rid, plan, "resume")

    @staticmethod
    def _charge_changes(conn: sa.Connection, rid: str, rows: list[dict]) -> list[str]:
        """How this run's charges differ from the recorded ones, per step and cell."""
        ch = charges_table.c
        keys = ("guarantee_type", "epsilon", "delta", "rho")
        recorded = {(x["step"], x["cell"]): x for x in conn.execute(
            sa.select(ch.step, ch.cell, *[ch[k] for k in keys])
            .where(ch.release_id == rid)).mappings()}
        now = {(x["step"], x["cell"]): x for x in rows}
        changes = []
        for step, cell in sorted(set(recorded) | set(now)):
            old, new = recorded.get((step, cell)), now.get((step, cell))
            where = f"step {step}, cell {cell}"
            if old is None or new is None:
                changes.append(f"{where}: {'charged' if old else 'not charged'} → "
                               f"{'charged' if new else 'not charged'}")
                continue
            for k in keys:
                a, b = old[k], new[k]
                same = (a == b if isinstance(a, str) or a is None or b is None
                        else math.isclose(a, b, rel_tol=CAP_MATCH_TOL, abs_tol=0.0))
                if not same:
                    changes.append(f"{where}: {k} {a!r} → {b!r}")
        return changes

    @staticmethod
    def _record_plan(conn: sa.Connection, rid: str, plan: dict, how: str) -> None:
        conn.execute(plans_table.insert().values(
            release_id=rid, plan_sha256=plan["plan_sha256"], plan=canonical_plan(plan["plan"]),
            code_version=json.dumps(plan["code_version"], sort_keys=True), recorded_at=_now(),
            recorded_by=how))

    def release_plan(self, release_id: str) -> dict | None:
        """The plan entry a release was charged under (None: none recorded)."""
        _release_id(release_id)
        if plans_table.name not in self._tables:
            return None
        p = plans_table.c
        with self._reading(f"release {release_id}") as conn:
            row = conn.execute(sa.select(plans_table).where(p.release_id == release_id)
                               ).mappings().first()
        if row is None:
            return None
        return {"plan": json.loads(row["plan"]), "plan_sha256": row["plan_sha256"],
                "code_version": json.loads(row["code_version"]),
                "recorded_at": row["recorded_at"], "recorded_by": row["recorded_by"]}

    @staticmethod
    def _check_charges(release_id: str, charges: Iterable[Charge]) -> list[dict]:
        if isinstance(charges, Charge):
            charges = [charges]
        rows = []
        for i, ch in enumerate(charges):
            if not isinstance(ch, Charge):
                raise LedgerError(f"release {release_id}: charge {i} is not a Charge: {ch!r}")
            where = f"release {release_id}, charge {i} ({ch.cell} / {ch.step})"
            _text(ch.cell, f"{where}: cell")
            _text(ch.step, f"{where}: step")
            if ch.guarantee_type not in GUARANTEE_TYPES:
                raise LedgerError(f"{where}: guarantee_type must be one of {GUARANTEE_TYPES}, "
                                  f"got {ch.guarantee_type!r}")
            eps = _finite(ch.epsilon, f"{where}: epsilon")
            delta = _finite(ch.delta, f"{where}: delta", hi=1.0)
            rho = None if ch.rho is None else _finite(ch.rho, f"{where}: rho")
            if ch.guarantee_type == "pure" and delta != 0.0:
                raise LedgerError(f"{where}: a pure-DP step has delta 0, got {ch.delta!r}")
            rows.append({"seq": i, "cell": ch.cell, "step": ch.step,
                         "guarantee_type": ch.guarantee_type, "epsilon": eps, "delta": delta,
                         "rho": rho})
        if not rows:
            raise LedgerError(f"release {release_id} has no charges: nothing to record")
        return rows

    def _change(self, release_id: str, what: str,
                decide: Callable[[dict, float], dict | None]):
        """Lock the release row; decide(row, db_now) returns the new values (None: no change).

        Returns whatever decide returned."""
        _release_id(release_id)
        self._writable(f"{what} {release_id}")

        def change(conn: sa.Connection):
            r = releases_table.c
            row = conn.execute(self._release_select().where(r.release_id == release_id)
                               .with_for_update()).mappings().first()
            if row is None:
                raise LedgerError(f"{what}: no release {release_id} in the ledger at {self.url}")
            values = decide(self._full_row(row), self._db_clock(conn))
            if values:
                conn.execute(releases_table.update().where(r.release_id == release_id)
                             .values(updated_at=_now(), **values))
            return values

        return self._run_write(change, f"{what} {release_id}")

    # leases

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
            why = (f"{display_text(holder)} took it over (lease until {_iso(expires)}"
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
        _text(owner, "owner")
        lease = _lease_seconds(lease_seconds)

        def decide(row, now):
            lost = self._lost(row, owner, now, "renew_lease")
            if lost is not None:
                raise lost
            return {"lease_expires": now + lease}

        return self._change(release_id, "renew_lease", decide)["lease_expires"]

    def release_lease(self, release_id: str, owner: str) -> bool:
        """Give the lease up if ``owner`` holds it (then another owner may resume at once).

        Returns whether it was ``owner``'s; another owner's lease is left alone."""
        _text(owner, "owner")

        def decide(row, _db_now):
            if row.get("lease_owner") != owner:
                return None
            return {"lease_owner": None, "lease_expires": None}

        return self._change(release_id, "release_lease", decide) is not None

    def check_lease(self, release_id: str, owner: str) -> float:
        """Raise :class:`LeaseLost` unless ``owner`` holds the release's lease; read-only.

        Returns the seconds the lease has left by the database's clock (negative: it expired,
        but no one has taken it over, so it is still ``owner``'s; renew it)."""
        _release_id(release_id)
        _text(owner, "owner")
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
        lease = Lease(self, release_id, owner, _lease_seconds(lease_seconds))
        lease.start()
        try:
            yield lease
        finally:
            lease.stop()

    # status changes

    def complete_release(self, release_id: str, manifest_sha256: str, owner: str) -> None:
        """Mark an in-progress release published; ``owner`` must hold its lease.

        Idempotent: an already-published release with the same manifest is left as it is
        (whoever asks). Raises :class:`LeaseLost` if another owner took the release over."""
        _text(manifest_sha256, "manifest_sha256")
        _text(owner, "owner")

        def decide(row, now):
            st = row["status"]
            if st == "published":
                if row["manifest_sha256"] == manifest_sha256:
                    return None
                raise LedgerError(f"release {release_id} is already published with another "
                                  f"manifest ({row['manifest_sha256']})")
            if st == "withdrawn":
                raise LedgerError(f"release {release_id} is withdrawn: it cannot be published")
            lost = self._lost(row, owner, now, "complete_release")
            if lost is not None:
                raise lost
            return {"status": "published", "manifest_sha256": manifest_sha256,
                    "published_at": _now()}

        self._change(release_id, "complete_release", decide)

    def fail_release(self, release_id: str, reason: str, owner: str | None = None) -> None:
        """Mark a release failed and drop its lease. Its charges stay: noise may be drawn.

        ``owner``: the run that failed (it must hold the lease: :class:`LeaseLost` otherwise);
        None (an operator): refused with :class:`ReleaseBusy` while another owner's lease is
        live. The reason is kept on one line (at most 500 characters)."""

        def decide(row, now):
            st = row["status"]
            if st in ("published", "withdrawn"):
                raise LedgerError(f"release {release_id} is {st} and cannot fail now"
                                  + ("; withdraw it instead" if st == "published" else ""))
            holder, expires = row.get("lease_owner"), row.get("lease_expires")
            if owner is not None:
                lost = self._lost(row, owner, now, "fail_release")
                if lost is not None and st != "failed":
                    raise lost
            elif holder is not None and expires is not None and expires > now:
                raise ReleaseBusy(f"release {release_id} is being run by {display_text(holder)} "
                                  f"(lease until {_iso(expires)}): it cannot be failed now",
                                  holder=holder, lease_expires=expires)
            return {"status": "failed", "lease_owner": None, "lease_expires": None,
                    "reason": _one_line(str(reason), MAX_FAILURE_REASON)}

        self._change(release_id, "fail_release", decide)

    def withdraw_release(self, release_id: str, reason: str) -> dict:
        """Mark a published release withdrawn, for good. Its charges stay: its outputs were out.

        The reason is validated first (:func:`dpatlas.core.ids.validate_reason`). Idempotent: a
        withdrawn release is left as it is, with its first reason and time. Returns
        ``{"release_id", "status": "withdrawn", "reason", "withdrawn_at", "changed"}``,
        ``changed`` False when it was withdrawn already. A release that is not published
        (in progress, failed, unknown) cannot be withdrawn: :class:`LedgerError`."""
        why = _reason(reason, "withdrawal reason")
        seen: dict = {}

        def decide(row, _db_now):
            seen.update(row)
            if row["status"] == "withdrawn":
                return None
            if row["status"] != "published":
                raise LedgerError(
                    f"release {release_id} is {row['status']}, not published: only a published "
                    "release can be withdrawn (an unfinished one is resumed or left failed; its "
                    "budget stays spent either way)")
            return {"status": "withdrawn", "reason": why, "withdrawn_at": _now()}

        values = self._change(release_id, "withdraw_release", decide)
        if values is None:
            return {"release_id": release_id, "status": "withdrawn", "reason": seen["reason"],
                    "withdrawn_at": seen["withdrawn_at"], "changed": False}
        return {"release_id": release_id, "status": "withdrawn", "reason": why,
                "withdrawn_at": values["withdrawn_at"], "changed": True}

    # reading

    @staticmethod
    def _spent(conn: sa.Connection, dataset: str,
               adding: Iterable[dict] = ()) -> tuple[float, float, int]:
        """The dataset's lifetime (ε, δ) (with the charge rows ``adding`` composed in, for a
        release being charged) and its release count: δ summed; ε by the accountant's
        ``lifetime_epsilon`` (zCDP charges' ρ summed and converted once where that is tighter
        than adding every charge's ε)."""
        r, ch = releases_table.c, charges_table.c
        joined = charges_table.join(releases_table, ch.release_id == r.release_id)

        def sums(*where):
            return conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0),
                          sa.func.coalesce(sa.func.sum(ch.delta), 0.0),
                          sa.func.coalesce(sa.func.sum(ch.rho), 0.0))
                .select_from(joined).where(r.dataset == dataset, *where)).one()

        adding = list(adding)
        eps, delta, _ = sums()
        eps = math.fsum([float(eps), *(x["epsilon"] for x in adding)])
        delta = math.fsum([float(delta), *(x["delta"] for x in adding)])
        concentrated = [x for x in adding if _is_zcdp(x)]
        z_eps, z_delta, z_rho = sums(ch.guarantee_type == "zcdp", ch.rho.is_not(None))
        z_delta = math.fsum([float(z_delta), *(x["delta"] for x in concentrated)])
        z_rho = math.fsum([float(z_rho), *(x["rho"] for x in concentrated)])
        if z_rho > 0:
            o_eps, _, _ = sums(sa.or_(ch.guarantee_type != "zcdp", ch.rho.is_(None)))
            others = math.fsum([float(o_eps), *(x["epsilon"] for x in adding
                                                if not _is_zcdp(x))])
            eps = lifetime_epsilon(eps, others, z_rho, z_delta)
        n = conn.execute(sa.select(sa.func.count()).select_from(releases_table)
                         .where(r.dataset == dataset)).scalar_one()
        return eps, float(delta), int(n)

    def _has_ledger(self) -> bool:
        return {caps_table.name, releases_table.name, charges_table.name} <= self._tables

    def release(self, release_id: str) -> dict | None:
        """The release's row as a dict (plus its charge count and eps/delta sums), or None.

        ``lease_owner`` / ``lease_expires`` (epoch seconds, database clock) say who runs it."""
        _release_id(release_id)
        if not self._has_ledger():
            return None
        r, ch = releases_table.c, charges_table.c
        with self._reading(f"release {release_id}") as conn:
            row = conn.execute(self._release_select().where(r.release_id == release_id)
                               ).mappings().first()
            if row is None:
                return None
            n, eps, delta = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0),
                          sa.func.coalesce(sa.func.sum(ch.delta), 0.0))
                .where(ch.release_id == release_id)).one()
        return {**self._full_row(row), "charges": int(n), "epsilon": float(eps),
                "delta": float(delta)}

    def spent(self, dataset: str) -> dict:
        """The dataset's spend, cap and what is left (caps and left are None with no cap)."""
        out = {"dataset": dataset, "epsilon": 0.0, "delta": 0.0, "cap_epsilon": None,
               "cap_delta": None, "left_epsilon": None, "left_delta": None, "releases": 0}
        if not self._has_ledger():
            return out
        with self._reading(f"spend of {dataset}") as conn:
            cap = conn.execute(sa.select(caps_table.c.cap_epsilon, caps_table.c.cap_delta)
                               .where(caps_table.c.dataset == dataset)).first()
            eps, delta, n = self._spent(conn, dataset)
        out.update(epsilon=eps, delta=delta, releases=n)
        if cap is not None:
            out.update(cap_epsilon=cap.cap_epsilon, cap_delta=cap.cap_delta,
                       left_epsilon=max(cap.cap_epsilon - eps, 0.0),
                       left_delta=max(cap.cap_delta - delta, 0.0))
        return out

    def entries(self, dataset: str | None = None) -> pd.DataFrame:
        """One row per charge, with its release's id, dataset and status."""
        rows = []
        if self._has_ledger():
            r, ch = releases_table.c, charges_table.c
            q = (sa.select(r.release_id, r.dataset, r.status, ch.cell, ch.step,
                           ch.guarantee_type, ch.epsilon, ch.delta, ch.rho, ch.charged_at)
                 .select_from(charges_table.join(releases_table, ch.release_id == r.release_id))
                 .order_by(r.created_at, r.release_id, ch.seq))
            if dataset is not None:
                q = q.where(r.dataset == dataset)
            with self._reading("entries") as conn:
                rows = conn.execute(q).all()
        df = pd.DataFrame([tuple(x) for x in rows], columns=ENTRY_COLUMNS)
        for col in ("epsilon", "delta", "rho"):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
        return df

    def summary(self) -> dict:
        """What ``dpatlas ledger show`` shows, as data (``--json``): the URL (no password);
        per dataset its cap (None: none set), the cap's history, what is spent and left, and
        per release its id, status, start, charged eps and delta, reason and lease. Reads only."""
        out = {"url": self.url, "ledger_exists": self._has_ledger(), "datasets": []}
        if not out["ledger_exists"]:
            return out
        r, ch = releases_table.c, charges_table.c
        lease_cols = ([r.lease_owner, r.lease_expires]
                      if set(ADDED_RELEASE_COLUMNS) <= self._release_columns else [])
        cols = [r.release_id, r.dataset, r.status, r.created_at, r.reason, *lease_cols]
        eps_sum = sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0).label("eps")
        delta_sum = sa.func.coalesce(sa.func.sum(ch.delta), 0.0).label("delta")
        with self._reading("summary") as conn:
            caps = {x.dataset: x for x in conn.execute(sa.select(caps_table)).all()}
            rels = conn.execute(
                sa.select(*cols, eps_sum, delta_sum)
                .select_from(releases_table.outerjoin(charges_table,
                                                      ch.release_id == r.release_id))
                .group_by(*cols).order_by(r.dataset, r.created_at, r.release_id)
            ).mappings().all()
            now = self._db_clock(conn)
            lifetime = {ds: self._spent(conn, ds)[:2]
                        for ds in set(caps) | {x["dataset"] for x in rels}}
        history = self.cap_changes()
        for ds in sorted(lifetime):
            eps, delta = lifetime[ds]  # zCDP charges composed as rho (see _spent)
            cap = caps.get(ds)
            out["datasets"].append({
                "dataset": ds,
                "cap": None if cap is None else {"epsilon": cap.cap_epsilon,
                                                 "delta": cap.cap_delta},
                "cap_changes": [h for h in history if h["dataset"] == ds],
                "spent": {"epsilon": eps, "delta": delta},
                "left": None if cap is None else {
                    "epsilon": max(cap.cap_epsilon - eps, 0.0),
                    "delta": max(cap.cap_delta - delta, 0.0)},
                "over_cap": cap is not None and not (_within(eps, cap.cap_epsilon)
                                                     and _within(delta, cap.cap_delta)),
                "releases": [self._release_summary(x, now) for x in rels
                             if x["dataset"] == ds]})
        return out

    @staticmethod
    def _release_summary(x, now: float) -> dict:
        holder, expires = x.get("lease_owner"), x.get("lease_expires")
        leased = x["status"] == "in_progress" and holder is not None and expires is not None
        return {"release_id": x["release_id"], "status": x["status"],
                "started": x["created_at"], "epsilon": float(x["eps"]),
                "delta": float(x["delta"]), "reason": x["reason"],
                "lease": {"owner": holder, "until": _iso(expires), "live": expires > now}
                if leased else None}

    def summary_text(self) -> str:
        """Per dataset: cap, its history, spent, left; per release: id, status, start, eps, delta.

        Every stored text is shown with its control characters escaped (:func:`display_text`), so
        a reason or id cannot forge a line."""
        summary = self.summary()
        head = f"privacy-budget ledger at {summary['url']}"
        if not summary["ledger_exists"]:
            return (f"{head}\n  there is no ledger at this URL yet (no ledger tables): "
                    f"`{SET_CAP_COMMAND.format(dataset='D')}` creates it")
        lines = [head]
        if not summary["datasets"]:
            lines.append(f"  no datasets yet (set a cap: `{SET_CAP_COMMAND.format(dataset='D')}`)")
        for d in summary["datasets"]:
            lines += _dataset_lines(d)
        return "\n".join(lines)


def _dataset_lines(d: dict) -> list[str]:
    """``ledger show``'s lines for one dataset of :meth:`Ledger.summary`."""
    cap, spent, mine = d["cap"], d["spent"], d["releases"]
    lines = [f"dataset {display_text(d['dataset'])}:"]
    if cap is None:
        lines.append("  lifetime cap: none set")
    else:
        lines.append(f"  lifetime cap per privacy unit: eps={_fmt(cap['epsilon'])} "
                     f"delta={_fmt(cap['delta'])}")
    if d["cap_changes"]:
        lines.append("  cap changes (UTC):")
    for h in d["cap_changes"]:
        old = ("none" if h["old_epsilon"] is None else
               f"eps={_fmt(h['old_epsilon'])} delta={_fmt(h['old_delta'])}")
        lines.append(f"    {h['changed_at'][:19]}  {old} -> eps={_fmt(h['new_epsilon'])}"
                     f" delta={_fmt(h['new_delta'])}  by {display_text(h['actor'])}: "
                     f"{display_text(h['reason'])}")
    lines.append(f"  spent: eps={_fmt(spent['epsilon'])} delta={_fmt(spent['delta'])} "
                 f"over {len(mine)} release{'s' if len(mine) != 1 else ''} "
                 f"(failed and withdrawn releases included: never refunded)")
    if cap is not None:
        lines.append(f"  left: eps={_fmt(d['left']['epsilon'])} "
                     f"delta={_fmt(d['left']['delta'])}")
        if d["over_cap"]:
            lines.append("  over the cap: the cap was set below what is spent; no "
                         "release of this dataset can be charged until it is raised")
    if mine:
        w = max(10, *(len(display_text(x["release_id"])) for x in mine))
        lines.append(f"    {'release':<{w}}  {'status':<11}  {'started (UTC)':<19}  "
                     f"{'eps':>10}  {'delta':>10}")
        for x in mine:
            lines.append(f"    {display_text(x['release_id']):<{w}}  "
                         f"{display_text(x['status']):<11}  "
                         f"{display_text(x['started'])[:19]:<19}  "
                         f"{_fmt(x['epsilon']):>10}  {_fmt(x['delta']):>10}"
                         f"{_release_note(x)}")
    return lines


def _release_note(x: dict) -> str:
    if x["reason"] and x["status"] in ("failed", "withdrawn"):
        return f"  ({display_text(x['reason'])})"
    lease = x["lease"]
    if lease is not None:
        state = "live" if lease["live"] else "expired"
        return f"  (lease {state}: {display_text(lease['owner'])} until {lease['until']})"
    return ""
