"""Inputs that cannot break the privacy claim: one record per person and cell across all
partitions, a limit on what clip/drop may change, and strict column types."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpatlas.release import contributions, staged_layout
from dpatlas.core.config import ConfigError, parse_config
from dpatlas.release.contributions import (ContributionError, check_contributions,
                                           require_person_unit)
from dpatlas.release.ingest import InputError, partitions, read_partition
from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.release.validate import ValidationFailed, apply_policy, check_changed_share

# --- building inputs ---------------------------------------------------------------------------


def state_records(state: str, n: int = 60, tracts: int = 6, seed: int = 0,
                  first_id: int = 0) -> pd.DataFrame:
    """``n`` people of one state with distinct ids, spread over ``tracts`` tracts."""
    rng = np.random.default_rng([seed, int(state)])
    geoids, _ = tract_geoids(state, tracts, 2)
    return pd.DataFrame({
        "person_id": [f"p{first_id + i:06d}" for i in range(n)],
        "geoid": geoids[np.arange(n) % tracts],
        "parent_rank": np.round(rng.uniform(0, 1, n), 2),
        "child_rank": np.round(rng.uniform(0, 1, n), 2),
        "cell": np.where(np.arange(n) % 2 == 0, "female", "male"),
    })


def write_states(root: Path, frames: dict[str, pd.DataFrame]) -> Path:
    """A hive-partitioned Parquet dataset: root/microdata/state=SS/part-0.parquet."""
    for state, frame in frames.items():
        folder = root / "microdata" / f"state={state}"
        folder.mkdir(parents=True, exist_ok=True)
        frame.to_parquet(folder / "part-0.parquet", index=False)
    return root / "microdata"


def input_config(path: Path, fmt: str = "parquet", person_id: str | None = "person_id",
                 cell: str | None = "cell", **privacy_or_validation):
    data = {"input": {"path": str(path), "format": fmt,
                      "columns": {"person_id": person_id, "cell": cell}},
            "boundaries": {"path": "tracts.parquet"},
            "selection": {"rule": "fixed"}, **privacy_or_validation}
    return parse_config(data)


def stage_all(cfg, internal: Path, policy: str = "fail") -> tuple[list[Path], list[dict]]:
    """Ingest, validate and stage every partition, as the flow's first stage does."""
    staged, reports = [], []
    for part in partitions(cfg.input):
        clean, report = apply_policy(read_partition(cfg.input, part.key), policy, part.key,
                                     internal)
        path = internal / "staged" / f"input-{part.key}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        staged_layout.write(clean, path)
        staged.append(path)
        reports.append(report.as_dict())
    return staged, reports


@pytest.fixture
def two_states(tmp_path) -> dict[str, pd.DataFrame]:
    return {"17": state_records("17", first_id=0), "18": state_records("18", first_id=1000)}


# --- one record per person and cell, across partitions -----------------------------------------


def test_same_person_in_two_states_is_refused(tmp_path, two_states):
    # p000007 also has a record in state 18, in the same cell as their record in state 17.
    person = two_states["17"].loc[7]
    two_states["18"].loc[3, ["person_id", "cell"]] = [person["person_id"], person["cell"]]
    cfg = input_config(write_states(tmp_path, two_states))
    staged, _ = stage_all(cfg, tmp_path / "internal")  # each state alone passes its contract

    with pytest.raises(ContributionError) as err:
        check_contributions(staged, "fail", tmp_path / "internal")
    message = str(err.value)
    quarantine = tmp_path / "internal" / "quarantine" / "duplicate-persons.parquet"
    assert "1 person(s)" in message and "2 records" in message and "17, 18" in message
    assert str(quarantine) in message and "validation.contributions: bound" in message
    assert "\n" not in message
    rows = pd.read_parquet(quarantine)
    assert list(rows["person_id"]) == ["p000007", "p000007"]
    assert sorted(rows["staged_file"]) == ["input-17.parquet", "input-18.parquet"]
    assert isinstance(err.value, ValidationFailed)  # the command line's exit 2


