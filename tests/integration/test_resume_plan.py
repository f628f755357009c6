"""A resume draws only under the plan its release was charged for, and draw once does not rest
on a file an operator can delete (issue 31, items 1, 4, 5 and O5). The release is the seeded one
of test_draw_once.py: crashed at a crash point, then resumed in the same process."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

from dpatlas.core import config as config_module
from dpatlas.core.plan_record import PlanChanged
from dpatlas.ledger import Ledger
from dpatlas.release.draws import DRAWS_FILE, DrawLog, DrawLogMissing, PersistedDrawChanged
from dpatlas.release.manifest import RANDOM_BITS_OS, RANDOM_BITS_SEEDED

from tests.integration.test_draw_once import (  # noqa: F401  (fixtures)
    crashed_release, draws_made, prefect_server, small_state)
from tests.integration.test_flow_structure import make_config

LEVELS = ["tract", "county", "state"]


def run(config: Path, seed: int | None = 11):
    from flows.release import release

    return release(str(config), "r1", seed)


def crashed(monkeypatch, config: Path, point: str, seed: int | None = 11) -> None:
    from dpatlas.release import crash

    def hook(name: str) -> None:
        if name == point:
            raise RuntimeError(f"crash at {name}")
    monkeypatch.setattr(crash, "fault_hook", hook)
    with pytest.raises(RuntimeError, match="crash at"):
        run(config, seed)
    monkeypatch.setattr(crash, "fault_hook", None)


def ledger_of(tmp_path: Path) -> Ledger:
    return Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")


def ledger_state(tmp_path: Path) -> tuple:
    led = ledger_of(tmp_path)
    return led.release("r1"), led.entries().to_dict("records"), led.release_plan("r1")


def ledger_sql(tmp_path: Path, statement: str, *params) -> None:
    """Edit the ledger as another version (or another host) would have left it."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    with engine.begin() as conn:
        conn.exec_driver_sql(statement, params)
    engine.dispose()


def refused_under_other_level_shares(tmp_path, internal, draws_made, monkeypatch):
    """Resumed by a version whose default level shares are 0.5/0.45/0.05: refused with
    nothing done (returns the error); then the version that began it is back."""
    began_with = config_module.DEFAULT_LEVEL_SHARES
    monkeypatch.setattr(config_module, "DEFAULT_LEVEL_SHARES",
                        {"tract": 0.5, "county": 0.45, "state": 0.05})
    err = refused_with_nothing_done(tmp_path, internal, draws_made, PlanChanged)
    monkeypatch.setattr(config_module, "DEFAULT_LEVEL_SHARES", began_with)
    return err


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def refused_with_nothing_done(tmp_path, internal, draws_made, error, seed=11):
    """The resume raises ``error``: no draw made, the log, the ledger and the (absent or
    present) published folder as they were."""
    from dpatlas.cli.common import operator_errors as _operator_errors

    log = internal / DRAWS_FILE
    log_before = log.read_bytes() if log.exists() else None
    ledger_before = ledger_state(tmp_path)
    published = tmp_path / "releases" / "r1"
    published_before = snapshot(published) if published.exists() else None
    draws_made.clear()
    with pytest.raises(error) as err:
        run(tmp_path / "config.yaml", seed)
    assert isinstance(err.value, _operator_errors())  # the command line: its message, exit 2
    assert draws_made == []
    assert (log.read_bytes() if log.exists() else None) == log_before
    assert ledger_state(tmp_path) == ledger_before  # the charge exactly as it was
    assert (snapshot(published) if published.exists() else None) == published_before
    return err.value


# -- item 1: the plan -----------------------------------------------------------------------


def test_a_resume_under_other_default_level_shares_is_refused_before_any_draw(
        small_state, tmp_path, monkeypatch, draws_made):
    """The auditor's repro: tract draws made under 0.66, a crash just before the levels' draw
    is recorded, then a version whose default shares are 0.5/0.45/0.05 resumes."""
    config = make_config(tmp_path, small_state, levels=LEVELS)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "before-record-levels-state-17")
    assert ("estimate", "input-17-2") in DrawLog(internal).draws()
    assert ("levels", "state-17") not in DrawLog(internal).draws()

    err = refused_under_other_level_shares(tmp_path, internal, draws_made, monkeypatch)
    assert "levels/county/epsilon: 0.31 → 0.45" in str(err)
    assert "levels/state/epsilon: 0.03 → 0.05" in str(err)
    assert not (tmp_path / "releases" / "r1").exists()  # nothing published
    assert ledger_of(tmp_path).release("r1")["status"] == "in_progress"

    # the version that began it finishes it
    draws_made.clear()
    outcome = run(config)
    assert outcome.status == "published"
    assert draws_made == [("levels", "state-17")]  # only the never-recorded draw


