"""The privacy-budget ledger, on SQLite (a temporary file) and on a real PostgreSQL server.

The PostgreSQL server is started by the test run itself (tests/support/pg_server.py), installing
Debian's postgresql package first if this is a fresh root machine without it. If none can be
had, the PostgreSQL half is skipped with the reason, unless DPATLAS_REQUIRE_PG=1 (then it fails).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.pg_server import LEDGER_DATASET, ledger, ledger_url, pg, url  # noqa: F401  (fixtures)
from dpatlas.core.ids import InvalidReason, InvalidReleaseId
from dpatlas.ledger import BudgetExceeded, Charge, Ledger, LedgerError, ReleaseBusy
from dpatlas.ledger.schema import caps_table, charges_table, releases_table
from tests.support.paths import REPO

DS = LEDGER_DATASET
CFG = "c" * 64


def charges(eps_each: float, n: int = 2, delta: float = 0.0, kind: str = "pure") -> list[Charge]:
    cells = ["all", "female", "male", "young"]
    return [Charge(cell=cells[i % len(cells)], step=f"primary: p25 and p75 #{i}",
                   guarantee_type=kind, epsilon=eps_each, delta=delta,
                   rho=(eps_each ** 2 / 8 if kind == "zcdp" else None)) for i in range(n)]


def n_charge_rows(ledger: Ledger) -> int:
    return len(ledger.entries())


# --- backends -----------------------------------------------------------------------------------

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
    assert ledger.begin_release("r1", DS, charges(1.0), CFG, "a") == "resume"  # its own lease
    with pytest.raises(ReleaseBusy, match="being run by a"):  # a's lease is live
        ledger.begin_release("r1", DS, charges(1.0), CFG, "b")
    assert ledger.release_lease("r1", "a") is True
    assert ledger.begin_release("r1", DS, charges(1.0), CFG, "b") == "resume"
    assert n_charge_rows(ledger) == 2
    row = ledger.release("r1")
    assert row["owner"] == "b" and row["attempts"] == 3 and row["status"] == "in_progress"
    assert row["lease_owner"] == "b"
    ledger.complete_release("r1", "m" * 64, "b")
    row = ledger.release("r1")
    assert row["status"] == "published" and row["manifest_sha256"] == "m" * 64
    assert row["published_at"] is not None
    ledger.complete_release("r1", "m" * 64, "anyone")  # idempotent
    with pytest.raises(LedgerError, match="another manifest"):
        ledger.complete_release("r1", "x" * 64, "b")
    assert ledger.begin_release("r1", DS, charges(1.0), CFG, "c") == "published"
    assert n_charge_rows(ledger) == 2
    assert math.isclose(ledger.spent(DS)["epsilon"], 2.0)


def test_same_id_with_another_config_is_refused(ledger):
    ledger.begin_release("r1", DS, charges(1.0), CFG, "a")
    with pytest.raises(LedgerError, match="another configuration"):
        ledger.begin_release("r1", DS, charges(1.0), "d" * 64, "a")
    ledger.set_cap("other", 5, 0, reason="second dataset")
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
    with pytest.raises(LedgerError) as err:
        ledger.begin_release("r1", "uncapped", charges(0.1), CFG, "a")
    assert ("`dpatlas ledger set-cap --dataset uncapped --epsilon E --delta X --reason TEXT`"
            in str(err.value))
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
        ledger.complete_release("unknown", "m", "a")


def test_entries_and_spent_sums(ledger):
    ledger.set_cap("other", 3.0, 1e-6, reason="start")
    ledger.set_cap("other", 4.0, 1e-6, reason="more")  # upsert
    ledger.begin_release("r1", DS, charges(0.5, n=2), CFG, "a")
    ledger.begin_release("r2", DS, charges(0.25, n=4, delta=1e-7, kind="zcdp"), CFG, "a")
    ledger.begin_release("o1", "other", charges(1.0, n=3, delta=1e-7, kind="approx"), CFG, "a")
    ledger.complete_release("r1", "m1", "a")

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
    with pytest.raises(ReleaseBusy, match="being run by a"):  # an operator, during a's run
        ledger.fail_release("r1", "looks stuck")
    ledger.fail_release("r1", "worker died\nTraceback ...", owner="a")
    row = ledger.release("r1")
    assert row["status"] == "failed" and row["reason"] == "worker died Traceback ..."
    assert row["lease_owner"] is None  # a failed run holds nothing: b may resume at once
    assert ledger.spent(DS)["epsilon"] == pytest.approx(2.0)
    with pytest.raises(LedgerError, match="resume"):
        ledger.complete_release("r1", "m", "a")
    assert ledger.begin_release("r1", DS, charges(1.0), CFG, "b") == "resume"
    ledger.complete_release("r1", "m", "b")
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
        ledger.complete_release("r1", "m", "b")
    assert "withdrawn" in ledger.summary_text()


def test_schema_is_created_once_and_reopened(url):
    with Ledger(url) as a:
        a.set_cap(DS, 1.0, 0.0, reason="initial cap")
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
    led.after_cap_check = lambda: time.sleep(0.4)  # hold the lock between check and insert
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
    assert out == ["busy", "new"], out  # the loser finds the winner's live lease
    df = ledger.entries(DS)
    assert len(df) == 2 and set(df["release_id"]) == {"same"}
    assert ledger.spent(DS)["epsilon"] == pytest.approx(2.0)


def test_two_processes_near_the_cap_only_one_fits(ledger, url):
    # each release spends 2 x 1.0: one fits, both do not
    ledger.set_cap(DS, 3.0, 0.0, reason="tight")
    out = _race(url, [("ra", 1.0), ("rb", 1.0)])
    assert out == ["exceeded", "new"], out
    s = ledger.spent(DS)
    assert s["epsilon"] == pytest.approx(2.0) and s["releases"] == 1
    assert len(ledger.entries(DS)) == 2


# --- the cap is the ledger's --------------------------------------------------------------------

def test_cap_changes_are_recorded_with_reason_and_shown(ledger):
    assert ledger.cap(DS) == (10.0, 1e-5)
    assert ledger.cap("nobody") is None
    assert ledger.set_cap(DS, 12.0, 1e-5, reason="board approved more", actor="ops:alice")
    assert not ledger.set_cap(DS, 12.0, 1e-5, reason="same again")  # no change, no record
    changes = ledger.cap_changes(DS)
    assert [(c["old_epsilon"], c["new_epsilon"], c["reason"]) for c in changes] == [
        (None, 10.0, "initial cap"), (10.0, 12.0, "board approved more")]
    assert changes[1]["actor"] == "ops:alice" and changes[1]["old_delta"] == 1e-5
    assert ":" in changes[0]["actor"]  # host:user by default
    text = ledger.summary_text()
    assert "none -> eps=10 delta=1e-5" in text
    assert "eps=10 delta=1e-5 -> eps=12 delta=1e-5  by ops:alice: board approved more" in text
    assert changes[1]["changed_at"][:19] in text


@pytest.mark.parametrize("reason", ["", "   ", "two\nlines", "bell\x07", None, "x" * 501])
def test_set_cap_needs_a_valid_reason(ledger, reason):
    with pytest.raises(LedgerError) as err:
        ledger.set_cap(DS, 1.0, 0.0, reason=reason)
    assert isinstance(err.value, InvalidReason)
    assert ledger.cap(DS) == (10.0, 1e-5) and len(ledger.cap_changes(DS)) == 1


@pytest.mark.parametrize("eps, delta", [(math.inf, 0.0), (math.nan, 0.0), (-1.0, 0.0),
                                        (1.0, 1.5), ("1", "x"), (True, 0.0)])
def test_set_cap_needs_finite_numbers(ledger, eps, delta):
    with pytest.raises(LedgerError):
        ledger.set_cap(DS, eps, delta, reason="bad numbers")
    assert ledger.cap(DS) == (10.0, 1e-5)


def test_config_cap_must_match_the_ledgers(ledger):
    with pytest.raises(LedgerError) as err:
        ledger.begin_release("r1", DS, charges(0.5), CFG, "a", expected_cap=(20.0, 1e-5))
    msg = str(err.value)
    assert "eps=20 delta=1e-5" in msg and "eps=10 delta=1e-5" in msg and "set-cap" in msg
    assert ledger.release("r1") is None and ledger.cap(DS) == (10.0, 1e-5)  # nothing written
    with pytest.raises(LedgerError, match="delta=1e-6"):
        ledger.begin_release("r1", DS, charges(0.5), CFG, "a", expected_cap=(None, 1e-6))
    assert ledger.begin_release("r1", DS, charges(0.5), CFG, "a",
                                expected_cap=(10.0, None)) == "new"
    assert ledger.begin_release("r2", DS, charges(0.5), CFG, "a",
                                expected_cap=(10.0, 1e-5)) == "new"
    assert ledger.cap(DS) == (10.0, 1e-5) and len(ledger.cap_changes()) == 1


# --- read-only opening --------------------------------------------------------------------------

def _raw_write(led: Ledger) -> None:
    with led._tx(write=True) as conn:
        conn.execute(sa.text("CREATE TABLE intruder (x INTEGER)"))


def test_read_only_on_an_empty_database_writes_nothing(url, tmp_path):
    ro = Ledger(url, create=False)
    try:
        assert "there is no ledger at this URL yet" in ro.summary_text()
        assert ro.cap(DS) is None and ro.release("r1") is None and ro.cap_changes() == []
        assert ro.entries().empty and ro.spent(DS)["epsilon"] == 0.0
        with pytest.raises(LedgerError, match="read-only"):
            ro.set_cap(DS, 1.0, 0.0, reason="x")
        with pytest.raises(LedgerError, match="read-only"):
            ro.begin_release("r1", DS, charges(0.1), CFG, "a")
        with pytest.raises(LedgerError, match="read-only"):
            ro.withdraw_release("r1", "x")
    finally:
        ro.close()
    if url.startswith("sqlite"):
        assert not (tmp_path / "ledger.db").exists()  # not even an empty file
    else:
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                assert sa.inspect(conn).get_table_names() == []
        finally:
            engine.dispose()


def test_read_only_on_a_ledger_reads_and_cannot_write(ledger, url, tmp_path):
    ledger.begin_release("r1", DS, charges(0.5), CFG, "a")
    before = (tmp_path / "ledger.db").read_bytes() if url.startswith("sqlite") else None
    with Ledger(url, create=False) as ro:
        assert ro.cap(DS) == (10.0, 1e-5)
        assert ro.release("r1")["lease_owner"] == "a"
        assert ro.check_lease("r1", "a") > 50
        assert "r1" in ro.summary_text() and len(ro.entries()) == 2
        with pytest.raises(LedgerError, match="read-only"):
            ro.renew_lease("r1", "a", 60)
        with pytest.raises(sa.exc.DBAPIError, match="(?i)read-only|readonly"):
            _raw_write(ro)  # the database itself refuses: SQLite mode=ro, PG read-only tx
    if before is not None:
        assert (tmp_path / "ledger.db").read_bytes() == before


# --- opening errors: one line, no password -----------------------------------------------------

@pytest.mark.parametrize("bad", [
    "nonsense://u:hunter2pw@host/db",
    "postgresql+psycopg://u:hunter2pw@127.0.0.1:1/x",  # nothing listens there
    "postgresql+psycopg://u:hunter2pw@host:notaport/db",
    "postgresql+nodriver://u:hunter2pw@host/db",
    "postgresql+psycopg://u:hunter2pw@[::1/db",
    "sqlite:///{tmp}/afile/ledger.db",  # a path under a regular file
    "sqlite:///{tmp}/garbage.db",  # not a database
])
def test_bad_ledger_urls_are_one_line_errors(bad, tmp_path):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "garbage.db").write_bytes(b"this is not a database file at all" * 100)
    # Reading only, a SQLite file that does not exist is a ledger not created yet (below).
    for create in (True, False) if "afile" not in bad else (True,):
        with pytest.raises(LedgerError) as err:
            Ledger(bad.format(tmp=tmp_path), create=create).summary_text()
        msg = str(err.value)
        assert "\n" not in msg and "hunter2pw" not in msg and len(msg) < 500, msg
    if "afile" in bad:
        assert "no ledger at this URL yet" in Ledger(bad.format(tmp=tmp_path),
                                                     create=False).summary_text()


def test_unreachable_database_is_a_ledger_error():
    with pytest.raises(LedgerError, match=r"cannot open .*u:\*\*\*@127\.0\.0\.1:1/x"):
        Ledger("postgresql+psycopg://u:secret@127.0.0.1:1/x")


_OPEN_WITHOUT_PERMISSION = """
import os, sys
from dpatlas.ledger import Ledger, LedgerError
Ledger(sys.argv[2]).close()  # warm up: every module is imported while we may still read them
if os.geteuid() == 0:  # root ignores file permissions: become nobody (65534) for the real test
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
try:
    Ledger(sys.argv[1])
