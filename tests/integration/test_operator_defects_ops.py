"""Operator defects of issue 17 (D3, D4, D5, D7, D8, D10, D13, D14, D16) and person ids of
mixed types: each test reproduces the defect as the reviewer found it."""

from __future__ import annotations

import errno
import http.client
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dpatlas.publication import serve as S
from dpatlas.core.config import load_config
from dpatlas.release.ingest import InputError, partitions, read_partition
from dpatlas.release.preflight import PreflightError, check_before_writing

from tests.support.inputs import write_config
from tests.integration.test_inputs import input_config, one_state_file, state_records, write_states


# --- serve: D3, D4 (second line), D10 ----------------------------------------------------------


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "root"
    (root / "r1").mkdir(parents=True)
    data = bytes(range(256)) * 8
    (root / "r1" / "tracts.pmtiles").write_bytes(data)
    (root / "index.html").write_text("<!doctype html><title>root</title>")
    internal = tmp_path / "internal" / "data_docs"      # e.g. the internal Data Docs site
    internal.mkdir(parents=True)
    (internal / "index.html").write_text("<title>validation results: confidential</title>")
    os.symlink(internal, root / "evil_dir")
    os.symlink("r1", root / "latest")                   # the feed's own link stays usable
    ledger = sqlite3.connect(root / "ledger.db")        # a ledger someone put in the root
    ledger.execute("create table t (path text)")
    ledger.execute("insert into t values ('/home/owner/secret')")
    ledger.commit()
    ledger.close()
    (root / "copy.bin").write_bytes((root / "ledger.db").read_bytes())  # renamed database
    server, _ = S.serve_in_thread(root)
    host, port = server.server_address[:2]
    yield (lambda: http.client.HTTPConnection(host, port, timeout=10)), data
    server.shutdown()
    server.server_close()


def _get(connect, path, headers=None):
    conn = connect()
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def test_d3_serve_does_not_follow_a_linked_folder_out_of_the_root(served):
    connect, data = served
    for path in ("/evil_dir/", "/evil_dir/index.html", "/evil_dir"):
        response, body = _get(connect, path)
        assert response.status == 404, path
        assert b"confidential" not in body
    response, body = _get(connect, "/latest/tracts.pmtiles")
    assert response.status == 200 and body == data


def test_d4_serve_never_sends_a_database(served):
    connect, _ = served
    for path in ("/ledger.db", "/copy.bin"):
        response, body = _get(connect, path)
        assert response.status == 404, path
        assert b"/home/owner" not in body and b"SQLite format" not in body


def test_d10_serve_answers_a_huge_range_and_a_nul_in_the_path(served):
    connect, data = served
    huge = "9" * 4300
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": f"bytes={huge}-"})
    assert response.status == 416 and body == b""
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": f"bytes=0-{huge}"})
    assert response.status == 206 and body == data
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": f"bytes=-{huge}"})
    assert response.status == 206 and body == data
    for path in ("/r1/tracts.pmtiles%00", "/%00/", "/r1%00/tracts.pmtiles"):
        response, _ = _get(connect, path)
        assert response.status in (400, 404), path
    # the server is still up and well
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": "bytes=0-3"})
    assert response.status == 206 and body == data[:4]


def test_d10_parse_range_never_converts_thousands_of_digits():
    with pytest.raises(S.Unsatisfiable):
        S.parse_range("bytes=" + "1" * 5000 + "-", 100)
    assert S.parse_range("bytes=5-" + "1" * 5000, 100) == (5, 99)
    assert S.parse_range("bytes=-" + "1" * 5000, 100) == (0, 99)
    assert S.parse_range("bytes=" + "0" * 5000 + "7-9", 100) == (7, 9)


# --- D4: a ledger inside the publish root ------------------------------------------------------