def test_bound_keeps_exactly_one_record_by_the_persons_own_records(tmp_path, two_states):
    p7, p9 = two_states["17"].loc[7], two_states["17"].loc[9]
    two_states["18"].loc[3, ["person_id", "cell"]] = [p7["person_id"], p7["cell"]]
    two_states["18"].loc[5, ["person_id", "cell"]] = [p9["person_id"], p9["cell"]]
    # and p000011 twice in one tract of state 17, same cell: a repeat inside one partition
    two_states["17"].loc[23, ["person_id", "geoid", "cell"]] = [
        "p000011", two_states["17"].loc[11, "geoid"], two_states["17"].loc[11, "cell"]]
    cfg = input_config(write_states(tmp_path, two_states))
    internal = tmp_path / "internal"
    staged, _ = stage_all(cfg, internal)
    before = {p.name: pd.read_parquet(p) for p in staged}

    # The staged list in either order: the rule depends on the records, not on file order.
    report = check_contributions(list(reversed(staged)), "bound", internal)
    assert report["checked"] and report["persons_repeated"] == 3
    assert report["records_of_repeated"] == 6 and report["records_removed"] == 3
    assert report["records"] == 120
    assert sorted(Path(f).name for f in report["files_rewritten"]) == [
        "input-17.parquet", "input-18.parquet"]

    after = {p.name: pd.read_parquet(p) for p in staged}
    # state 17's GEOIDs sort before state 18's: the 17 records of p7 and p9 are kept
    assert set(after["input-18.parquet"]["row"]) == set(before["input-18.parquet"]["row"]) - {
        60 + 3, 60 + 5}
    # within one tract the smaller input row is kept
    assert set(after["input-17.parquet"]["row"]) == set(before["input-17.parquet"]["row"]) - {23}
    everything = pd.concat(after.values())
    assert not everything.duplicated(["person_id", "cell"]).any()
    kept = everything.set_index("person_id").loc[["p000007", "p000009", "p000011"], "row"]
    assert sorted(kept) == [7, 9, 11]
    pd.testing.assert_frame_equal(  # untouched records are byte-for-byte the same values
        after["input-17.parquet"], before["input-17.parquet"][
            before["input-17.parquet"]["row"] != 23].reset_index(drop=True))
    q = pd.read_parquet(internal / "quarantine" / "duplicate-persons.parquet")
    assert len(q) == 6 and q["kept"].sum() == 3
    assert not list((internal / "staged").glob("*.tmp"))  # atomic rewrite left no temp file

    again = check_contributions(staged, "bound", internal)  # idempotent on resume
    assert again["persons_repeated"] == 0 and again["files_rewritten"] == []



def test_files_hashed_two_at_a_time_give_the_verdict_of_one_at_a_time(tmp_path, two_states,
                                                                      monkeypatch):
    """The staged files are hashed in two threads (contributions.HASHING_THREADS): the same
    repeats, counts and kept records as one file after another."""
    from dpatlas.release import contributions as C

    p7 = two_states["17"].loc[7]
    two_states["18"].loc[3, ["person_id", "cell"]] = [p7["person_id"], p7["cell"]]
    cfg = input_config(write_states(tmp_path, two_states))
    reports, files = {}, {}
    for threads in (1, 2):
        monkeypatch.setattr(C, "HASHING_THREADS", threads)
        internal = tmp_path / f"threads-{threads}"
        staged, _ = stage_all(cfg, internal)
        reports[threads] = check_contributions(staged, "bound", internal)
        files[threads] = [pd.read_parquet(p) for p in staged]
        assert not list(internal.glob("contribution-hashes-*"))  # the scratch is removed
    for key in ("records", "persons_repeated", "records_of_repeated", "records_removed"):
        assert reports[2][key] == reports[1][key], key
    assert reports[2]["records"] == 120 and reports[2]["records_removed"] == 1
    for one, two in zip(files[1], files[2]):
        pd.testing.assert_frame_equal(one, two)

def test_same_person_in_two_cells_of_one_tract_is_accepted(tmp_path, two_states):
    # cells compose sequentially, so a person may be in several of them
    row = two_states["17"].loc[4]
    twin = row.copy()
    twin["cell"] = "male" if row["cell"] == "female" else "female"
    two_states["17"] = pd.concat([two_states["17"], twin.to_frame().T], ignore_index=True)
    cfg = input_config(write_states(tmp_path, two_states))
    staged, _ = stage_all(cfg, tmp_path / "internal")
    report = check_contributions(staged, "fail", tmp_path / "internal")
    assert report["checked"] and report["persons_repeated"] == 0 and report["records"] == 121
    assert not (tmp_path / "internal" / "quarantine" / "duplicate-persons.parquet").exists()


def test_hash_collisions_never_reject_or_remove_anyone(tmp_path, two_states, monkeypatch):
    # Every (person, cell) hashes to the same value: all are candidates, none is a repeat.
    monkeypatch.setattr(contributions, "_key_hashes",
                        lambda frame: np.zeros(len(frame), dtype=np.uint64))
    cfg = input_config(write_states(tmp_path, two_states))
    staged, _ = stage_all(cfg, tmp_path / "internal")
    assert check_contributions(staged, "fail", tmp_path / "internal")["persons_repeated"] == 0
    report = check_contributions(staged, "bound", tmp_path / "internal")
    assert report["records_removed"] == 0 and report["files_rewritten"] == []


def test_integer_ids_across_partitions(tmp_path, two_states):
    for frame in two_states.values():
        frame["person_id"] = frame["person_id"].str[1:].astype("int64")
    two_states["18"].loc[0, ["person_id", "cell"]] = [12, two_states["17"].loc[12, "cell"]]
    cfg = input_config(write_states(tmp_path, two_states))
    staged, _ = stage_all(cfg, tmp_path / "internal")
    with pytest.raises(ContributionError, match="1 person"):
        check_contributions(staged, "fail", tmp_path / "internal")


