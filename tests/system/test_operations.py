"""Operations: crash recovery (SIGKILL at several points), reruns, concurrency, the budget cap,
and the Dask runner, each through the real command line in subprocesses."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
from tests.support.dask_cluster import dask_processes
from tests.support.inputs import write_config
from tests.support.paths import CRASH_AT
from tests.support.prefect_server import prefect_server

pytestmark = pytest.mark.slow

CRASH_POINTS = ["after-ledger-charge", "after-select-input-17-1", "after-estimate-input-17-0",
                "after-publish", "after-ledger-complete"]


@pytest.fixture(scope="module")
def api_url(tmp_path_factory):
    with prefect_server(tmp_path_factory.mktemp("prefect")) as url:
        yield url


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=9, params=StateParams(n_tracts=60, counties=3))
    return out


def config(tmp: Path, data: Path, **over) -> Path:
    cfg = {"input": {"path": str(data / "microdata")},
           "boundaries": {"path": str(data / "tracts.parquet")},
           "selection": {"rule": "dp", "threshold": 3.0},
           "publish": {"root": str(tmp / "releases")},
           "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il",
                      "cap_epsilon": 10.0},
           "partition_tracts": 20}
    return write_config(tmp / "config.yaml", cfg, **over)


def logging_workers(api_url: str, folder: Path):
    """Two `dask worker` processes whose Prefect task runs log to their log files."""
    return dask_processes(folder, workers=2,
                          env={"PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "INFO"})


def staged_config(tmp: Path, data: Path, cluster, shared: Path, levels: list[str]) -> Path:
    """runner dask on ``cluster``, staging at the ``file://`` folder ``shared``."""
    return config(tmp, data, runner="dask", dask_address=cluster.address, levels=levels,
                  staging_url=f"file://{shared}")


