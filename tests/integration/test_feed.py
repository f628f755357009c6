"""The publication feed: verified entries, latest pointer, withdrawal, atomic visibility."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import queue
import shutil
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dpatlas.publication import feed as F
from dpatlas.publication import stac
from dpatlas.publication import json_feed
from dpatlas.core.ids import InvalidReason, InvalidReleaseId
from dpatlas.ledger import Charge, Ledger, LedgerError
from dpatlas.publication.withdraw import WithdrawIncomplete, withdraw_everywhere

ATOM = "{http://www.w3.org/2005/Atom}"
FILES = ("tracts.parquet", "tracts.geojson", "tracts.csv", "p25_map.png")
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_release(root: Path, release_id: str, published: str | None = None, size: int = 2000,
                 corrupt: str | None = None, staging: bool = True) -> Path:
    """A fake release folder written under a staging name and renamed into place.

    `corrupt` names a file whose manifest hash is made wrong."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".staging-{release_id}-{os.getpid()}" if staging else root / release_id
    tmp.mkdir()
    files = {}
    for i, name in enumerate(FILES):
        data = (f"{release_id}:{name}:".encode() + os.urandom(size + 97 * i))
        (tmp / name).write_bytes(data)
        files[name] = {"sha256": _sha(data), "bytes": len(data)}
    if corrupt:
        files[corrupt]["sha256"] = _sha(b"something else")
    manifest = {"release_id": release_id,
                "published": published or datetime.now(timezone.utc).isoformat(),
                "files": files}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if staging:
        os.replace(tmp, root / release_id)
    return root / release_id


def at(minutes: int) -> str:
    return (T0 + timedelta(minutes=minutes)).isoformat()


def snapshot(root: Path) -> dict:
    """Every byte of the feed, for 'unchanged' checks."""
    out = {}
    for name in (F.FEED_JSON, F.FEED_ATOM, F.LATEST_JSON):
        p = root / name
        out[name] = p.read_bytes() if p.exists() else None
    link = root / F.LATEST_LINK
    out["link"] = os.readlink(link) if link.is_symlink() else None
    out["temps"] = sorted(p.name for p in root.glob(F.TMP_PREFIX + "*"))
    # the STAC catalogue written with the feed: every byte of it, and its temporary files
    collection = root / stac.COLLECTION_FILE
    out["stac"] = collection.read_bytes() if collection.exists() else None
    out["stac_items"] = {p.name: p.read_bytes() for p in sorted((root / stac.ITEMS_DIR)
                                                                .glob("*"))}
    return out


# ----------------------------------------------------------------------------- single process


def test_empty_root(tmp_path):
    assert F.read_feed(tmp_path) == {"feed_version": 1, "updated": None, "latest": None,
                                     "releases": []}
    assert F.latest(tmp_path) is None


def test_update_feed_lists_release_and_moves_latest(tmp_path):
    make_release(tmp_path, "r1", at(0))
    entry = F.update_feed(tmp_path, "r1")
    manifest_bytes = (tmp_path / "r1" / "manifest.json").read_bytes()
    assert entry["release_id"] == "r1" and entry["status"] == "published"
    assert entry["published"] == at(0)
    assert entry["manifest_sha256"] == _sha(manifest_bytes)
    assert entry["withdrawn_reason"] is None and entry["withdrawn_at"] is None
    assert set(entry["files"]) == set(FILES)
    for name, meta in entry["files"].items():
        assert meta["path"] == f"r1/{name}"
        data = (tmp_path / meta["path"]).read_bytes()
        assert meta["sha256"] == _sha(data) and meta["bytes"] == len(data)

    feed = F.read_feed(tmp_path)
    assert feed["feed_version"] == 1 and feed["latest"] == "r1"
    datetime.fromisoformat(feed["updated"])
    assert feed["releases"] == [entry]
    assert F.latest(tmp_path) == "r1"
    assert json.loads((tmp_path / "latest.json").read_text()) == {
        "release_id": "r1", "manifest": "r1/manifest.json"}
    link = tmp_path / "latest"
    assert link.is_symlink() and os.readlink(link) == "r1"      # relative
    assert (link / "manifest.json").read_bytes() == manifest_bytes

    make_release(tmp_path, "r2", at(10))
    F.update_feed(tmp_path, "r2")
    feed = F.read_feed(tmp_path)
    assert [r["release_id"] for r in feed["releases"]] == ["r2", "r1"]     # newest first
    assert feed["latest"] == F.latest(tmp_path) == os.readlink(link) == "r2"
    assert not list(tmp_path.glob(F.TMP_PREFIX + "*"))