def test_csv_ids_keep_their_leading_zeros(tmp_path):
    # Read as numbers, "007" and "7" would be one person (and be refused or bounded).
    frame = state_records("17", n=4, tracts=2)
    frame["person_id"] = ["007", "7", "0007", "8"]
    frame["cell"] = "all"
    path = tmp_path / "in.csv"
    frame.to_csv(path, index=False)
    cfg = input_config(path, fmt="csv")
    staged, _ = stage_all(cfg, tmp_path / "internal")
    # staged in (cell, GEOID) order: the ids as text, in whatever order
    assert sorted(pd.read_parquet(staged[0])["person_id"]) == ["0007", "007", "7", "8"]
    assert check_contributions(staged, "fail", tmp_path / "internal")["persons_repeated"] == 0


def test_without_person_ids_nothing_is_checked(tmp_path, two_states):
    cfg = input_config(write_states(tmp_path, two_states), person_id=None)
    staged, _ = stage_all(cfg, tmp_path / "internal")
    assert check_contributions(staged, "fail", tmp_path / "internal")["checked"] is False


def test_a_release_needs_a_person_id_or_the_stated_assumption(tmp_path):
    with pytest.raises(ConfigError) as err:
        require_person_unit(input_config(tmp_path, person_id=None))
    message = str(err.value)
    assert "input.columns.person_id" in message
    assert "privacy.assume_one_record_per_person: true" in message and "\n" not in message

    assumed = require_person_unit(input_config(tmp_path, person_id=None, privacy={
        "assume_one_record_per_person": True}))
    assert assumed["claim"] == "one record per person and cell"
    assert assumed["status"] == "unverified assumption"
    verified = require_person_unit(input_config(tmp_path, validation={"contributions": "bound"}))
    assert verified["status"] == "verified" and "smallest (GEOID, input row)" in verified["basis"]


def _repeats_across_and_within(two_states: dict[str, pd.DataFrame]) -> None:
    """p7 and p9 in both states (same cell), p11 twice in one tract of state 17."""
    p7, p9 = two_states["17"].loc[7], two_states["17"].loc[9]
    two_states["18"].loc[3, ["person_id", "cell"]] = [p7["person_id"], p7["cell"]]
    two_states["18"].loc[5, ["person_id", "cell"]] = [p9["person_id"], p9["cell"]]
    two_states["17"].loc[23, ["person_id", "geoid", "cell"]] = [
        "p000011", two_states["17"].loc[11, "geoid"], two_states["17"].loc[11, "cell"]]


def _checked_on_workers(cfg, internal: Path, policy: str) -> dict:
    """The contributions check as runner dask does it: each partition validated, staged and
    hashed into buckets by its worker task's code, one bucket task's code per bucket, then
    the check on what they found."""
    from dpatlas.release.contribution_buckets import BUCKETS, merge_buckets, repeated_in_bucket
    from dpatlas.release.validate_parts import validate_part
    from dpatlas.release.validation_report import report_index

    parts = [validate_part(read_partition(cfg.input, part.key), "fail", part.key,
                           str(internal), str(internal), str(report_index(internal)),
                           hash_ids=True)
             for part in partitions(cfg.input)]
    found = merge_buckets([repeated_in_bucket(b, [p.hashes for p in parts])
                           for b in range(BUCKETS)])
    staged = [Path(p.staged) for p in parts]
    return check_contributions(staged, policy, internal,
                               found=(found, sum(p.report["rows_out"] for p in parts)))


def test_the_chunks_are_planned_from_the_validation_tasks_counts_as_from_the_staged_rows(
        tmp_path, two_states):
    """Runner dask: each validation task counts its clean rows per (geoid, cell) and the flow
    plans the chunks from those counts instead of reading every record again. They equal the
    counts read from the staged file (with rows the policy dropped: ranks out of range), a
    file with known counts is not read, and a file the contributions check rewrote is read
    again."""
    from dpatlas.release.estimate import split_into_chunks, staged_counts, tracts_of
    from dpatlas.release.validate_parts import validate_part
    from dpatlas.release.validation_report import report_index
    from flows.validation import ValidatedInput

    two_states["17"].loc[[4, 9, 10], "child_rank"] = 1.7  # dropped (policy drop)
    cfg = input_config(write_states(tmp_path, two_states))
    internal = tmp_path / "internal"
    parts = [validate_part(read_partition(cfg.input, part.key), "drop", part.key,
                           str(internal), str(internal), str(report_index(internal)))
             for part in partitions(cfg.input)]
    staged = [Path(p.staged) for p in parts]
    read = staged_counts(staged)
    assert sum(int(c["n"].sum()) for c in read.values()) == 120 - 3
    for part, path in zip(parts, staged):
        pd.testing.assert_frame_equal(part.counts, read[path])
    known = {path: part.counts for part, path in zip(parts, staged)}
    for limit in (None, 40):  # chunks, also split by groups of cells
        assert (split_into_chunks(tracts_of(staged_counts(staged, known)), 4, known, limit)
                == split_into_chunks(tracts_of(read), 4, read, limit))
    staged[0].unlink()  # known counts: the file is not read
    assert staged_counts(staged[:1], known)[staged[0]] is known[staged[0]]
    validated = ValidatedInput([], staged, counts=known)
    after = validated.counts_after({"files_rewritten": [str(staged[1])]})
    assert list(after) == [staged[0]]


