"""Leases: one charge, one release, across hosts. On SQLite and on the test run's PostgreSQL.

Hosts are played by processes (spawned, each with its own connections) with different owners;
"killing a host" is SIGKILL, so nothing is released on the way out. Lease lengths are short
(0.5 to 2 s) so that expiry can be waited for; the arithmetic of every timing assertion is in
the test.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from tests.support.pg_server import LEDGER_DATASET, ledger, ledger_url, pg, url  # noqa: F401  (fixtures)
from dpatlas.ledger import Charge, LeaseLost, Ledger, LedgerError, ReleaseBusy

DS = LEDGER_DATASET
CFG = "c" * 64
RID = "r1"


def charges(n: int = 2) -> list[Charge]:
    return [Charge("all", f"step {i}", "pure", 0.5, 0.0) for i in range(n)]


def db_now(led: Ledger) -> float:
    with led._tx(write=False) as conn:
        return led._db_clock(conn)


class FakeClock:
    """A lease clock the test advances instead of sleeping until a lease expires."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clocked(ledger, url):
    """The test's ledger with an injected lease clock, starting at the database's now."""
    clock = FakeClock(db_now(ledger))
    led = Ledger(url, clock=clock)
    yield led, clock
    led.close()


def lease_of(led: Ledger, rid: str = RID) -> tuple[str | None, float | None]:
    row = led.release(rid)
    return row["lease_owner"], row["lease_expires"]


# --- one process, two owners --------------------------------------------------------------------

def test_lease_is_taken_renewed_and_released(ledger):
    assert ledger.begin_release(RID, DS, charges(), CFG, "host-a", lease_seconds=60) == "new"
    owner, expires = lease_of(ledger)
    assert owner == "host-a" and expires - db_now(ledger) == pytest.approx(60, abs=2)
    assert ledger.check_lease(RID, "host-a") == pytest.approx(60, abs=2)

    with pytest.raises(ReleaseBusy) as err:
        ledger.begin_release(RID, DS, charges(), CFG, "host-b")
    assert err.value.holder == "host-a" and err.value.lease_expires == pytest.approx(expires)
    msg = str(err.value)
    assert "being run by host-a" in msg and "lasts until" in msg and "\n" not in msg
    with pytest.raises(LeaseLost, match="host-a took it over"):
        ledger.check_lease(RID, "host-b")
    with pytest.raises(LeaseLost):
        ledger.renew_lease(RID, "host-b", 60)
    with pytest.raises(LeaseLost):
        ledger.complete_release(RID, "m", "host-b")
    assert ledger.release_lease(RID, "host-b") is False  # not b's: left alone
    assert lease_of(ledger) == ("host-a", pytest.approx(expires))

    new_expiry = ledger.renew_lease(RID, "host-a", 120)
    assert new_expiry - db_now(ledger) == pytest.approx(120, abs=2)
    assert ledger.release_lease(RID, "host-a") is True
    assert lease_of(ledger) == (None, None)
    with pytest.raises(LeaseLost, match="no one holds"):
        ledger.complete_release(RID, "m", "host-a")
    assert ledger.begin_release(RID, DS, charges(), CFG, "host-b") == "resume"
    ledger.complete_release(RID, "m", "host-b")
    assert ledger.release(RID)["status"] == "published"
    assert len(ledger.entries()) == 2  # charged once


def test_expired_lease_is_taken_over_and_the_old_holder_is_told(clocked):
    ledger, clock = clocked
    ledger.begin_release(RID, DS, charges(), CFG, "host-a", lease_seconds=0.5)
    clock.advance(0.8)
    # Expiry alone loses nothing: no one took it, so it is still a's (it may renew).
    assert ledger.check_lease(RID, "host-a") < 0
    assert ledger.begin_release(RID, DS, charges(), CFG, "host-b", lease_seconds=30) == "resume"
    for call in (lambda: ledger.check_lease(RID, "host-a"),
                 lambda: ledger.renew_lease(RID, "host-a", 30),
                 lambda: ledger.complete_release(RID, "m", "host-a"),
                 lambda: ledger.fail_release(RID, "a gives up", owner="host-a")):
        with pytest.raises(LeaseLost, match="host-b took it over"):
            call()
    assert ledger.release(RID)["status"] == "in_progress"
    assert ledger.release_lease(RID, "host-a") is False
    assert lease_of(ledger)[0] == "host-b"
    ledger.complete_release(RID, "m", "host-b")
    assert ledger.release(RID)["status"] == "published"
    assert ledger.release(RID)["attempts"] == 2 and len(ledger.entries()) == 2


def test_an_expired_lease_no_one_took_still_completes(clocked):
    ledger, clock = clocked
    ledger.begin_release(RID, DS, charges(), CFG, "host-a", lease_seconds=0.3)
    clock.advance(0.5)
    ledger.complete_release(RID, "m", "host-a")  # takeover, not expiry, is what loses it
    assert ledger.release(RID)["status"] == "published"
    assert ledger.begin_release(RID, DS, charges(), CFG, "host-b") == "published"


