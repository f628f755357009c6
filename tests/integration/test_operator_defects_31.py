"""Operator defects of issue 31 in the command line and the servers (O3b, O6, O7, O8, O9,
O11, O12): each test reproduces the defect as the reviewer found it."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dpatlas.core.config import load_config
from dpatlas.ledger import Ledger
from dpatlas.release.synthetic_data import PARQUET

from tests.support.cli import ENV, refusal_block, run_in_process
from tests.integration.test_preflight import data  # noqa: F401 - a fixture
from tests.integration.test_synthesize import SOURCE, published  # noqa: F401 - a fixture

CRASH_AT = Path(__file__).resolve().parents[1] / "support" / "crash_at.py"
SYNTHETIC = f"{SOURCE}-synthetic"


def _crash_at(point: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CRASH_AT), point, *map(str, args)],
                          capture_output=True, text=True, env=ENV, timeout=300)


def _entry(cfg_path, release_id: str) -> dict | None:
    with Ledger(load_config(cfg_path).ledger.url, create=False) as ledger:
        return ledger.release(release_id)


def _charges(cfg_path) -> int:
    cfg = load_config(cfg_path)
    with Ledger(cfg.ledger.url, create=False) as ledger:
        return len(ledger.entries(cfg.ledger.dataset))


def _expire_lease(cfg_path, release_id: str) -> None:
    """What waiting out the killed run's lease does (60 s), at once."""
    url = load_config(cfg_path).ledger.url
    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    con.execute("update ledger_releases set lease_expires = 0 where release_id = ?",
                (release_id,))
    con.commit()
    con.close()


# --- O3b: a synthesize killed after its charge is finished by a rerun -------------------------


def _synthesize(cfg_path, *extra):
    return ("synthesize", "-c", cfg_path, "--release-id", SOURCE, "--epsilon", "2", *extra)


@pytest.mark.parametrize("point", ["synthesize-after-charge", "before-record-synthetic",
                                   "synthesize-after-move"])