@pytest.mark.parametrize("policy", ["fail", "bound"])
def test_the_check_from_the_workers_hashes_equals_the_flows(tmp_path, two_states, policy):
    """Issue 35: with the hashing in the validation tasks and the repeats found a bucket at a
    time (runner dask), the check gives the same report, the same quarantine file and the
    same rows removed as the flow's own check, for both policies."""
    _repeats_across_and_within(two_states)
    cfg = input_config(write_states(tmp_path, two_states))
    flow, workers = tmp_path / "flow" / "r", tmp_path / "workers" / "r"
    staged, _ = stage_all(cfg, flow)

    def outcome(check, internal: Path):
        try:
            report = check()
        except ContributionError as err:
            report = {"refused": str(err).replace(str(internal), "<internal>")}
        report = {k: ([Path(f).name for f in v] if k == "files_rewritten" else
                      v.replace(str(internal), "<internal>") if isinstance(v, str) else v)
                  for k, v in report.items()}
        quarantine = pd.read_parquet(internal / "quarantine" / "duplicate-persons.parquet")
        rows = {p.name: pd.read_parquet(p) for p in sorted((internal / "staged").iterdir())}
        return report, quarantine, rows

    expected = outcome(lambda: check_contributions(staged, policy, flow), flow)
    got = outcome(lambda: _checked_on_workers(cfg, workers, policy), workers)
    assert got[0] == expected[0]
    assert expected[0].get("persons_repeated", 3) == 3  # the repeats were there to find
    pd.testing.assert_frame_equal(got[1], expected[1])
    assert got[2].keys() == expected[2].keys() == {"input-17.parquet", "input-18.parquet"}
    for name in expected[2]:
        pd.testing.assert_frame_equal(got[2][name], expected[2][name])
    assert not list((workers / "contribution-hashes").rglob("*.tmp"))


