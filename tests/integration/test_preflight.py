"""Operator errors found in review: each gives one line and exit 2, with nothing charged or
published (issue 7's repro commands), and the checks that run before any charge."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

from tests.support.cli import ENV, OWN_SERVER, refusal_block
from tests.support.cli import run_in_process as dpatlas  # refusals: exit codes and messages
from tests.support.inputs import write_config
from tests.support.paths import CRASH_AT


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=11, params=StateParams(n_tracts=30, counties=2))
    return out


def config(tmp: Path, data: Path, **over) -> Path:
    base = {"input": {"path": str(data / "microdata")},
            "boundaries": {"path": str(data / "tracts.parquet")},
            "selection": {"rule": "dp", "threshold": 3.0},
            "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
            "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"}}
    return write_config(tmp / "config.yaml", base, **over)


def charges(tmp: Path) -> int:
    import sqlite3

    db = tmp / "ledger.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        return con.execute("SELECT count(*) FROM ledger_charges").fetchone()[0]


def one_line_error(res) -> str:
    refusal_block(res)  # said last; a config error may list one indented line per key after it
    return res.stdout


@pytest.mark.parametrize("rid", ["a/b", "..", "../../x", "x$y", "esc\x1b[31m", ".hidden",
                                 " lead", "feed.json", "latest", "LATEST", "r" * 300])
def test_bad_release_ids_are_refused_before_anything(tmp_path, data, rid):
    cfg = config(tmp_path, data)
    out = one_line_error(dpatlas("release", "-c", str(cfg), "--release-id", rid))
    assert "release id" in out
    assert charges(tmp_path) == 0
    assert not (tmp_path / "releases").exists()
    assert not (tmp_path / "internal").exists()
    assert not (tmp_path.parent / "x").exists()


def test_bad_release_id_in_config_is_a_config_error(tmp_path, data):
    cfg = tmp_path / "c.yaml"
    body = yaml.safe_load(config(tmp_path, data).read_text())
    body["release_id"] = "../escape"
    cfg.write_text(yaml.safe_dump(body))
    assert "release_id" in one_line_error(dpatlas("config", "check", str(cfg)))


def test_withdraw_and_rerun_validate_ids(tmp_path, data):
    cfg = config(tmp_path, data)
    assert "release id" in one_line_error(
        dpatlas("withdraw", "../x", "-c", str(cfg), "--reason", "wrong"))
    assert "release id" in one_line_error(dpatlas("rerun", "feed.atom", "-c", str(cfg)))


@pytest.mark.parametrize("reason", ["", "   ", "two\nlines", "bell\x07"])
def test_withdraw_reasons_must_be_one_printable_line(tmp_path, data, reason):
    cfg = config(tmp_path, data)
    assert "reason" in one_line_error(
        dpatlas("withdraw", "r1", "-c", str(cfg), "--reason", reason))


def test_seeded_noise_is_refused_for_a_public_root(tmp_path, data):
    cfg = config(tmp_path, data, publish={"mode": "public"})
    out = one_line_error(dpatlas("release", "-c", str(cfg), "--release-id", "r1",
                                 "--noise-seed", "3"))
    assert "seed" in out and "public" in out
    assert charges(tmp_path) == 0 and not (tmp_path / "releases").exists()


@pytest.mark.parametrize("layout", ["internal-in-public", "public-in-input", "same-folder"])
def test_overlapping_roots_are_refused(tmp_path, data, layout):
    root = tmp_path / "releases"
    internal = {"internal-in-public": root / "internal",
                "public-in-input": tmp_path / "internal",
                "same-folder": root}[layout]
    if layout == "public-in-input":
        root = data / "microdata" / "published"
    cfg = config(tmp_path, data, publish={"root": str(root), "internal_root": str(internal)})
    out = one_line_error(dpatlas("release", "-c", str(cfg), "--release-id", "r1"))
    assert "overlap" in out
    assert charges(tmp_path) == 0 and not root.exists()


def test_symlink_at_the_release_path_is_refused(tmp_path, data):
    cfg = config(tmp_path, data)
    (tmp_path / "releases").mkdir()
    os.symlink(tmp_path / "nowhere", tmp_path / "releases" / "r1")  # dangling
    out = one_line_error(dpatlas("release", "-c", str(cfg), "--release-id", "r1"))
    assert "symbolic link" in out
    assert charges(tmp_path) == 0


@pytest.mark.parametrize("section,body,key", [
    ("privacy", {"epsilon_per_tract": True}, "privacy.epsilon_per_tract"),
    ("ledger", {"cap_epsilon": float("inf")}, "ledger.cap_epsilon"),
    ("privacy", {"delta": float("nan")}, "privacy.delta"),
])
def test_numbers_that_are_not_numbers_are_config_errors(tmp_path, data, section, body, key):
    cfg = tmp_path / "c.yaml"
    doc = yaml.safe_load(config(tmp_path, data).read_text())
    doc.setdefault(section, {}).update(body)
    cfg.write_text(yaml.safe_dump(doc))
    assert key in one_line_error(dpatlas("config", "check", str(cfg)))


def test_config_check_reads_every_file_and_hides_the_password(tmp_path, data):
    cfg = config(tmp_path, data)
    doc = yaml.safe_load(cfg.read_text())
    ok = dpatlas("config", "check", str(cfg))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "boundaries" in ok.stdout and "partition" in ok.stdout
    doc["ledger"]["url"] = "postgresql+psycopg://op:s3cret-pw@127.0.0.1:1/ledger"
    cfg.write_text(yaml.safe_dump(doc))
    res = dpatlas("config", "check", str(cfg))
    assert "s3cret-pw" not in res.stdout + res.stderr
    doc["ledger"]["url"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    doc["boundaries"]["path"] = str(tmp_path / "missing.parquet")
    cfg.write_text(yaml.safe_dump(doc))
    assert "missing.parquet" in one_line_error(dpatlas("config", "check", str(cfg)))


def test_ledger_show_never_writes(tmp_path, data):
    cfg = config(tmp_path, data, ledger={"url": f"sqlite:///{tmp_path / 'fresh.db'}"})
    before = (tmp_path / "fresh.db").stat().st_mtime_ns
    res = dpatlas("ledger", "show", "-c", str(cfg))
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "fresh.db").stat().st_mtime_ns == before
    empty = config(tmp_path, data, ledger={"url": f"sqlite:///{tmp_path / 'none.db'}"})
    (tmp_path / "none.db").unlink(missing_ok=True)
    dpatlas("ledger", "show", "-c", str(empty))
    assert not (tmp_path / "none.db").exists()


def test_a_release_that_would_suppress_everything_is_not_charged(tmp_path, data):
    cfg = config(tmp_path, data, publish={"min_n": 100000})
    out = one_line_error(dpatlas("release", "-c", str(cfg), "--release-id", "r1",
                                 "--noise-seed", "1", env=OWN_SERVER))
    assert "suppress everything" in out
    assert charges(tmp_path) == 0 and not (tmp_path / "releases" / "r1").exists()


def test_a_tract_over_the_memory_limit_is_refused_before_the_charge(tmp_path, data):
    cfg = config(tmp_path, data, selection={"rule": "fixed", "mechanism": "DPExpTheilSen",
                                            "threshold": None},
                 limits={"memory_gib": 1e-6})
    out = one_line_error(dpatlas("release", "-c", str(cfg), "--release-id", "r1",
                                 "--noise-seed", "1", env=OWN_SERVER))
    assert "DPExpTheilSen would need" in out and "limits.memory_gib" in out
    assert charges(tmp_path) == 0


def _children(pid: int) -> set[int]:
    """Every process whose ancestry includes ``pid``, or that was started by it and re-parented
    (we look for the Prefect server by its command line instead)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return {int(line.split()[0]) for line in out.splitlines()[1:]
            if "prefect.server.api.server:create_app" in line}


