"""Operator defects O1, O2, O6b and O6c of issue 31: what may be served, where staged copies
may go, the feed's indexes rebuilt from the release folders and the ledger, and a demo that
never overwrites an operator's folder. Each test reproduces the defect as it was found."""

from __future__ import annotations

import http.client
import importlib.util
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from dpatlas.core.config import load_config
from dpatlas.ledger import Charge
from dpatlas.publication import feed as FEED
from dpatlas.publication import serve as S
from dpatlas.publication.withdraw import withdraw_everywhere
from tasks.publish import show_in_feed

from tests.support.cli import invoke as cli  # in-process, a dead Prefect URL (NO_SERVER)
from tests.support.inputs import write_config
from tests.integration.test_feed import CFG, at, make_release, pub, publish  # noqa: F401
from tests.integration.test_operator_defects_cli import one_line
from tests.integration.test_operator_defects_ops import (  # noqa: F401  (fixtures)
    _flow_config, prefect_harness, small_state)
from tests.integration.test_preflight import charges, config, data  # noqa: F401  (fixture)
from tests.integration.test_purge import releases  # noqa: F401  (fixture)
from tests.integration.test_synthesize import published  # noqa: F401  (fixture)

RID = "r1"
PUBLISHED = b"PAR1 published tract values"
STAGED = b"PAR1 person-level rows"
KEY = b"secret commitment key"


def _demo_like(folder: Path) -> Path:
    """A folder laid out as `dpatlas demo` leaves it: the input under data/, the publish root
    releases/ (one release, its manifest listing its files), the internal folder beside it."""
    root = folder / "releases"
    (root / RID).mkdir(parents=True)
    (root / RID / "tracts.parquet").write_bytes(PUBLISHED)
    (root / RID / "index.html").write_text("<title>release</title>")
    (root / RID / "manifest.json").write_text(json.dumps(
        {"release_id": RID, "files": {"tracts.parquet": {"sha256": "0" * 64},
                                      "index.html": {"sha256": "0" * 64}}}))
    (root / ".dpatlas-root.json").write_text('{"mode": "public"}')
    (root / "feed.json").write_text('{"feed_version": 1, "latest": null, "releases": []}')
    (root / ".feed.lock").write_text("")
    internal = folder / "releases-internal" / RID
    (internal / "staged").mkdir(parents=True)
    (internal / "staged" / "input-37.parquet").write_bytes(STAGED)
    (internal / "input_commitment.key").write_bytes(KEY)
    (folder / "data" / "microdata" / "state=37").mkdir(parents=True)
    (folder / "data" / "microdata" / "state=37" / "part-0.parquet").write_bytes(STAGED)
    return root


@pytest.fixture
def no_serving(monkeypatch):
    """`dpatlas serve` returns at once instead of serving (were it not refused, a test would
    otherwise wait for ever); the list says whether it got as far as serving."""
    served = []
    monkeypatch.setattr(S.ThreadingServer, "serve_forever",
                        lambda self, *a, **k: served.append(self.server_address))
    return served


# --- O1: serve only a publish root, and in it only published files ----------------------------


def test_o1_serve_refuses_the_demo_folder_and_names_its_publish_root(tmp_path, no_serving):
    root = _demo_like(tmp_path)
    message = one_line(cli("serve", tmp_path, "--port", "0"))
    assert "not a publish root" in message and f"serve the publish root {root}" in message
    assert no_serving == []
    res = cli("serve", root, "--port", "0")                    # the root itself is served
    assert res.exit_code == 0, res.output
    assert len(no_serving) == 1


@pytest.mark.parametrize("copied", ["staged/input-37.parquet", "input_commitment.key",
                                    "microdata/state=37/part-0.parquet", "ledger.db"])
def test_o1_serve_refuses_a_publish_root_holding_internal_files(tmp_path, no_serving, copied):
    root = _demo_like(tmp_path)
    (root / copied).parent.mkdir(parents=True, exist_ok=True)
    (root / copied).write_bytes(STAGED)
    message = one_line(cli("serve", root, "--port", "0"))
    assert copied in message and "never published" in message
    assert no_serving == []


def test_o1_the_servers_names_are_the_feeds():
    from dpatlas.publication import publish_root as P

    assert (P.FEED_FILE, P.MANIFEST, P.LOCK_NAME, P.TMP_PREFIX) == (
        FEED.FEED_JSON, FEED.MANIFEST, FEED.LOCK_NAME, FEED.TMP_PREFIX)