def test_lease_times_are_the_databases_not_this_hosts(ledger, monkeypatch):
    """A host whose clock runs an hour fast must not see a live lease as expired."""
    ledger.begin_release(RID, DS, charges(), CFG, "host-a", lease_seconds=60)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    with pytest.raises(ReleaseBusy):
        ledger.begin_release(RID, DS, charges(), CFG, "host-b")
    assert ledger.check_lease(RID, "host-a") == pytest.approx(60, abs=2)


def test_bad_lease_arguments(ledger):
    for bad in (0, -1, float("nan"), float("inf"), "x", 10 ** 9):
        with pytest.raises(LedgerError, match="lease_seconds"):
            ledger.begin_release(RID, DS, charges(), CFG, "host-a", lease_seconds=bad)
    assert ledger.release(RID) is None
    with pytest.raises(LedgerError, match="no release"):
        ledger.renew_lease(RID, "host-a", 5)


# --- the leased() context manager ---------------------------------------------------------------

def test_leased_renews_while_the_run_lives_and_releases_at_the_end(ledger, url):
    lease_s = 0.6
    ledger.begin_release(RID, DS, charges(), CFG, "host-a", lease_seconds=lease_s)
    other = Ledger(url)
    busy = 0
    try:
        with ledger.leased(RID, "host-a", lease_s) as lease:
            # Counted, not timed: the run lives until the holder has renewed 16 times (entry and
            # one per lease_s / 3: at least five lease lengths), however slow the machine, and
            # another host finds the release busy at every look meanwhile.
            while lease.renewals < 16 or busy < 10:
                assert lease._thread.is_alive(), "the renewals stopped while the run lived"
                with pytest.raises(ReleaseBusy):
                    other.begin_release(RID, DS, charges(), CFG, "host-b")
                busy += 1
                time.sleep(0.05)
            lease.check()
            ledger.complete_release(RID, "m", "host-a")
        assert lease.renewals >= 8, lease.renewals
        assert busy >= 10
        assert lease_of(ledger) == (None, None) and ledger.release(RID)["status"] == "published"
    finally:
        other.close()


def test_leased_refuses_a_lease_it_does_not_hold(ledger):
    ledger.begin_release(RID, DS, charges(), CFG, "host-a", lease_seconds=30)
    with pytest.raises(LeaseLost):
        with ledger.leased(RID, "host-b", 30):
            pytest.fail("the body must not run without the lease")
    assert lease_of(ledger)[0] == "host-a"


def test_leased_check_raises_once_a_renewal_found_the_lease_taken(ledger, url, monkeypatch):
    """The holder's renewals fail for a while (database unreachable, process frozen); the lease
    expires, another host takes over; the next renewal learns it and check() raises."""
    lease_s = 0.6
    ledger.begin_release(RID, DS, charges(), CFG, "host-a", lease_seconds=lease_s)
    real_renew = ledger.renew_lease
    outage = {"on": False, "tries_after": 0}

    def flaky(*args, **kw):
        if outage["on"]:
            raise LedgerError("the ledger at ... failed: server closed the connection")
        outage["tries_after"] += 1
        return real_renew(*args, **kw)

    monkeypatch.setattr(ledger, "renew_lease", flaky)
    other = Ledger(url)
    try:
        with ledger.leased(RID, "host-a", lease_s) as lease:
            lease.check()  # fine so far
            outage["on"] = True
            time.sleep(lease_s + 0.3)
            assert other.begin_release(RID, DS, charges(), CFG, "host-b",
                                       lease_seconds=30) == "resume"
            outage["on"] = False
            outage["tries_after"] = 0
            # Counted, not timed: the first background renewal after the outage meets host-b's
            # lease and ends the renewal thread; five tries that do not would be a bug.
            while lease._thread.is_alive() and outage["tries_after"] < 5:
                time.sleep(0.05)
            assert lease._lost is not None
            with pytest.raises(LeaseLost, match="host-b took it over"):
                lease.check()
            with pytest.raises(LeaseLost):
                ledger.complete_release(RID, "m", "host-a")
        assert lease_of(ledger)[0] == "host-b"  # leaving the block released nothing of b's
        other.complete_release(RID, "m", "host-b")
    finally:
        other.close()


# --- hosts as processes -------------------------------------------------------------------------

def _holder(url: str, owner: str, lease_s: float, hold_s: float, events, out) -> None:
    """A host: charge the release, hold its lease (renewing) for hold_s, then publish it.
    hold_s < 0: hold forever (until killed)."""
    led = Ledger(url)
    try:
        out.put(("begin", led.begin_release(RID, DS, charges(), CFG, owner,
                                            lease_seconds=lease_s)))
        with led.leased(RID, owner, lease_s) as lease:
            out.put(("holding", lease.expires))
            if hold_s < 0:
                while True:
                    time.sleep(1)
            time.sleep(hold_s)
            lease.check()
            led.complete_release(RID, "m", owner)
        out.put(("done", lease.renewals))
    except Exception as e:  # reported to the test
        out.put(("error", repr(e)))
    finally:
        led.close()