def test_a_resume_under_another_tract_epsilon_from_the_code_is_refused(
        small_state, tmp_path, monkeypatch, draws_made):
    config = make_config(tmp_path, small_state, levels=LEVELS)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "after-estimate-input-17-0")
    monkeypatch.setattr(config_module, "DEFAULT_LEVEL_SHARES",
                        {"tract": 0.7, "county": 0.27, "state": 0.03})
    err = refused_with_nothing_done(tmp_path, internal, draws_made, PlanChanged)
    assert "primary_epsilon" in str(err) and "levels/tract" not in str(err)


def test_the_same_plan_under_another_code_version_resumes_and_publishes(
        small_state, tmp_path, monkeypatch, draws_made):
    config = make_config(tmp_path, small_state)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "after-estimate-input-17-0")
    old = {"package": "0.0.1", "git_commit": "0" * 40, "source_sha256": "0" * 64}
    log = internal / DRAWS_FILE  # as if an older version had begun and charged it
    lines = log.read_text().splitlines(keepends=True)
    header = json.loads(lines[0])
    assert header["plan_sha256"] == ledger_of(tmp_path).release_plan("r1")["plan_sha256"]
    lines[0] = json.dumps({**header, "code_version": old}, sort_keys=True) + "\n"
    log.write_text("".join(lines))
    ledger_sql(tmp_path, "UPDATE ledger_release_plans SET code_version = ?", json.dumps(old))
    draws_made.clear()

    outcome = run(config)
    assert outcome.status == "published"
    assert ("select", "input-17-0") not in draws_made  # recorded draws reused
    assert ledger_of(tmp_path).release_plan("r1")["code_version"] == old  # as charged


# -- item 4: random bits from the draw log --------------------------------------------------


def test_the_manifest_states_the_random_bits_the_draws_used(
        small_state, tmp_path, monkeypatch, draws_made):
    config = make_config(tmp_path, small_state, levels=LEVELS)
    crashed(monkeypatch, config, "before-record-levels-state-17")  # the tracts' draws seeded
    outcome = run(config, seed=None)  # resumed without a seed: the levels' from os.urandom
    manifest = json.loads((Path(outcome.folder) / "manifest.json").read_text())
    sampler = manifest["noise_sampler"]
    assert sampler["random_bits"] == (f"mixed (NOT FOR RELEASE): {RANDOM_BITS_OS} and "
                                      f"{RANDOM_BITS_SEEDED}")  # not the last run's alone
    assert sampler["draws_by_random_bits"] == {RANDOM_BITS_OS: 1, RANDOM_BITS_SEEDED: 6}
    from dpatlas.audit.files import check_mode

    assert "mixed" in check_mode(Path(outcome.folder), manifest)  # a test release


# -- O5: draw once without trusting a deletable file ----------------------------------------


def test_a_deleted_draw_log_of_a_charged_release_is_refused(
        small_state, tmp_path, monkeypatch, draws_made):
    config = make_config(tmp_path, small_state)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "after-estimate-input-17-0")
    (internal / DRAWS_FILE).unlink()
    err = refused_with_nothing_done(tmp_path, internal, draws_made, DrawLogMissing)
    assert "was charged in the ledger" in str(err) and "stays spent" in str(err)
    assert not (tmp_path / "releases" / "r1").exists()


def test_a_cut_draw_log_is_refused_and_nothing_redrawn(
        small_state, tmp_path, monkeypatch, draws_made):
    config = make_config(tmp_path, small_state)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "after-estimate-input-17-0")
    log = internal / DRAWS_FILE
    log.write_text(log.read_text().splitlines(keepends=True)[0])  # the header alone
    err = refused_with_nothing_done(tmp_path, internal, draws_made, PersistedDrawChanged)
    assert "lines were cut from the log" in str(err)


def test_a_crash_past_publish_resumes_with_the_published_values(
        small_state, tmp_path, monkeypatch, draws_made):
    config = make_config(tmp_path, small_state)
    crashed(monkeypatch, config, "after-publish")
    folder = tmp_path / "releases" / "r1"
    published = pd.read_parquet(folder / "tracts.parquet")
    before = snapshot(folder)
    draws_made.clear()
    outcome = run(config)
    assert outcome.status == "published" and draws_made == []
    assert snapshot(folder) == before
    assert pd.read_parquet(folder / "tracts.parquet").equals(published)