def test_o3b_a_killed_synthesize_is_finished_by_a_rerun_charged_once(published, point):
    cfg_path, _ = published
    before = _charges(cfg_path)
    killed = _crash_at(point, *_synthesize(cfg_path))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert _entry(cfg_path, SYNTHETIC)["status"] == "in_progress"
    folder = Path(cfg_path).parent / "releases" / SYNTHETIC
    drawn = (folder / PARQUET).read_bytes() if point == "synthesize-after-move" else None

    busy = run_in_process(*_synthesize(cfg_path))  # the killed run's lease is still live
    assert "being run by" in refusal_block(busy)
    _expire_lease(cfg_path, SYNTHETIC)
    res = run_in_process(*_synthesize(cfg_path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert _entry(cfg_path, SYNTHETIC)["status"] == "published"
    assert _charges(cfg_path) == before + 1  # charged once, by the killed run
    if point == "synthesize-after-move":
        assert (folder / PARQUET).read_bytes() == drawn  # the recorded draw, never redrawn
    elif point == "before-record-synthetic":
        assert (folder / PARQUET).is_file()  # unrecorded: nothing read it, drawn again
    from dpatlas.audit import run as audit
    assert audit.audit_release(folder).ok


def test_o3b_a_synthesize_resumed_under_other_estimator_defaults_is_refused(published,
                                                                            monkeypatch):
    """A charged synthetic id is finished only under the plan it was charged for: a version
    whose BinAgg defaults differ (the request names none) is refused, nothing drawn."""
    import mechanisms as M
    from dpatlas.release.synthetic_data import ESTIMATOR

    cfg_path, _ = published
    killed = _crash_at("synthesize-after-charge", *_synthesize(cfg_path))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    _expire_lease(cfg_path, SYNTHETIC)
    estimator = M.get(ESTIMATOR)
    defaults = estimator.hyper
    monkeypatch.setattr(estimator, "hyper", lambda given: {**defaults(given), "min_count": 3})
    res = run_in_process(*_synthesize(cfg_path))
    text = refusal_block(res)
    assert "another budget plan" in text and "hyper/min_count: 2 → 3" in text, text
    assert not (Path(cfg_path).parent / "releases" / SYNTHETIC).exists()  # nothing drawn
    assert _entry(cfg_path, SYNTHETIC)["status"] == "in_progress"  # the charge as it was
    monkeypatch.setattr(estimator, "hyper", defaults)
    res = run_in_process(*_synthesize(cfg_path))  # the plan it was charged for finishes it
    assert res.returncode == 0, res.stdout + res.stderr
    assert _entry(cfg_path, SYNTHETIC)["status"] == "published"


def test_o3b_a_recorded_draw_is_reused_not_redrawn(published):
    cfg_path, _ = published
    killed = _crash_at("synthesize-after-move", *_synthesize(cfg_path, "--out",
                                                             Path(cfg_path).parent / "syn"))
    assert killed.returncode == -9
    out = Path(cfg_path).parent / "syn"
    drawn = (out / PARQUET).read_bytes()
    _expire_lease(cfg_path, SYNTHETIC)
    # another --out is another request: refused, the charge kept for the right rerun
    other = run_in_process(*_synthesize(cfg_path, "--out", Path(cfg_path).parent / "syn2"))
    assert "exactly as it was begun" in refusal_block(other)
    res = run_in_process(*_synthesize(cfg_path, "--out", out))
    assert res.returncode == 0, res.stdout + res.stderr
    assert (out / PARQUET).read_bytes() == drawn
    assert _entry(cfg_path, SYNTHETIC)["status"] == "published"


def test_o3b_a_recorded_draw_that_changed_is_refused_not_redrawn(published):
    cfg_path, _ = published
    killed = _crash_at("synthesize-after-move", *_synthesize(cfg_path))
    assert killed.returncode == -9
    folder = Path(cfg_path).parent / "releases" / SYNTHETIC
    (folder / PARQUET).write_bytes(b"tampered")
    _expire_lease(cfg_path, SYNTHETIC)
    res = run_in_process(*_synthesize(cfg_path))
    assert "never drawn again" in refusal_block(res)
    assert (folder / PARQUET).read_bytes() == b"tampered"


def test_o3b_a_charged_synthesize_whose_draw_log_is_gone_is_refused(published):
    cfg_path, _ = published
    killed = _crash_at("synthesize-after-move", *_synthesize(cfg_path))
    assert killed.returncode == -9
    (load_config(cfg_path).publish.internal / SYNTHETIC / "draws.jsonl").unlink()
    _expire_lease(cfg_path, SYNTHETIC)
    res = run_in_process(*_synthesize(cfg_path))
    assert "never drawn again" in refusal_block(res)
    assert _entry(cfg_path, SYNTHETIC)["status"] == "in_progress"


# --- O6: an empty release id is refused, never replaced by a fresh one ------------------------


@pytest.mark.parametrize("args", [("release", "--release-id", ""),
                                  ("release", "--release-id", " "),
                                  ("synthesize", "--release-id", SOURCE, "--epsilon", "2",
                                   "--synthetic-id", "")])
def test_o6_an_empty_release_id_is_refused(published, args):
    cfg_path, _ = published
    before = _charges(cfg_path)
    res = run_in_process(args[0], "-c", cfg_path, *args[1:])
    assert "invalid release id" in refusal_block(res)
    assert _charges(cfg_path) == before


def test_o6_the_flow_refuses_an_empty_release_id(published):
    from dpatlas.core.ids import InvalidReleaseId
    from flows.release import release

    cfg_path, _ = published
    with pytest.raises(InvalidReleaseId):
        release.fn(str(cfg_path), "")


# --- O9: a withdrawn id is refused at the start; a moved folder keeps its config -----------------


def _relative_folder(folder: Path, data: Path) -> Path:
    """A demo-like folder: its data inside, its config naming everything relatively."""
    import shutil

    from tests.support.inputs import write_config

    shutil.copytree(data, folder / "data")
    return write_config(folder / "config.yaml", {
        "input": {"path": "data/microdata"}, "boundaries": {"path": "data/tracts.parquet"},
        "selection": {"rule": "dp", "threshold": 3.0}, "publish": {"root": "releases"},
        "ledger": {"url": "sqlite:///ledger.db", "dataset": "il"}})


def test_o9_a_moved_folder_with_a_relative_config_holds_the_same_config(tmp_path, data):
    from dpatlas.core.config import fingerprint

    cfg_path = _relative_folder(tmp_path / "a", data)
    before = fingerprint(load_config(cfg_path))
    (tmp_path / "a").rename(tmp_path / "b")
    assert fingerprint(load_config(tmp_path / "b" / "config.yaml")) == before
    # a config naming files outside its folder names other files once moved alone
    text = (tmp_path / "b" / "config.yaml").read_text().replace(
        "data/microdata", str(tmp_path / "b" / "data" / "microdata"))
    (tmp_path / "b" / "config.yaml").write_text(text)
    absolute = fingerprint(load_config(tmp_path / "b" / "config.yaml"))
    assert absolute == before  # the same files, named absolutely: the same config
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.yaml").write_text(text.replace("sqlite:///ledger.db",
                                                             f"sqlite:///{tmp_path}/b/ledger.db"))
    assert fingerprint(load_config(tmp_path / "c" / "config.yaml")) != before