def _frozen_holder(url: str, owner: str, lease_s: float, go, out) -> None:
    """A host that takes the lease, then freezes (no renewals) until the test says go, and
    then tries to go on: check, complete, and enter leased()."""
    led = Ledger(url)
    try:
        out.put(("begin", led.begin_release(RID, DS, charges(), CFG, owner,
                                            lease_seconds=lease_s)))
        go.wait(60)
        results = []
        for name, call in (("check_lease", lambda: led.check_lease(RID, owner)),
                           ("complete_release", lambda: led.complete_release(RID, "m", owner)),
                           ("leased", lambda: led.leased(RID, owner, lease_s).__enter__())):
            try:
                call()
                results.append((name, "ok"))
            except LeaseLost as e:
                results.append((name, "LeaseLost", str(e)))
            except Exception as e:
                results.append((name, repr(e)))
        out.put(("results", results))
    finally:
        led.close()


def _spawn(target, *args):
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=target, args=args, daemon=True)
    p.start()
    return p


def _get(q, kind: str, timeout: float = 90):
    msg = q.get(timeout=timeout)
    assert msg[0] == kind, msg
    return msg[1]


def test_two_hosts_one_lease(ledger, url):
    """Two processes with different owners begin the same release: exactly one gets it."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    a = _spawn(_holder, url, "host-a", 30.0, -1, None, out)
    try:
        assert _get(out, "begin") == "new"
        _get(out, "holding")
        b = _spawn(_holder, url, "host-b", 30.0, 0, None, out)
        b.join(90)
        kind, text = out.get(timeout=10)
        assert kind == "error" and "ReleaseBusy" in text and "host-a" in text, (kind, text)
        assert len(ledger.entries()) == 2 and lease_of(ledger)[0] == "host-a"
    finally:
        a.kill()
        a.join(30)


def test_killed_holder_is_taken_over_only_after_its_lease_expires(ledger, url):
    lease_s = 2.0
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    holder = _spawn(_holder, url, "host-a", lease_s, -1, None, out)
    try:
        assert _get(out, "begin") == "new"
        _get(out, "holding")
        time.sleep(lease_s)  # let the renewal thread run a few times
    finally:
        holder.kill()  # SIGKILL: no release, no more renewals
        holder.join(30)
    _, expires = lease_of(ledger)  # the last renewal's expiry: now fixed
    # Renewals come every lease_s / 3, so at the kill at least 2/3 of a lease was left.
    assert expires - db_now(ledger) > 0.5
    busy = 0
    while True:
        try:
            status = ledger.begin_release(RID, DS, charges(), CFG, "host-b", lease_seconds=30)
            break
        except ReleaseBusy as e:
            assert e.holder == "host-a" and e.lease_expires == pytest.approx(expires)
            busy += 1
            time.sleep(0.05)
    taken_at = db_now(ledger)
    assert status == "resume" and busy >= 5
    owner, new_expires = lease_of(ledger)
    # the takeover happened after the dead holder's lease ended, by the database's clock ...
    assert owner == "host-b" and new_expires - 30 >= expires
    # ... and soon after (polling every 0.05 s)
    assert taken_at - expires < 1.5
    assert len(ledger.entries()) == 2  # still one charge
    ledger.complete_release(RID, "m", "host-b")


def test_renewals_keep_a_long_run_alive_across_processes(ledger, url):
    lease_s = 0.9
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    holder = _spawn(_holder, url, "host-a", lease_s, 5 * lease_s, None, out)
    try:
        assert _get(out, "begin") == "new"
        _get(out, "holding")
        busy, status = 0, None
        while holder.is_alive() and status != "published":
            try:
                status = ledger.begin_release(RID, DS, charges(), CFG, "host-b")
            except ReleaseBusy:
                busy += 1
            # "published": the holder finished meanwhile; anything else is a takeover
            assert status in (None, "published"), "host-b took over a renewed lease"
            time.sleep(0.1)
        renewals = _get(out, "done")
    finally:
        holder.join(30)
        if holder.is_alive():
            holder.kill()
    assert busy >= 10 and renewals >= 8, (busy, renewals)
    assert ledger.release(RID)["status"] == "published"
    assert ledger.begin_release(RID, DS, charges(), CFG, "host-b") == "published"


def test_a_holder_that_lost_its_lease_is_told_in_its_own_process(ledger, url):
    lease_s = 0.5
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    frozen = _spawn(_frozen_holder, url, "host-a", lease_s, go, out)
    try:
        assert _get(out, "begin") == "new"
        time.sleep(lease_s + 0.3)
        assert ledger.begin_release(RID, DS, charges(), CFG, "host-b",
                                    lease_seconds=30) == "resume"
        go.set()
        results = _get(out, "results")
    finally:
        frozen.join(30)
        if frozen.is_alive():
            frozen.kill()
    assert [r[:2] for r in results] == [("check_lease", "LeaseLost"),
                                        ("complete_release", "LeaseLost"),
                                        ("leased", "LeaseLost")], results
    assert all("host-b took it over" in r[2] for r in results)
    assert ledger.release(RID)["status"] == "in_progress" and lease_of(ledger)[0] == "host-b"