def test_refresh_is_idempotent(tmp_path):
    make_release(tmp_path, "r1", at(0))
    make_release(tmp_path, "r2", at(5))
    F.update_feed(tmp_path, "r1")
    F.update_feed(tmp_path, "r2")
    again = F.update_feed(tmp_path, "r1")
    feed = F.read_feed(tmp_path)
    assert [r["release_id"] for r in feed["releases"]] == ["r2", "r1"]
    assert feed["releases"][1] == again
    assert F.latest(tmp_path) == "r2"   # a refresh of an older release does not move latest back


def test_atom_parses(tmp_path):
    for i in range(3):
        make_release(tmp_path, f"r{i}", at(i))
        F.update_feed(tmp_path, f"r{i}")
    F.withdraw(tmp_path, "r1", "bad <geometry> & more")
    top = ET.parse(tmp_path / "feed.atom").getroot()
    assert top.tag == f"{ATOM}feed"
    assert top.find(f"{ATOM}id").text == "urn:dpatlas:feed"
    assert top.find(f"{ATOM}updated").text.endswith("Z")
    entries = top.findall(f"{ATOM}entry")
    assert [e.find(f"{ATOM}id").text for e in entries] == [
        "urn:dpatlas:release:r2", "urn:dpatlas:release:r1", "urn:dpatlas:release:r0"]
    for e, rid in zip(entries, ["r2", "r1", "r0"]):
        assert rid in e.find(f"{ATOM}title").text
        datetime.fromisoformat(e.find(f"{ATOM}updated").text.replace("Z", "+00:00"))
        links = e.findall(f"{ATOM}link")
        alt = [ln for ln in links if ln.get("rel") == "alternate"]
        assert [ln.get("href") for ln in alt] == [f"{rid}/manifest.json"]
        assert (tmp_path / alt[0].get("href")).is_file()
        assert {ln.get("href") for ln in links if ln.get("rel") == "enclosure"} == {
            f"{rid}/{n}" for n in FILES}
    summary = entries[1].find(f"{ATOM}summary").text
    assert "withdrawn" in summary and "bad <geometry> & more" in summary
    assert "(withdrawn)" in entries[1].find(f"{ATOM}title").text
    assert "published" in entries[0].find(f"{ATOM}summary").text


@pytest.mark.parametrize("damage", ["wrong_hash", "missing_file", "wrong_size", "wrong_id",
                                    "no_folder", "bad_manifest"])
def test_bad_release_is_refused_and_feed_unchanged(tmp_path, damage):
    make_release(tmp_path, "good", at(0))
    F.update_feed(tmp_path, "good")
    before = snapshot(tmp_path)

    if damage == "wrong_hash":
        make_release(tmp_path, "bad", at(5), corrupt="tracts.geojson")
    elif damage != "no_folder":
        make_release(tmp_path, "bad", at(5))
        folder = tmp_path / "bad"
        if damage == "missing_file":
            (folder / "p25_map.png").unlink()
        elif damage == "wrong_size":
            with open(folder / "tracts.csv", "ab") as fh:
                fh.write(b"x")
        elif damage == "wrong_id":
            m = json.loads((folder / "manifest.json").read_text())
            m["release_id"] = "other"
            (folder / "manifest.json").write_text(json.dumps(m))
        elif damage == "bad_manifest":
            (folder / "manifest.json").write_text('{"release_id": "bad", "files": ')
    with pytest.raises(F.FeedError):
        F.update_feed(tmp_path, "bad")
    assert snapshot(tmp_path) == before
    assert F.latest(tmp_path) == "good"
    assert [r["release_id"] for r in F.read_feed(tmp_path)["releases"]] == ["good"]


@pytest.mark.parametrize("rid", ["", ".staging-x", "../x", "a/b", "latest", "feed.json", " r"])
def test_unusable_ids_refused(tmp_path, rid):
    with pytest.raises(F.FeedError):
        F.update_feed(tmp_path, rid)


