"""Issue 21 item 7: ``dpatlas purge`` removes the person-level internal files (staged input,
quarantined rows) of published or withdrawn releases older than the retention, and nothing a
release that is still unfinished needs to resume; a rerun of a purged release is a no-op."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dpatlas.ledger import Charge, Ledger
from dpatlas.release.retention import plan_purge, purge
from tests.support.cli import invoke
from tests.support.inputs import write_config
from tests.integration.test_operator_defects_ops import (  # noqa: F401  (fixtures)
    _flow_config, prefect_harness, small_state)

DS = "il"
OWNER = "host:/internal"
PERSON_LEVEL = ("staged/input-17.parquet", "quarantine/input-17.parquet")
KEPT_FILES = ("draws.jsonl", "results/chunk-0000.parquet", "validation.json",
              "input_commitment.key")


def _charge() -> list[Charge]:
    return [Charge(cell="all", step="primary: p25 and p75", guarantee_type="pure", epsilon=0.1,
                   delta=0.0, rho=None)]


def _config(tmp: Path, **publish) -> Path:
    cfg = {"input": {"path": str(tmp / "microdata")},
           "boundaries": {"path": str(tmp / "tracts.parquet")},
           "selection": {"rule": "fixed"},
           "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal"),
                       **publish},
           "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": DS}}
    return write_config(tmp / "config.yaml", cfg)


def _internal_folder(tmp: Path, rid: str) -> Path:
    folder = tmp / "internal" / rid
    for name in (*PERSON_LEVEL, *KEPT_FILES):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"confidential" if name in PERSON_LEVEL else b"kept")
    return folder


def _release(ledger: Ledger, rid: str, status: str) -> None:
    ledger.begin_release(rid, DS, _charge(), "c" * 64, OWNER)
    if status in ("published", "withdrawn"):
        ledger.complete_release(rid, "m" * 64, OWNER)
    if status == "withdrawn":
        ledger.withdraw_release(rid, "a test withdrawal")
    if status == "failed":
        ledger.fail_release(rid, "a test failure", OWNER)


@pytest.fixture
def releases(tmp_path):
    """One internal folder per ledger status, plus one the ledger never charged."""
    config = _config(tmp_path)
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    for rid, status in (("pub", "published"), ("wd", "withdrawn"), ("run", "in_progress"),
                        ("bad", "failed")):
        _release(ledger, rid, status)
    ledger.release_lease("run", OWNER)
    ledger.close()
    for rid in ("pub", "wd", "run", "bad", "uncharged"):
        _internal_folder(tmp_path, rid)
    (tmp_path / "internal" / "logs").mkdir()  # not a release folder: never touched
    return tmp_path, config


def _person_level_left(tmp: Path) -> dict[str, bool]:
    return {rid: any((tmp / "internal" / rid / name).exists() for name in PERSON_LEVEL)
            for rid in ("pub", "wd", "run", "bad", "uncharged")}


def test_purge_removes_only_final_releases_past_the_retention(releases):
    tmp, _ = releases
    ledger = Ledger(f"sqlite:///{tmp / 'ledger.db'}", create=False)
    # Just published: younger than 30 days, nothing removed.
    young = plan_purge(tmp / "internal", ledger, 30)
    assert {i.release_id for i in young} == {"pub", "wd", "run", "bad", "uncharged"}
    assert not any(i.removed for i in young)
    assert "less than 30 day(s) ago" in {i.release_id: i.kept_because for i in young}["pub"]

    later = datetime.now(timezone.utc) + timedelta(days=31)
    items = {i.release_id: i for i in plan_purge(tmp / "internal", ledger, 30, now=later)}
    assert {rid for rid, i in items.items() if i.removed} == {"pub", "wd"}
    assert items["pub"].age_days == pytest.approx(31, abs=0.01)
    assert items["pub"].size == 2 * len(b"confidential") and len(items["pub"].files) == 2
    assert items["run"].kept_because.startswith("in_progress: unfinished")
    assert items["bad"].kept_because.startswith("failed: unfinished")
    assert items["uncharged"].status == "not in the ledger"

    purge(list(items.values()))
    assert _person_level_left(tmp) == {"pub": False, "wd": False, "run": True, "bad": True,
                                       "uncharged": True}
    for rid in ("pub", "wd"):  # the rest of a purged release's folder stays
        assert all((tmp / "internal" / rid / name).is_file() for name in KEPT_FILES)
    # Idempotent: the purged releases hold nothing person-level any more.
    assert {i.release_id for i in plan_purge(tmp / "internal", ledger, 30, now=later)} == {
        "run", "bad", "uncharged"}



def test_purge_removes_the_staged_copy_under_the_staging_url_too(releases):
    """A release run with Dask workers elsewhere copied its staged input to
    ``<staging_url>/<id>/staged/``: person-level rows the internal folder's purge alone
    would leave behind. Removed with it; the draws beside it and unfinished releases kept."""
    tmp, _ = releases
    shared = tmp / "shared"
    for rid in ("pub", "run"):
        for name in ("staged/input-17.parquet", "results/input-17-0.parquet"):
            (shared / rid / name).parent.mkdir(parents=True, exist_ok=True)
            (shared / rid / name).write_bytes(b"staged rows" if "staged" in name else b"draw")
    # a final release whose internal folder was purged already still has its staged copy
    purge([i for i in plan_purge(tmp / "internal", Ledger(f"sqlite:///{tmp / 'ledger.db'}",
                                                          create=False), 0) if i.removed])
    ledger = Ledger(f"sqlite:///{tmp / 'ledger.db'}", create=False)
    later = datetime.now(timezone.utc) + timedelta(days=31)
    url = shared.as_uri()
    items = {i.release_id: i for i in plan_purge(tmp / "internal", ledger, 30, now=later,
                                                 staging_url=url)}
    assert items["pub"].removed and items["pub"].staged_copy == f"{url}/pub/staged"
    assert items["pub"].files == (str(shared / "pub" / "staged" / "input-17.parquet"),)
    assert items["pub"].size == len(b"staged rows")
    assert not items["run"].removed
    purge(list(items.values()))
    assert not (shared / "pub" / "staged").exists()
    assert (shared / "pub" / "results" / "input-17-0.parquet").is_file()
    assert (shared / "run" / "staged" / "input-17.parquet").is_file()
    assert "pub" not in {i.release_id for i in plan_purge(tmp / "internal", ledger, 30,
                                                          now=later, staging_url=url)}

def test_the_command_dry_run_lists_and_removes_nothing(releases):
    tmp, config = releases
    res = invoke("purge", "--config", config, "--older-than", "0", "--dry-run")
    assert res.exit_code == 0, res.output
    assert all(_person_level_left(tmp).values())
    lines = res.output.splitlines()
    assert lines[0].split("\t") == ["release", "status", "age (days)", "files", "bytes", "action"]
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:-1]}
    assert rows["pub"][1:2] == ["published"] and rows["pub"][-1] == "would remove"
    assert rows["run"][-1].startswith("kept: in_progress: unfinished")
    assert rows["bad"][-1].startswith("kept: failed: unfinished")
    assert lines[-1].startswith("would remove 4 file(s), 48 bytes, of 2 release(s)")


def test_the_command_purges_then_finds_nothing(releases):
    tmp, config = releases
    res = invoke("purge", "--config", config, "--older-than", "0")
    assert res.exit_code == 0, res.output
    assert "removed 4 file(s), 48 bytes, of 2 release(s) published at least 0 day(s) ago; " \
           "kept 3 release(s)" in res.output
    assert _person_level_left(tmp) == {"pub": False, "wd": False, "run": True, "bad": True,
                                       "uncharged": True}
    again = invoke("purge", "--config", config, "--older-than", "0")
    assert again.exit_code == 0, again.output
    assert "removed 0 file(s), 0 bytes, of 0 release(s)" in again.output


def test_the_config_retention_is_the_default(releases):
    tmp, config = releases
    res = invoke("purge", "--config", config)  # 30 days: everything is younger
    assert res.exit_code == 0, res.output
    assert "removed 0 file(s)" in res.output and all(_person_level_left(tmp).values())


def test_a_null_retention_keeps_everything(tmp_path):
    config = _config(tmp_path, internal_retention_days=None)
    folder = _internal_folder(tmp_path, "pub")
    res = invoke("purge", "--config", config)
    assert res.exit_code == 0, res.output
    assert "kept forever" in res.output and (folder / PERSON_LEVEL[0]).is_file()


@pytest.mark.parametrize("args", [("--older-than", "-1"), ("--older-than", "ten")])
def test_bad_days_exit_2(releases, args):
    tmp, config = releases
    res = invoke("purge", "--config", config, *args)
    assert res.exit_code == 2, res.output
    assert all(_person_level_left(tmp).values())


def test_a_negative_retention_in_the_config_is_refused(tmp_path):
    import yaml

    config = _config(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["publish"]["internal_retention_days"] = -1
    config.write_text(yaml.safe_dump(data))
    res = invoke("purge", "--config", config)
    assert res.exit_code == 2
    assert "internal_retention_days" in res.output


def test_a_release_is_private_then_purged_and_its_rerun_is_a_no_op(prefect_harness, small_state,
                                                                   tmp_path):
    import flows.release as R

    config = _flow_config(tmp_path, small_state)
    old = os.umask(0)  # the widest umask: the internal folder must still be private
    try:
        assert R.release(str(config), "r1", 3).status == "published"
    finally:
        os.umask(old)
    internal, published = tmp_path / "internal" / "r1", tmp_path / "releases" / "r1"
    assert (internal / "staged").is_dir() and (internal / "data_docs").is_dir()
    for path in [internal, *internal.rglob("*")]:
        want = 0o700 if path.is_dir() else 0o600
        assert stat.S_IMODE(path.lstat().st_mode) == want, (path, oct(path.lstat().st_mode))
    assert stat.S_IMODE((published / "tracts.csv").stat().st_mode) == 0o666  # public

    res = invoke("purge", "--config", config, "--older-than", "0")
    assert res.exit_code == 0, res.output
    assert not (internal / "staged").exists() and (internal / "draws.jsonl").is_file()
    before = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")
                    if "ledger.db" not in p.name)
    assert R.release(str(config), "r1", 3).status == "already_published"
    after = sorted((p.relative_to(tmp_path), p.stat().st_mtime_ns) for p in tmp_path.rglob("*")
                   if "ledger.db" not in p.name)
    assert after == before