@pytest.mark.parametrize("began_with", ["draws.jsonl", "state.json"])
def test_o9_a_release_begun_under_the_absolute_fingerprint_still_resumes(tmp_path, data,
                                                                         began_with):
    """A release begun by a version before relative paths (its draw log, or the older
    state.json, and its ledger entry hold the absolute form): the same config resumes it
    under the recorded form; another config is still refused."""
    import json

    from dpatlas.core.config import fingerprint
    from dpatlas.release.draws import DrawLog
    from dpatlas.release.ingest import input_fingerprint
    from dpatlas.release.run_state import InputChanged

    cfg = load_config(_relative_folder(tmp_path / "a", data))
    internal = cfg.publish.internal / "r1"
    absolute, inputs = fingerprint(cfg, relative_paths=False), input_fingerprint(cfg.input)
    assert absolute != fingerprint(cfg)
    if began_with == "state.json":
        internal.mkdir(parents=True)
        (internal / "state.json").write_text(json.dumps(
            {"config_sha256": absolute, "input_sha256": inputs, "started": "2026-11-20"}))
    else:
        DrawLog.open(internal, "r1", absolute, inputs)

    def resume(c):
        return DrawLog.open(internal, "r1", fingerprint(c), inputs,
                            earlier_config_sha256=fingerprint(c, relative_paths=False))

    assert resume(cfg)["config_sha256"] == absolute  # resumed, not "the config changed"
    other = load_config(_relative_folder(tmp_path / "b", data))
    other = other.model_copy(update={"privacy": other.privacy.model_copy(
        update={"epsilon_per_tract": 2.0})})
    with pytest.raises(InputChanged):
        resume(other)


@pytest.mark.parametrize("moved", [False, True])
def test_o9_a_withdrawn_id_is_refused_before_its_input_is_read(tmp_path, data, moved):
    from dpatlas.core.config import fingerprint
    from dpatlas.ledger import Charge
    from dpatlas.release.draws import DrawLog
    from dpatlas.release.ingest import input_fingerprint
    from tests.support.cli import OWN_SERVER

    cfg_path = _relative_folder(tmp_path / "a", data)
    cfg = load_config(cfg_path)  # r1 as its run left it: charged, its draw log begun
    DrawLog.open(cfg.publish.internal / "r1", "r1", fingerprint(cfg),
                 input_fingerprint(cfg.input))
    with Ledger(cfg.ledger.url) as ledger:
        ledger.begin_release("r1", "il", [Charge("all", "primary", "pure", 1.0, 0.0)],
                             fingerprint(cfg), "test-owner")
        ledger.complete_release("r1", "manifest-sha", "test-owner")
        ledger.withdraw_release("r1", "wrong boundaries")
    if moved:
        (tmp_path / "a").rename(tmp_path / "b")
        cfg_path = tmp_path / "b" / "config.yaml"
    before = _charges(cfg_path)
    res = run_in_process("release", "-c", cfg_path, "--release-id", "r1", env=OWN_SERVER)
    text = refusal_block(res)
    assert "withdrawn" in text and "config changed" not in text, text
    assert not (cfg_path.parent / "releases-internal" / "r1" / "staged").exists()  # nothing read
    assert _charges(cfg_path) == before