@pytest.mark.parametrize("damage", ["deleted", "cut"])
def test_a_crash_past_publish_with_a_damaged_log_is_refused_never_redrawn(
        small_state, tmp_path, monkeypatch, draws_made, damage):
    config = make_config(tmp_path, small_state)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "after-publish")
    log = internal / DRAWS_FILE
    if damage == "deleted":
        log.unlink()
    else:
        log.write_text(log.read_text().splitlines(keepends=True)[0])
    refused_with_nothing_done(tmp_path, internal, draws_made, PersistedDrawChanged)
    assert ledger_of(tmp_path).release("r1")["status"] == "in_progress"


def test_a_missing_log_of_a_release_another_host_holds_names_that_host(
        small_state, tmp_path, monkeypatch, draws_made):
    """Two hosts, one ledger, their own internal folders: the log is in the other host's."""
    config = make_config(tmp_path, small_state)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "after-estimate-input-17-0")
    ledger_sql(tmp_path, "UPDATE ledger_releases SET lease_owner = 'host-b:/scratch/r1'")
    (internal / DRAWS_FILE).unlink()
    err = refused_with_nothing_done(tmp_path, internal, draws_made, DrawLogMissing)
    assert "held (or was last held) by host-b:/scratch/r1" in str(err) and "lease" in str(err)


def test_a_release_charged_before_plans_were_recorded_is_compared_by_its_charges(
        small_state, tmp_path, monkeypatch, draws_made):
    """A header and a ledger entry without a plan (the previous version's): the ledger's
    charges per step and cell decide; other level shares are refused, the same resume."""
    config = make_config(tmp_path, small_state, levels=LEVELS)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "before-record-levels-state-17")
    log = internal / DRAWS_FILE
    lines = log.read_text().splitlines(keepends=True)
    header = {k: v for k, v in json.loads(lines[0]).items()
              if k not in ("plan", "plan_sha256", "code_version", "protocol")}
    lines[0] = json.dumps(header, sort_keys=True) + "\n"
    log.write_text("".join(lines))
    ledger_sql(tmp_path, "DELETE FROM ledger_release_plans")

    err = refused_under_other_level_shares(tmp_path, internal, draws_made, monkeypatch)
    assert "before plans were recorded" in str(err)
    assert "step level county: NoisyStats, cell all: epsilon" in str(err)

    draws_made.clear()
    assert run(config).status == "published"
    assert draws_made == [("levels", "state-17")]
    assert ledger_of(tmp_path).release_plan("r1")["recorded_by"] == "resume"


def test_a_crash_past_publish_with_its_lines_and_files_gone_is_refused_never_redrawn(
        small_state, tmp_path, monkeypatch, draws_made):
    """Past publish, every draw the published folder needs must be recorded: with the log cut
    and the draw files deleted too, nothing can be reused, and nothing is drawn again."""
    config = make_config(tmp_path, small_state)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "after-publish")
    log = internal / DRAWS_FILE
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    for folder in ("selection", "results"):
        for file in (internal / folder).glob("*.parquet"):
            file.unlink()
    err = refused_with_nothing_done(tmp_path, internal, draws_made, PersistedDrawChanged)
    assert "is already published at" in str(err) and "does not record 6" in str(err)


# -- issue 35: the draw layout --------------------------------------------------------------


def test_a_resume_by_a_version_that_chunks_otherwise_is_refused_before_any_draw(
        small_state, tmp_path, monkeypatch, draws_made):
    """A version whose chunks hold other tracts under the same names would reuse the recorded
    draw of ``input-17-0`` for tracts it was not drawn for, and draw others' noise again."""
    import tasks.validate
    from dpatlas.release.draws import DrawLayoutChanged

    config = make_config(tmp_path, small_state, levels=LEVELS)
    internal = tmp_path / "internal" / "r1"
    crashed(monkeypatch, config, "after-estimate-input-17-0")
    assert ("estimate", "input-17-0") in DrawLog(internal).draws()

    began_with = tasks.validate.split_into_chunks
    monkeypatch.setattr(tasks.validate, "split_into_chunks",
                        lambda geoids, size, *rest: began_with(geoids, size + 7, *rest))
    err = refused_with_nothing_done(tmp_path, internal, draws_made, DrawLayoutChanged)
    assert "chunks/input-17-0/geoids" in str(err)
    assert not (tmp_path / "releases" / "r1").exists()

    monkeypatch.setattr(tasks.validate, "split_into_chunks", began_with)
    draws_made.clear()
    assert run(config).status == "published"  # the version that began it finishes it
    assert ("estimate", "input-17-0") not in draws_made