def _get(server, path):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def test_o1_served_root_answers_only_published_files(tmp_path):
    """Files copied into a root after the server started are refused request by request: a
    staged partition, the key, a Parquet file no manifest lists; the published ones are not."""
    root = _demo_like(tmp_path)
    server, _ = S.serve_in_thread(root)
    try:
        shutil.copytree(tmp_path / "releases-internal" / RID / "staged", root / RID / "staged")
        shutil.copy(tmp_path / "releases-internal" / RID / "input_commitment.key", root / RID)
        (root / "input.parquet").write_bytes(STAGED)
        (root / RID / "draws.jsonl").write_text("{}")
        for path in (f"/{RID}/staged/input-37.parquet", f"/{RID}/input_commitment.key",
                     "/input.parquet", f"/{RID}/draws.jsonl", "/.feed.lock"):
            status, body = _get(server, path)
            assert status == 404 and STAGED not in body and KEY not in body, path
        assert _get(server, f"/{RID}/tracts.parquet") == (200, PUBLISHED)
        assert _get(server, "/feed.json")[0] == 200
        assert _get(server, f"/{RID}/")[0] == 200             # the release's page
    finally:
        server.shutdown()
        server.server_close()


# --- O2: staging_url resolved against the config, refused where rows must not go ---------------


def _staging_config(tmp: Path, data: Path, url: str) -> Path:
    return config(tmp, data, staging_url=url)


@pytest.mark.parametrize("url", ["stage", "./stage", "file://stage"])
def test_o2_a_relative_staging_url_is_the_config_folders(tmp_path, data, url, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cfg = load_config(_staging_config(tmp_path, data, url))
    expected = str((tmp_path / "stage").resolve())
    assert cfg.staging_url == (f"file://{expected}" if url.startswith("file://") else expected)
    assert load_config(_staging_config(tmp_path, data, "s3://bucket/p")).staging_url == \
        "s3://bucket/p"


def _refused_where(tmp: Path, data: Path) -> dict[str, tuple[str, str]]:
    """staging_url -> what the refusal must say."""
    root = tmp / "releases"
    return {f"file://{root}/stage": ("inside the publish root", str(root)),
            str(data / "microdata" / "stage"): ("inside the input", str(data / "microdata")),
            "s3://bucket/prefix": ("needs the package s3fs", "not installed"),
            "bogus://x/y": ("unknown scheme bogus://", "file://")}


@pytest.mark.parametrize("case", range(4))
def test_o2_config_check_and_release_refuse_a_bad_staging_url(tmp_path, data, case):
    """Found before a row is read: `config check` lists it, a release is refused before it
    writes or charges anything (s3:// and bogus:// went down the bug path after the ingest)."""
    if case == 2 and importlib.util.find_spec("s3fs") is not None:
        pytest.skip("s3fs is installed here")
    url, (said, named) = list(_refused_where(tmp_path, data).items())[case]
    cfg = _staging_config(tmp_path, data, url)
    res = cli("config", "check", cfg)
    assert res.exit_code == 2 and said in res.output and named in res.output, res.output
    message = one_line(cli("release", "-c", cfg, "--release-id", "r1"))
    assert said in message and "nothing was read or charged" in message
    assert not (tmp_path / "internal").exists() and charges(tmp_path) == 0
    assert not (data / "microdata" / "stage").exists()


def test_o2_purge_from_another_folder_removes_a_relative_staging_urls_copy(releases,
                                                                           monkeypatch):
    tmp, config_path = releases
    doc = yaml.safe_load(config_path.read_text())
    config_path.write_text(yaml.safe_dump({**doc, "staging_url": "stage"}))
    staged = tmp / "stage" / "pub" / "staged" / "input-17.parquet"
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"staged rows")
    (tmp / "elsewhere").mkdir()
    monkeypatch.chdir(tmp / "elsewhere")
    res = cli("purge", "--config", config_path, "--older-than", "0")
    assert res.exit_code == 0, res.output
    assert not staged.exists() and not (tmp / "elsewhere" / "stage").exists()


# --- O6c: the demo never takes an operator's folder -------------------------------------------