# --- O11: bad arguments are one line and exit 2, never a traceback ---------------------------

FAST = ("--mechanism", "NoisyStats", "--no-rule", "--epsilon", "1")


@pytest.mark.parametrize("args,says", [
    (("synth", "--tracts", "-5"), "--tracts -5"),
    (("synth", "--states", "99"), "not state FIPS codes: 99"),
    (("synth", "--states", ""), "one or more state FIPS codes"),
    (("synth", "--states", "37,37"), "37 more than once"),
    (("synth", "--states", "ab"), "not state FIPS codes: ab"),
    (("synth", "--tracts", "3", "--out", "/proc/x"), "/proc/x"),
    # (small, so that today's code, which ran them until it failed, fails fast too)
    (("evaluate", "--reps", "0", "--tracts", "5", *FAST), "--reps 0"),
    (("evaluate", "--reps", "-5", "--tracts", "5", *FAST), "--reps -5"),
    (("evaluate-rule", "--reps", "0", "--tracts", "5", "--large-tracts", "5",
      "--scenario", "demo"), "--reps 0"),
    (("evaluate-small-area", "--seed", "-1", "--quick", "--tracts", "20"), "--seed -1"),
    (("evaluate", "--out", "/proc/x", "--reps", "1", "--tracts", "5", *FAST), "/proc/x"),
    (("server", "start", "--port", "70000"), "--port 70000"),
    (("server", "start", "--port", "-1"), "--port -1"),
])
def test_o11_bad_arguments_are_one_line(tmp_path, args, says):
    res = run_in_process(*args, cwd=tmp_path)
    assert says in refusal_block(res)


@pytest.mark.parametrize("pid", [10**20, 0, -1, 1, "12"])
@pytest.mark.parametrize("command", ["status", "stop"])
def test_o11_a_corrupt_server_record_is_named_and_nothing_is_signalled(tmp_path, pid, command,
                                                                      monkeypatch):
    import os

    signalled = []
    monkeypatch.setattr(os, "killpg", lambda *a: signalled.append(a))
    monkeypatch.setattr(os, "kill", lambda *a: signalled.append(a))
    record = tmp_path / "dpatlas-server.json"
    record.write_text(json.dumps({"pid": pid, "url": "http://127.0.0.1:9/api", "port": 9}))
    res = run_in_process("server", command, "--home", tmp_path)
    text = refusal_block(res)
    assert str(record) in text and "damaged" in text, text
    assert signalled == []


def test_o11_a_tiny_epsilon_is_a_config_error_before_the_input_is_read(tmp_path, data):
    from tests.integration.test_preflight import config

    cfg = config(tmp_path, data, privacy={"epsilon_per_tract": 0.5})
    cfg.write_text(cfg.read_text().replace("epsilon_per_tract: 0.5", "epsilon_per_tract: 1e-300"))
    res = run_in_process("release", "-c", cfg, "--release-id", "r1")
    text = refusal_block(res)
    assert "privacy.epsilon_per_tract" in text and "at least 0.001" in text, text
    assert not (tmp_path / "internal").exists()


def test_o11_ledger_show_json_keeps_stdout_for_json(tmp_path):
    res = run_in_process("ledger", "show", "--json", "-c", tmp_path / "missing.yaml")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("error:") and "missing.yaml" in res.stderr


# --- O12, the command line's parts ---------------------------------------------------------------


@pytest.mark.parametrize("schedule,key", [({"cron": "61 * * * *"}, "schedule.cron"),
                                          ({"cron": "0 3 1 * *", "timezone": "Mars/Olympus"},
                                           "schedule.timezone")])