def test_withdraw_keeps_listing_and_moves_latest_back(tmp_path):
    for i in range(3):
        make_release(tmp_path, f"r{i}", at(i))
        F.update_feed(tmp_path, f"r{i}")
    assert F.latest(tmp_path) == "r2"

    entry = F.withdraw(tmp_path, "r2", "wrong boundaries")
    assert entry["status"] == "withdrawn" and entry["withdrawn_reason"] == "wrong boundaries"
    datetime.fromisoformat(entry["withdrawn_at"])
    feed = F.read_feed(tmp_path)
    assert [r["release_id"] for r in feed["releases"]] == ["r2", "r1", "r0"]
    assert [r["status"] for r in feed["releases"]] == ["withdrawn", "published", "published"]
    assert feed["latest"] == F.latest(tmp_path) == os.readlink(tmp_path / "latest") == "r1"
    assert (tmp_path / "r2").is_dir()                    # the folder itself is left alone

    # withdrawing a release that is not latest leaves latest alone
    F.withdraw(tmp_path, "r0", "duplicate")
    assert F.latest(tmp_path) == "r1"
    # refreshing a withdrawn release keeps it withdrawn
    F.update_feed(tmp_path, "r2")
    feed = F.read_feed(tmp_path)
    assert feed["releases"][0]["status"] == "withdrawn" and feed["latest"] == "r1"
    assert feed["releases"][0]["withdrawn_reason"] == "wrong boundaries"
    # the last published one: latest becomes null and the symlink goes away
    F.withdraw(tmp_path, "r1", "superseded")
    feed = F.read_feed(tmp_path)
    assert feed["latest"] is None and F.latest(tmp_path) is None
    assert json.loads((tmp_path / "latest.json").read_text()) == {"release_id": None,
                                                                  "manifest": None}
    assert not os.path.lexists(tmp_path / "latest")
    assert len(feed["releases"]) == 3
    # a new publication becomes latest again
    make_release(tmp_path, "r3", at(30))
    F.update_feed(tmp_path, "r3")
    assert F.latest(tmp_path) == os.readlink(tmp_path / "latest") == "r3"


def test_withdraw_errors(tmp_path):
    make_release(tmp_path, "r1", at(0))
    F.update_feed(tmp_path, "r1")
    before = snapshot(tmp_path)
    with pytest.raises(F.FeedError):
        F.withdraw(tmp_path, "nope", "reason")
    with pytest.raises(F.FeedError):
        F.withdraw(tmp_path, "r1", "  ")
    assert snapshot(tmp_path) == before


def test_unlisted_folders_are_not_scanned(tmp_path):
    make_release(tmp_path, "orphan", at(50))     # e.g. crash between rename and feed update
    make_release(tmp_path, "r1", at(0))
    F.update_feed(tmp_path, "r1")
    assert [r["release_id"] for r in F.read_feed(tmp_path)["releases"]] == ["r1"]
    F.update_feed(tmp_path, "orphan")            # recovery: added only when asked for by id
    assert [r["release_id"] for r in F.read_feed(tmp_path)["releases"]] == ["orphan", "r1"]
    assert F.latest(tmp_path) == "orphan"


def test_equal_published_times_newest_added_wins(tmp_path):
    for rid in ("a", "b", "c"):
        make_release(tmp_path, rid, at(0))
        F.update_feed(tmp_path, rid)
        assert F.latest(tmp_path) == rid
    assert [r["release_id"] for r in F.read_feed(tmp_path)["releases"]] == ["c", "b", "a"]


