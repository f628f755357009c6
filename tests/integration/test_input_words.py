"""Issue 33 item 6: refusals in the operator's words. A bad rank in the input column the config
maps to the pipeline's ``y`` (``input.columns.child_rank``) is named by the input's column in
the refusal, the offline validation report and the quarantine file, and the report says where
the offending rows are and how to fix them. Each test failed on the code before the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from dpatlas.release import validation_report as R
from dpatlas.release.validate import ValidationFailed, apply_policy, input_column_names

from tests.integration.test_ingest_defects import ledger_entries, release_config
from tests.integration.test_inputs import input_config, state_records, write_states
from tests.support.cli import OWN_SERVER, refusal_block
from tests.support.cli import run_in_process as dpatlas

RENAMED = {"parent_rank": "mum_rank", "child_rank": "kid_rank"}
RANK_FIX = "must lie in [0, 1]: rescale them"


def _report_text(internal: Path) -> tuple[str, str]:
    """The report's index and the failed run's page, ``<wbr>`` removed."""
    failed = next(r for r in R.load_runs(internal) if not r["success"])
    page = R.report_dir(internal) / R.RUNS_DIR / f"{failed['run_id']}.html"
    return (R.report_index(internal).read_text().replace("<wbr>", ""),
            page.read_text().replace("<wbr>", ""))


def _assert_in_user_words(internal: Path, child: str, parent: str) -> None:
    quarantined = pd.read_parquet(internal / "quarantine" / "input-37.parquet")
    assert child in quarantined.columns and parent in quarantined.columns
    assert not {"x", "y"} & set(quarantined.columns), list(quarantined.columns)
    assert quarantined[child].tolist() == [1.7] and quarantined["row"].tolist() == [3]
    index, page = _report_text(internal)
    for text in (index, page):
        assert f"on <code>{child}</code>" in text or f"<td><code>{child}</code></td>" in text
        assert not re.search(r"<code>[xy]</code>", text), text
        assert "input-37.parquet" in text and RANK_FIX in text
    assert f"{child} is a rank normalised to [0, 1]" in page  # the details too
    link = re.search(r'<p class="quarantine">Offending rows: <a href="([^"]+)">', index)[1]
    assert (R.report_dir(internal) / link).resolve() == \
        (internal / "quarantine" / "input-37.parquet").resolve()


@pytest.mark.parametrize("names", [{}, RENAMED], ids=["default-names", "renamed"])
def test_a_bad_rank_is_named_by_the_input_column_in_report_and_quarantine(tmp_path, names):
    frame = state_records("37", n=24, tracts=2).rename(columns=names)
    child, parent = names.get("child_rank", "child_rank"), names.get("parent_rank", "parent_rank")
    frame.loc[3, child] = 1.7
    root = write_states(tmp_path, {"37": frame})
    cfg = input_config(root, cell=None)
    cfg = cfg.model_copy(update={"input": cfg.input.model_copy(update={
        "columns": cfg.input.columns.model_copy(update=names)})})
    from dpatlas.release.ingest import read_partition

    internal = tmp_path / "internal" / "r1"
    with pytest.raises(ValidationFailed) as err:
        apply_policy(read_partition(cfg.input, "37"), "fail", "37", internal,
                     columns=input_column_names(cfg.input.columns))
    assert f"on column '{child}'" in str(err.value) and RANK_FIX in str(err.value)
    _assert_in_user_words(internal, child, parent)


def test_a_release_refused_for_a_renamed_rank_column_speaks_its_name(tmp_path):
    frame = state_records("37", n=120, tracts=6).rename(columns=RENAMED)
    frame.loc[3, "kid_rank"] = 1.7
    root = write_states(tmp_path, {"37": frame})
    # a copy: write_config adds person_id to the columns it is given
    cfg = release_config(tmp_path, root, ["37"], input={"columns": dict(RENAMED)})
    out = refusal_block(dpatlas("release", "-c", str(cfg), "--release-id", "r1",
                                "--noise-seed", "1", env=OWN_SERVER))
    assert "on column 'kid_rank': 1 row(s)" in out
    assert "column 'y'" not in out and "'x'" not in out
    assert f"fix: ranks ('kid_rank') {RANK_FIX}" in out
    assert "validation.policy: clip" in out
    assert ledger_entries(tmp_path / "ledger.db") == 0
    _assert_in_user_words(tmp_path / "internal" / "r1", "kid_rank", "mum_rank")


def test_under_policy_drop_the_report_says_the_rows_were_left_out_not_how_to_refuse(tmp_path):
    frame = state_records("37", n=24, tracts=2).rename(columns=RENAMED)
    frame.loc[3, "kid_rank"] = 1.7
    cfg = input_config(write_states(tmp_path, {"37": frame}), cell=None)
    cfg = cfg.input.model_copy(update={
        "columns": cfg.input.columns.model_copy(update=RENAMED)})
    from dpatlas.release.ingest import read_partition

    internal = tmp_path / "internal" / "r1"
    clean, report = apply_policy(read_partition(cfg, "37"), "drop", "37", internal,
                                 columns=input_column_names(cfg.columns))
    assert report.dropped == 1 and len(clean) == 23
    index, _ = _report_text(internal)
    assert "policy drop left these rows out of the release" in index
    assert RANK_FIX not in index and "input-37.parquet" in index
    assert "kid_rank" in index and not re.search(r"<code>[xy]</code>", index)


def test_the_duplicate_persons_quarantine_names_the_input_columns(tmp_path):
    from dpatlas.release.contributions import ContributionError, check_contributions
    from tests.integration.test_inputs import stage_all

    names = {**RENAMED, "person_id": "pid", "cell": "group"}
    frames = {"17": state_records("17", first_id=0), "18": state_records("18", first_id=1000)}
    frames["18"].loc[3, ["person_id", "cell"]] = frames["17"].loc[7, ["person_id", "cell"]].values
    frames = {k: f.rename(columns=names) for k, f in frames.items()}
    cfg = input_config(write_states(tmp_path, frames), person_id="pid", cell="group")
    cfg = cfg.model_copy(update={"input": cfg.input.model_copy(update={
        "columns": cfg.input.columns.model_copy(update=RENAMED)})})
    staged, _ = stage_all(cfg, tmp_path / "internal")
    with pytest.raises(ContributionError):
        check_contributions(staged, "fail", tmp_path / "internal",
                            input_column_names(cfg.input.columns))
    rows = pd.read_parquet(tmp_path / "internal" / "quarantine" / "duplicate-persons.parquet")
    assert set(rows.columns) == {"row", "geoid", "mum_rank", "kid_rank", "group", "pid",
                                 "staged_file"}
    assert list(rows["pid"]) == ["p000007", "p000007"]