def _release_config(tmp: Path, **over) -> Path:
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    cfg = {"input": {"path": str(data / "microdata")},
           "boundaries": {"path": str(data / "tracts.parquet")},
           "selection": {"rule": "fixed"},
           "publish": {"root": str(tmp / "releases")},
           "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"}}
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp / "config.yaml"
    cfg.setdefault("input", {}).setdefault("columns", {})["person_id"] = "person_id"
    cfg["publish"].setdefault("mode", "test")
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("where", ["releases/ledger.db", "releases/sub/ledger.db"])
def test_d4_a_ledger_inside_the_publish_root_is_refused_before_anything(tmp_path, where):
    (tmp_path / "releases").mkdir()
    config = _release_config(tmp_path, ledger={"url": f"sqlite:///{tmp_path / where}"})
    cfg = load_config(config)
    with pytest.raises(PreflightError, match="ledger .* inside the publish root"):
        check_before_writing(cfg, "r1", None)
    assert not (tmp_path / where).exists()


def test_d4_config_check_refuses_a_ledger_inside_the_publish_root(tmp_path):
    """`config check` reports what a release would refuse, before reading any data."""
    (tmp_path / "releases").mkdir()
    config = _release_config(tmp_path,
                             ledger={"url": f"sqlite:///{tmp_path / 'releases' / 'ledger.db'}"})
    result = subprocess.run([sys.executable, "-m", "dpatlas.cli.commands", "config", "check",
                             str(config)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "COLUMNS": "300"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "inside the publish root" in result.stdout + result.stderr
    assert not (tmp_path / "releases" / "ledger.db").exists()


def test_d4_a_ledger_outside_the_publish_root_passes(tmp_path):
    cfg = load_config(_release_config(tmp_path))
    check_before_writing(cfg, "r1", None)


# --- D5: synthesize --out inside a published release ------------------------------------------


def test_d5_synthesize_out_inside_a_published_release_is_refused(tmp_path):
    from dpatlas.release.synthetic_data import SynthesizeError, plan_synthetic

    config = _release_config(tmp_path)
    release = tmp_path / "releases" / "r1"
    release.mkdir(parents=True)
    (release / "manifest.json").write_text("{}")
    os.symlink("r1", tmp_path / "releases" / "latest")
    for out in (release / "sub", tmp_path / "releases" / "latest" / "sub", release / "a" / "b"):
        if out.parent != release:
            out.parent.mkdir(parents=True, exist_ok=True)
        with pytest.raises(SynthesizeError, match="inside the published folder"):
            plan_synthetic(config, "r1", 1.0, out=out)
        assert not out.exists()
    internal = tmp_path / "releases-internal"
    internal.mkdir()
    with pytest.raises(SynthesizeError, match="overlaps the internal folder"):
        plan_synthetic(config, "r1", 1.0, out=internal / "x")
    assert not (internal / "x").exists()


# --- D7: unreadable input files ----------------------------------------------------------------


def _config_check(tmp_path: Path, input_path: Path, fmt: str):
    """``dpatlas config check`` as an operator runs it; its temp folder is the test's own."""
    (tmp_path / "tmp").mkdir()
    config = _release_config(tmp_path, input={"path": str(input_path), "format": fmt})
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "COLUMNS": "300",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    result = subprocess.run([sys.executable, "-m", "dpatlas.cli.commands", "config", "check",
                             str(config)], capture_output=True, text=True, env=env, timeout=600)
    return result, list((tmp_path / "tmp").glob("dpatlas-error-*.log"))


def test_d7_zero_byte_csv_is_an_operator_error(tmp_path):
    empty = tmp_path / "in.csv"
    empty.write_bytes(b"")
    result, logs = _config_check(tmp_path, empty, "csv")
    assert result.returncode == 2, result.stdout
    assert "internal error" not in result.stdout and logs == []
    assert str(empty) in result.stdout.replace("\n", "") and "empty" in result.stdout


def test_d7_truncated_parquet_is_an_operator_error(tmp_path):
    path = one_state_file(tmp_path, state_records("17", n=200))
    path.write_bytes(path.read_bytes()[:300])
    result, logs = _config_check(tmp_path, path, "parquet")
    assert result.returncode == 2, result.stdout
    assert "internal error" not in result.stdout and logs == []
    text = result.stdout.replace("\n", "")
    assert str(path) in text and "truncated or corrupt" in text


@pytest.mark.parametrize("damage", ["truncate", "empty"])
def test_d7_a_damaged_partition_of_a_hive_dataset_is_named(tmp_path, damage):
    root = write_states(tmp_path, {"17": state_records("17"),
                                   "18": state_records("18", first_id=1000)})
    bad = root / "state=18" / "part-0.parquet"
    bad.write_bytes(bad.read_bytes()[:200] if damage == "truncate" else b"")
    cfg = input_config(root)
    with pytest.raises(InputError) as err:
        parts = partitions(cfg.input)
        for part in parts:
            read_partition(cfg.input, part.key)
    message = str(err.value)
    assert str(bad) in message and "\n" not in message
    assert ("empty" if damage == "empty" else "truncated or corrupt") in message


# --- D14: text rank columns in Parquet ---------------------------------------------------------


def test_d14_a_text_rank_column_in_parquet_is_refused(tmp_path):
    frame = state_records("17", n=10, tracts=2)
    frame["child_rank"] = frame["child_rank"].astype(str)      # "0.53": numbers stored as text
    path = one_state_file(tmp_path, frame)
    with pytest.raises(InputError, match="child_rank column 'child_rank' is stored as text"):
        partitions(input_config(path).input)
    result, logs = _config_check(tmp_path, path, "parquet")
    assert result.returncode == 2 and logs == [], result.stdout
    assert "stored as text" in result.stdout


# --- person ids: one canonical type -----------------------------------------------------------


def test_person_ids_of_mixed_types_across_partitions_are_refused(tmp_path):
    text = state_records("17")
    text["person_id"] = [f"{i:03d}" for i in range(len(text))]        # "007" ...
    numbers = state_records("18", first_id=1000)
    numbers["person_id"] = list(range(1000, 1000 + len(numbers)))
    numbers.loc[0, "person_id"] = 7                                   # 7
    cfg = input_config(write_states(tmp_path, {"17": text, "18": numbers}))
    with pytest.raises(InputError) as err:
        partitions(cfg.input)
    message = str(err.value)
    assert "person id" in message and "integer" in message and "text" in message
    assert "state=17" in message and "state=18" in message and "one type" in message


def test_mixed_staged_person_id_types_are_refused_by_the_contribution_check(tmp_path):
    from dpatlas.release.contributions import ContributionError, check_contributions

    staged = []
    for key, ids in (("17", ["007", "8"]), ("18", [7, 9])):
        frame = state_records(key, n=2, tracts=1)
        frame = pd.DataFrame({"row": [0, 1], "geoid": frame["geoid"], "x": 0.5, "y": 0.5,
                              "cell": "all", "person_id": ids})
        staged.append(tmp_path / f"input-{key}.parquet")
        frame.to_parquet(staged[-1], index=False)
    with pytest.raises(ContributionError, match="one type"):
        check_contributions(staged, "fail", tmp_path / "internal")


# --- D13: stale Prefect server logs ------------------------------------------------------------


def test_d13_empty_server_logs_of_dead_commands_are_removed(tmp_path, monkeypatch):
    from dpatlas.cli import prefect_server as PS

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"dpatlas-prefect-server-{dead.pid}.log"
    stale.write_bytes(b"")                                   # left by a SIGKILLed release
    kept = tmp_path / f"dpatlas-prefect-server-{dead.pid + 100000}.log"
    kept.write_text("uvicorn: address in use\n")             # a log with something in it
    alive = tmp_path / f"dpatlas-prefect-server-{os.getppid()}.log"
    alive.write_bytes(b"")                                   # a running command's log
    other = tmp_path / "dpatlas-prefect-server-notapid.log"
    other.write_bytes(b"")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # no server is started
    with PS.prefect_api():
        pass
    assert not stale.exists()
    assert kept.exists() and alive.exists() and other.exists()


def test_d13_a_sigkilled_command_leaves_no_log_for_the_next_one(tmp_path):
    """The real sequence: a command's server log, the command SIGKILLed, the next command."""
    code = ("import os, signal, sys, tempfile; tempfile.tempdir = sys.argv[1];"
            "from dpatlas.cli.prefect_server import default_server_log;"
            "default_server_log().touch(); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)])
    assert proc.returncode == -9
    assert len(list(tmp_path.glob("dpatlas-prefect-server-*.log"))) == 1
    code = ("import os, sys, tempfile; tempfile.tempdir = sys.argv[1];"
            "os.environ['PREFECT_API_URL'] = 'http://127.0.0.1:9/api';"
            "from dpatlas.cli.prefect_server import prefect_api\n"
            "with prefect_api(): pass")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    assert list(tmp_path.glob("dpatlas-prefect-server-*.log")) == []


# --- D8 and D16: through the release flow ------------------------------------------------------


@pytest.fixture(scope="module")
def prefect_harness():
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="module")
def small_state(tmp_path_factory) -> Path:
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=5, params=StateParams(n_tracts=40, counties=2))
    return out


def _flow_config(tmp: Path, data: Path) -> Path:
    cfg = {"input": {"path": str(data / "microdata")},
           "boundaries": {"path": str(data / "tracts.parquet")},
           "selection": {"rule": "fixed"},
           "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
           "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"},
           "partition_tracts": 40}
    return write_config(tmp / "config.yaml", cfg)