def cli(api_url: str, *args, crash: str | None = None, wait: bool = True):
    env = {**os.environ, "PREFECT_API_URL": api_url, "COLUMNS": "200",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    # a crash is injected by tests/support/crash_at.py: the command line with a fault hook
    command = ([str(CRASH_AT), crash] if crash
               else ["-m", "dpatlas.cli.commands"])
    proc = subprocess.Popen([sys.executable, *command, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def ledger_rows(tmp: Path) -> pd.DataFrame:
    from dpatlas.ledger import Ledger

    return Ledger(f"sqlite:///{tmp / 'ledger.db'}").entries("il")


def digest(folder: Path) -> dict:
    """What must match between a resumed and an uninterrupted run: the published data files
    and the manifest without its timestamps."""
    out = {f: hashlib.sha256((folder / f).read_bytes()).hexdigest()
           for f in ("tracts.parquet", "tracts.csv", "tracts.geojson")}
    m = json.loads((folder / "manifest.json").read_text())
    # times, and what depends on where the test's temporary folder is
    for key in ("started", "published", "files", "config_sha256", "boundaries"):
        m.pop(key)
    # keyed by a random per-release secret, so two releases of the same input differ here
    commitment = m.pop("input_commitment")
    assert commitment["scheme"] == "hmac-sha256" and len(commitment["value"]) == 64
    m["files_sha"] = {f: v["sha256"] for f, v in
                      json.loads((folder / "manifest.json").read_text())["files"].items()
                      if f != "p25_map.png"}
    out["manifest"] = m
    return out


@pytest.fixture(scope="module")
def baseline(api_url, state, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("baseline")
    rc, out = cli(api_url, "release", "-c", str(config(tmp, state)), "--release-id", "r",
                  "--noise-seed", "11")
    assert rc == 0, out
    return tmp, digest(tmp / "releases" / "r"), ledger_rows(tmp)


def _file_or_pending(path: Path) -> Path:
    return path if path.exists() else path.with_name(path.name + ".unrecorded")


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_then_resume_matches_uninterrupted(api_url, state, baseline, tmp_path, point):
    cfg = config(tmp_path, state)
    rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "r", "--noise-seed", "11",
                  crash=point)
    assert rc == -9, out  # killed by SIGKILL at the crash point
    internal = tmp_path / "releases-internal" / "r"
    # The draws recorded before the crash. A chunk running in the other thread may have
    # persisted its file without recording it when the crash came: that one is drawn again
    # (dpatlas.release.draws.draw_once; nothing read it), so it is not among these.
    log = internal / "draws.jsonl"
    recorded = [json.loads(line) for line in log.read_text().splitlines()[1:]] \
        if log.exists() else []
    # A draw recorded when the crash came before its rename is still under its pending name
    # (dpatlas.release.draws): the resume renames it, so its mtime is kept.
    persisted = {internal / d["path"]: _file_or_pending(internal / d["path"]).stat().st_mtime_ns
                 for d in recorded if d.get("stage") in ("select", "estimate") and "path" in d}
    assert persisted or point == "after-ledger-charge", "the crash came after a draw"
    rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "r", "--noise-seed", "11")
    assert rc == 0, out
    # draws recorded before the crash were reused, not drawn again
    for path, mtime in persisted.items():
        assert path.stat().st_mtime_ns == mtime, path
    _, expected, expected_ledger = baseline
    assert digest(tmp_path / "releases" / "r") == expected
    rows = ledger_rows(tmp_path)
    cols = ["release_id", "cell", "step", "guarantee_type", "epsilon", "delta"]
    pd.testing.assert_frame_equal(rows[cols].reset_index(drop=True),
                                  expected_ledger[cols].reset_index(drop=True))
    assert set(rows["status"]) == {"published"}
    feed = json.loads((tmp_path / "releases" / "feed.json").read_text())
    assert feed["_dpatlas"]["latest"] == "r"


def test_staged_release_crashed_after_its_selections_resumes_from_them(api_url, state,
                                                                        baseline, tmp_path):
    """Staged at a file:// URL (the local runner's threads play the workers): killed once the
    flow has recorded every selection, the resumed release reuses them (not redrawn) and
    publishes what the unstaged, uninterrupted release published."""
    shared = tmp_path / "shared"
    cfg = config(tmp_path, state, staging_url=f"file://{shared}")
    rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "r", "--noise-seed", "11",
                  crash="after-staged-select")
    assert rc == -9, out
    selections = {p: p.stat().st_mtime_ns for p in (shared / "r" / "selection").glob("*.parquet")}
    assert len(selections) == 3 and not (shared / "r" / "results").exists()
    rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "r", "--noise-seed", "11")
    assert rc == 0, out
    for path, mtime in selections.items():
        assert path.stat().st_mtime_ns == mtime, path
    assert digest(tmp_path / "releases" / "r") == baseline[1]


def test_rerun_is_a_noop_and_new_id_is_charged(api_url, state, tmp_path):
    cfg = config(tmp_path, state)
    assert cli(api_url, "release", "-c", str(cfg), "--release-id", "a")[0] == 0
    manifest = (tmp_path / "releases" / "a" / "manifest.json").read_bytes()
    n_rows = len(ledger_rows(tmp_path))
    rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "a")
    assert rc == 0 and "already published" in out
    assert (tmp_path / "releases" / "a" / "manifest.json").read_bytes() == manifest
    assert len(ledger_rows(tmp_path)) == n_rows  # nothing charged
    assert cli(api_url, "release", "-c", str(cfg), "--release-id", "b")[0] == 0
    rows = ledger_rows(tmp_path)
    assert len(rows) == 2 * n_rows  # a fresh draw is a new id and is charged again
    rc, out = cli(api_url, "ledger", "show", "-c", str(cfg))
    assert rc == 0 and "a" in out and "b" in out


def test_cap_refuses_before_any_noise(api_url, state, tmp_path):
    cfg = config(tmp_path, state, ledger={"cap_epsilon": 1.5})
    assert cli(api_url, "release", "-c", str(cfg), "--release-id", "first")[0] == 0
    rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "second")
    assert rc == 2, out
    assert "already spent" in out and "left" in out
    assert not (tmp_path / "releases" / "second").exists()
    assert not (tmp_path / "releases-internal" / "second" / "selection").exists()  # no noise
    assert set(ledger_rows(tmp_path)["release_id"]) == {"first"}