@pytest.mark.slow
def test_killed_release_leaves_no_prefect_server_and_nothing_public_half_written(tmp_path, data):
    cfg = config(tmp_path, data)
    before = _children(os.getpid())
    res = subprocess.run([sys.executable, str(CRASH_AT),
                          "after-ledger-charge", "release", "-c", str(cfg), "--release-id", "r1",
                          "--noise-seed", "1"], capture_output=True, text=True, env=ENV,
                         timeout=600)
    assert res.returncode == -9, res.stdout + res.stderr  # SIGKILL: no cleanup code ran
    import select

    # Each server's own exit, not a deadline: PR_SET_PDEATHSIG kills it with the release; one
    # that lives on is waited for until the run's timeout.
    for pid in _children(os.getpid()) - before:
        try:
            exited = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # gone already
        try:
            select.select([exited], [], [])
        finally:
            os.close(exited)
    assert not (_children(os.getpid()) - before), "a Prefect server outlived the killed release"
    root = tmp_path / "releases"
    assert not root.exists() or not [p for p in root.iterdir() if p.name.startswith(".staging")]


def test_evaluation_only_estimators_cannot_be_configured_for_a_release(tmp_path, data):
    cfg = tmp_path / "c.yaml"
    doc = yaml.safe_load(config(tmp_path, data).read_text())
    doc["profile"] = {"name": "full-suite", "suite": ["NoisyStats", "DPSSTheilSen"]}
    cfg.write_text(yaml.safe_dump(doc))
    out = one_line_error(dpatlas("config", "check", str(cfg)))
    assert "profile.suite" in out and "DPSSTheilSen" in out