def _ledger(tmp: Path):
    from dpatlas.ledger import Ledger

    return Ledger(f"sqlite:///{tmp / 'ledger.db'}", create=False)


def test_d8_resume_after_the_input_changed(prefect_harness, small_state, tmp_path, monkeypatch):
    import flows.release as R
    from dpatlas.cli.common import operator_errors as _operator_errors
    from dpatlas.release.events import _refusals

    data = tmp_path / "data"
    shutil.copytree(small_state, data)
    config = _flow_config(tmp_path, data)

    class Killed(Exception):
        pass

    def crash_after_charge(name):
        if name == "after-ledger-charge":
            raise Killed("stopped after the charge")

    monkeypatch.setattr(R, "crashpoint", crash_after_charge)
    with pytest.raises(Killed):
        R.release(str(config), "r1", 3)
    monkeypatch.undo()
    charged = _ledger(tmp_path).release("r1")
    assert charged["status"] == "in_progress"
    spent = _ledger(tmp_path).spent("il")["epsilon"]

    part = next((data / "microdata").rglob("*.parquet"))
    original = part.read_bytes()
    frame = pd.read_parquet(part)
    frame.loc[0, "child_rank"] = 1.0 - frame.loc[0, "child_rank"]   # one record changed
    frame.to_parquet(part, index=False)

    with pytest.raises(Exception) as err:
        R.release(str(config), "r1", 3)
    assert isinstance(err.value, _operator_errors()) and isinstance(err.value, _refusals())
    message = str(err.value)
    assert "\n" not in message
    assert "input changed since release r1 was charged" in message
    assert "restore the original input" in message and "stays spent" in message
    after = _ledger(tmp_path).release("r1")
    assert after["status"] == "failed" and "input changed" in after["reason"]
    assert _ledger(tmp_path).spent("il")["epsilon"] == pytest.approx(spent)  # never un-spent

    part.write_bytes(original)                                # the way out: restore, resume
    outcome = R.release(str(config), "r1", 3)
    assert outcome.status == "published"
    assert _ledger(tmp_path).release("r1")["status"] == "published"
    assert _ledger(tmp_path).spent("il")["epsilon"] == pytest.approx(spent)


def test_d16_rerun_of_a_published_id_on_a_read_only_file_system(prefect_harness, small_state,
                                                                 tmp_path, monkeypatch):
    import flows.release as R
    from dpatlas.publication import feed

    config = _flow_config(tmp_path, small_state)
    assert R.release(str(config), "r1", 3).status == "published"

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    # Every way the run could write to the publish root or the internal folder.
    monkeypatch.setattr(R, "ReleaseLock", read_only)
    monkeypatch.setattr(feed, "_atomic_write", read_only)
    monkeypatch.setattr(feed, "_locked", read_only)
    monkeypatch.setattr(R, "open_release", read_only)
    monkeypatch.setattr(R, "mark_root", read_only)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")
                    if "ledger.db" not in p.name)
    outcome = R.release(str(config), "r1", 3)
    assert outcome.status == "already_published"
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")
                   if "ledger.db" not in p.name)
    assert after == before