def test_subflow_parameters_over_the_servers_limit_are_refused_before_the_charge(
        api_url, state, tmp_path):
    """The server refuses a flow run whose parameters exceed its limit; found at the subflow
    call, that was after the charge (a national release). The flow measures them first."""
    cfg = config(tmp_path, state, partition_tracts=1)  # 60 chunks: a few KiB of parameters
    env = {"PREFECT_SERVER_API_MAX_PARAMETER_SIZE": "2000"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "big")
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert rc == 2, out
    assert "over the Prefect server's limit of 2,000" in out and "nothing was charged" in out
    assert "Traceback" not in out
    assert ledger_rows(tmp_path).empty
    assert not (tmp_path / "releases-internal" / "big" / "selection").exists()  # no noise


def test_two_operators_same_release(api_url, state, tmp_path):
    cfg = config(tmp_path, state)
    procs = [cli(api_url, "release", "-c", str(cfg), "--release-id", "same", wait=False)
             for _ in range(2)]
    results = [(p.wait(timeout=600), p.stdout.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for rc, out in results:
        if rc == 2:
            assert "being run by" in out or "busy" in out.lower(), out
    rows = ledger_rows(tmp_path)
    assert len(rows) == len(rows.drop_duplicates(["release_id", "cell", "step"]))  # charged once
    assert set(rows["release_id"]) == {"same"}


def test_dask_runner_matches_local(api_url, state, tmp_path):
    local = tmp_path / "local"
    dask = tmp_path / "dask"
    local.mkdir()
    dask.mkdir()
    rc, out = cli(api_url, "release", "-c", str(config(local, state)), "--release-id", "x",
                  "--noise-seed", "5")
    assert rc == 0, out
    rc, out = cli(api_url, "release", "-c", str(config(dask, state, runner="dask",
                                                       dask_workers=2)),
                  "--release-id", "x", "--noise-seed", "5")
    assert rc == 0, out
    a = pd.read_csv(local / "releases" / "x" / "tracts.csv")
    b = pd.read_csv(dask / "releases" / "x" / "tracts.csv")
    pd.testing.assert_frame_equal(a, b)


def test_dask_cluster_of_separate_processes_reads_a_staging_url(api_url, state, tmp_path):
    """`dask scheduler` and two `dask worker` processes on loopback, the release pointed at them
    by dask_address and staging its partitions at a file:// URL: every chunk's select and
    estimate task runs in a worker process (its log names it; the release's own output does
    not), each draw is written at the staging URL (private) and recorded there by URL, and
    the release equals the local runner's with the same seed."""
    local, dask = tmp_path / "local", tmp_path / "dask"
    local.mkdir()
    dask.mkdir()
    levels = ["tract", "county", "state"]  # the chunks and the levels read URLs
    rc, out = cli(api_url, "release", "-c", str(config(local, state, levels=levels)),
                  "--release-id", "x", "--noise-seed", "5")
    assert rc == 0, out
    shared = tmp_path / "shared"
    with logging_workers(api_url, tmp_path / "cluster") as cluster:
        rc, out = cli(api_url, "release", "-c",
                      str(staged_config(dask, state, cluster, shared, levels)),
                      "--release-id", "x", "--noise-seed", "5")
        assert all(w.poll() is None for w in cluster.workers)  # the same workers throughout
    assert rc == 0, out
    chunks = [f"input-17-{k}" for k in range(3)]  # 60 tracts, partition_tracts 20
    worker_logs = "".join(log.read_text() for log in cluster.worker_logs)
    for name in chunks:
        for stage in ("select", "estimate"):
            run = f"Task run '{stage}-{name}'"
            assert f"{run} - Finished in state Completed()" in worker_logs, worker_logs[-3000:]
            assert run not in out  # not run in the release's own process
    assert (shared / "x" / "staged" / "input-17.parquet").is_file()
    for folder in ("selection", "results"):
        for name in chunks:
            file = shared / "x" / folder / f"{name}.parquet"
            assert file.stat().st_mode & 0o777 == 0o600
    draws = [json.loads(line) for line in
             (dask / "releases-internal" / "x" / "draws.jsonl").read_text().splitlines()[1:]]
    url_draws = {(d["stage"], d["chunk"]): d["url"] for d in draws if "url" in d}
    assert url_draws == {(stage, name): f"file://{shared}/x/{folder}/{name}.parquet"
                         for stage, folder, names in (("select", "selection", chunks),
                                                      ("estimate", "results", chunks),
                                                      ("levels", "levels", ["state-17"]))
                         for name in names}
    for table in ("tracts.csv", "counties.csv", "states.csv"):
        a = pd.read_csv(local / "releases" / "x" / table)
        b = pd.read_csv(dask / "releases" / "x" / table)
        pd.testing.assert_frame_equal(a, b)


LEVELS = ["tract", "county", "state"]


@pytest.fixture(scope="module")
def two_states(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("two-states")
    write_synthetic(out, ["17", "18"], seed=9, params=StateParams(n_tracts=40, counties=2))
    return out


@pytest.fixture(scope="module")
def two_states_local(api_url, two_states, tmp_path_factory) -> Path:
    """The two-state release with levels on the local runner (seed 5): what every runner must
    publish."""
    tmp = tmp_path_factory.mktemp("two-states-local")
    rc, out = cli(api_url, "release", "-c", str(config(tmp, two_states, levels=LEVELS)),
                  "--release-id", "x", "--noise-seed", "5")
    assert rc == 0, out
    return tmp / "releases" / "x"


def _same_tables(expected: Path, got: Path) -> None:
    """Every CSV of the release (counties, states, the tracts per state) equal."""
    tables = sorted(p.relative_to(expected) for p in expected.rglob("*.csv"))
    assert {"counties.csv", "states.csv"} <= {str(t) for t in tables}
    assert tables == sorted(p.relative_to(got) for p in got.rglob("*.csv"))
    for table in tables:
        pd.testing.assert_frame_equal(pd.read_csv(expected / table), pd.read_csv(got / table))


def _level_draws(internal: Path) -> list[dict]:
    return [d for d in (json.loads(line) for line in
                        (internal / "draws.jsonl").read_text().splitlines()[1:])
            if d["stage"] == "levels"]


def test_levels_run_on_the_workers_of_a_cluster_of_separate_processes(
        api_url, two_states, two_states_local, tmp_path):
    """Issue 35: with runner dask and a staging URL, each state's level task runs in a `dask
    worker` process (its log names it; the release's own output does not), reads its rows by
    URL and writes its draw there; the flow records it by URL and copies it into the internal
    folder, and the counties and states equal the local runner's."""
    shared, dask = tmp_path / "shared", tmp_path / "dask"
    dask.mkdir()
    with logging_workers(api_url, tmp_path / "cluster") as cluster:
        rc, out = cli(api_url, "release", "-c",
                      str(staged_config(dask, two_states, cluster, shared, LEVELS)),
                      "--release-id", "x", "--noise-seed", "5")
    assert rc == 0, out
    worker_logs = "".join(log.read_text() for log in cluster.worker_logs)
    units = ["state-17", "state-18"]
    for unit in units:
        run = f"Task run 'estimate-levels-{unit}'"
        assert f"{run} - Finished in state Completed()" in worker_logs, worker_logs[-3000:]
        assert run not in out  # not run in the release's own process
        assert (shared / "x" / "levels" / f"{unit}.parquet").stat().st_mode & 0o777 == 0o600
    internal = dask / "releases-internal" / "x"
    assert {d["chunk"]: d["url"] for d in _level_draws(internal)} == {
        unit: f"file://{shared}/x/levels/{unit}.parquet" for unit in units}
    for unit in units:  # the copy the flow publishes from is the draw recorded
        assert ((internal / "levels" / f"{unit}.parquet").read_bytes()
                == (shared / "x" / "levels" / f"{unit}.parquet").read_bytes())
    _same_tables(two_states_local, dask / "releases" / "x")


def test_validation_and_the_contributions_check_run_on_the_workers(api_url, tmp_path):
    """Issue 35: with runner dask and a staging URL, every partition's validation and every
    bucket of the contributions check run in the `dask worker` processes (their logs name
    them; the release's own output does not), each partition staged at the URL by its task;
    the release's Data Docs list every partition's input run, and the release (a person in
    both states, bounded to one record) equals the local runner's."""
    data = tmp_path / "data"
    write_synthetic(data, ["17", "18"], seed=9, params=StateParams(n_tracts=20, counties=2))
    parts = {s: data / "microdata" / f"state={s}" / "part-0.parquet" for s in ("17", "18")}
    frames = {s: pd.read_parquet(p) for s, p in parts.items()}
    frames["18"].loc[[3, 5], "person_id"] = frames["17"].loc[[7, 9], "person_id"].to_numpy()
    frames["18"].to_parquet(parts["18"], index=False)
    bound = {"validation": {"contributions": "bound"}}
    local, dask, shared = tmp_path / "local", tmp_path / "dask", tmp_path / "shared"
    local.mkdir()
    dask.mkdir()
    rc, out = cli(api_url, "release", "-c", str(config(local, data, levels=LEVELS, **bound)),
                  "--release-id", "x", "--noise-seed", "5")
    assert rc == 0, out
    with logging_workers(api_url, tmp_path / "cluster") as cluster:
        rc, out = cli(api_url, "release", "-c", str(config(
            dask, data, runner="dask", dask_address=cluster.address, levels=LEVELS,
            staging_url=f"file://{shared}", **bound)), "--release-id", "x", "--noise-seed", "5")
        assert all(w.poll() is None for w in cluster.workers)
    assert rc == 0, out
    worker_logs = "".join(log.read_text() for log in cluster.worker_logs)
    runs = [f"validate-{s}" for s in ("17", "18")] + [f"contribution-bucket-{b}"
                                                        for b in range(16)]
    for name in runs:
        run = f"Task run '{name}'"
        assert f"{run} - Finished in state Completed()" in worker_logs, worker_logs[-3000:]
        assert run not in out  # not run in the release's own process
    internal = dask / "releases-internal" / "x"
    docs = internal / "data_docs" / "validations"
    assert {"input-17", "input-18"} <= {p.name for p in docs.glob("*/*")}
    assert not (shared / "x" / "contribution-hashes").exists()  # person-level: not kept
    assert not (shared / "x" / "validation-parts").exists()
    assert not (shared / "x" / "quarantine").exists()
    # the bounded partition at the URL is the flow's copy, one record fewer per repeat
    staged = shared / "x" / "staged" / "input-18.parquet"
    assert staged.stat().st_mode & 0o777 == 0o600
    assert staged.read_bytes() == (internal / "staged" / "input-18.parquet").read_bytes()
    assert len(pd.read_parquet(staged)) == len(frames["18"]) - 2
    reports = [json.loads((root / "releases-internal" / "x" / "validation.json").read_text())
               for root in (local, dask)]
    for report in reports:
        report["contributions"]["files_rewritten"] = [
            Path(f).name for f in report["contributions"]["files_rewritten"]]
        report["contributions"].pop("quarantine_file")
        for part in report["partitions"]:
            part.pop("docs_index")
    assert reports[0] == reports[1]
    assert reports[1]["contributions"]["records_removed"] == 2
    _same_tables(local / "releases" / "x", dask / "releases" / "x")


def test_staged_levels_recorded_before_a_crash_are_not_drawn_again(
        api_url, two_states, two_states_local, tmp_path):
    """Killed once the flow has recorded every level draw made on the workers, the resumed
    release reuses them (same files, no new draw, no level task run) and publishes what the
    local runner published."""
    shared, dask = tmp_path / "shared", tmp_path / "dask"
    dask.mkdir()
    with logging_workers(api_url, tmp_path / "cluster") as cluster:
        cfg = staged_config(dask, two_states, cluster, shared, LEVELS)
        rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "x",
                      "--noise-seed", "5", crash="after-staged-levels")
        assert rc == -9, out
        internal = dask / "releases-internal" / "x"
        recorded = _level_draws(internal)
        assert len(recorded) == 2
        drawn = {p: (p.stat().st_mtime_ns, p.read_bytes())
                 for p in (shared / "x" / "levels").glob("*.parquet")}
        assert len(drawn) == 2
        runs_before = cluster.worker_logs[0].read_text() + cluster.worker_logs[1].read_text()
        rc, out = cli(api_url, "release", "-c", str(cfg), "--release-id", "x",
                      "--noise-seed", "5")
        assert rc == 0, out
        runs_after = cluster.worker_logs[0].read_text() + cluster.worker_logs[1].read_text()
    for path, (mtime, data) in drawn.items():
        assert path.stat().st_mtime_ns == mtime and path.read_bytes() == data, path
    assert _level_draws(internal) == recorded  # no new draw
    assert (runs_after.count("Task run 'estimate-levels-")
            == runs_before.count("Task run 'estimate-levels-"))
    _same_tables(two_states_local, dask / "releases" / "x")


def test_runner_dask_starts_one_cluster_for_the_release_and_runs_the_levels_on_it(
        api_url, two_states, two_states_local, tmp_path):
    """Issue 35: runner dask with no dask_address starts one LocalCluster for the release
    (no subflow's task runner starts one of its own), and the level tasks run in its worker
    processes (they name their process: not the release's), sharing the disk; the counties and
    states equal the local runner's."""
    cfg = config(tmp_path, two_states, runner="dask", dask_workers=2, levels=LEVELS)
    proc = cli(api_url, "release", "-c", str(cfg), "--release-id", "x", "--noise-seed", "5",
               wait=False)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert out.count("started the release's Dask cluster") == 1, out
    assert "Creating a new Dask cluster" not in out  # prefect-dask started none of its own
    ran_in = {int(pid) for pid in re.findall(r"state-1[78]: \d+ unit-cells, .* \(process (\d+)\)",
                                             out)}
    assert len(ran_in) >= 1 and proc.pid not in ran_in, out
    _same_tables(two_states_local, tmp_path / "releases" / "x")


def test_two_hosts_one_ledger_one_release(api_url, state, tmp_path):
    """Two processes with their own lock folders (as two hosts would have) and one ledger: the
    ledger's lease lets exactly one of them work the release; the id is charged once and
    published once."""
    shared = {"publish": {"root": str(tmp_path / "releases")},
              "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}", "dataset": "il"}}
    cfgs = []
    for host in ("host-a", "host-b"):
        (tmp_path / host).mkdir()
        cfgs.append(config(tmp_path / host, state, publish={
            **shared["publish"], "internal_root": str(tmp_path / host / "internal")},
            ledger=shared["ledger"]))
    procs = [cli(api_url, "release", "-c", str(c), "--release-id", "one", wait=False)
             for c in cfgs]
    results = [(p.wait(timeout=600), p.stdout.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes in ([0, 0], [0, 2]), results
    for rc, out in results:
        if rc == 2:
            assert "lease" in out.lower() or "busy" in out.lower(), out
        elif "already published" not in out:
            assert "published" in out, out
    rows = ledger_rows(tmp_path)
    assert len(rows) == len(rows.drop_duplicates(["release_id", "cell", "step"]))
    assert set(rows["status"]) == {"published"}
    # exactly one host did the work: only its scratch folder holds estimates
    worked = [h for h in ("host-a", "host-b")
              if list((tmp_path / h / "internal" / "one").glob("results/*.parquet"))]
    assert len(worked) == 1, worked
