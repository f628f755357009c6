"""The release flow resumes from its draw log alone (issue 19, item 4: one "draw once"
checkpoint; dpatlas/release/draws.py): a crash between a draw and its record, a tampered
recorded draw, and a release begun by the version with ``state.json``. The release is the
seeded one of test_flow_structure.py, so a resumed run must publish its recorded bytes."""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402
from dpatlas.release import crash  # noqa: E402
from dpatlas.release.draws import DRAWS_FILE, DrawLog  # noqa: E402

from tests.integration.test_flow_structure import (  # noqa: E402
    SEEDED_RELEASE_SHA256, _without_feature_ids, make_config)

ALL_DRAWS = {(stage, f"input-17-{k}") for stage in ("select", "estimate") for k in range(3)}


@pytest.fixture(scope="module", autouse=True)
def prefect_server():
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="module")
def small_state(tmp_path_factory) -> Path:  # the data of test_flow_structure's seeded release
    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=5, params=StateParams(n_tracts=90, counties=3))
    return out


class Crash(Exception):
    pass


@pytest.fixture
def draws_made(monkeypatch) -> list:
    """Every noise draw the release's tasks make, as (stage, chunk): the drawing tasks
    (selection, estimates, levels) all draw through tasks.draws.draw_computed."""
    import tasks.draws

    made = []

    def counted(log, stage, chunk, out, draw, *args, real=tasks.draws.draw_once, **kwargs):
        def counting_draw():
            made.append((stage, chunk))
            return draw()
        return real(log, stage, chunk, out, counting_draw, *args, **kwargs)

    monkeypatch.setattr(tasks.draws, "draw_once", counted)
    return made


def crash_at(monkeypatch, point: str) -> None:
    def hook(name: str) -> None:
        if name == point:
            raise Crash(name)
    monkeypatch.setattr(crash, "fault_hook", hook)


def crashed_release(monkeypatch, config: Path, point: str) -> None:
    """Run the release until it crashes at ``point``; later runs go on uninterrupted."""
    crash_at(monkeypatch, point)
    with pytest.raises(Crash):
        release(config)
    monkeypatch.setattr(crash, "fault_hook", None)


def release(config: Path):
    from flows.release import release as run

    return run(str(config), "r1", 11)


def published_sha256(outcome) -> dict:
    """As the seeded release's test compares them: the GeoJSON without its feature ids (added
    after the recording; each checked to be its GEOID)."""
    folder = Path(outcome.folder)
    got = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
           for name in SEEDED_RELEASE_SHA256}
    got["tracts.geojson"] = hashlib.sha256(
        _without_feature_ids(folder / "tracts.geojson")).hexdigest()
    return got


def recorded_files(internal: Path) -> dict:
    return {key: (internal / line["path"]).read_bytes()
            for key, line in DrawLog(internal).draws().items()}


def test_a_crash_between_a_draw_and_its_record_redraws_only_that_unseen_draw(
        small_state, tmp_path, monkeypatch, draws_made):
    config, internal = make_config(tmp_path, small_state), tmp_path / "internal" / "r1"
    crashed_release(monkeypatch, config, "before-record-select-input-17-1")
    unseen = internal / "selection" / "input-17-1.parquet.unrecorded"  # its pending name
    assert unseen.exists()  # persisted, never recorded: nothing downstream read it
    before = recorded_files(internal)
    assert ("select", "input-17-1") not in before
    assert ("estimate", "input-17-1") not in before  # its estimate never ran
    first_run = Counter(draws_made)
    draws_made.clear()

    outcome = release(config)
    assert outcome.status == "published"
    # on resume only what the log did not record was drawn, each once: the recorded draws
    # were reused, the unseen selection of input-17-1 drawn again
    assert sorted(draws_made) == sorted(ALL_DRAWS - set(before))
    assert ("select", "input-17-1") in draws_made and first_run[("select", "input-17-1")] == 1
    after = recorded_files(internal)
    assert all(after[key] == data for key, data in before.items())  # not replaced
    assert set(after) == ALL_DRAWS
    assert len((internal / DRAWS_FILE).read_text().splitlines()) == 1 + len(ALL_DRAWS)
    assert published_sha256(outcome) == SEEDED_RELEASE_SHA256  # as if never interrupted