def test_an_unusable_ledger_is_one_line(tmp_path, data):
    base = config(tmp_path, data)
    doc = yaml.safe_load(base.read_text())
    cfg = tmp_path / "bad-ledger.yaml"
    doc["ledger"]["url"] = "mysql://user@127.0.0.1/x"  # not a supported backend
    cfg.write_text(yaml.safe_dump(doc))
    assert "ledger" in one_line_error(dpatlas("ledger", "show", "-c", str(cfg))).lower()
    assert "ledger" in one_line_error(dpatlas("config", "check", str(cfg))).lower()
    doc["ledger"]["url"] = "sqlite:////proc/no-such-dir/ledger.db"  # cannot be created
    cfg.write_text(yaml.safe_dump(doc))
    assert "ledger" in one_line_error(dpatlas(
        "ledger", "set-cap", "--dataset", "il", "--epsilon", "5", "--reason", "first cap",
        "-c", str(cfg))).lower()


def test_the_cap_is_the_ledgers_a_config_stating_another_is_refused(tmp_path, data):
    cfg = config(tmp_path, data)  # the ledger's cap: 10 (set with a reason, as an operator does)
    doc = yaml.safe_load(cfg.read_text())
    doc["ledger"]["cap_epsilon"] = 20.0
    other = tmp_path / "other-cap.yaml"
    other.write_text(yaml.safe_dump(doc))
    out = one_line_error(dpatlas("release", "-c", str(other), "--release-id", "r1",
                                 "--noise-seed", "1", env=OWN_SERVER))
    assert "10" in out and "20" in out
    assert charges(tmp_path) == 0
    shown = dpatlas("ledger", "show", "-c", str(other))
    assert shown.returncode == 0 and "test set-up" in shown.stdout  # the cap's reason, kept


def test_the_config_hash_does_not_depend_on_how_paths_are_spelled(tmp_path, data, monkeypatch):
    from dpatlas.core.config import fingerprint, load_config

    cfg = config(tmp_path, data)
    doc = yaml.safe_load(cfg.read_text())
    doc["boundaries"]["path"] = os.path.relpath(doc["boundaries"]["path"], tmp_path)
    relative = tmp_path / "relative.yaml"
    relative.write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    assert fingerprint(load_config(Path("relative.yaml"))) == fingerprint(load_config(cfg))
    assert fingerprint(load_config(Path("./relative.yaml"))) == \
        fingerprint(load_config(relative.resolve()))