def test_o6c_demo_refuses_a_folder_holding_an_operators_config_and_data(tmp_path):
    out = tmp_path / "mine"
    partition = out / "data" / "microdata" / "state=37" / "part-0.parquet"
    partition.parent.mkdir(parents=True)
    partition.write_bytes(STAGED)
    (out / "config.yaml").write_text("# the operator's own release config\n")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    message = one_line(cli("demo", "--out", out))
    assert f"--out {out} already holds files the demo did not create" in message
    assert "config.yaml" in message and "nothing was written" in message
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_o6c_demo_takes_a_new_folder_or_its_own(tmp_path):
    from dpatlas.cli.demo import DEMO_MARKER, DemoFolderInUse, claim_demo_folder, write_demo_config

    for fresh in (tmp_path / "new", tmp_path / "empty"):
        (tmp_path / "empty").mkdir(exist_ok=True)
        claim_demo_folder(fresh)
        assert (fresh / DEMO_MARKER).is_file()
        claim_demo_folder(fresh)                               # a rerun of the demo
    earlier = tmp_path / "earlier"                             # a demo's, before the marker
    write_demo_config(earlier, "full-suite")
    (earlier / "releases").mkdir()
    claim_demo_folder(earlier)
    assert (earlier / DEMO_MARKER).is_file()
    edited = tmp_path / "edited"                               # its config changed by hand
    write_demo_config(edited)
    (edited / "config.yaml").write_text((edited / "config.yaml").read_text()
                                        .replace("1.0", "2.0"))
    with pytest.raises(DemoFolderInUse, match="config.yaml"):
        claim_demo_folder(edited)
    assert not (edited / DEMO_MARKER).exists()


# --- O6b: the feed's indexes rebuilt from the release folders and the ledger -------------------


INDEXES = (FEED.FEED_JSON, FEED.FEED_ATOM, "collection.json")


def _listing(root: Path) -> dict:
    """What every index says: feed.json's entries (status, reason, time), the Atom entries'
    ids, the STAC collection's item links."""
    feed = FEED.read_feed(root)
    atom = (root / FEED.FEED_ATOM).read_text()
    collection = json.loads((root / "collection.json").read_text())
    return {"feed": {r["release_id"]: (r["status"], r["withdrawn_reason"], r["withdrawn_at"])
                     for r in feed["releases"]},
            "latest": (feed["latest"], FEED.latest(root)),
            "atom": sorted(rid for rid in ("r0", "r1", "r2", "r3", "r4", "r5")
                           if f"urn:dpatlas:release:{rid}<" in atom),
            "stac": sorted(Path(link["href"]).stem for link in collection["links"]
                           if link["rel"] == "item")}


@pytest.fixture
def three_published(pub):
    """r0, r1, r2 published and in the feed, r1 then withdrawn; r3's folder is charged but
    unfinished in the ledger, r4's never charged: neither may enter a rebuilt feed."""
    led, root = pub
    publish(led, root, "r2", at(2))
    withdraw_everywhere(led, root, "r1", "wrong boundaries")
    led.begin_release("r3", "ds", [Charge("all", "s", "pure", 0.5, 0.0)], CFG, "host")
    make_release(root, "r3", at(3))
    make_release(root, "r4", at(4))
    return led, root, _listing(root)


def test_o6b_deleted_indexes_are_rebuilt_with_every_release_on_the_next_publish(
        three_published):
    led, root, before = three_published
    assert before["feed"]["r1"][0] == "withdrawn" and before["latest"] == ("r2", "r2")
    for name in INDEXES:
        (root / name).unlink()
    publish(led, root, "r5", at(5), in_feed=False)
    show_in_feed.fn(root, "r5", ledger_url=led.url)
    after = _listing(root)
    assert after["feed"] == {**before["feed"], "r5": ("published", None, None)}
    assert after["latest"] == ("r5", "r5")
    assert after["atom"] == after["stac"] == ["r0", "r1", "r2", "r5"]


def test_o6b_a_withdrawal_after_the_feed_was_deleted_keeps_every_release(three_published):
    led, root, before = three_published
    (root / FEED.FEED_JSON).unlink()
    withdraw_everywhere(led, root, "r2", "a second withdrawal")
    after = _listing(root)
    assert set(after["feed"]) == {"r0", "r1", "r2"} and after["feed"]["r1"] == before["feed"]["r1"]
    assert after["feed"]["r2"][:2] == ("withdrawn", "a second withdrawal")
    assert after["latest"] == ("r0", "r0") and after["atom"] == ["r0", "r1", "r2"]


def test_o6b_a_corrupt_feed_no_longer_stops_a_release_after_its_charge(
        prefect_harness, small_state, tmp_path):
    """feed.json corrupted between two releases: the second was charged and published, then
    refused with "feed.json is not valid JSON". Now it is listed, with the first."""
    import flows.release as R

    config = _flow_config(tmp_path, small_state)
    assert R.release(str(config), "a", 3).status == "published"
    (tmp_path / "releases" / FEED.FEED_JSON).write_text('{"releases": [')
    assert R.release(str(config), "b", 4).status == "published"
    feed = FEED.read_feed(tmp_path / "releases")
    assert [r["release_id"] for r in feed["releases"]] == ["b", "a"] and feed["latest"] == "b"
    assert R.release(str(config), "b", 4).status == "already_published"