def test_a_tampered_recorded_draw_stops_the_resume_and_restoring_it_resumes(
        small_state, tmp_path, monkeypatch, draws_made):
    from dpatlas.cli.common import operator_errors as _operator_errors
    from dpatlas.ledger import Ledger
    from dpatlas.release.draws import PersistedDrawChanged

    config, internal = make_config(tmp_path, small_state), tmp_path / "internal" / "r1"
    crashed_release(monkeypatch, config, "after-estimate-input-17-0")
    selection = internal / "selection" / "input-17-0.parquet"
    original = selection.read_bytes()
    pd.read_parquet(selection).iloc[1:].to_parquet(selection, index=False)  # a tract dropped
    tampered = selection.read_bytes()
    assert tampered != original
    draws_made.clear()

    with pytest.raises(PersistedDrawChanged) as err:
        release(config)
    assert isinstance(err.value, _operator_errors())  # the command line: its message, exit 2
    assert str(selection) in str(err.value) and "never drawn again" in str(err.value)
    assert ("select", "input-17-0") not in draws_made  # not silently redrawn
    assert selection.read_bytes() == tampered  # nor overwritten
    assert not (tmp_path / "releases" / "r1").exists()  # nothing published from it
    assert Ledger(f"sqlite:///{tmp_path / 'ledger.db'}").release("r1")["status"] == "in_progress"

    selection.write_bytes(original)  # the way out: restore the recorded draw, run again
    draws_made.clear()
    outcome = release(config)
    assert outcome.status == "published"
    assert ("select", "input-17-0") not in draws_made
    assert ("estimate", "input-17-0") not in draws_made
    assert published_sha256(outcome) == SEEDED_RELEASE_SHA256


def test_a_release_begun_with_state_json_resumes_without_drawing_again(
        small_state, tmp_path, monkeypatch, draws_made):
    config, internal = make_config(tmp_path, small_state), tmp_path / "internal" / "r1"
    crashed_release(monkeypatch, config, "after-estimate-input-17-0")
    # what the previous version left: state.json, and the draws as files, with no log
    log = internal / DRAWS_FILE
    header = json.loads(log.read_text().splitlines()[0])
    before = recorded_files(internal)
    (internal / "state.json").write_text(json.dumps(
        {k: header[k] for k in ("input_sha256", "config_sha256", "started")}))
    log.unlink()
    draws_made.clear()

    outcome = release(config)
    assert outcome.status == "published"
    assert not set(draws_made) & set(before)  # every persisted draw reused
    assert sorted(draws_made) == sorted(ALL_DRAWS - set(before))
    assert not (internal / "state.json").exists()
    migrated = json.loads(log.read_text().splitlines()[0])
    # migrated as it began (state.json held no plan: the ledger, which has it, compares it)
    assert migrated == {k: header[k] for k in ("release_id", "config_sha256", "input_sha256",
                                               "started", "protocol")}
    manifest = json.loads((Path(outcome.folder) / "manifest.json").read_text())
    assert manifest["started"] == header["started"][:10]  # the original start, to the day
    assert published_sha256(outcome) == SEEDED_RELEASE_SHA256


def test_the_county_and_state_draw_is_recorded_once_and_reused_on_resume(
        small_state, tmp_path, monkeypatch, draws_made):
    config = make_config(tmp_path, small_state, levels=["tract", "county", "state"])
    internal = tmp_path / "internal" / "r1"
    crashed_release(monkeypatch, config, "after-estimate-levels-17")
    assert draws_made.count(("levels", "state-17")) == 1
    before = recorded_files(internal)
    assert ("levels", "state-17") in before
    draws_made.clear()

    outcome = release(config)
    assert outcome.status == "published"
    assert draws_made == []  # every draw, the levels' included, was recorded before the crash
    assert recorded_files(internal) == before
    counties = pd.read_parquet(Path(outcome.folder) / "counties.parquet")
    drawn = pd.read_parquet(internal / "levels" / "state-17.parquet")
    released = counties[counties["status"] == "released"]
    assert len(released) > 0
    # the published county values are the recorded draw's, rounded
    merged = released.merge(drawn[drawn["level"] == "county"], on=["geoid", "cell"],
                            suffixes=("", "_drawn"))
    assert len(merged) == len(released)
    assert (merged["p25_raw"] - merged["p25_raw_drawn"]).abs().max() < 1e-3