def test_o12_config_check_refuses_what_serving_refuses(tmp_path, data, schedule, key):
    from deploy.schedule import cron_schedule
    from dpatlas.core.config import ConfigError
    from tests.integration.test_preflight import config

    cfg = config(tmp_path, data, schedule=schedule)
    with pytest.raises(ConfigError, match=key):  # what `python -m deploy.serve` says
        cron_schedule(load_config(cfg).schedule)
    res = run_in_process("config", "check", cfg)
    assert key in refusal_block(res)


def test_o12_set_cap_without_delta_keeps_the_delta_cap(tmp_path, data):
    from tests.integration.test_preflight import config

    cfg = config(tmp_path, data)  # cap eps 10, delta 1e-5
    res = run_in_process("ledger", "set-cap", "-c", cfg, "--dataset", "il", "--epsilon", "12",
                         "--reason", "more releases")
    assert res.returncode == 0, res.stdout + res.stderr
    with Ledger(load_config(cfg).ledger.url, create=False) as ledger:
        assert ledger.cap("il") == (12.0, 1e-5)
        # a dataset's first cap needs its delta: refused, nothing written
        first = run_in_process("ledger", "set-cap", "-c", cfg, "--dataset", "new",
                               "--epsilon", "1", "--reason", "first")
        assert "--delta" in refusal_block(first)
        assert ledger.cap("new") is None


@pytest.mark.parametrize("command", [("withdraw", "r1", "--reason", "wrong"),
                                     ("purge", "--older-than", "0")])
def test_o12_withdraw_and_purge_refuse_a_ledger_that_is_not_there(tmp_path, data, command):
    from tests.integration.test_preflight import config

    cfg = config(tmp_path, data)
    typo = tmp_path / "ledgr.db"
    cfg.write_text(cfg.read_text().replace(str(tmp_path / "ledger.db"), str(typo)))
    res = run_in_process(*command, "-c", cfg)
    assert str(typo) in refusal_block(res) and "no privacy-budget ledger" in res.stdout
    assert not typo.exists()


