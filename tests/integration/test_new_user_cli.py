"""Issue 21, item 4: the configuration and the command line as a new user meets them. The
example config runs as printed against the demo's data layout; the demo folder can be moved;
`config check` lists every problem; refusals that need no data come before the ingest; output
piped to a file is whole, and `--json` is JSON alone."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
import yaml

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

from tests.support.cli import NO_SERVER
from tests.support.cli import run_in_process as dpatlas  # in-process: exit codes and output
from tests.support.cli import refusal_block, run_subprocess

# A narrow pipe: rich would wrap and cut here (the logs were cut at 80 columns).
PIPE_80 = {**NO_SERVER, "COLUMNS": "80"}


def demo_layout(folder: Path, tracts: int = 30) -> Path:
    """The folder as `dpatlas demo --out folder` lays it out (data/microdata,
    data/tracts.parquet), with a small synthetic state."""
    write_synthetic(folder / "data", ["17"], seed=3, params=StateParams(n_tracts=tracts,
                                                                         counties=2))
    return folder


def ledger_charges(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master")}
        if "ledger_charges" not in tables:
            return 0
        return con.execute("SELECT count(*) FROM ledger_charges").fetchone()[0]


# --- 1. the example config runs as printed ------------------------------------------------------

def test_the_example_config_runs_as_printed_against_the_demo_layout(tmp_path):
    demo = demo_layout(tmp_path / "demo")
    example = dpatlas("config", "example")
    assert example.returncode == 0
    assert "threshold_file: thresholds.yaml" not in "\n".join(
        ln.split("#")[0] for ln in example.stdout.splitlines())  # no file that does not exist
    config = demo / "example.yaml"
    config.write_text(example.stdout)  # as printed: nothing edited

    # before a cap: every file found, and the one problem said, with exit 2
    check = dpatlas("config", "check", config)
    assert "ok input" in check.stdout and "ok boundaries" in check.stdout, check.stdout
    assert "ok selection threshold" in check.stdout, check.stdout
    block = refusal_block(check)
    assert "would be refused (1 problem)" in block and "no lifetime budget cap" in block, block
    assert "dpatlas ledger set-cap" in block

    cap = dpatlas("ledger", "set-cap", "-c", config, "--dataset", "default", "--epsilon", "10",
                  "--delta", "1e-5", "--reason", "first cap")
    assert cap.returncode == 0, cap.stdout
    assert dpatlas("config", "check", config).returncode == 0

    run = run_subprocess("release", "-c", config, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    (folder,) = [d for d in (demo / "releases").iterdir()
                 if (d / "manifest.json").is_file() and not d.is_symlink()]
    # the release used the calibration shipped with the package
    assert json.loads((folder / "config.json").read_text())["selection"][
        "threshold_file"] == "thresholds.yaml"
    assert ledger_charges(demo / "ledger.db") > 0

    # and the audit of it, as JSON alone on stdout
    audit = dpatlas("audit", folder, "--json")
    report = json.loads(audit.stdout)
    assert audit.returncode == report["exit_code"] == 0, audit.stdout
    assert report["verdict"].startswith("PASSED") and report["checks"], report
    assert all(c["ok"] for c in report["checks"]), report


def test_a_missing_threshold_file_points_to_the_shipped_one(tmp_path):
    demo = demo_layout(tmp_path / "demo")
    doc = yaml.safe_load(dpatlas("config", "example").stdout)
    doc["selection"]["threshold_file"] = "thresholds.yaml"  # the old example's file
    (demo / "c.yaml").write_text(yaml.safe_dump(doc))
    block = refusal_block(dpatlas("config", "check", demo / "c.yaml"))
    assert "selection.threshold_file not found" in block, block
    assert "leave selection.threshold_file out" in block and "shipped" in block, block
    assert "dpatlas calibrate" in block


# --- 2. the demo folder can be moved -------------------------------------------------------------

def test_the_demo_config_is_relative_so_the_folder_can_be_moved(tmp_path):
    from dpatlas.cli.demo import ensure_demo_cap, write_demo_config
    from dpatlas.core.config import load_config

    first = demo_layout(tmp_path / "first")
    written = yaml.safe_load(write_demo_config(first).read_text())
    assert written["input"]["path"] == "data/microdata"
    assert written["boundaries"]["path"] == "data/tracts.parquet"
    assert written["publish"]["root"] == "releases"
    assert "threshold_file" not in written["selection"]  # the shipped calibration
    assert str(tmp_path) not in yaml.safe_dump(written)  # no machine path at all

    moved = tmp_path / "elsewhere" / "moved"
    moved.parent.mkdir()
    shutil.move(first, moved)
    config = moved / "config.yaml"
    cfg = load_config(config)
    assert cfg.input.path == (moved / "data" / "microdata").resolve()
    assert cfg.publish.root == (moved / "releases").resolve()
    assert ensure_demo_cap(config) is not None
    assert (moved / "ledger.db").exists() and not (tmp_path / "first").exists()
    check = dpatlas("config", "check", config)
    assert check.returncode == 0, check.stdout
    assert f"ok input {moved.resolve() / 'data' / 'microdata'}" in check.stdout, check.stdout

    run = run_subprocess("release", "-c", config, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert any((d / "manifest.json").is_file() for d in (moved / "releases").iterdir())
    assert not (tmp_path / "first").exists()


# --- 3. config check: every problem at once ------------------------------------------------------

def test_config_check_reports_every_problem_at_once(tmp_path):
    demo = demo_layout(tmp_path / "demo")
    doc = yaml.safe_load(dpatlas("config", "example").stdout)
    doc["input"]["path"] = "data/no-such-microdata"
    doc["boundaries"]["path"] = "data/no-such-tracts.parquet"
    doc["selection"]["threshold_file"] = "missing-thresholds.yaml"
    (demo / "c.yaml").write_text(yaml.safe_dump(doc))
    block = refusal_block(dpatlas("config", "check", demo / "c.yaml"))
    assert "(4 problems)" in block, block
    for said in ("input not found", "boundaries not found", "missing-thresholds.yaml",
                 "no lifetime budget cap"):
        assert said in block, (said, block)


# --- 4. refusals that need no data come before the ingest ----------------------------------------

def _uncapped_config(demo: Path, **selection) -> Path:
    doc = yaml.safe_load(dpatlas("config", "example").stdout)
    doc["selection"].update(selection)
    doc["publish"]["internal_root"] = "internal"
    (demo / "c.yaml").write_text(yaml.safe_dump(doc))
    return demo / "c.yaml"


def test_a_release_without_a_cap_is_refused_before_the_ingest(tmp_path):
    demo = demo_layout(tmp_path / "demo", tracts=60)
    config = _uncapped_config(demo)
    t0 = time.perf_counter()
    res = dpatlas("release", "-c", config, "--release-id", "r1")  # Prefect URL: a dead one
    took = time.perf_counter() - t0
    block = refusal_block(res)
    assert "no lifetime budget cap" in block and "nothing was read or charged" in block, block
    assert "expect_" not in res.stdout  # no validation ran
    assert not (demo / "internal").exists()  # no staged copy, no report, no lock
    assert not (demo / "releases").exists()
    assert ledger_charges(demo / "ledger.db") == 0
    assert took < 30, took  # no Prefect server, no ingest


def test_every_refusal_before_the_ingest_is_said_at_once(tmp_path):
    demo = demo_layout(tmp_path / "demo")
    config = _uncapped_config(demo, threshold_file="gone.yaml")
    block = refusal_block(dpatlas("release", "-c", config, "--release-id", "r1"))
    assert "2 problems" in block and "gone.yaml" in block and "no lifetime budget cap" in block
    assert not (demo / "internal").exists()


def test_a_published_release_is_rerun_without_the_checks(tmp_path):
    """A published id's rerun reads and writes nothing, so nothing before the ingest is
    refused either (not even a missing input)."""
    from dpatlas.core.config import load_config
    from dpatlas.ledger import Charge, Ledger
    from dpatlas.release.preflight import refusals_before_ingest

    demo = demo_layout(tmp_path / "demo")
    cfg = load_config(_uncapped_config(demo))
    with Ledger(cfg.ledger.url) as ledger:
        ledger.set_cap("default", 10.0, 1e-5, reason="test")
        ledger.begin_release("r1", "default", [Charge("all", "primary", "pure", 1.0, 0.0)],
                             "cfg", "owner")
        ledger.complete_release("r1", "manifest-sha", "owner")
        shutil.rmtree(demo / "data")
        assert refusals_before_ingest(cfg, "r1") == []
        assert any("input not found" in p for p in refusals_before_ingest(cfg, "r2"))


# --- 5. a cap below the spend --------------------------------------------------------------------

def test_a_cap_below_the_spend_needs_force_and_says_what_it_means(tmp_path):
    from dpatlas.core.config import load_config
    from dpatlas.ledger import Charge, Ledger

    demo = demo_layout(tmp_path / "demo")
    config = _uncapped_config(demo)
    cfg = load_config(config)
    with Ledger(cfg.ledger.url) as ledger:
        ledger.set_cap("default", 10.0, 1e-5, reason="test")
        ledger.begin_release("r1", "default", [Charge("all", "primary", "pure", 3.0, 0.0)],
                             "cfg", "owner")

    def set_cap(*extra):
        return dpatlas("ledger", "set-cap", "-c", config, "--dataset", "default", "--epsilon",
                       "2", "--delta", "1e-5", "--reason", "stop releases", *extra)

    refused = " ".join(refusal_block(set_cap()).split())
    assert "below what it has already spent" in refused and "--force" in refused, refused
    assert "no release of it could be charged" in refused, refused
    with Ledger(cfg.ledger.url, create=False) as ledger:
        assert ledger.cap("default") == (10.0, 1e-5)
    forced = set_cap("--force")
    assert forced.returncode == 0, forced.stdout
    said = " ".join(forced.stdout.split())
    assert "recorded with --force" in said and "no release of dataset default can be charged" \
        in said, said
    with Ledger(cfg.ledger.url, create=False) as ledger:
        assert ledger.cap("default") == (2.0, 1e-5)


# --- 6. whole lines off a terminal, and --json ---------------------------------------------------

def test_estimators_piped_shows_every_name_whole():
    import mechanisms as M

    res = dpatlas("estimators", env=PIPE_80)
    assert res.returncode == 0
    assert "…" not in res.stdout
    names = [ln.split("\t")[0] for ln in res.stdout.splitlines()[1:]]
    assert names == list(M.REGISTRY), names
    rows = [ln.split("\t") for ln in res.stdout.splitlines()]
    assert rows[0] == ["name", "guarantee at eps=1", "publishable", "noise sampler",
                       "what it is"]
    assert all(len(r) == 5 for r in rows), rows


def test_estimators_json():
    import mechanisms as M

    res = dpatlas("estimators", "--json", env=PIPE_80)
    assert res.returncode == 0
    listed = json.loads(res.stdout)
    assert [e["name"] for e in listed] == list(M.REGISTRY)
    by_name = {e["name"]: e for e in listed}
    assert by_name["NoisyStats"]["publishable"] is True
    assert by_name["OLS"]["publishable"] is False and by_name["OLS"]["not_publishable_reason"]


def _capped_ledger_with_a_release(demo: Path) -> Path:
    from dpatlas.core.config import load_config
    from dpatlas.ledger import Charge, Ledger

    config = _uncapped_config(demo)
    with Ledger(load_config(config).ledger.url) as ledger:
        ledger.set_cap("default", 10.0, 1e-5, reason="a cap with a long reason " + "x" * 60)
        rid = "20261126T000000Z-a-release-id-long-enough-to-be-cut"
        ledger.begin_release(rid, "default", [Charge("all", "primary", "pure", 1.5, 0.0)],
                             "cfg", "owner")
        ledger.complete_release(rid, "manifest-sha", "owner")
    return config


def test_ledger_show_piped_is_whole_and_json_is_json(tmp_path):
    demo = demo_layout(tmp_path / "demo")
    config = _capped_ledger_with_a_release(demo)
    shown = dpatlas("ledger", "show", "-c", config, env=PIPE_80)
    assert shown.returncode == 0
    lines = shown.stdout.splitlines()
    head = [ln for ln in lines if ln.strip().startswith("release ")]
    assert len(head) == 1 and head[0].split() == ["release", "status", "started", "(UTC)",
                                                   "eps", "delta"], lines
    assert any("20261126T000000Z-a-release-id-long-enough-to-be-cut  published" in ln
               for ln in lines), lines
    assert any(ln.endswith("x" * 60) for ln in lines), lines  # the reason, not wrapped

    res = dpatlas("ledger", "show", "-c", config, "--json", env=PIPE_80)
    assert res.returncode == 0
    doc = json.loads(res.stdout)
    (ds,) = doc["datasets"]
    assert ds["dataset"] == "default" and ds["cap"] == {"epsilon": 10.0, "delta": 1e-5}
    assert ds["spent"]["epsilon"] == pytest.approx(1.5)
    assert ds["left"]["epsilon"] == pytest.approx(8.5)
    assert [r["status"] for r in ds["releases"]] == ["published"]
    assert ds["cap_changes"][0]["reason"].endswith("x" * 60)


def test_evaluate_intervals_piped_keeps_its_headers_whole(tmp_path):
    res = dpatlas("evaluate-intervals", "--out", tmp_path / "ei", "--tracts", "40", "--reps",
                  "2", "--epsilon", "1", env=PIPE_80)
    assert res.returncode == 0, res.stdout
    (head,) = [ln for ln in res.stdout.splitlines() if ln.startswith("scenario\t")]
    assert head.split("\t") == ["scenario", "mechanism", "epsilon", "coverage", "worst Q",
                                "worst W", "extreme deciles", "SE cover", "worst SE Q",
                                "median width", "width<=0.2", "width<=0.5", "reliable",
                                "[0,1] share", "reliable intervals"]
    assert "…" not in res.stdout


@pytest.mark.parametrize("command", [
    ("evaluate", "--tracts", "40", "--reps", "2", "--epsilon", "1", "--mechanism",
     "NoisyStats", "--no-rule"),
    ("evaluate-intervals", "--tracts", "40", "--reps", "2", "--epsilon", "1"),
    ("evaluate-rule", "--tracts", "40", "--large-tracts", "20", "--reps", "2", "--epsilon", "1",
     "--scenario", "demo"),
    ("evaluate-small-area", "--quick", "--tracts", "60"),
])
def test_evaluation_commands_print_json_alone(tmp_path, command):
    res = dpatlas(*command, "--out", tmp_path / "out", "--json", env=PIPE_80)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)  # nothing but the document on stdout
    rows = next(v for k, v in doc.items() if k in ("summary", "rows", "targets"))
    assert rows and all(isinstance(r, dict) for r in rows), doc
    assert doc["files"] and all(Path(f).exists() for f in doc["files"]), doc["files"]
    assert res.stderr  # the progress went there


def test_an_unwritable_publish_root_is_refused_before_the_ingest(tmp_path, monkeypatch):
    """(Tests run as root here, for whom every folder is writable: the permission is faked.)"""
    import os

    from dpatlas.core.config import load_config
    from dpatlas.release import preflight

    demo = demo_layout(tmp_path / "demo")
    cfg = load_config(_uncapped_config(demo))
    real_access = os.access
    monkeypatch.setattr(preflight.os, "access",
                        lambda p, mode: Path(p) != demo and real_access(p, mode))
    found = preflight.refusals_before_ingest(cfg, "r1")
    assert any(p.startswith("publish.root") and "cannot be written" in p for p in found), found
    assert any(p.startswith("publish.internal_root") for p in found), found
    with pytest.raises(preflight.PreflightError, match="nothing was read or charged"):
        preflight.check_before_ingest(cfg, "r1")