except LedgerError as e:
    print(e)
    sys.exit(3)
"""


def test_sqlite_in_a_folder_without_write_permission(tmp_path):
    """One line (the child exits 3), not a traceback, when the SQLite file cannot be created."""
    folder = tmp_path / "locked"
    folder.mkdir()
    os.chmod(tmp_path, 0o755)  # nobody may look in, but not write
    os.chmod(folder, 0o555)
    try:
        for target in (folder / "ledger.db", folder / "sub" / "ledger.db"):
            p = subprocess.run([sys.executable, "-c", _OPEN_WITHOUT_PERMISSION,
                                f"sqlite:///{target}", f"sqlite:///{tmp_path / 'warm.db'}"],
                               capture_output=True, text=True, timeout=120, cwd=REPO)
            assert p.returncode == 3, (p.stdout, p.stderr)
            lines = p.stdout.strip().splitlines()
            assert len(lines) == 1 and "cannot open the privacy-budget ledger" in lines[0], lines
            assert str(target) in lines[0] and "Traceback" not in p.stderr
        assert not any(folder.iterdir())
    finally:
        os.chmod(folder, 0o755)


# --- ids, withdrawal, display -------------------------------------------------------------------

@pytest.mark.parametrize("rid", ["feed.json", "latest", "a$b", "r\x1b[31m", "", "../x",
                                 "x" * 65, "LATEST", "r1.json"])
def test_release_ids_are_validated_everywhere(ledger, rid):
    calls = [lambda: ledger.begin_release(rid, DS, charges(0.1), CFG, "a"),
             lambda: ledger.release(rid), lambda: ledger.complete_release(rid, "m", "a"),
             lambda: ledger.fail_release(rid, "x"), lambda: ledger.withdraw_release(rid, "x"),
             lambda: ledger.renew_lease(rid, "a", 5), lambda: ledger.release_lease(rid, "a"),
             lambda: ledger.check_lease(rid, "a")]
    for call in calls:
        with pytest.raises(LedgerError) as err:
            call()
        assert isinstance(err.value, InvalidReleaseId), err.value
    assert n_charge_rows(ledger) == 0


def test_withdraw_is_validated_idempotent_and_only_for_published(ledger):
    ledger.begin_release("r1", DS, charges(0.5), CFG, "a")
    with pytest.raises(LedgerError, match="in_progress, not published"):
        ledger.withdraw_release("r1", "too early")
    ledger.complete_release("r1", "m", "a")
    for bad in ("", "  ", "line\nforged", "esc\x1b[2J"):
        with pytest.raises(LedgerError) as err:
            ledger.withdraw_release("r1", bad)
        assert isinstance(err.value, InvalidReason)
    assert ledger.release("r1")["status"] == "published"  # nothing written
    first = ledger.withdraw_release("r1", "  wrong boundaries  ")
    assert first["changed"] and first["reason"] == "wrong boundaries"
    again = ledger.withdraw_release("r1", "another reason")
    assert not again["changed"]
    assert (again["reason"], again["withdrawn_at"]) == (first["reason"], first["withdrawn_at"])
    row = ledger.release("r1")
    assert (row["reason"], row["withdrawn_at"]) == ("wrong boundaries", first["withdrawn_at"])
    with pytest.raises(LedgerError, match="no release r9"):
        ledger.withdraw_release("r9", "x")


def test_summary_cannot_be_forged_by_stored_text(ledger):
    """Text stored by an older version (or by hand) is shown escaped, on its own line."""
    ledger.begin_release("r1", DS, charges(0.5), CFG, "a")
    ledger.complete_release("r1", "m", "a")
    r = releases_table.c
    with ledger._tx(write=True) as conn:
        conn.execute(releases_table.update().where(r.release_id == "r1").values(
            status="withdrawn", reason="oops\n    r2  published  2020-01-01  0  0\x1b[2J\u202e"))
    text = ledger.summary_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("r1"))
    assert "oops\\x0a    r2  published" in line and "\\x1b[2J\\u202e" in line
    assert not any(x.strip().startswith("r2") for x in text.splitlines())
    assert "\x1b" not in text and "\u202e" not in text


# --- migration from the previous version's schema -----------------------------------------------

def _old_schema(url: str) -> None:
    """The ledger tables exactly as the previous version created them, written by hand, with
    a cap, a published release and an in-progress one (no lease columns, no cap history)."""
    engine = sa.create_engine(url)
    serial = "INTEGER" if url.startswith("sqlite") else "SERIAL"
    ddl = [
        "CREATE TABLE ledger_caps (dataset VARCHAR(200) NOT NULL PRIMARY KEY, "
        "cap_epsilon DOUBLE PRECISION NOT NULL, cap_delta DOUBLE PRECISION NOT NULL, "
        "created_at VARCHAR(40) NOT NULL, updated_at VARCHAR(40) NOT NULL, "
        "CONSTRAINT ck_ledger_caps_epsilon CHECK (cap_epsilon >= 0), "
        "CONSTRAINT ck_ledger_caps_delta CHECK (cap_delta >= 0 AND cap_delta <= 1))",
        "CREATE TABLE ledger_releases (release_id VARCHAR(200) NOT NULL, "
        "dataset VARCHAR(200) NOT NULL REFERENCES ledger_caps (dataset), "
        "status VARCHAR(20) NOT NULL, owner TEXT NOT NULL, config_sha256 VARCHAR(128) NOT NULL, "
        "manifest_sha256 VARCHAR(128), reason TEXT, attempts INTEGER NOT NULL, "
        "created_at VARCHAR(40) NOT NULL, updated_at VARCHAR(40) NOT NULL, "
        "published_at VARCHAR(40), withdrawn_at VARCHAR(40), "
        "CONSTRAINT pk_ledger_releases PRIMARY KEY (release_id), "
        "CONSTRAINT ck_ledger_releases_status CHECK "
        "(status IN ('in_progress', 'published', 'failed', 'withdrawn')))",
        f"CREATE TABLE ledger_charges (charge_id {serial} NOT NULL PRIMARY KEY, "
        "release_id VARCHAR(200) NOT NULL REFERENCES ledger_releases (release_id), "
        "seq INTEGER NOT NULL, cell TEXT NOT NULL, step TEXT NOT NULL, "
        "guarantee_type VARCHAR(16) NOT NULL, epsilon DOUBLE PRECISION NOT NULL, "
        "delta DOUBLE PRECISION NOT NULL, rho DOUBLE PRECISION, charged_at VARCHAR(40) NOT NULL,"
        " CONSTRAINT uq_ledger_charges_release_seq UNIQUE (release_id, seq))",
        "INSERT INTO ledger_caps VALUES ('tracts-2020', 5.0, 1e-6, '2025-01-01T00:00:00+00:00', "
        "'2025-01-01T00:00:00+00:00')",
    ]
    for rid, status in (("old-pub", "published"), ("old-run", "in_progress")):
        ddl.append(f"INSERT INTO ledger_releases VALUES ('{rid}', 'tracts-2020', '{status}', "
                   f"'oldhost:123', '{CFG}', NULL, NULL, 1, '2025-01-0{len(ddl)}T00:00:00+00:00',"
                   " '2025-01-01T00:00:00+00:00', NULL, NULL)")
        for seq in range(2):
            ddl.append(f"INSERT INTO ledger_charges (release_id, seq, cell, step, guarantee_type,"
                       f" epsilon, delta, rho, charged_at) VALUES ('{rid}', {seq}, 'all', "
                       f"'primary #{seq}', 'pure', 0.75, 0.0, NULL, '2025-01-01T00:00:00+00:00')")
    try:
        with engine.begin() as conn:
            for stmt in ddl:
                conn.exec_driver_sql(stmt)
    finally:
        engine.dispose()


def _columns(url: str) -> tuple[set[str], set[str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            insp = sa.inspect(conn)
            return (set(insp.get_table_names()),
                    {c["name"] for c in insp.get_columns("ledger_releases")})
    finally:
        engine.dispose()


def test_previous_version_ledger_is_migrated_in_place(url):
    _old_schema(url)
    old_tables, old_cols = _columns(url)
    assert "ledger_cap_changes" not in old_tables and "lease_owner" not in old_cols

    with Ledger(url, create=False) as ro:  # reads an old ledger as it is, migrating nothing
        assert ro.spent(DS)["epsilon"] == pytest.approx(3.0)
        assert ro.release("old-run")["lease_owner"] is None
        assert "old-pub" in ro.summary_text() and ro.cap_changes() == []
    assert _columns(url) == (old_tables, old_cols)

    with Ledger(url) as led:
        tables, cols = _columns(url)
        assert {"ledger_cap_changes", "ledger_release_plans"} | old_tables == tables
        assert cols == old_cols | {"lease_owner", "lease_expires"}
        assert led.spent(DS)["epsilon"] == pytest.approx(3.0) and led.cap(DS) == (5.0, 1e-6)
        assert led.release("old-pub")["status"] == "published"
        # an in-progress release of the old version has no lease: a new owner may resume it
        assert led.begin_release("old-run", DS, charges(0.75), CFG, "newhost") == "resume"
        assert led.release("old-run")["lease_owner"] == "newhost"
        led.set_cap(DS, 6.0, 1e-6, reason="after the upgrade")
        assert [c["old_epsilon"] for c in led.cap_changes()] == [5.0]
    with Ledger(url) as again:  # idempotent: nothing more to add, nothing lost
        assert _columns(url) == (tables, cols)
        assert again.release("old-run")["lease_owner"] == "newhost"
        assert n_charge_rows(again) == 4