def test_o12_purge_never_follows_a_linked_staged_folder_and_names_it(tmp_path, data):
    import os

    from tests.integration.test_operator_defects_cli import charge
    from tests.integration.test_preflight import config

    cfg = config(tmp_path, data)
    internal = load_config(cfg).publish.internal
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "keep.parquet").write_bytes(b"someone else's")
    for rid in ("r1", "r2"):
        charge(cfg, rid, 1.0)
        (internal / rid).mkdir(parents=True)
    os.symlink(outside, internal / "r1" / "staged")
    (internal / "r2" / "staged").mkdir()
    (internal / "r2" / "staged" / "part.parquet").write_bytes(b"rows")
    res = run_in_process("purge", "-c", cfg, "--older-than", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert (outside / "keep.parquet").read_bytes() == b"someone else's"
    assert str(internal / "r1" / "staged") in res.stdout and "symbolic link" in res.stdout
    assert not (internal / "r2" / "staged").exists()  # the others are purged all the same


def test_o12_server_start_with_a_file_as_home_says_so(tmp_path):
    home = tmp_path / "file"
    home.write_text("")
    res = run_in_process("server", "start", "--home", home, "--port", "4299")
    assert f"--home {home} is not a folder" in refusal_block(res)


def test_o12_a_second_server_start_at_once_is_told_one_is_starting(tmp_path):
    import fcntl
    import os

    from tests.support.prefect_server import free_port

    lock = os.open(tmp_path / "dpatlas-server.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)  # the first `server start`, still starting
    try:
        res = run_in_process("server", "start", "--home", tmp_path, "--port",
                             free_port(), "--timeout", "1")
    finally:
        os.close(lock)
    assert "another `dpatlas server start` is starting" in refusal_block(res)
    assert not (tmp_path / "dpatlas-server.json").exists()


def test_o12_a_read_only_internal_folder_is_named(tmp_path, monkeypatch):
    import errno

    from tests.support.cli import stand_in_config, stand_in_release

    def read_only(config, rid, seed):  # as os.fsync of a folder says it: no file named
        raise OSError(errno.EROFS, "Read-only file system")

    stand_in_release(monkeypatch, read_only)
    cfg = stand_in_config(tmp_path)
    text = refusal_block(run_in_process("release", "-c", cfg, "--release-id", "r7"))
    assert "Read-only file system" in text and str(tmp_path / "out-internal" / "r7") in text


@pytest.mark.parametrize("args,says", [(("--release-id", "latest"), "reserved"),
                                       (("--profile", "bogus"), "--profile 'bogus'")])
def test_o12_demo_refuses_bad_arguments_before_writing_anything(tmp_path, args, says):
    res = run_in_process("demo", "--out", tmp_path / "demo", *args)
    assert says in refusal_block(res)
    assert not (tmp_path / "demo").exists()


# --- O8: a rerun whose wait times out says the run goes on -----------------------------------


def test_o8_a_rerun_that_times_out_says_the_run_may_still_publish_and_charge(tmp_path, data,
                                                                              monkeypatch):
    import deploy.trigger
    from tests.integration.test_preflight import config

    cfg = config(tmp_path, data)
    scheduled = deploy.trigger.TriggeredRun("0f0e", "gentle-fox", "SCHEDULED", None, None)
    monkeypatch.setattr(deploy.trigger, "trigger_release", lambda *a, **k: scheduled)
    res = run_in_process("rerun", "r1", "-c", cfg, "--timeout", "0.001",
                         env={"PREFECT_API_URL": "http://127.0.0.1:4200/api"})
    out = " ".join(res.stdout.split())
    assert res.returncode == 1, out
    assert "nothing was published" not in out and "nothing was charged" not in out, out
    assert "may still publish and charge release r1" in out, out
    assert "http://127.0.0.1:4200/runs/flow-run/0f0e" in out and "SCHEDULED" in out, out


# --- O7: the Prefect server going away during a release ---------------------------------------

_SERVER_GOES_AWAY = """
import contextlib, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import flows.release
import dpatlas.cli.commands as C
import dpatlas.cli.release_commands as R
import dpatlas.cli.prefect_server as ps
from dpatlas.core.config import load_config


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args):
        pass


RUN_SECONDS = float(sys.argv[1])
server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()


class Api:
    url = f"http://127.0.0.1:{server.server_address[1]}/api"
    used = "a stand-in Prefect server"

    def ready(self):
        pass


def release(config, rid, seed):  # the run is under way when its server is stopped
    server.shutdown()
    server.server_close()
    time.sleep(RUN_SECONDS)


ps.prefect_api = lambda *a, **k: contextlib.nullcontext(Api())
R._checked_release = lambda c, rid, seed: (load_config(c), rid)
flows.release.release = release
sys.argv = ["dpatlas", *sys.argv[2:]]
C.main()
"""


def test_o7_a_release_whose_prefect_server_goes_away_stops_at_once_and_says_so(tmp_path):
    import time

    from tests.support.cli import stand_in_config

    cfg = stand_in_config(tmp_path)
    start = time.monotonic()
    res = subprocess.run([sys.executable, "-c", _SERVER_GOES_AWAY, "45", "release", "-c",
                          str(cfg), "--release-id", "r7"], capture_output=True, text=True,
                         env=ENV, timeout=120)
    took = time.monotonic() - start
    text = refusal_block(res)
    assert took < 40, took  # it hung for minutes in the client's retries
    assert "Prefect server" in text and "went away" in text, text
    assert f"dpatlas release -c {cfg} --release-id r7" in " ".join(text.split()), text


def test_o7_server_stop_refuses_while_a_flow_run_is_in_progress(tmp_path):
    import json as json_
    import os
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Api(BaseHTTPRequestHandler):
        def do_POST(self):  # /api/flow_runs/filter: one release running
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json_.dumps([{"id": "0f0e", "name": "r1-release"}]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    api = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    prefect = tmp_path / "bin" / "prefect"  # a process that looks like `prefect server`
    prefect.parent.mkdir()
    os.symlink(sys.executable, prefect)
    server = subprocess.Popen([str(prefect), "-c", "import time; time.sleep(120)", "server"],
                              start_new_session=True)
    home = tmp_path / "home"
    home.mkdir()
    (home / "dpatlas-server.json").write_text(json_.dumps({
        "pid": server.pid, "url": f"http://127.0.0.1:{api.server_address[1]}/api"}))
    try:
        res = run_in_process("server", "stop", "--home", home)
        text = refusal_block(res)
        assert "r1-release" in text and "--force" in text, text
        assert server.poll() is None and (home / "dpatlas-server.json").exists()
        forced = run_in_process("server", "stop", "--home", home, "--force")
        assert forced.returncode == 0, forced.stdout + forced.stderr
        assert server.wait(timeout=30) is not None
    finally:
        if server.poll() is None:
            server.kill()
        api.shutdown()
        api.server_close()


_KILL_SERVER_AFTER_CHARGE = """
import os, signal, sys

from dpatlas.cli.commands import main
from dpatlas.cli.prefect_server import read_server_record
from dpatlas.release import crash


def kill_the_server(point):
    if point == "after-ledger-charge":
        os.killpg(read_server_record().pid, signal.SIGKILL)


crash.install_fault_hook(kill_the_server)
sys.argv = ["dpatlas", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_o7_the_dpatlas_server_killed_during_a_release_then_the_rerun_finishes_it(tmp_path,
                                                                                  data):
    import time

    from tests.integration.test_preflight import charges, config
    from tests.support.prefect_server import free_port

    cfg = config(tmp_path, data)
    env = {**ENV, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    started = subprocess.run([sys.executable, "-m", "dpatlas.cli.commands", "server", "start",
                              "--port", str(free_port())], env=env, capture_output=True,
                             text=True, timeout=300)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        start = time.monotonic()
        res = subprocess.run([sys.executable, "-c", _KILL_SERVER_AFTER_CHARGE, "release", "-c",
                              str(cfg), "--release-id", "r1", "--noise-seed", "3"], env=env,
                             capture_output=True, text=True, timeout=600)
        took = time.monotonic() - start
        text = refusal_block(res)
        assert "went away" in text and f"--release-id r1" in text, text
        assert took < 150, took  # the run is short; the client's retries took minutes more
        charged = charges(tmp_path)
        assert charged > 0 and _entry(cfg, "r1")["status"] == "in_progress"
    finally:
        subprocess.run([sys.executable, "-m", "dpatlas.cli.commands", "server", "stop",
                        "--force"], env=env, capture_output=True, timeout=120)
    again = subprocess.run([sys.executable, "-m", "dpatlas.cli.commands", "release", "-c",
                            str(cfg), "--release-id", "r1", "--noise-seed", "3"], env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _entry(cfg, "r1")["status"] == "published" and charges(tmp_path) == charged


@pytest.mark.slow
def test_o9_a_release_killed_then_its_folder_moved_resumes_there(tmp_path, data):
    from tests.integration.test_preflight import charges

    cfg_path = _relative_folder(tmp_path / "a", data)
    killed = _crash_at("after-ledger-charge", "release", "-c", cfg_path, "--release-id", "r1",
                       "--noise-seed", "3")
    assert killed.returncode == -9, killed.stdout + killed.stderr
    charged = charges(tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / "b")  # the demo folder moved, byte for byte
    # its lease names the old internal folder, as another host's would: waited out
    _expire_lease(tmp_path / "b" / "config.yaml", "r1")
    res = subprocess.run([sys.executable, "-m", "dpatlas.cli.commands", "release", "-c",
                          str(tmp_path / "b" / "config.yaml"), "--release-id", "r1",
                          "--noise-seed", "3"], capture_output=True, text=True, env=ENV,
                         timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "b" / "releases" / "r1" / "manifest.json").is_file()
    assert charges(tmp_path / "b") == charged
