"""The release flow's structure (issue 19, item 4): pre-charge refusals are one `preflight`
task run, visible in Prefect; chunks fan out with `.map` without changing a seeded release's
bytes; faults are injected by tests, never read from the environment by production code."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402

from tests.support.inputs import write_config  # noqa: E402
from tests.support.paths import REPO  # noqa: E402

# sha256 of the data files of the seeded release below, recorded on the code before the flow
# was restructured (commit a65d230): seeded noise, one draw per chunk and stage, so any change
# in which draw feeds which tract, or in their order, changes these bytes. Re-recorded when
# issue 21 item 6 put the synthetic state in Illinois' real outline: the input changed (tract
# polygons, hence centroids and the data drawn over them), the release code did not.
# Re-recorded at issue 32, whose interval step changed on purpose (a third draw per tract,
# standard errors of the total error, margins of error): the flow's structure did not.
# tracts.geojson re-recorded at issue 33: coordinates at 6 decimals (RFC 7946 section 11.2).
# All three re-recorded at issue 33 item 4: a public `name` column (Census-style) was added;
# the values and the flow's structure did not change.
# tracts.geojson re-recorded at issue 35: its vertices are rounded one by one (snap-rounded only
# where that breaks a polygon), so each ring starts where the boundary file's does; the 90
# features' properties and ids are the same, each polygon `shapely.equals` the recorded one.
SEEDED_RELEASE_SHA256 = {
    "tracts.csv": "9aaa64e6313372d08596e5cf7e54449bbc5283e416e35aca7ec886befe7b3373",
    "tracts.geojson": "3dde5e925485a1059b485ef350f5a93c099f82b0dfe936f081c3772390edc6a2",
    "tracts.parquet": "0b7acc1e0a172f091b898949dc508b2cc174690af024901a148258fbe019dc04",
}


@pytest.fixture(scope="module", autouse=True)
def prefect_server():
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="module")
def small_state(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=5, params=StateParams(n_tracts=90, counties=3))
    return out


def make_config(tmp: Path, data: Path, **over) -> Path:
    cfg = {"input": {"path": str(data / "microdata")},
           "boundaries": {"path": str(data / "tracts.parquet")},
           "privacy": {"epsilon_per_tract": 1.0},
           "selection": {"rule": "dp", "threshold": 3.0},
           "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
           "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"},
           "partition_tracts": 30}
    return write_config(tmp / "config.yaml", cfg, **over)


def flow_task_runs(state, ready=lambda runs: True, looks: int = 600) -> list:
    """The task runs of the flow run that ended in ``state`` (the Prefect server's record).

    Prefect records task-run states from events, after the flow has returned: the client's
    events are drained, then the record is read until ``ready`` holds (a readiness wait, not
    an assertion; at most ``looks`` reads, 0.2 s apart)."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all()
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        for _ in range(looks):
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            if ready(runs):
                break
            time.sleep(0.2)
    return runs


def _preflight(runs, final) -> list:
    """The preflight task runs whose recorded state (None until the server has one) passes
    ``final``."""
    return [t for t in runs if t.name.startswith("preflight") and t.state is not None
            and final(t.state)]


def failed_preflight(state) -> list:
    runs = flow_task_runs(state, ready=lambda runs: _preflight(runs, lambda s: s.is_failed()))
    return _preflight(runs, lambda s: s.is_failed())


@pytest.mark.parametrize("over, seed, refusal, stage", [
    ({"publish": {"mode": "public"}}, 3, "a noise seed makes the noise repeatable",
     "before-writing"),
    ({"publish": {"min_n": 100000}}, 3, "every tract has fewer than publish.min_n",
     "before-charge"),
])
def test_a_refusal_is_a_failed_preflight_task_run_with_its_message(small_state, tmp_path,
                                                                    over, seed, refusal, stage):
    from dpatlas.ledger import Ledger
    from dpatlas.release.preflight import PreflightError
    from flows.release import release

    config = make_config(tmp_path, small_state, **over)
    state = release(str(config), "r1", seed, return_state=True)
    assert state.is_failed()
    error = state.result(raise_on_failure=False)
    assert isinstance(error, PreflightError) and refusal in str(error)  # the flow still refuses
    runs = failed_preflight(state)
    assert [t.name for t in runs] == [f"preflight-{stage}"]
    assert refusal in runs[0].state.message
    assert Ledger(f"sqlite:///{tmp_path / 'ledger.db'}").release("r1") is None  # not charged
    assert not (tmp_path / "releases" / "r1").exists()  # nothing published
    if stage == "before-writing":  # nothing written at all, not even the internal folder
        assert not (tmp_path / "internal").exists()


def test_a_seeded_release_is_byte_identical_to_the_one_before_the_restructuring(small_state,
                                                                               tmp_path):
    from flows.release import release

    state = release(str(make_config(tmp_path, small_state)), "r1", 11, return_state=True)
    folder = Path(state.result().folder)
    got = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
           for name in SEEDED_RELEASE_SHA256}
    # Features gained their GEOID as "id" after the recording (issue 21): the GeoJSON without
    # it must be the recorded bytes, and the ids nothing but the GEOIDs.
    got["tracts.geojson"] = hashlib.sha256(_without_feature_ids(folder / "tracts.geojson")
                                           ).hexdigest()
    assert got == SEEDED_RELEASE_SHA256
    preflight = _preflight(flow_task_runs(
        state, ready=lambda runs: len(_preflight(runs, lambda s: s.is_completed())) == 2),
        lambda s: True)
    assert sorted(t.name for t in preflight if t.state.is_completed()) == [
        "preflight-before-charge", "preflight-before-writing"]