def test_contribution_check_memory_is_bounded(tmp_path):
    """500,000 records in 5 partitions, 100 repeats: peak Python-heap use stays near the
    hash arrays (8 bytes a record), not a copy of every id."""
    import tracemalloc

    n, parts = 500_000, 5
    staged = []
    for k in range(parts):
        ids = np.arange(k * n // parts, (k + 1) * n // parts)
        frame = pd.DataFrame({"row": ids, "geoid": "17001000100", "x": 0.5, "y": 0.5,
                              "cell": "all", "person_id": [f"id{i}" for i in ids]})
        if k == parts - 1:
            frame.loc[:99, "person_id"] = [f"id{i}" for i in range(100)]  # repeats of part 0
        path = tmp_path / f"input-{k}.parquet"
        frame.to_parquet(path, index=False)
        staged.append(path)
    tracemalloc.start()
    report = check_contributions(staged, "bound", tmp_path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert report["persons_repeated"] == 100 and report["records_removed"] == 100
    assert len(pd.read_parquet(staged[-1])) == n // parts - 100
    assert peak < 150 * 2**20, f"peak {peak / 2**20:.0f} MiB"


# --- what clip and drop may change --------------------------------------------------------------


def test_percentiles_read_as_unit_ranks_are_refused_under_clip(tmp_path, two_states):
    for frame in two_states.values():
        frame[["parent_rank", "child_rank"]] = np.round(
            frame[["parent_rank", "child_rank"]] * 100, 1)
    cfg = input_config(write_states(tmp_path, two_states))
    _, reports = stage_all(cfg, tmp_path / "internal", policy="clip")
    assert sum(r["clipped"] for r in reports) >= 110  # every partition passed on its own
    with pytest.raises(ValidationFailed) as err:
        check_changed_share(reports, 0.01)
    message = str(err.value)
    changed = sum(r["clipped"] for r in reports)
    assert f"{changed:,} of 120 input rows ({changed / 120:.2%}" in message
    assert "validation.max_changed_share 1.00%" in message
    assert "set input.rank_scale: percentile" in message and "\n" not in message


def test_percentile_scale_is_accepted(tmp_path, two_states):
    for frame in two_states.values():
        frame[["parent_rank", "child_rank"]] = (frame[["parent_rank", "child_rank"]] * 100
                                                ).round().astype("int64")  # integer ranks too
    cfg = input_config(write_states(tmp_path, two_states))
    cfg = cfg.model_copy(update={"input": cfg.input.model_copy(update={"rank_scale":
                                                                       "percentile"})})
    _, reports = stage_all(cfg, tmp_path / "internal", policy="clip")
    assert sum(r["clipped"] for r in reports) == 0
    check_changed_share(reports, 0.0)


def test_change_limit_counts_drops_over_all_partitions(tmp_path, two_states):
    two_states["18"].loc[[1, 2], "child_rank"] = np.nan
    cfg = input_config(write_states(tmp_path, two_states))
    staged, reports = stage_all(cfg, tmp_path / "internal", policy="drop")
    by_state = {r["partition"]: r for r in reports}
    assert by_state["18"]["dropped"] == 2 and by_state["18"]["rows_out"] == 58
    assert by_state["17"]["dropped"] == 0
    assert len(pd.read_parquet(staged[1])) == 58  # n counts only the valid rows
    check_changed_share(reports, 2 / 120)  # exactly at the limit: allowed
    with pytest.raises(ValidationFailed, match=r"2 of 120 input rows \(1\.67%: 0 clipped, "
                                               r"2 dropped\)") as err:
        check_changed_share(reports, 0.01)
    assert "raise validation.max_changed_share" in str(err.value)


# --- strict column types ------------------------------------------------------------------------


def one_state_file(tmp_path: Path, frame: pd.DataFrame) -> Path:
    path = tmp_path / "in.parquet"
    frame.to_parquet(path, index=False)
    return path


def test_blank_geoid_in_csv_is_reported_as_blank(tmp_path):
    frame = state_records("01", n=20, tracts=3)  # Alabama: GEOIDs start with a zero
    path = tmp_path / "in.csv"
    frame.to_csv(path, index=False)
    lines = path.read_text().splitlines()
    for row in (3, 17):  # data row r is line r + 1 (after the header)
        cells = lines[row + 1].split(",")
        cells[1] = ""
        lines[row + 1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")
    cfg = input_config(path, fmt="csv")
    df = read_partition(cfg.input, "all")
    assert df["geoid"].isna().sum() == 2
    valid = df["geoid"].dropna()
    assert (valid.str.fullmatch(r"01\d{9}")).all()  # text: no float, no lost zero
    with pytest.raises(ValidationFailed) as err:
        apply_policy(df, "fail", "all", tmp_path / "internal")
    message = str(err.value)
    assert "2 rows have a blank GEOID, e.g. input rows 3, 17" in message
    assert ".0" not in message and "match_regex" not in message


def test_integer_geoid_column_is_refused(tmp_path):
    frame = state_records("01", n=10, tracts=2)
    frame["geoid"] = frame["geoid"].astype("int64")
    cfg = input_config(one_state_file(tmp_path, frame))
    for call in (lambda: partitions(cfg.input), lambda: read_partition(cfg.input, "all")):
        with pytest.raises(InputError) as err:
            call()
        message = str(err.value)
        assert "11-character text" in message and "leading zero" in message
        assert "\n" not in message


def test_float_geoid_column_is_refused(tmp_path):
    frame = state_records("17", n=10, tracts=2)
    frame["geoid"] = frame["geoid"].astype(float)
    with pytest.raises(InputError, match="stored as float numbers"):
        partitions(input_config(one_state_file(tmp_path, frame)).input)


def test_boolean_rank_is_refused(tmp_path):
    frame = state_records("17", n=10, tracts=2)
    frame["parent_rank"] = frame["parent_rank"] > 0.5
    with pytest.raises(InputError, match="parent_rank is boolean"):
        partitions(input_config(one_state_file(tmp_path, frame)).input)


def test_text_ranks_that_are_not_numbers_are_refused(tmp_path):
    frame = state_records("17", n=10, tracts=2)
    frame["child_rank"] = frame["child_rank"].astype(str)
    frame.loc[[2, 6], "child_rank"] = ["high", "n.a."]
    path = tmp_path / "in.csv"  # (a text rank column in Parquet is refused by its type alone)
    frame.to_csv(path, index=False)
    cfg = input_config(path, fmt="csv")
    with pytest.raises(InputError) as err:
        read_partition(cfg.input, "all")
    message = str(err.value)
    assert "child_rank column 'child_rank'" in message and "2 row(s)" in message
    assert "'high', 'n.a.'" in message and "input rows 2, 6" in message


def test_text_ranks_in_csv_are_refused(tmp_path):
    frame = state_records("17", n=10, tracts=2)
    frame["parent_rank"] = frame["parent_rank"].astype(object)
    frame.loc[4, "parent_rank"] = "abc"
    path = tmp_path / "in.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(InputError, match=r"parent_rank column 'parent_rank' holds text .* "
                                         r"e\.g\. 'abc'"):
        read_partition(input_config(path, fmt="csv").input, "all")


def test_numbers_as_text_and_integers_are_ranks(tmp_path):
    frame = state_records("17", n=10, tracts=2)
    frame["parent_rank"] = frame["parent_rank"].astype(str)
    frame.loc[0, "parent_rank"] = ""  # blank: missing, for the contract to report
    frame["child_rank"] = (frame["child_rank"] * 100).round().astype("int64")
    path = tmp_path / "in.csv"  # numbers as text are ranks in a CSV; Parquet text is refused
    frame.to_csv(path, index=False)
    cfg = input_config(path, fmt="csv")
    df = read_partition(cfg.input, "all")
    assert df["x"].dtype == float and np.isnan(df.loc[0, "x"])
    assert np.allclose(df.loc[1:, "x"], frame.loc[1:, "parent_rank"].astype(float))
    assert np.array_equal(df["y"], frame["child_rank"].to_numpy(dtype=float))


def test_float_person_ids_are_refused(tmp_path):
    frame = state_records("17", n=10, tracts=2)
    frame["person_id"] = np.arange(10, dtype=float)
    with pytest.raises(InputError, match="person ids must be integers or text"):
        partitions(input_config(one_state_file(tmp_path, frame)).input)


def test_integer_person_ids_with_a_gap_stay_integers(tmp_path):
    frame = state_records("17", n=4, tracts=2)
    frame["person_id"] = pd.array([2**60 + 1, None, 2**60 + 3, 2**60 + 5], dtype="Int64")
    df = read_partition(input_config(one_state_file(tmp_path, frame)).input, "all")
    # as float64 these three ids would be one number; as integers they stay apart
    assert df["person_id"].dropna().nunique() == 3
    with pytest.raises(ValidationFailed, match="person_id"):
        apply_policy(df, "fail", "all", tmp_path / "internal")


# --- reading one state at a time ----------------------------------------------------------------


def interleaved_states(n_per_state: int = 400, states=("01", "17", "18")) -> pd.DataFrame:
    """Records of several states, interleaved (as an unsorted national file would be)."""
    frames = [state_records(s, n=n_per_state, tracts=8, first_id=1000 * k)
              for k, s in enumerate(states)]
    mixed = pd.concat(frames, ignore_index=True)
    order = np.random.default_rng(3).permutation(len(mixed))
    return mixed.iloc[order].reset_index(drop=True)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_single_file_is_split_by_state_with_file_row_positions(tmp_path, fmt, monkeypatch):
    frame = interleaved_states()
    frame.loc[[5, 900], "geoid"] = [None, "x1700100010"]  # blank and malformed: "other"
    path = tmp_path / f"in.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
        monkeypatch.setattr("dpatlas.release.ingest._STREAM_BLOCK_BYTES", 4096)  # many blocks
    else:
        frame.to_parquet(path, index=False, row_group_size=100)
        monkeypatch.setattr("dpatlas.release.ingest._STREAM_BATCH_ROWS", 97)
    cfg = input_config(path, fmt=fmt)

    parts = partitions(cfg.input)
    assert [(p.key, p.rows) for p in parts] == [("01", 400), ("17", 399), ("18", 399),
                                                ("other", 2)]
    whole = read_partition(cfg.input, "all")
    pieces = []
    for part in parts:
        df = read_partition(cfg.input, part.key)
        assert len(df) == part.rows
        if part.key != "other":
            assert (df["geoid"].str[:2] == part.key).all()
        # every record keeps its position in the file, so quarantine reports point at it
        assert df["row"].is_monotonic_increasing
        expected = whole.set_index("row").loc[df["row"]]
        assert list(df["geoid"]) == list(expected["geoid"])
        assert np.array_equal(df["x"], expected["x"]) and np.array_equal(df["y"], expected["y"])
        assert list(df["person_id"]) == list(expected["person_id"])
        pieces.append(df)
    assert sorted(pd.concat(pieces)["row"]) == list(range(len(frame)))
    other = read_partition(cfg.input, "other")
    assert list(other["row"]) == [5, 900] and other["geoid"].isna().tolist() == [True, False]
    assert read_partition(cfg.input, "56").empty  # a state with no records


def test_csv_state_read_holds_one_state_not_the_file(tmp_path, monkeypatch):
    """Arrow memory while reading one of twenty states from a ~9 MB CSV stays far below what
    the whole file takes: the file is streamed in blocks and only that state's rows are kept.
    (Blocks of 16 KiB here stand for the 1 MiB blocks of a national file of ~300 MB: pyarrow
    reads some 32 blocks ahead, so the bound is a multiple of the block size.) Measured: one
    state 1.44 MB, the file 7.03 MB. With ten states and 64 KiB blocks the margin was 3%, and
    read-ahead under a loaded CI machine took it (3.54 vs 7.03 MB)."""
    import pyarrow as pa

    monkeypatch.setattr("dpatlas.release.ingest._STREAM_BLOCK_BYTES", 16 << 10)
    states = tuple(f"{s:02d}" for s in (1, 4, 5, 6, 8, 9, 10, 11, 12, 13,
                                        15, 16, 17, 18, 19, 20, 21, 22, 23, 24))
    frame = interleaved_states(n_per_state=10_000, states=states)
    path = tmp_path / "in.csv"
    frame.to_csv(path, index=False)
    cfg = input_config(path, fmt="csv")

    pools = []  # kept alive: buffers allocated from a pool may outlive the read

    def arrow_peak(key: str) -> int:
        pools.append(pa.proxy_memory_pool(pa.default_memory_pool()))
        previous = pa.default_memory_pool()
        pa.set_memory_pool(pools[-1])
        try:
            df = read_partition(cfg.input, key)
        finally:
            pa.set_memory_pool(previous)
        assert len(df) == (10_000 if key != "all" else 200_000)
        return pools[-1].max_memory()

    one_state, whole = arrow_peak("06"), arrow_peak("all")
    assert one_state < whole / 3, (one_state, whole)


def test_csv_type_change_after_the_first_block_is_an_input_error(tmp_path, monkeypatch):
    frame = interleaved_states(n_per_state=300)
    frame["parent_rank"] = frame["parent_rank"].astype(object)
    frame.loc[850, "parent_rank"] = "high"  # far past the first (small) block
    path = tmp_path / "in.csv"
    frame.to_csv(path, index=False)
    monkeypatch.setattr("dpatlas.release.ingest._STREAM_BLOCK_BYTES", 4096)
    cfg = input_config(path, fmt="csv")
    state = frame.loc[850, "geoid"][:2]
    with pytest.raises(InputError) as err:
        read_partition(cfg.input, state)
    message = str(err.value)
    assert "cannot be read with consistent column types" in message and "\n" not in message


def test_hive_partition_counts_come_from_the_footers(tmp_path, two_states, monkeypatch):
    two_states["36"] = state_records("36", n=7, first_id=5000)
    cfg = input_config(write_states(tmp_path, two_states))
    monkeypatch.setattr("dpatlas.release.ingest._to_table", lambda *a, **k: pytest.fail("data read"))
    assert [(p.key, p.rows) for p in partitions(cfg.input)] == [("17", 60), ("18", 60),
                                                                ("36", 7)]
    monkeypatch.undo()
    df = read_partition(cfg.input, "36")
    assert list(df["row"]) == list(range(120, 127))  # positions in partition order


def test_footer_counts_are_read_once_per_file_and_again_once_it_changed(tmp_path, two_states):
    """Every partition read needs the rows of the states before it: each file's footer is
    read once per process (issue 35), and a file written again is read again."""
    from dpatlas.release import ingest

    cfg = input_config(write_states(tmp_path, two_states))
    ingest._FOOTER_ROWS.clear()
    assert list(read_partition(cfg.input, "18")["row"]) == list(range(60, 120))
    files = sorted(str(p) for p in (tmp_path / "microdata").glob("state=*/part-0.parquet"))
    assert sorted(key[0] for key in ingest._FOOTER_ROWS) == files
    # a count the cache holds is the one used: the footer is not opened again
    (key17,) = [key for key in ingest._FOOTER_ROWS if "state=17" in key[0]]
    ingest._FOOTER_ROWS[key17] = 1000
    assert list(read_partition(cfg.input, "18")["row"])[:1] == [1000]
    # state 17 written again with fewer records: another size, read again
    two_states["17"].iloc[:25].to_parquet(tmp_path / "microdata" / "state=17" / "part-0.parquet",
                                          index=False)
    assert list(read_partition(cfg.input, "18")["row"]) == list(range(25, 85))
    ingest._FOOTER_ROWS.clear()


def test_the_state_folder_check_passes_malformed_geoids_to_the_contract(tmp_path, two_states):
    """Only a whole 11-digit GEOID of another state is misfiled: a 10-digit GEOID (a lost
    leading zero), a blank or a null one in folder state=18 are left to the contract, also
    when they do not start with 18."""
    frame = two_states["18"].copy()
    frame["geoid"] = frame["geoid"].astype(object)
    frame.loc[0, "geoid"] = "1700100010"   # 10 digits
    frame.loc[1, "geoid"] = ""
    frame.loc[2, "geoid"] = None
    frame.loc[3, "geoid"] = "17abc000100"  # 11 characters, not digits
    two_states["18"] = frame
    cfg = input_config(write_states(tmp_path, two_states))
    assert len(read_partition(cfg.input, "18")) == 60
    frame.loc[4, "geoid"] = "17001000100"  # a whole GEOID of state 17: refused
    frame.to_parquet(tmp_path / "microdata" / "state=18" / "part-0.parquet", index=False)
    with pytest.raises(InputError, match="state=18/part-0.parquet"):
        read_partition(cfg.input, "18")


# --- a large state split by whole cells ---------------------------------------------------------

# Records per cell of the large state: sorted, its cells are "../etc", "a/b", "x y", "ü"
# (text that must never reach a file name). With a bound of 70 the greedy groups are
# ["../etc", "a/b"] (60; adding "x y" would make 100), ["x y"] (40; "ü" would make 120) and
# ["ü"] alone (80: one cell larger than the bound is still one group).
SPLIT_CELLS = {"x y": 40, "ü": 80, "../etc": 50, "a/b": 10}
SPLIT_PARTITIONS = [("01", 30, None), ("17-c0", 60, ("../etc", "a/b")),
                    ("17-c1", 40, ("x y",)), ("17-c2", 80, ("ü",))]


def cells_of_two_states() -> dict[str, pd.DataFrame]:
    """State 17 with 180 records in four cells, interleaved; state 01 with 30 (under the
    bound, and first: the split state's positions do not start at 0)."""
    cells = np.repeat(list(SPLIT_CELLS), list(SPLIT_CELLS.values()))
    large = state_records("17", n=len(cells), tracts=8)
    large["cell"] = np.random.default_rng(4).permutation(cells)
    small = state_records("01", n=30, tracts=3, first_id=5000)
    return {"01": small, "17": large}


@pytest.mark.parametrize("form", ["hive", "csv", "parquet"])
def test_a_state_above_the_bound_is_split_by_whole_cells(tmp_path, form, monkeypatch):
    frames = cells_of_two_states()
    if form == "hive":
        cfg = input_config(write_states(tmp_path, frames))
        monkeypatch.setattr("dpatlas.release.ingest._STREAM_BATCH_ROWS", 23)
    else:
        mixed = pd.concat(frames.values(), ignore_index=True)
        mixed = mixed.iloc[np.random.default_rng(5).permutation(len(mixed))]
        path = tmp_path / f"in.{form}"
        if form == "csv":
            mixed.to_csv(path, index=False)
            monkeypatch.setattr("dpatlas.release.ingest._STREAM_BLOCK_BYTES", 2048)
        else:
            mixed.to_parquet(path, index=False, row_group_size=50)
            monkeypatch.setattr("dpatlas.release.ingest._STREAM_BATCH_ROWS", 23)
        cfg = input_config(path, fmt=form)
    # under the default bound every state is one partition, keyed as before
    assert [(p.key, p.rows, p.cells) for p in partitions(cfg.input)] == [("01", 30, None),
                                                                         ("17", 180, None)]
    monkeypatch.setattr("dpatlas.release.ingest.PARTITION_RECORDS", 70)
    parts = partitions(cfg.input)
    assert [(p.key, p.rows, p.cells) for p in parts] == SPLIT_PARTITIONS
    assert parts == partitions(cfg.input)  # the same keys on every listing

    whole = read_partition(cfg.input, "all")
    state = read_partition(cfg.input, "17")
    pieces = []
    for part in parts[1:]:
        df = read_partition(cfg.input, part.key, part.cells)
        # exactly this group's records, at their positions in the input, in input order
        expected = whole[(whole["geoid"].str[:2] == "17") & whole["cell"].isin(part.cells)]
        assert len(df) == part.rows and sorted(set(df["cell"])) == list(part.cells)
        pd.testing.assert_frame_equal(df.reset_index(drop=True),
                                      expected.reset_index(drop=True))
        # without the listed cells, the partition lists them again and reads the same
        pd.testing.assert_frame_equal(read_partition(cfg.input, part.key), df)
        pieces.append(df)
    union = pd.concat(pieces).sort_values("row", ignore_index=True)
    pd.testing.assert_frame_equal(union, state.reset_index(drop=True))
    assert len(read_partition(cfg.input, "01")) == 30
    with pytest.raises(InputError, match="no partition 17-c3"):
        read_partition(cfg.input, "17-c3")


@pytest.mark.parametrize("staging", [True, False])
def test_a_validation_on_the_workers_that_fails_leaves_no_rows_at_the_staging_location(
        tmp_path, monkeypatch, staging):
    """With runner dask, the validation tasks write each partition's staged rows, quarantine
    file and GX project where the workers write (the staging location, or the internal
    folder). When a task fails (an unreadable partition, a lost worker) the flow records none
    of them and a rerun validates everything again; the person-level rows the others wrote at
    a staging location are removed, not left there. In the internal folder (no staging
    location) only the unrecorded GX projects go; its staged rows and quarantine stay, as the
    local runner's do."""
    import flows.validation as validation
    from dpatlas.core.config import parse_config

    data = write_states(tmp_path / "data", {"17": state_records("17")})
    config = {"input": {"path": str(data), "columns": {"person_id": "person_id"}},
              "boundaries": {"path": "tracts.parquet"}, "selection": {"rule": "fixed"},
              "runner": "dask"}
    if staging:
        config["staging_url"] = str(tmp_path / "staging")
    cfg = parse_config(config)
    internal = tmp_path / "internal" / "r"
    where = tmp_path / "staging" / "r" if staging else internal

    class LostWorker(RuntimeError):
        pass

    def crashing_subflow(*args, **kwargs):  # one task wrote its files, another was lost
        for name in ("staged/input-17.parquet", "quarantine/input-17.parquet",
                     "validation-parts/17/gx/great_expectations.yml",
                     "contribution-hashes/17/bucket-0.npy"):
            (where / name).parent.mkdir(parents=True, exist_ok=True)
            (where / name).write_bytes(b"person-level")
        raise LostWorker("worker lost")

    class Subflow:
        def with_options(self, **options):
            return crashing_subflow

    monkeypatch.setattr(validation, "validate_on_workers", Subflow())
    monkeypatch.setattr(validation, "release_task_runner", lambda cfg, address: None)
    with pytest.raises(LostWorker):
        validation.validate_release_input(cfg, "r", None, internal, partitions(cfg.input))
    left = sorted(str(p.relative_to(where)) for p in where.rglob("*") if p.is_file())
    assert left == ([] if staging else ["quarantine/input-17.parquet", "staged/input-17.parquet"])
