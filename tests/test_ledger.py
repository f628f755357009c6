"""The privacy-budget ledger, on SQLite (a temporary file) and on a real PostgreSQL server.

The PostgreSQL server is started by the test run itself (tests/pg_server.py), installing
Debian's postgresql package first if this is a fresh root machine without it. If none can be
had, the PostgreSQL half is skipped with the reason, unless DPATLAS_REQUIRE_PG=1 (then it fails).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import uuid
import warnings

import pytest
import sqlalchemy as sa

import pg_server
from dpatlas.ledger import (BudgetExceeded, Charge, Ledger, LedgerError, ReleaseBusy,
                            caps_table, charges_table)

DS = "tracts-2020"
CFG = "c" * 64


def charges(eps_each: float, n: int = 2, delta: float = 0.0, kind: str = "pure") -> list[Charge]:
    cells = ["all", "female", "male", "young"]
    return [Charge(cell=cells[i % len(cells)], step=f"primary: p25 and p75 #{i}",
                   guarantee_type=kind, epsilon=eps_each, delta=delta,
                   rho=(eps_each ** 2 / 8 if kind == "zcdp" else None)) for i in range(n)]


def n_charge_rows(ledger: Ledger) -> int:
    return len(ledger.entries())


# --- backends -----------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def pg():
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(pg_server.postgres_server())
        except pg_server.PostgresUnavailable as e:
            if os.environ.get("DPATLAS_REQUIRE_PG"):
                pytest.fail(f"PostgreSQL required (DPATLAS_REQUIRE_PG) but unavailable: {e}")
            pytest.skip(f"PostgreSQL unavailable, PostgreSQL ledger tests skipped: {e}")
        if server.install_seconds:
            warnings.warn(f"installed Debian's postgresql for the ledger tests in "
                          f"{server.install_seconds:.0f} s")
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    server = request.getfixturevalue("pg")
    return server.create_database(f"ledger_{uuid.uuid4().hex[:16]}")


@pytest.fixture
def ledger(url):
    led = Ledger(url)
    led.set_cap(DS, 10.0, 1e-5)
    yield led
    led.close()


# --- single process -----------------------------------------------------------------------------

def test_first_release_is_new_and_charged(ledger):
    assert ledger.begin_release("r1", DS, charges(0.5, n=3), CFG, "alice@host:1") == "new"
    row = ledger.release("r1")
    assert row["status"] == "in_progress" and row["owner"] == "alice@host:1"
    assert row["config_sha256"] == CFG and row["dataset"] == DS and row["attempts"] == 1
    assert row["created_at"].endswith("+00:00")
    assert row["charges"] == 3 and math.isclose(row["epsilon"], 1.5)
    s = ledger.spent(DS)
    assert math.isclose(s["epsilon"], 1.5) and s["delta"] == 0.0 and s["releases"] == 1
    assert math.isclose(s["left_epsilon"], 8.5) and s["cap_epsilon"] == 10.0
    assert ledger.release("nope") is None


def test_same_id_resumes_then_is_published_without_new_charges(ledger):
    assert ledger.begin_release("r1", DS, charges(1.0), CFG, "a") == "new"
    assert ledger.begin_release("r1", DS, charges(1.0), CFG, "b") == "resume"
    assert n_charge_rows(ledger) == 2
    row = ledger.release("r1")
    assert row["owner"] == "b" and row["attempts"] == 2 and row["status"] == "in_progress"
    ledger.complete_release("r1", "m" * 64)
    row = ledger.release("r1")
    assert row["status"] == "published" and row["manifest_sha256"] == "m" * 64
    assert row["published_at"] is not None
    ledger.complete_release("r1", "m" * 64)  # idempotent
    with pytest.raises(LedgerError, match="another manifest"):
        ledger.complete_release("r1", "x" * 64)
    assert ledger.begin_release("r1", DS, charges(1.0), CFG, "c") == "published"
    assert n_charge_rows(ledger) == 2
    assert math.isclose(ledger.spent(DS)["epsilon"], 2.0)


def test_same_id_with_another_config_is_refused(ledger):
    ledger.begin_release("r1", DS, charges(1.0), CFG, "a")
    with pytest.raises(LedgerError, match="another configuration"):
        ledger.begin_release("r1", DS, charges(1.0), "d" * 64, "a")
    ledger.set_cap("other", 5, 0)
    with pytest.raises(LedgerError, match="exists for dataset"):
        ledger.begin_release("r1", "other", charges(1.0), CFG, "a")
    assert n_charge_rows(ledger) == 2


def test_budget_exceeded_writes_nothing(ledger):
    assert ledger.begin_release("r1", DS, charges(4.75), CFG, "a") == "new"  # 9.5 spent
    with pytest.raises(BudgetExceeded) as err:
        ledger.begin_release("r2", DS, charges(0.5), CFG, "a")  # would spend 1.0
    msg = str(err.value)
    assert msg == ("release r2 would spend eps=1 (delta=0) on dataset tracts-2020: already "
                   "spent eps=9.5 of the lifetime cap 10 (delta 0 of 1e-5); left eps=0.5 "
                   "(delta 1e-5)")
    assert err.value.left_epsilon == pytest.approx(0.5)
    assert isinstance(err.value, LedgerError)
    assert ledger.release("r2") is None and n_charge_rows(ledger) == 2
    # delta counts too
    with pytest.raises(BudgetExceeded, match="delta"):
        ledger.begin_release("r3", DS, charges(0.1, delta=1e-5, kind="approx"), CFG, "a")
    assert ledger.release("r3") is None
    # exactly the rest fits, float sums within the tolerance (ten charges of 0.05 = 0.5)
    assert ledger.begin_release("r4", DS, charges(0.05, n=10), CFG, "a") == "new"
    s = ledger.spent(DS)
    assert s["epsilon"] == pytest.approx(10.0) and s["left_epsilon"] == pytest.approx(0.0)
    with pytest.raises(BudgetExceeded):
        ledger.begin_release("r5", DS, charges(1e-6, n=1), CFG, "a")


def test_no_cap_and_bad_charges_are_refused(ledger):
    with pytest.raises(LedgerError, match="set_cap"):
        ledger.begin_release("r1", "uncapped", charges(0.1), CFG, "a")
    bad = [
        [Charge("all", "s", "pure", -1.0, 0.0, None)],
        [Charge("all", "s", "pure", math.nan, 0.0, None)],
        [Charge("all", "s", "laplace", 1.0, 0.0, None)],
        [Charge("all", "s", "pure", 1.0, 1e-6, None)],  # pure has delta 0
        [Charge("all", "s", "approx", 1.0, 2.0, None)],
        [],
    ]
    for b in bad:
        with pytest.raises(LedgerError):
            ledger.begin_release("r1", DS, b, CFG, "a")
    assert ledger.release("r1") is None and n_charge_rows(ledger) == 0
    with pytest.raises(LedgerError):
        ledger.complete_release("unknown", "m")


def test_entries_and_spent_sums(ledger):
    ledger.set_cap("other", 3.0, 1e-6)
    ledger.set_cap("other", 4.0, 1e-6)  # upsert
    ledger.begin_release("r1", DS, charges(0.5, n=2), CFG, "a")
    ledger.begin_release("r2", DS, charges(0.25, n=4, delta=1e-7, kind="zcdp"), CFG, "a")
    ledger.begin_release("o1", "other", charges(1.0, n=3, delta=1e-7, kind="approx"), CFG, "a")
    ledger.complete_release("r1", "m1")

    df = ledger.entries(DS)
    assert list(df.columns) == ["release_id", "dataset", "status", "cell", "step",
                                "guarantee_type", "epsilon", "delta", "rho", "charged_at"]
    assert len(df) == 6 and set(df["release_id"]) == {"r1", "r2"}
    assert df["epsilon"].sum() == pytest.approx(2.0)
    assert df["delta"].sum() == pytest.approx(4e-7)
    assert df.loc[df.release_id == "r1", "status"].unique().tolist() == ["published"]
    assert df.loc[df.release_id == "r1", "rho"].isna().all()
    assert df.loc[df.release_id == "r2", "rho"].tolist() == pytest.approx([0.25 ** 2 / 8] * 4)
    assert df["cell"].tolist()[:2] == ["all", "female"]
    assert len(ledger.entries()) == 9 and len(ledger.entries("other")) == 3
    assert ledger.entries("none").empty

    s = ledger.spent(DS)
    assert s["epsilon"] == pytest.approx(2.0) and s["delta"] == pytest.approx(4e-7)
    assert s["left_epsilon"] == pytest.approx(8.0) and s["left_delta"] == pytest.approx(1e-5 - 4e-7)
    assert s["releases"] == 2
    o = ledger.spent("other")
    assert o["cap_epsilon"] == 4.0 and o["epsilon"] == pytest.approx(3.0) and o["releases"] == 1
    assert ledger.spent("nobody")["cap_epsilon"] is None

    text = ledger.summary_text()
    for needle in ("dataset tracts-2020", "dataset other", "r1", "published", "r2",
                   "in_progress", "eps=10", "left: eps=8", "eps=4"):
        assert needle in text, (needle, text)


def test_fail_and_withdraw_keep_the_charges(ledger):
    ledger.begin_release("r1", DS, charges(1.0), CFG, "a")
    ledger.fail_release("r1", "worker died")
    row = ledger.release("r1")
    assert row["status"] == "failed" and row["reason"] == "worker died"
    assert ledger.spent(DS)["epsilon"] == pytest.approx(2.0)
    with pytest.raises(LedgerError, match="resume"):
        ledger.complete_release("r1", "m")
    assert ledger.begin_release("r1", DS, charges(1.0), CFG, "b") == "resume"
    ledger.complete_release("r1", "m")
    with pytest.raises(LedgerError, match="withdraw"):
        ledger.fail_release("r1", "late")
    ledger.withdraw_release("r1", "error found in the input")
    row = ledger.release("r1")
    assert row["status"] == "withdrawn" and row["withdrawn_at"] is not None
    assert ledger.spent(DS)["epsilon"] == pytest.approx(2.0)  # never refunded
    assert len(ledger.entries(DS)) == 2
    with pytest.raises(LedgerError, match="withdrawn"):
        ledger.begin_release("r1", DS, charges(1.0), CFG, "c")
    with pytest.raises(LedgerError):
        ledger.complete_release("r1", "m")
    assert "withdrawn" in ledger.summary_text()


def test_schema_is_created_once_and_reopened(url):
    with Ledger(url) as a:
        a.set_cap(DS, 1.0, 0.0)
        a.begin_release("r1", DS, charges(0.25), CFG, "a")
    with Ledger(url) as b:  # tables exist: reopened, nothing lost
        assert b.spent(DS)["epsilon"] == pytest.approx(0.5)
        assert charges_table.name == "ledger_charges"


def test_lock_held_too_long_raises_release_busy(ledger, url):
    impatient = Ledger(url, lock_timeout=0.3)
    try:
        with ledger._tx(write=True) as conn:  # another writer holds the dataset's lock
            conn.execute(sa.select(caps_table).where(caps_table.c.dataset == DS)
                         .with_for_update()).all()
            with pytest.raises(ReleaseBusy, match="locked"):
                impatient.begin_release("r1", DS, charges(1.0), CFG, "a")
        assert impatient.release("r1") is None
        assert impatient.begin_release("r1", DS, charges(1.0), CFG, "a") == "new"
    finally:
        impatient.close()


# --- two processes ------------------------------------------------------------------------------

def _race_worker(url, release_id, eps, barrier, results):
    """Runs in a spawned process: begin one release as soon as the other process is ready."""
    led = Ledger(url)
    led._pause_after_check = 0.4  # hold the lock between the check and the insert
    try:
        led.spent(DS)  # connect first, so both start the race at the same moment
        barrier.wait(timeout=60)
        try:
            out = led.begin_release(release_id, DS, charges(eps), CFG, f"pid {os.getpid()}")
        except ReleaseBusy:
            out = "busy"
        except BudgetExceeded:
            out = "exceeded"
        except Exception as e:  # reported to the test
            out = f"error: {e!r}"
        results.put(out)
    finally:
        led.close()


def _race(url, jobs) -> list[str]:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(len(jobs)), ctx.Queue()
    procs = [ctx.Process(target=_race_worker, args=(url, rid, eps, barrier, results))
             for rid, eps in jobs]
    for p in procs:
        p.start()
    try:
        out = sorted(results.get(timeout=90) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return out


def test_two_processes_same_release_id_charge_once(ledger, url):
    out = _race(url, [("same", 1.0), ("same", 1.0)])
    assert out.count("new") == 1, out
    other, = [x for x in out if x != "new"]
    assert other in ("resume", "busy"), out
    df = ledger.entries(DS)
    assert len(df) == 2 and set(df["release_id"]) == {"same"}
    assert ledger.spent(DS)["epsilon"] == pytest.approx(2.0)


def test_two_processes_near_the_cap_only_one_fits(ledger, url):
    ledger.set_cap(DS, 3.0, 0.0)  # each release spends 2 x 1.0: one fits, both do not
    out = _race(url, [("ra", 1.0), ("rb", 1.0)])
    assert out == ["exceeded", "new"], out
    s = ledger.spent(DS)
    assert s["epsilon"] == pytest.approx(2.0) and s["releases"] == 1
    assert len(ledger.entries(DS)) == 2


def test_unreachable_database_is_a_ledger_error():
    with pytest.raises(LedgerError, match=r"cannot open .*u:\*\*\*@127\.0\.0\.1:1/x"):
        Ledger("postgresql+psycopg://u:secret@127.0.0.1:1/x")