def _without_feature_ids(path: Path) -> bytes:
    """The GeoJSON's bytes as written before features had an ``id``, after checking that
    each id is its feature's GEOID (written as write_geojson_rfc7946 writes)."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    for feature in doc["features"]:
        assert feature.pop("id") == feature["properties"]["geoid"]
    return json.dumps(doc, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":")).encode("utf-8")


def test_crash_points_read_no_environment_and_call_the_injected_fault_hook(monkeypatch):
    from dpatlas.release import crash

    monkeypatch.setenv("DPATLAS_CRASH_AT", "after-publish")  # what used to kill the process
    crash.crashpoint("after-publish")  # still alive: production code reads no variable
    seen = []
    monkeypatch.setattr(crash, "fault_hook", seen.append)
    crash.crashpoint("after-publish")
    assert seen == ["after-publish"]


def test_the_release_path_reads_no_environment_variable():
    """Faults and clocks are injected by tests; the release path's behaviour is its config's."""
    root = REPO
    sources = [p for d in ("flows", "tasks", "dpatlas/release", "dpatlas/ledger")
               for p in sorted((root / d).rglob("*.py"))]
    assert len(sources) > 20
    readers = [str(p.relative_to(root)) for p in sources
               if re.search(r"\bos\.environ\b|\bgetenv\(|\benviron\[", p.read_text())]
    assert readers == []


def test_a_lease_expires_by_the_injected_clock_not_by_waiting(tmp_path):
    from dpatlas.ledger import Charge, Ledger

    now = [1_000_000.0]
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", clock=lambda: now[0])
    try:
        ledger.set_cap("il", 10.0, 1e-5, reason="test set-up")
        charge = [Charge("all", "step", "pure", 0.5, 0.0)]
        ledger.begin_release("r1", "il", charge, "c" * 64, "host-a", lease_seconds=30)
        assert ledger.release("r1")["lease_expires"] == 1_000_030.0
        assert ledger.check_lease("r1", "host-a") == 30.0
        now[0] += 31
        assert ledger.check_lease("r1", "host-a") == -1.0
        assert ledger.begin_release("r1", "il", charge, "c" * 64, "host-b",
                                    lease_seconds=30) == "resume"
    finally:
        ledger.close()


def test_runs_are_named_by_release_and_chunk_and_artifact_names_its_files(small_state,
                                                                         tmp_path):
    """Issue 21: the release run, its subflow and its task runs are named after the release
    and the chunk (a run that chose its id itself is renamed once it has one), and the summary
    artifact names each file in its folder of the publish root, never as a path of this
    machine (links only under publish.base_url: tests/unit/release/test_summary_links.py)."""
    import re

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId,
                                                FlowRunFilter, FlowRunFilterParentFlowRunId)

    from flows.release import release
    from tasks.report import SUMMARY_KEY

    state = release(str(make_config(tmp_path, small_state)), None, 11, return_state=True)
    outcome = state.result()
    rid, run_id = outcome.release_id, state.state_details.flow_run_id
    chunks = sorted(p.stem for p in (tmp_path / "internal" / rid / "results").glob("*.parquet"))
    assert len(chunks) == 3
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run_id).name == f"release-{rid}"
        subflows = {s.name: s for s in client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])))}
        # selection and estimation, then the publish parts (issue 35): each a named subflow
        assert sorted(subflows) == [f"publish-parts-{rid}", f"select-estimate-{rid}"]
        sub = subflows[f"select-estimate-{rid}"]
        parts = {t.name for t in flow_task_runs(subflows[f"publish-parts-{rid}"].state,
                                                ready=lambda runs: len(runs) == 2)}
        # one state: one part, its tiles built in it; then the overview maps
        assert parts == {"publish-part-all", "overview"}
        # the local runner: a task run per chunk while there are few (dpatlas.release.
        # task_groups), each chunk selected then estimated in it
        names = {t.name for t in flow_task_runs(
            sub.state, ready=lambda runs: len(runs) == len(chunks))}
        assert names == {f"select-estimate-{c}" for c in chunks}
        [summary] = [a for a in client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))) if a.key == SUMMARY_KEY]
    # the boundary file is read while the input is validated (its own task run, submitted
    # before the partitions' checks), and checked against the data's tracts after them
    def of(runs, task: str) -> list:  # Prefect names a task's run <task>-<3 random words>
        return [t for t in runs if t.name.startswith(f"{task}-") and t.end_time]

    own = flow_task_runs(state, ready=lambda runs: of(runs, "read-boundaries")
                         and of(runs, "check-boundaries"))
    [read], [check] = of(own, "read-boundaries"), of(own, "check-boundaries")
    validated = max(t.end_time for t in own if t.name.startswith("validate-"))
    assert read.start_time < validated < check.start_time
    # no publish.base_url: no link (relative ones 404 in the UI); each file and its folder
    # named, every one there (issue 33)
    assert re.findall(r"\]\(([^)]*)\)", summary.data) == []
    named = re.findall(r"^- `([^`]*)`$", summary.data, re.MULTILINE)
    assert sorted(named) == sorted(outcome.files)
    assert f"folder `{rid}/` of the publish root" in summary.data
    assert "file:" not in summary.data and str(tmp_path) not in summary.data
    root = tmp_path / "releases"
    assert all((root / rid / name).is_file() for name in named)


def test_local_runner_selects_and_estimates_runs_of_chunks_drawing_as_one_per_chunk(
        small_state, tmp_path, monkeypatch):
    """With more chunks than LOCAL_TASK_GROUPS the local runner gives each task run a run of
    consecutive chunks (dpatlas.release.task_groups), and every chunk still draws once under
    its own name and seed, here computed in the release's worker processes
    (dpatlas.release.compute_pool): the same estimates, bit for bit, as a task run per chunk
    computed on the flow's threads."""
    import pandas as pd

    import flows.cluster as cluster
    from dpatlas.release import compute_pool
    from dpatlas.release.draws import DrawLog
    from flows.release import release

    config = make_config(tmp_path, small_state, partition_tracts=4)
    monkeypatch.setattr(cluster, "LOCAL_TASK_GROUPS", 5)
    monkeypatch.setattr(compute_pool, "MIN_RECORDS", 0)  # the small state in processes
    started = []
    real_pool = compute_pool.compute_pool

    def recorded_pool(processes):
        started.append(processes)
        return real_pool(processes)

    monkeypatch.setattr("flows.release.compute_pool", recorded_pool)
    grouped = release(str(config), "grouped", 11, return_state=True)
    assert started == [2]  # the config's default local_processes
    monkeypatch.setattr(cluster, "LOCAL_TASK_GROUPS", 10_000)
    release(str(make_config(tmp_path, small_state, partition_tracts=4, local_processes=0)),
            "one-per-chunk", 11)
    assert started == [2, 0]

    internal = tmp_path / "internal"
    chunks = sorted(p.stem for p in (internal / "grouped" / "results").glob("*.parquet"))
    assert len(chunks) > 5
    for rid in ("grouped", "one-per-chunk"):
        drawn = DrawLog(internal / rid).draws()
        assert sorted(drawn) == sorted((s, c) for s in ("select", "estimate") for c in chunks)
    for chunk in chunks:
        pd.testing.assert_frame_equal(
            pd.read_parquet(internal / "grouped" / "results" / f"{chunk}.parquet"),
            pd.read_parquet(internal / "one-per-chunk" / "results" / f"{chunk}.parquet"))

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    with get_client(sync_client=True) as client:
        [sub] = [s for s in client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(
                any_=[grouped.state_details.flow_run_id])))
            if s.name == "select-estimate-grouped"]
    names = sorted(t.name for t in flow_task_runs(sub.state, ready=lambda runs: len(runs) >= 2))
    assert 2 <= len(names) <= 5
    # each run names its first and last chunk; together they hold every chunk in order
    spans = [re.fullmatch(r"select-estimate-(input-[\w-]+?)(?:-to-(input-[\w-]+))?", n).groups()
             for n in names]
    firsts = sorted(first for first, _ in spans)
    assert firsts[0] == chunks[0] and set(firsts) <= set(chunks)