def test_failed_write_leaves_old_feed_and_no_temp(tmp_path, monkeypatch):
    make_release(tmp_path, "r1", at(0))
    F.update_feed(tmp_path, "r1")
    before = snapshot(tmp_path)
    make_release(tmp_path, "r2", at(5))

    def boom(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(F.os, "fsync", boom)
    with pytest.raises(OSError):
        F.update_feed(tmp_path, "r2")
    monkeypatch.undo()
    assert snapshot(tmp_path) == before
    F.update_feed(tmp_path, "r2")
    assert F.latest(tmp_path) == "r2"


def test_stale_temp_files_are_cleaned(tmp_path):
    make_release(tmp_path, "r1", at(0))
    (tmp_path / f"{F.TMP_PREFIX}feed.json-999-dead").write_text('{"half')
    # A writer of the root's web map killed between its temp write and the rename.
    (tmp_path / "map").mkdir()
    (tmp_path / ".index.html.tmp-999-dead").write_text("<html")
    (tmp_path / "map" / ".app.js.tmp-999-dead").write_text("half")
    F.update_feed(tmp_path, "r1")
    assert not list(tmp_path.glob(F.TMP_PREFIX + "*"))
    assert not list(tmp_path.rglob(".*.tmp-*"))
    assert (tmp_path / "index.html").is_file()  # the feed's page was written afresh


@pytest.mark.parametrize("rid", ["feed.atom", "LATEST", "a$b", "r\x1b[31m", "r1.json",
                                 "x" * 65, "tab\tid", "\u00e9t\u00e9"])
def test_ids_follow_the_one_rule(tmp_path, rid):
    with pytest.raises(F.FeedError) as err:
        F.update_feed(tmp_path, rid)
    assert isinstance(err.value, InvalidReleaseId)
    with pytest.raises(F.FeedError):
        F.withdraw(tmp_path, rid, "reason")
    assert snapshot(tmp_path)["link"] is None and not (tmp_path / F.FEED_JSON).exists()


def test_the_feeds_own_names_are_never_release_ids(tmp_path):
    for name in sorted(F.RESERVED) + [F.TMP_PREFIX + "feed.json-1-ab", ".staging-r1"]:
        with pytest.raises(F.InvalidFeedId):
            F.update_feed(tmp_path, name)


@pytest.mark.parametrize("reason", ["", "  ", "two\nlines", "bell\x07", "nul\x00",
                                    "esc\x1b[2J", None, "x" * 501])
def test_withdraw_validates_the_reason_first(tmp_path, reason):
    make_release(tmp_path, "r1", at(0))
    F.update_feed(tmp_path, "r1")
    before = snapshot(tmp_path)
    with pytest.raises(F.FeedError) as err:
        F.withdraw(tmp_path, "r1", reason)
    assert isinstance(err.value, InvalidReason)
    assert snapshot(tmp_path) == before


def test_second_withdraw_changes_nothing(tmp_path):
    for i in range(2):
        make_release(tmp_path, f"r{i}", at(i))
        F.update_feed(tmp_path, f"r{i}")
    first = F.withdraw(tmp_path, "r1", "wrong boundaries", withdrawn_at=at(60))
    assert first["changed"] and first["withdrawn_at"] == at(60)
    before = snapshot(tmp_path)
    again = F.withdraw(tmp_path, "r1", "a different reason")
    assert not again["changed"]
    assert (again["withdrawn_reason"], again["withdrawn_at"]) == ("wrong boundaries", at(60))
    assert snapshot(tmp_path) == before     # not a byte rewritten
    with pytest.raises(F.FeedError, match="ISO-8601"):
        F.withdraw(tmp_path, "r0", "x", withdrawn_at="yesterday")


def test_withdraw_can_list_an_unlisted_release_as_withdrawn(tmp_path):
    make_release(tmp_path, "r0", at(0))
    F.update_feed(tmp_path, "r0")
    make_release(tmp_path, "r1", at(10))     # a crash between completing it and its feed update
    with pytest.raises(F.FeedError, match="not in the feed"):
        F.withdraw(tmp_path, "r1", "bad")
    out = F.withdraw(tmp_path, "r1", "bad", list_unlisted=True)
    assert out["changed"] and out["status"] == "withdrawn" and set(out["files"]) == set(FILES)
    feed = F.read_feed(tmp_path)
    assert [(r["release_id"], r["status"]) for r in feed["releases"]] == [
        ("r1", "withdrawn"), ("r0", "published")]
    assert feed["latest"] == F.latest(tmp_path) == "r0"   # never latest, not even briefly
    make_release(tmp_path, "r2", at(20), corrupt="tracts.csv")
    before = snapshot(tmp_path)
    with pytest.raises(F.FeedError, match="does not match its manifest"):
        F.withdraw(tmp_path, "r2", "bad", list_unlisted=True)
    assert snapshot(tmp_path) == before


def test_atom_is_well_formed_whatever_the_feed_holds(tmp_path):
    """Entries written by an older version may hold control characters and odd ids."""
    make_release(tmp_path, "r1", at(0))
    F.update_feed(tmp_path, "r1")
    feed = F.read_feed(tmp_path)
    old = dict(feed["releases"][0], release_id="old\x1bid\x00", status="withdrawn",
               withdrawn_at=at(5), withdrawn_reason="bad\x07data\x0b\ufffe & <x> \x85 \ud800")
    old["files"] = {"a\x01.csv": {"path": "old/a\x01.csv", "bytes": 3, "sha256": "0"}}
    feed["releases"].append(old)
    raw = F.render_atom(feed)
    top = ET.fromstring(raw)                     # well-formed
    entries = top.findall(f"{ATOM}entry")
    summary = entries[1].find(f"{ATOM}summary").text
    assert "bad\\x07data\\x0b\\ufffe & <x> \\x85 \\ud800" in summary
    assert entries[1].find(f"{ATOM}id").text == "urn:dpatlas:release:old\\x1bid\\x00"
    enclosure = [e for e in entries[1].findall(f"{ATOM}link") if e.get("rel") == "enclosure"]
    assert enclosure[0].get("title") == "a\\x01.csv"
    # and through the real writer: a feed.json holding such text still yields a valid feed.atom
    (tmp_path / F.FEED_JSON).write_text(json.dumps(feed))
    make_release(tmp_path, "r2", at(10))
    F.update_feed(tmp_path, "r2")
    ET.parse(tmp_path / F.FEED_ATOM)


# ------------------------------------------------------------------- withdraw from both places

CFG = "c" * 64


@pytest.fixture
def pub(tmp_path):
    """A publish root with r0, r1 published (r1 latest) and a ledger that agrees."""
    root = tmp_path / "pub"
    led = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    led.set_cap("ds", 10.0, 0.0, reason="test cap")
    for i in range(2):
        publish(led, root, f"r{i}", at(i))
    yield led, root
    led.close()


def publish(led, root, rid, published, in_feed=True) -> None:
    led.begin_release(rid, "ds", [Charge("all", "s", "pure", 0.5, 0.0)], CFG, "host")
    folder = make_release(root, rid, published)
    led.complete_release(rid, _sha((folder / "manifest.json").read_bytes()), "host")
    if in_feed:
        F.update_feed(root, rid)


def both(led, root, rid) -> tuple:
    row = led.release(rid)
    entry = F.listed(root, rid)
    return (row["status"], row["reason"], row["withdrawn_at"],
            entry and (entry["status"], entry["withdrawn_reason"], entry["withdrawn_at"]))


def test_withdraw_everywhere_then_again(pub):
    led, root = pub
    out = withdraw_everywhere(led, root, "r1", "  wrong boundaries ")
    assert out["ledger_changed"] and out["feed_changed"] and out["latest"] == "r0"
    assert out["reason"] == "wrong boundaries" and "withdrew release r1" in out["message"]
    status, reason, when, feed_side = both(led, root, "r1")
    assert (status, reason) == ("withdrawn", "wrong boundaries")
    assert feed_side == ("withdrawn", "wrong boundaries", when)   # one reason, one time
    assert F.latest(root) == "r0" and led.spent("ds")["epsilon"] == pytest.approx(1.0)

    before_feed, before_ledger = snapshot(root), both(led, root, "r1")
    again = withdraw_everywhere(led, root, "r1", "another reason")
    assert not again["ledger_changed"] and not again["feed_changed"]
    assert "nothing changed" in again["message"] and again["reason"] == "wrong boundaries"
    assert snapshot(root) == before_feed and both(led, root, "r1") == before_ledger


@pytest.mark.parametrize("case", ["blank reason", "newline reason", "bad id", "unknown id",
                                  "not published", "no root", "damaged unlisted folder"])
def test_withdraw_everywhere_checks_everything_before_writing(pub, tmp_path, case):
    led, root = pub
    rid, reason, where = "r1", "fine reason", root
    if case == "blank reason":
        reason = "   "
    elif case == "newline reason":
        reason = "ok\nforged line"
    elif case == "bad id":
        rid = "latest"
    elif case == "unknown id":
        rid = "r9"
    elif case == "not published":
        rid = "r5"
        led.begin_release(rid, "ds", [Charge("all", "s", "pure", 0.5, 0.0)], CFG, "host")
        make_release(root, rid, at(30))
    elif case == "no root":
        where = tmp_path / "elsewhere"
    elif case == "damaged unlisted folder":
        rid = "r3"
        publish(led, root, rid, at(40), in_feed=False)
        (root / rid / "tracts.csv").write_bytes(b"changed")
    before_feed = snapshot(root)
    before_rows = {r: led.release(r) for r in ("r0", "r1", "r3", "r5") if led.release(r)}
    with pytest.raises((LedgerError, F.FeedError, InvalidReason, InvalidReleaseId)):
        withdraw_everywhere(led, where, rid, reason)
    assert snapshot(root) == before_feed
    assert {r: led.release(r) for r in before_rows} == before_rows


def test_withdraw_everywhere_completes_after_a_crash_between_the_writes(pub, monkeypatch):
    led, root = pub
    real_write_feed = F._write_feed
    calls = {"n": 0}

    def fail_once(*args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(28, "No space left on device")
        return real_write_feed(*args)

    monkeypatch.setattr(F, "_write_feed", fail_once)
    with pytest.raises(WithdrawIncomplete, match="run the same withdraw again") as err:
        withdraw_everywhere(led, root, "r1", "first reason")
    assert "\n" not in str(err.value)
    assert led.release("r1")["status"] == "withdrawn"          # the ledger was written ...
    assert F.listed(root, "r1")["status"] == "published"        # ... the feed was not
    # the operator reruns it, even with other words: the first reason wins on both sides
    out = withdraw_everywhere(led, root, "r1", "second wording")
    assert not out["ledger_changed"] and out["feed_changed"]
    status, reason, when, feed_side = both(led, root, "r1")
    assert (status, reason) == ("withdrawn", "first reason")
    assert feed_side == ("withdrawn", "first reason", when)
    feed = F.read_feed(root)
    assert feed["latest"] == F.latest(root) == os.readlink(root / "latest") == "r0"
    ET.parse(root / F.FEED_ATOM)


def test_withdraw_everywhere_adopts_a_feed_side_withdrawal(pub):
    """Withdrawn in the feed only (by hand, or by an older version): the ledger follows it."""
    led, root = pub
    F.withdraw(root, "r0", "found by the feed team", withdrawn_at=at(99))
    out = withdraw_everywhere(led, root, "r0", "operator's words")
    assert out["ledger_changed"] and not out["feed_changed"]
    assert both(led, root, "r0")[1] == "found by the feed team"
    assert both(led, root, "r0")[3][1] == "found by the feed team"


def test_withdraw_everywhere_when_the_feed_never_listed_it(pub):
    led, root = pub
    publish(led, root, "r2", at(20), in_feed=False)            # folder there, feed not updated
    out = withdraw_everywhere(led, root, "r2", "bad")
    assert out["feed_changed"] and F.listed(root, "r2")["status"] == "withdrawn"
    assert F.latest(root) == "r1"
    publish(led, root, "r3", at(30), in_feed=False)
    shutil.rmtree(root / "r3")                                  # no folder at all
    out = withdraw_everywhere(led, root, "r3", "bad")
    assert out["ledger_changed"] and out["feed_changed"] is None
    assert "does not list it" in out["message"] and F.listed(root, "r3") is None


# ------------------------------------------------------------------------------ multi process

N_PUBLISH = 50
# No deadline on the work: each process does a counted amount of it, and the test waits for the
# processes' own exit (a hung one is caught by pytest-timeout, not by a clock that a busy machine
# would trip).


def _publisher(root: str, prefix: str, n: int, pause: float, start, done) -> None:
    root_p = Path(root)
    start.wait()
    try:
        for i in range(n):
            rid = f"{prefix}{i:03d}"
            make_release(root_p, rid, size=20_000)     # staging folder + os.replace
            F.update_feed(root_p, rid)
            if pause:
                time.sleep(pause)
    finally:
        done.set()


def _check_release(root: Path, rid: str, entry: dict | None) -> list[str]:
    """The folder is present, its manifest.json parses, every file has the listed sha256."""
    folder = root / rid
    try:
        raw = (folder / "manifest.json").read_bytes()
    except OSError as e:
        return [f"{rid}: manifest unreadable: {e!r}"]
    try:
        manifest = json.loads(raw)
    except json.JSONDecodeError as e:
        return [f"{rid}: manifest is not complete JSON: {e}"]
    bad = []
    if entry is not None and entry["manifest_sha256"] != _sha(raw):
        bad.append(f"{rid}: manifest sha256 differs from the feed")
    for name, meta in manifest["files"].items():
        try:
            data = (folder / name).read_bytes()
        except OSError as e:
            bad.append(f"{rid}/{name}: unreadable: {e!r}")
            continue
        if _sha(data) != meta["sha256"]:
            bad.append(f"{rid}/{name}: wrong sha256")
        if entry is not None and entry["files"][name]["sha256"] != meta["sha256"]:
            bad.append(f"{rid}/{name}: feed and manifest disagree")
    return bad


def _poller(root: str, ready, done, out) -> None:
    root_p = Path(root)
    polls = 0
    violations: list[str] = []
    seen_latest: set = set()
    seen_feed = False
    max_listed = 0
    ready.set()
    final = False
    while True:
        if done.is_set():
            final = True         # one more complete poll after the last publication
        polls += 1
        bad: list[str] = []
        # latest.json first, then feed.json: the pointer is only ever moved to a release that
        # an earlier feed.json already listed, and releases are never removed from the feed.
        try:
            pointer = json.loads((root_p / "latest.json").read_bytes())
        except FileNotFoundError:
            pointer = None
        except json.JSONDecodeError as e:
            bad.append(f"latest.json is not complete JSON: {e}")
            pointer = None
        try:
            feed_raw = (root_p / "feed.json").read_bytes()
        except FileNotFoundError:
            feed_raw = None
            if seen_feed:
                bad.append("feed.json disappeared")
        feed = None
        if feed_raw is not None:
            seen_feed = True
            try:
                feed = json_feed.entries(json.loads(feed_raw), F.FEED_VERSION)
            except json.JSONDecodeError as e:
                bad.append(f"feed.json is not complete JSON: {e}")
        try:
            link = os.readlink(root_p / "latest")
        except FileNotFoundError:
            link = None

        entries = {}
        if feed is not None:
            entries = {r["release_id"]: r for r in feed["releases"]}
            max_listed = max(max_listed, len(entries))
            for rid, entry in entries.items():
                bad += _check_release(root_p, rid, entry)
            if feed["latest"] is not None and feed["latest"] not in entries:
                bad.append(f"feed.json latest {feed['latest']} not listed")
        if pointer is not None and pointer["release_id"] is not None:
            rid = pointer["release_id"]
            seen_latest.add(rid)
            if pointer["manifest"] != f"{rid}/manifest.json":
                bad.append(f"latest.json manifest path {pointer['manifest']}")
            if feed is not None and rid not in entries:
                bad.append(f"latest.json names {rid}, not listed in a later feed.json")
            bad += _check_release(root_p, rid, None)
        if link is not None:
            bad += _check_release(root_p, link, None)
        violations += [f"poll {polls}: {b}" for b in bad]
        if final:
            break
    out.put({"polls": polls, "violations": violations[:50], "n_violations": len(violations),
             "distinct_latest": len(seen_latest), "max_listed": max_listed})


def _ctx():
    # spawn, not fork: a forked child inherits whatever the test process holds (Prefect's
    # service threads after a flow ran in it, JAX's thread pool) and died with exit code 1
    # when a release test had run first in the same worker.
    return multiprocessing.get_context("spawn")


def _result_of(reader, out) -> dict:
    """The reader's result, waiting as long as the reader lives (no deadline: a reader that died
    without a result fails the test at once, a hung one is stopped by pytest-timeout)."""
    while True:
        try:
            return out.get(timeout=1)
        except queue.Empty:
            if not reader.is_alive() and out.empty():
                raise AssertionError(f"the reader exited ({reader.exitcode}) without a result")


def test_polling_reader_never_sees_partial_state(tmp_path, record_property):
    ctx = _ctx()
    root = tmp_path / "pub"
    root.mkdir()
    ready, done, out = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_poller, args=(str(root), ready, done, out))
    writer = ctx.Process(target=_publisher,
                         args=(str(root), "rel-", N_PUBLISH, 0.01, ready, done))
    t0 = time.monotonic()
    reader.start()
    writer.start()
    try:
        result = _result_of(reader, out)
    finally:
        writer.join()
        reader.join()
    elapsed = time.monotonic() - t0   # reported, never asserted
    assert writer.exitcode == 0 and reader.exitcode == 0

    feed = F.read_feed(root)
    published = len(feed["releases"])
    msg = (f"polling reader: {result['polls']} polls in {elapsed:.1f} s while {published} "
           f"releases were published; {result['n_violations']} violations; "
           f"{result['distinct_latest']} distinct latest values seen")
    print(msg)
    record_property("feed_polls", result["polls"])
    record_property("feed_publications", published)
    assert result["n_violations"] == 0, result["violations"]
    assert published == N_PUBLISH
    assert feed["latest"] == F.latest(root) == f"rel-{N_PUBLISH - 1:03d}"
    assert result["polls"] >= 20
    assert result["distinct_latest"] >= 2          # the reader really ran during publication
    assert not list(root.glob(F.TMP_PREFIX + "*"))


def test_concurrent_updaters_lose_nothing(tmp_path):
    ctx = _ctx()
    root = tmp_path / "pub"
    root.mkdir()
    start = ctx.Event()
    dones = [ctx.Event() for _ in range(3)]
    procs = [ctx.Process(target=_publisher, args=(str(root), f"w{k}-", 12, 0.0, start, dones[k]))
             for k in range(3)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs)
    feed = F.read_feed(root)
    ids = {r["release_id"] for r in feed["releases"]}
    assert ids == {f"w{k}-{i:03d}" for k in range(3) for i in range(12)}
    assert len(feed["releases"]) == 36
    assert feed["latest"] == F.latest(root) == os.readlink(root / "latest")
    assert feed["latest"] == feed["releases"][0]["release_id"]
    ET.parse(root / "feed.atom")
    assert len(ET.parse(root / "feed.atom").getroot().findall(f"{ATOM}entry")) == 36
    assert not list(root.glob(F.TMP_PREFIX + "*"))


# ---------------------------------------------------------------- the STAC catalogue beside it


def item(root: Path, rid: str) -> dict:
    return json.loads((root / stac.ITEMS_DIR / f"{rid}.json").read_text())


def test_stac_catalogue_follows_the_feed(tmp_path):
    for i in range(3):
        make_release(tmp_path, f"r{i}", at(i))
        F.update_feed(tmp_path, f"r{i}")
    assert stac.validate_catalog(tmp_path) == 3
    entry = F.listed(tmp_path, "r1")
    assets = item(tmp_path, "r1")["assets"]
    assert set(assets) == set(FILES) | {"manifest.json"}
    for name in FILES:
        assert assets[name]["file:checksum"] == "1220" + entry["files"][name]["sha256"]
        assert assets[name]["file:size"] == entry["files"][name]["bytes"]
    assert item(tmp_path, "r1")["geometry"] is None  # these manifests state no extent
    F.withdraw(tmp_path, "r1", "wrong boundaries", withdrawn_at=at(60))
    props = item(tmp_path, "r1")["properties"]
    assert (props["dpatlas:status"], props["dpatlas:withdrawn_reason"],
            props["dpatlas:withdrawn_at"]) == ("withdrawn", "wrong boundaries", at(60))
    assert item(tmp_path, "r2")["properties"]["dpatlas:status"] == "published"
    assert stac.validate_catalog(tmp_path) == 3


def test_unchanged_catalogue_documents_are_not_rewritten(tmp_path):
    make_release(tmp_path, "r0", at(0))
    F.update_feed(tmp_path, "r0")
    path = tmp_path / stac.ITEMS_DIR / "r0.json"
    before = path.stat()
    make_release(tmp_path, "r1", at(1))
    F.update_feed(tmp_path, "r1")  # the collection changes; r0's item does not
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_rerun_withdrawal_completes_the_catalogue(tmp_path):
    make_release(tmp_path, "r0", at(0))
    F.update_feed(tmp_path, "r0")
    F.withdraw(tmp_path, "r0", "wrong boundaries")
    withdrawn = item(tmp_path, "r0")
    (tmp_path / stac.ITEMS_DIR / "r0.json").unlink()  # as if a crash lost it
    assert not F.withdraw(tmp_path, "r0", "wrong boundaries")["changed"]
    assert item(tmp_path, "r0") == withdrawn


def test_the_catalogue_names_are_reserved(tmp_path):
    for name in (stac.COLLECTION_FILE, stac.ITEMS_DIR):
        assert name in F.RESERVED
        with pytest.raises(InvalidReleaseId):
            F.update_feed(tmp_path, name)


def test_a_day_only_release_after_a_timed_one_of_the_same_day_is_latest(tmp_path):
    """Manifests now give the UTC day only; an older manifest of the same day gave the second.
    The newer, day-only release must still become latest (it sorted before midnight's
    second-precise neighbour when times were compared)."""
    make_release(tmp_path, "old", "2026-11-25T21:02:43+00:00")
    F.update_feed(tmp_path, "old")
    make_release(tmp_path, "new", "2026-11-25")
    F.update_feed(tmp_path, "new")
    assert F.latest(tmp_path) == "new"
    assert [r["release_id"] for r in F.read_feed(tmp_path)["releases"]] == ["new", "old"]
    make_release(tmp_path, "next-day", "2026-11-26")
    F.update_feed(tmp_path, "next-day")
    make_release(tmp_path, "back-dated", "2026-11-24")  # an earlier day stays below
    F.update_feed(tmp_path, "back-dated")
    assert F.latest(tmp_path) == "next-day"
