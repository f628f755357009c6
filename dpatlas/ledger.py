"""The privacy-budget ledger: every release's charges, in a real database, capped per dataset.

One ledger serves every release of a deployment. It lives in any database SQLAlchemy 2 reaches:
a SQLite file by default (``sqlite:///ledger.db``), PostgreSQL (``postgresql+psycopg://...``)
when several machines share it.

Rules the ledger enforces:

- a dataset (the population whose privacy is protected) has a lifetime cap per privacy unit,
  ``(cap_epsilon, cap_delta)``, set with :meth:`Ledger.set_cap`; no release of a dataset
  without one;
- the spend of a dataset is the sum of epsilon and of delta over every charge of every release
  of it, whatever the release's status: noise may have been drawn before a release failed or
  was withdrawn, so spent budget is never refunded (summing is basic sequential composition,
  which is conservative for every guarantee type);
- :meth:`Ledger.begin_release` checks the cap and records the release with all its charges in
  one transaction, serialized per ledger (SQLite: ``BEGIN IMMEDIATE`` and a busy timeout) or per
  dataset (PostgreSQL and others: ``SELECT ... FOR UPDATE`` on the dataset's cap row), so two
  processes can never both spend the last of a budget, and the same release id is charged once.

Tables (created if missing): ``ledger_caps`` (one row per dataset), ``ledger_releases`` (one row
per release id, its primary key), ``ledger_charges`` (one row per charged budget step).
Times are UTC ISO-8601 strings; amounts are double precision floats.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import pandas as pd
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy import exc as sa_exc

__all__ = ["LedgerError", "BudgetExceeded", "ReleaseBusy", "Charge", "Ledger",
           "GUARANTEE_TYPES", "STATUSES"]

GUARANTEE_TYPES = ("pure", "approx", "zcdp", "gdp")
STATUSES = ("in_progress", "published", "failed", "withdrawn")
REL_TOL = 1e-9  # relative tolerance of the cap check, for float sums
DEFAULT_LOCK_TIMEOUT = 30.0  # seconds to wait for another process's ledger transaction

ENTRY_COLUMNS = ["release_id", "dataset", "status", "cell", "step", "guarantee_type",
                 "epsilon", "delta", "rho", "charged_at"]


class LedgerError(RuntimeError):
    """A ledger operation refused (unknown release, mismatched config, no cap, bad charge...)."""


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


class ReleaseBusy(LedgerError):
    """Another process holds this release id (or the ledger's lock) right now; try again later."""


@dataclass(frozen=True)
class Charge:
    cell: str  # demographic cell ("all" if none)
    step: str  # budget step name, e.g. "primary: p25 and p75"
    guarantee_type: str  # "pure" | "approx" | "zcdp" | "gdp"
    epsilon: float  # the step's epsilon in (eps, delta) terms (for zcdp: its conversion)
    delta: float
    rho: float | None = None  # zCDP rho where the step has one


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

releases_table = sa.Table(
    "ledger_releases", metadata,
    sa.Column("release_id", sa.String(200), nullable=False),
    sa.Column("dataset", sa.String(200), sa.ForeignKey("ledger_caps.dataset"), nullable=False,
              index=True),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("owner", sa.Text, nullable=False),
    sa.Column("config_sha256", sa.String(128), nullable=False),
    sa.Column("manifest_sha256", sa.String(128)),
    sa.Column("reason", sa.Text),  # the last failure or withdrawal reason
    sa.Column("attempts", sa.Integer, nullable=False),  # begin_release calls: 1 + resumes
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("updated_at", sa.String(40), nullable=False),
    sa.Column("published_at", sa.String(40)),
    sa.Column("withdrawn_at", sa.String(40)),
    sa.PrimaryKeyConstraint("release_id", name="pk_ledger_releases"),  # unique release ids
    sa.CheckConstraint("status IN ('in_progress', 'published', 'failed', 'withdrawn')",
                       name="ck_ledger_releases_status"),
)

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

_PG_SCHEMA_LOCK = 0x64706C6564676572 & 0x7FFFFFFFFFFFFFFF  # "dpledger": advisory lock for DDL


# --- helpers ------------------------------------------------------------------------------------

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _fmt(x: float | None) -> str:
    """Short float: 9.5, 0.1 (not 0.1000000001), 1e-5 (not 1e-05)."""
    if x is None:
        return "none"
    s = f"{x:.10g}"
    if "e" in s:
        mant, exp = s.split("e")
        s = f"{mant}e{'-' if exp.startswith('-') else ''}{exp.lstrip('+-').lstrip('0') or '0'}"
    return s


def _within(total: float, cap: float) -> bool:
    return total <= cap + REL_TOL * abs(cap)


def _finite(x, name: str, lo: float = 0.0, hi: float = math.inf) -> float:
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


# --- the ledger ---------------------------------------------------------------------------------

class Ledger:
    """The privacy-budget ledger in the database at ``url`` (any SQLAlchemy URL).

    ``lock_timeout``: seconds to wait for another process's ledger transaction before giving
    up with :class:`ReleaseBusy`.
    """

    def __init__(self, url: str, *, lock_timeout: float = DEFAULT_LOCK_TIMEOUT):
        url = str(url)
        if "://" not in url:  # a bare file path: a SQLite file
            url = "sqlite:///" + str(Path(url).expanduser().resolve())
        self._url = sa.make_url(url)
        self.lock_timeout = float(lock_timeout)
        self._backend = self._url.get_backend_name()
        self._pause_after_check = 0.0  # tests only: hold the lock this long before writing
        if self._backend == "sqlite":
            self._engine = self._sqlite_engine()
        else:
            self._engine = sa.create_engine(self._url, pool_pre_ping=True)
        try:
            self._create_schema()
        except sa_exc.DBAPIError as e:
            self._engine.dispose()
            if _is_lock_timeout(e):
                raise self._busy(e, "creating the ledger tables") from e
            raise LedgerError(f"cannot open the privacy-budget ledger at {self.url}: "
                              f"{e.orig}") from e
        except Exception:
            self._engine.dispose()
            raise

    # engine and transactions

    def _sqlite_engine(self) -> sa.Engine:
        db = self._url.database
        if db and db != ":memory:" and not db.startswith("file:"):
            Path(db).expanduser().parent.mkdir(parents=True, exist_ok=True)
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

    def _create_schema(self) -> None:
        with self._engine.connect() as conn:
            have = set(sa.inspect(conn).get_table_names())
        if {t.name for t in metadata.sorted_tables} <= have:
            return
        with self._tx(write=True) as conn:
            if self._backend == "postgresql":  # two processes creating tables at once
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_SCHEMA_LOCK)))
            metadata.create_all(conn)

    def close(self) -> None:
        """Close the pooled connections (the ledger may still be used: they reopen)."""
        self._engine.dispose()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def url(self) -> str:
        return self._url.render_as_string(hide_password=True)

    def __repr__(self) -> str:
        return f"Ledger({self.url!r})"

    def _busy(self, e: BaseException, what: str) -> ReleaseBusy:
        return ReleaseBusy(f"{what}: the ledger at {self.url} stayed locked by another process "
                           f"for {_fmt(self.lock_timeout)} s; try again ({e.__class__.__name__})")

    def _run_write(self, fn, what: str, attempts: int = 3):
        """Run fn(conn) in a write transaction; rerun it after deadlocks and lost insert races."""
        last: BaseException | None = None
        for _ in range(attempts):
            try:
                with self._tx(write=True) as conn:
                    return fn(conn)
            except sa_exc.IntegrityError as e:
                last = e  # another process inserted the same key first: look again
            except sa_exc.DBAPIError as e:
                if _is_lock_timeout(e):
                    raise self._busy(e, what) from e
                if not _is_retryable(e):
                    raise
                last = e
            time.sleep(0.05)
        raise ReleaseBusy(f"{what}: kept conflicting with another process ({last})") from last

    # caps

    def set_cap(self, dataset: str, cap_epsilon: float, cap_delta: float) -> None:
        """Set (or change) the lifetime cap per privacy unit of a dataset."""
        _text(dataset, "dataset")
        eps = _finite(cap_epsilon, "cap_epsilon")
        delta = _finite(cap_delta, "cap_delta", hi=1.0)

        def upsert(conn: sa.Connection) -> None:
            now = _now()
            c = caps_table.c
            found = conn.execute(sa.select(c.dataset).where(c.dataset == dataset)
                                 .with_for_update()).first()
            if found is None:
                conn.execute(caps_table.insert().values(
                    dataset=dataset, cap_epsilon=eps, cap_delta=delta, created_at=now,
                    updated_at=now))
            else:
                conn.execute(caps_table.update().where(c.dataset == dataset).values(
                    cap_epsilon=eps, cap_delta=delta, updated_at=now))

        self._run_write(upsert, f"set_cap {dataset}")

    # releases

    def begin_release(self, release_id: str, dataset: str, charges: list[Charge],
                      config_sha256: str, owner: str) -> str:
        """Record a release and its charges if the dataset's cap allows, atomically.

        Returns "new" (recorded and charged), "resume" (this id exists unfinished with the same
        config hash: no new charge, the caller resumes it; it is marked in_progress again under
        ``owner``) or "published" (already completed: no new charge, nothing to do).
        Raises :class:`BudgetExceeded` (nothing written), :class:`LedgerError` (id exists with
        another config hash or dataset, was withdrawn, no cap set, invalid charge) or
        :class:`ReleaseBusy` (another process kept the ledger locked past ``lock_timeout``).
        """
        _text(release_id, "release_id")
        _text(dataset, "dataset")
        _text(config_sha256, "config_sha256")
        _text(owner, "owner")
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
            row = conn.execute(sa.select(releases_table).where(r.release_id == release_id)
                               .with_for_update()).mappings().first()
            if row is not None:
                return self._existing(conn, row, dataset, config_sha256, owner)
            if cap is None:
                raise LedgerError(
                    f"no lifetime budget cap is set for dataset {dataset!r}: set one with "
                    f"Ledger.set_cap({dataset!r}, cap_epsilon, cap_delta) before release "
                    f"{release_id}")
            spent_eps, spent_delta, _ = self._spent(conn, dataset)
            if not (_within(spent_eps + charge_eps, cap.cap_epsilon)
                    and _within(spent_delta + charge_delta, cap.cap_delta)):
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
            if self._pause_after_check:
                time.sleep(self._pause_after_check)
            now = _now()
            conn.execute(releases_table.insert().values(
                release_id=release_id, dataset=dataset, status="in_progress", owner=owner,
                config_sha256=config_sha256, manifest_sha256=None, reason=None, attempts=1,
                created_at=now, updated_at=now, published_at=None, withdrawn_at=None))
            conn.execute(charges_table.insert(),
                         [{**x, "release_id": release_id, "charged_at": now} for x in rows])
            return "new"

        return self._run_write(attempt, f"release {release_id}")

    @staticmethod
    def _existing(conn: sa.Connection, row, dataset: str, config_sha256: str,
                  owner: str) -> str:
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
            raise LedgerError(f"release {rid} was withdrawn ({row['reason']}): its budget stays "
                              f"spent and it cannot be resumed; use a new release id")
        r = releases_table.c
        conn.execute(releases_table.update().where(r.release_id == rid).values(
            status="in_progress", owner=owner, attempts=r.attempts + 1, updated_at=_now()))
        return "resume"

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

    def _set_status(self, release_id: str, what: str, decide) -> None:
        """Lock the release row, let decide(row) return the new values (or None: no change)."""
        _text(release_id, "release_id")

        def change(conn: sa.Connection) -> None:
            r = releases_table.c
            row = conn.execute(sa.select(releases_table).where(r.release_id == release_id)
                               .with_for_update()).mappings().first()
            if row is None:
                raise LedgerError(f"{what}: no release {release_id} in the ledger at {self.url}")
            values = decide(row)
            if values:
                conn.execute(releases_table.update().where(r.release_id == release_id)
                             .values(updated_at=_now(), **values))

        self._run_write(change, f"{what} {release_id}")

    def complete_release(self, release_id: str, manifest_sha256: str) -> None:
        """Mark an in-progress release published (idempotent with the same manifest)."""
        _text(manifest_sha256, "manifest_sha256")

        def decide(row):
            st = row["status"]
            if st == "published":
                if row["manifest_sha256"] == manifest_sha256:
                    return None
                raise LedgerError(f"release {release_id} is already published with another "
                                  f"manifest ({row['manifest_sha256']})")
            if st != "in_progress":
                raise LedgerError(f"release {release_id} is {st}, not in progress: "
                                  + ("begin_release it again to resume it first"
                                     if st == "failed" else "it cannot be published"))
            return {"status": "published", "manifest_sha256": manifest_sha256,
                    "published_at": _now()}

        self._set_status(release_id, "complete_release", decide)

    def fail_release(self, release_id: str, reason: str) -> None:
        """Mark a release failed. Its charges stay: noise may already have been drawn."""

        def decide(row):
            st = row["status"]
            if st in ("published", "withdrawn"):
                raise LedgerError(f"release {release_id} is {st} and cannot fail now"
                                  + ("; withdraw it instead" if st == "published" else ""))
            return {"status": "failed", "reason": str(reason)}

        self._set_status(release_id, "fail_release", decide)

    def withdraw_release(self, release_id: str, reason: str) -> None:
        """Mark a release withdrawn (for good). Its charges stay: its outputs may be out."""

        def decide(row):
            if row["status"] == "withdrawn":
                return None
            return {"status": "withdrawn", "reason": str(reason), "withdrawn_at": _now()}

        self._set_status(release_id, "withdraw_release", decide)

    # reading

    @staticmethod
    def _spent(conn: sa.Connection, dataset: str) -> tuple[float, float, int]:
        r, ch = releases_table.c, charges_table.c
        eps, delta = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0),
                      sa.func.coalesce(sa.func.sum(ch.delta), 0.0))
            .select_from(charges_table.join(releases_table, ch.release_id == r.release_id))
            .where(r.dataset == dataset)).one()
        n = conn.execute(sa.select(sa.func.count()).select_from(releases_table)
                         .where(r.dataset == dataset)).scalar_one()
        return float(eps), float(delta), int(n)

    def release(self, release_id: str) -> dict | None:
        """The release's row as a dict (plus its charge count and eps/delta sums), or None."""
        r, ch = releases_table.c, charges_table.c
        with self._tx(write=False) as conn:
            row = conn.execute(sa.select(releases_table).where(r.release_id == release_id)
                               ).mappings().first()
            if row is None:
                return None
            n, eps, delta = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0),
                          sa.func.coalesce(sa.func.sum(ch.delta), 0.0))
                .where(ch.release_id == release_id)).one()
        return {**dict(row), "charges": int(n), "epsilon": float(eps), "delta": float(delta)}

    def spent(self, dataset: str) -> dict:
        """The dataset's spend, cap and what is left (caps and left are None with no cap)."""
        with self._tx(write=False) as conn:
            cap = conn.execute(sa.select(caps_table.c.cap_epsilon, caps_table.c.cap_delta)
                               .where(caps_table.c.dataset == dataset)).first()
            eps, delta, n = self._spent(conn, dataset)
        out = {"dataset": dataset, "epsilon": eps, "delta": delta, "cap_epsilon": None,
               "cap_delta": None, "left_epsilon": None, "left_delta": None, "releases": n}
        if cap is not None:
            out.update(cap_epsilon=cap.cap_epsilon, cap_delta=cap.cap_delta,
                       left_epsilon=max(cap.cap_epsilon - eps, 0.0),
                       left_delta=max(cap.cap_delta - delta, 0.0))
        return out

    def entries(self, dataset: str | None = None) -> pd.DataFrame:
        """One row per charge, with its release's id, dataset and status."""
        r, ch = releases_table.c, charges_table.c
        q = (sa.select(r.release_id, r.dataset, r.status, ch.cell, ch.step, ch.guarantee_type,
                       ch.epsilon, ch.delta, ch.rho, ch.charged_at)
             .select_from(charges_table.join(releases_table, ch.release_id == r.release_id))
             .order_by(r.created_at, r.release_id, ch.seq))
        if dataset is not None:
            q = q.where(r.dataset == dataset)
        with self._tx(write=False) as conn:
            rows = conn.execute(q).all()
        df = pd.DataFrame([tuple(x) for x in rows], columns=ENTRY_COLUMNS)
        for col in ("epsilon", "delta", "rho"):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
        return df

    def summary_text(self) -> str:
        """Per dataset: cap, spent, left; per release: id, status, start time, eps, delta."""
        r, ch = releases_table.c, charges_table.c
        with self._tx(write=False) as conn:
            caps = {x.dataset: x for x in conn.execute(sa.select(caps_table)).all()}
            rels = conn.execute(
                sa.select(r.release_id, r.dataset, r.status, r.created_at, r.published_at,
                          r.reason, sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0),
                          sa.func.coalesce(sa.func.sum(ch.delta), 0.0))
                .select_from(releases_table.outerjoin(charges_table,
                                                      ch.release_id == r.release_id))
                .group_by(r.release_id, r.dataset, r.status, r.created_at, r.published_at,
                          r.reason)
                .order_by(r.dataset, r.created_at, r.release_id)).all()
        lines = [f"privacy-budget ledger at {self.url}"]
        datasets = sorted(set(caps) | {x.dataset for x in rels})
        if not datasets:
            lines.append("  no datasets yet (set a cap with set_cap)")
        for ds in datasets:
            mine = [x for x in rels if x.dataset == ds]
            eps = math.fsum(float(x[6]) for x in mine)
            delta = math.fsum(float(x[7]) for x in mine)
            cap = caps.get(ds)
            lines.append(f"dataset {ds}:")
            if cap is None:
                lines.append("  lifetime cap: none set")
            else:
                lines.append(f"  lifetime cap per privacy unit: eps={_fmt(cap.cap_epsilon)} "
                             f"delta={_fmt(cap.cap_delta)}")
            lines.append(f"  spent: eps={_fmt(eps)} delta={_fmt(delta)} "
                         f"over {len(mine)} release{'s' if len(mine) != 1 else ''} "
                         f"(failed and withdrawn releases included: never refunded)")
            if cap is not None:
                lines.append(f"  left: eps={_fmt(max(cap.cap_epsilon - eps, 0.0))} "
                             f"delta={_fmt(max(cap.cap_delta - delta, 0.0))}")
            if mine:
                w = max(10, *(len(x.release_id) for x in mine))
                lines.append(f"    {'release':<{w}}  {'status':<11}  {'started (UTC)':<19}  "
                             f"{'eps':>10}  {'delta':>10}")
                for x in mine:
                    extra = f"  ({x.reason})" if x.reason and x.status in ("failed",
                                                                            "withdrawn") else ""
                    lines.append(f"    {x.release_id:<{w}}  {x.status:<11}  "
                                 f"{x.created_at[:19]:<19}  {_fmt(float(x[6])):>10}  "
                                 f"{_fmt(float(x[7])):>10}{extra}")
        return "\n".join(lines)
