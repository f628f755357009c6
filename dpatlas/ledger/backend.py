"""The ledger's database: its URL (never shown with a password), the SQLite or PostgreSQL
engine, transactions (serialized writes, retried after deadlocks), the database's clock, and
opening (and migrating) the schema. :class:`LedgerBackend` is the base of
:class:`dpatlas.ledger.store.Ledger`; the operations build on it.

Lease times come from the DATABASE's clock (see dpatlas/ledger/store.py): PostgreSQL's
``clock_timestamp()`` (not ``now()``, frozen at the start of the transaction), SQLite's
``julianday('now')`` (the calling host's clock)."""

from __future__ import annotations

import re
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Self

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc

from dpatlas.ledger.errors import LedgerError, ReleaseBusy
from dpatlas.ledger.formatting import fmt, now_text, one_line
from dpatlas.ledger.schema import (ADDED_RELEASE_COLUMNS, TABLES, caps_table, charges_table,
                                   inspect_schema, migrate, releases_table)
from dpatlas.ledger.validation import checked_release_id

DEFAULT_LOCK_TIMEOUT = 30.0  # seconds to wait for another process's ledger transaction
SUPPORTED_BACKENDS = ("sqlite", "postgresql")

# The database's clock in epoch seconds (see the module doc for why this one per backend).
_DB_CLOCK = {
    "postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}

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


class LedgerBackend:
    """The ledger's database connection, transactions and schema (see :class:`Ledger` for the
    constructor's arguments)."""

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
        return one_line(_redact_url_text(text))

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

    def _current(self) -> bool:
        return (self._tables == TABLES
                and set(ADDED_RELEASE_COLUMNS) <= self._release_columns)

    def _open_schema(self) -> None:
        """See which tables exist; a writer creates the missing ones and adds missing columns."""
        with self._engine.connect() as conn:
            self._tables, self._release_columns = inspect_schema(conn)
        if self.read_only or self._current():
            return
        with self._tx(write=True) as conn:
            migrate(conn, self._backend)
            self._tables, self._release_columns = inspect_schema(conn)

    def close(self) -> None:
        """Close the pooled connections (the ledger may still be used: they reopen)."""
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.dispose()

    def __enter__(self) -> Self:
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
                           f"for {fmt(self.lock_timeout)} s; try again ({e.__class__.__name__})")

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

    def _has_ledger(self) -> bool:
        return {caps_table.name, releases_table.name, charges_table.name} <= self._tables

    def _change(self, release_id: str, what: str,
                decide: Callable[[dict, float], dict | None]):
        """Lock the release row; decide(row, db_now) returns the new values (None: no change).

        Returns whatever decide returned."""
        checked_release_id(release_id)
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
                             .values(updated_at=now_text(), **values))
            return values

        return self._run_write(change, f"{what} {release_id}")