def test_o6b_feed_rebuild_restores_a_feed_that_lists_too_little(three_published, tmp_path):
    """The state the defect left behind: a readable feed with the newest release only."""
    led, root, before = three_published
    for name in INDEXES:
        (root / name).unlink()
    publish(led, root, "r5", at(5))                            # as the old code did
    assert [r["release_id"] for r in FEED.read_feed(root)["releases"]] == ["r5"]
    cfg = write_config(tmp_path / "feed.yaml", {
        "input": {"path": "in"}, "boundaries": {"path": "b.parquet"},
        "selection": {"rule": "fixed"}, "publish": {"root": str(root)},
        "ledger": {"url": led.url, "dataset": "ds"}})
    res = cli("feed", "rebuild", "-c", cfg)
    assert res.exit_code == 0, res.output
    assert "4 release(s)" in res.output and "withdrawn: r1" in res.output
    assert "not listed: r3: the ledger holds it as in_progress" in res.output
    assert "not listed: r4: the ledger holds it as never charged" in res.output
    after = _listing(root)
    assert after["feed"] == {**before["feed"], "r5": ("published", None, None)}
    assert after["atom"] == after["stac"] == ["r0", "r1", "r2", "r5"]


def test_o6b_feed_rebuild_refuses_a_mistyped_ledger_and_keeps_the_feed(three_published,
                                                                       tmp_path):
    """Read as an empty ledger, a mistyped URL listed no release: the feed was emptied."""
    led, root, before = three_published
    cfg = write_config(tmp_path / "feed.yaml", {
        "input": {"path": "in"}, "boundaries": {"path": "b.parquet"},
        "selection": {"rule": "fixed"}, "publish": {"root": str(root)},
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledgr.db'}", "dataset": "ds"}})
    (tmp_path / "ledgr.db").unlink(missing_ok=True)  # write_config set a cap there
    res = cli("feed", "rebuild", "-c", cfg)
    assert res.exit_code == 2 and "no privacy-budget ledger" in res.output, res.output
    assert not (tmp_path / "ledgr.db").exists()  # nothing created
    assert _listing(root) == before  # every release still listed


def test_o6b_synthesize_rebuilds_a_corrupt_feed_and_lists_itself_beside_its_source(published):
    from dpatlas.core.hashing import sha256_file
    from dpatlas.ledger import Ledger
    from dpatlas.release.synthetic_data import synthesize_release
    from tests.integration.test_synthesize import EPS, SEED, SOURCE, _list_source_in_feed

    cfg_path, _ = published
    cfg = load_config(cfg_path)
    root = cfg.publish.root
    _list_source_in_feed(root)
    # the fixture completed the source with a stand-in sha; the flow records its manifest's
    with sqlite3.connect(cfg.ledger.url[len("sqlite:///"):]) as db:
        db.execute("update ledger_releases set manifest_sha256 = ? where release_id = ?",
                   (sha256_file(root / SOURCE / "manifest.json"), SOURCE))
    with Ledger(cfg.ledger.url) as ledger:                     # an earlier release beside it
        ledger.begin_release("r0", cfg.ledger.dataset, [Charge("all", "s", "pure", 0.5, 0.0)],
                             CFG, "host")
        make_release(root, "r0", "2026-11-24")
        ledger.complete_release("r0", sha256_file(root / "r0" / "manifest.json"), "host")
    FEED.update_feed(root, "r0")
    (root / FEED.FEED_JSON).write_text("{ corrupt")
    synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    feed = FEED.read_feed(root)
    assert [r["release_id"] for r in feed["releases"]] == [SOURCE, "r0"]
    assert [s["release_id"] for s in feed["synthetic"]] == [f"{SOURCE}-synthetic"]


def test_o6b_the_first_release_of_a_root_is_no_damage(tmp_path):
    root = tmp_path / "root"
    make_release(root, "first")
    assert FEED.feed_damage(root, adding="first") is None
    assert FEED.feed_damage(root) == f"{root / FEED.FEED_JSON} is missing"
    (root / FEED.FEED_JSON).write_text("[]")
    assert "is not a dpatlas feed" in FEED.feed_damage(root, adding="first")
