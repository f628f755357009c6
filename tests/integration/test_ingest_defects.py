"""Issue 31's input defects: records filed under another state's folder (item 2), null cells
dropped silently (O3), unit ranks declared as percentiles (O4), and ingest's misleading
messages (O12). Each test failed on the code before the fix."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpatlas.release.ingest import InputError, partitions, read_partition
from dpatlas.release.validate import ValidationFailed

from tests.support.cli import OWN_SERVER, refusal_block
from tests.support.cli import run_in_process as dpatlas
from tests.support.inputs import write_config
from tests.integration.test_inputs import input_config, state_records, write_states


def ledger_entries(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        return con.execute("SELECT count(*) FROM ledger_releases").fetchone()[0]


def release_config(tmp: Path, microdata: Path, boundaries_of: list[str], **over) -> Path:
    """A release config over ``microdata`` with synthetic boundaries of the given states."""
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    write_synthetic(tmp / "b", boundaries_of, seed=3, params=StateParams(n_tracts=6, counties=2))
    base = {"input": {"path": str(microdata)},
            "boundaries": {"path": str(tmp / "b" / "tracts.parquet")},
            "selection": {"rule": "dp", "threshold": 3.0},
            "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal"),
                        "min_n": 5},
            "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "d"}}
    return write_config(tmp / "config.yaml", base, **over)


# --- item 2: every record's GEOID belongs to its partition -----------------------------------


def split_tract(tmp: Path) -> tuple[Path, str]:
    """States 37 and 45, with every other record of tract 37's first tract filed in
    ``state=45/part-1.parquet`` (the issue's repro)."""
    frames = {"37": state_records("37", n=120, tracts=6),
              "45": state_records("45", n=120, tracts=6, first_id=1000)}
    root = write_states(tmp, frames)
    tract = frames["37"]["geoid"].iloc[0]
    moved = frames["37"][frames["37"]["geoid"] == tract].iloc[::2]
    frames["37"].drop(moved.index).to_parquet(root / "state=37" / "part-0.parquet", index=False)
    moved.to_parquet(root / "state=45" / "part-1.parquet", index=False)
    return root, tract


def test_a_record_of_another_state_in_a_state_folder_is_refused_naming_file_and_rows(tmp_path):
    root, tract = split_tract(tmp_path)
    cfg = input_config(root)
    assert len(read_partition(cfg.input, "37")) == 110
    with pytest.raises(InputError) as err:
        read_partition(cfg.input, "45")
    message = str(err.value)
    assert "state=45/part-1.parquet" in message and "10 record(s)" in message
    assert "rows 0, 1, 2, 3, 4 of the file" in message and repr(tract) in message
    assert "\n" not in message


def test_a_split_state_group_is_checked_too(tmp_path, monkeypatch):
    root, _ = split_tract(tmp_path)
    cfg = input_config(root)
    monkeypatch.setattr("dpatlas.release.ingest.PARTITION_RECORDS", 70)
    parts = [p for p in partitions(cfg.input) if p.key.startswith("45-")]
    assert [p.cells for p in parts] == [("female",), ("male",)]
    with pytest.raises(InputError, match="state=45/part-1.parquet"):  # the moved records'
        read_partition(cfg.input, parts[0].key, parts[0].cells)
    assert len(read_partition(cfg.input, parts[1].key, parts[1].cells)) == 60


def test_a_tract_in_two_staged_partitions_is_refused_before_the_charge():
    from dpatlas.release.estimate import all_sizes
    from dpatlas.release.validate import check_one_partition_per_tract

    counts = {Path("input-37.parquet"): pd.DataFrame({"geoid": ["37001000100"],
                                                      "cell": ["all"], "n": [4]}),
              Path("input-45.parquet"): pd.DataFrame({"geoid": ["37001000100", "45001000100"],
                                                      "cell": ["all", "all"], "n": [4, 9]})}
    with pytest.raises(ValidationFailed, match="37001000100.*input-37, input-45"):
        check_one_partition_per_tract(counts, all_sizes(counts))
    distinct = {p: c.iloc[-1:] for p, c in counts.items()}
    check_one_partition_per_tract(distinct, all_sizes(distinct))


def test_the_split_tract_release_is_refused_before_the_charge(tmp_path):
    root, tract = split_tract(tmp_path)
    cfg = release_config(tmp_path, root, ["37", "45"])
    res = dpatlas("release", "-c", str(cfg), "--release-id", "r1", "--noise-seed", "1",
                  env=OWN_SERVER)
    out = refusal_block(res)
    assert "state=45/part-1.parquet" in out and "rows 0, 1, 2, 3, 4" in out and tract in out
    assert ledger_entries(tmp_path / "ledger.db") == 0
    assert not (tmp_path / "releases" / "r1").exists()


# --- O3: records without a cell are refused or quarantined, never dropped unseen --------------


def cells_file(tmp: Path, blank: bool = False) -> Path:
    """One state's records in cells under the input column ``group``: 110 of 120 have none
    (null; the issue's repro, smaller), or with ``blank`` one has an empty label instead."""
    frame = state_records("37", n=120, tracts=6).rename(columns={"cell": "group"})
    frame["group"] = frame["group"].astype(object)
    if blank:
        frame.loc[12, "group"] = ""
    else:
        frame.loc[frame.index % 12 != 0, "group"] = None
    path = tmp / "data" / "microdata.parquet"
    path.parent.mkdir(parents=True)
    frame.to_parquet(path, index=False)
    return path


def test_null_cells_under_policy_fail_refuse_the_release_before_the_charge(tmp_path):
    cfg = release_config(tmp_path, cells_file(tmp_path), ["37"],
                         input={"columns": {"person_id": "person_id", "cell": "group"}})
    out = refusal_block(dpatlas("release", "-c", str(cfg), "--release-id", "r1",
                                "--noise-seed", "1", env=OWN_SERVER))
    assert "on column 'group': 110 row(s) have no cell, e.g. input rows 1, 2, 3, 4, 5" in out
    assert ledger_entries(tmp_path / "ledger.db") == 0


def test_null_cells_under_policy_drop_are_quarantined_and_counted(tmp_path):
    from dpatlas.release.validate import apply_policy

    cfg = input_config(cells_file(tmp_path), cell="group")
    clean, report = apply_policy(read_partition(cfg.input, "37"), "drop", "37",
                                 tmp_path / "internal")
    assert len(clean) == 10 and clean["cell"].notna().all()
    assert report.dropped == report.quarantined == 110
    quarantined = pd.read_parquet(report.quarantine_file)
    assert sorted(quarantined["row"]) == sorted(set(range(120)) - set(range(0, 120, 12)))


def test_an_empty_cell_label_is_refused_at_validation_naming_column_and_rows(tmp_path):
    # before: refused only at the charge, "cell must be a non-empty string, got ''"
    from dpatlas.release import validate

    cfg = input_config(cells_file(tmp_path, blank=True), cell="group")
    with pytest.raises(ValidationFailed) as err:
        validate.apply_policy(read_partition(cfg.input, "37"), "fail", "37",
                              tmp_path / "internal",
                              **({"columns": validate.input_column_names(cfg.input.columns)}
                                 if hasattr(validate, "input_column_names") else {}))
    assert "on column 'group': 1 row(s) have a blank cell, e.g. input rows 12" in str(err.value)


# --- O4: the declared rank scale against the ranks ----------------------------------------------


def test_unit_ranks_declared_as_percentiles_are_refused_before_the_charge(tmp_path):
    root = write_states(tmp_path, {"37": state_records("37", n=120, tracts=6)})  # on [0, 1]
    cfg = release_config(tmp_path, root, ["37"], input={"rank_scale": "percentile"})
    out = refusal_block(dpatlas("release", "-c", str(cfg), "--release-id", "r1",
                                "--noise-seed", "1", env=OWN_SERVER))
    assert "no rank in the input exceeds 1" in out and "input.rank_scale: unit" in out
    assert ledger_entries(tmp_path / "ledger.db") == 0
    assert not (tmp_path / "releases" / "r1").exists()


def test_the_rank_scale_check_reads_every_partition():
    from dpatlas.release.validate import check_rank_scale

    unit = [{"largest_rank": 0.0099}, {"largest_rank": None}, {"largest_rank": 0.01}]
    with pytest.raises(ValidationFailed, match="input.rank_scale: unit"):
        check_rank_scale(unit, "percentile")
    check_rank_scale(unit, "unit")
    check_rank_scale(unit + [{"largest_rank": 0.0101}], "percentile")  # one rank above 1
    check_rank_scale([{"largest_rank": None}], "percentile")  # no ranks: the contract's job


def test_percentiles_declared_as_unit_ranks_are_refused_with_the_scale_hint(tmp_path):
    from dpatlas.release.validate import apply_policy

    frame = state_records("37", n=40, tracts=4)
    frame[["parent_rank", "child_rank"]] *= 100
    cfg = input_config(write_states(tmp_path, {"37": frame}))
    with pytest.raises(ValidationFailed) as err:  # refused already; now it says why
        apply_policy(read_partition(cfg.input, "37"), "fail", "37", tmp_path / "internal")
    assert "look like percentiles: set input.rank_scale: percentile" in str(err.value)


# --- O12: what ingest and config check say -------------------------------------------------------


def ingest_refusals(cfg, key: str = "37") -> list[str]:
    """What listing the partitions and reading one say: each must refuse (InputError)."""
    return [str(pytest.raises(InputError, call).value)
            for call in (lambda: partitions(cfg.input), lambda: read_partition(cfg.input, key))]


def test_config_check_does_not_call_duplicates_or_a_missing_input_verified(tmp_path):
    frame = state_records("37", n=120, tracts=6)
    frame.loc[5, "person_id"] = frame.loc[7, "person_id"]
    frame.loc[5, "cell"] = frame.loc[7, "cell"]  # one person twice in one cell
    root = write_states(tmp_path, {"37": frame})
    cfg = release_config(tmp_path, root, ["37"])
    dup = dpatlas("config", "check", str(cfg))
    assert dup.returncode == 0, dup.stdout
    assert "verified" not in dup.stdout
    assert ("one record per person and cell: not read here; each release checks it before its "
            "charge, over person id column 'person_id'") in dup.stdout
    (root / "state=37" / "part-0.parquet").rename(tmp_path / "moved.parquet")
    (root / "state=37").rmdir()
    root.rmdir()
    missing = dpatlas("config", "check", str(cfg))
    assert missing.returncode == 2 and "input not found" in missing.stdout
    assert "verified" not in missing.stdout


def test_a_latin1_csv_is_said_to_be_not_utf8(tmp_path):
    frame = state_records("37", n=20, tracts=2)
    frame.loc[3, "cell"] = "Bézier"
    frame.to_csv(tmp_path / "in.csv", index=False, encoding="latin-1")
    for message in ingest_refusals(input_config(tmp_path / "in.csv", fmt="csv")):
        assert "is not UTF-8 text (line 5 holds" in message and "iconv -f latin1" in message
        assert "truncated or corrupt" not in message


def test_a_latin1_byte_after_the_first_block_is_said_to_be_not_utf8(tmp_path, monkeypatch):
    frame = state_records("37", n=3000, tracts=2)
    frame.loc[2500, "cell"] = "Bézier"
    frame.to_csv(tmp_path / "in.csv", index=False, encoding="latin-1")
    monkeypatch.setattr("dpatlas.release.ingest._STREAM_BLOCK_BYTES", 4096)
    with pytest.raises(InputError, match="is not UTF-8 text"):
        partitions(input_config(tmp_path / "in.csv", fmt="csv").input)


@pytest.mark.parametrize("where", ["", "state=37"])
def test_a_readme_in_a_parquet_folder_is_named_as_not_parquet(tmp_path, where):
    root = write_states(tmp_path, {"37": state_records("37", n=20, tracts=2)})
    (root / where / "README.txt").write_text("Exported by the census team.\n")
    with pytest.raises(InputError) as err:
        partitions(input_config(root).input)
    message = str(err.value)
    readme = str(Path(where) / "README.txt")
    assert f"holds {readme}, which is not a Parquet file" in message, message
    assert "truncated or corrupt" not in message


def test_a_truncated_parquet_file_is_still_called_truncated(tmp_path):
    path = tmp_path / "in.parquet"
    state_records("37", n=20, tracts=2).to_parquet(path, index=False)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(InputError, match="truncated or corrupt"):
        partitions(input_config(path).input)


@pytest.mark.parametrize("inside", [[], ["state=37/"], [".hidden.parquet", "_SUCCESS"]])
def test_an_input_folder_without_data_files_says_so(tmp_path, inside):
    folder = tmp_path / "microdata"
    folder.mkdir()
    for name in inside:
        (folder / name).mkdir() if name.endswith("/") else (folder / name).write_text("")
    for message in ingest_refusals(input_config(folder)):
        assert "holds no data files" in message and "[]" not in message


def test_a_folder_of_files_not_partitioned_by_state_says_so(tmp_path):
    folder = tmp_path / "microdata"
    folder.mkdir()
    state_records("37", n=20, tracts=2).to_parquet(folder / "part-0.parquet", index=False)
    with pytest.raises(InputError, match="is not partitioned by state.*state=SS"):
        partitions(input_config(folder).input)


@pytest.mark.parametrize("suffix", [".parquet", ".geojson"])
def test_integer_boundary_geoids_are_said_to_be_numbers(tmp_path, suffix):
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
    from dpatlas.core.places import BoundaryError
    from dpatlas.release.boundaries import load_boundaries, write_boundaries

    import geopandas as gpd

    write_synthetic(tmp_path, ["37"], seed=3, params=StateParams(n_tracts=4, counties=2))
    tracts = gpd.read_parquet(tmp_path / "tracts.parquet")
    tracts["GEOID"] = tracts["GEOID"].astype("int64")
    path = write_boundaries(tracts, tmp_path / f"numbers{suffix}")
    with pytest.raises(BoundaryError) as err:
        load_boundaries(path, "GEOID")
    message = str(err.value)
    assert "column 'GEOID' holds numbers, not text (4 of 4, e.g. 37001" in message, message
    assert "leading zeros may be lost" in message and "not 11 digits" not in message


def test_geoids_written_from_a_numeric_column_are_said_to_be_numbers(tmp_path):
    from dpatlas.release.validate import apply_policy

    frame = state_records("37", n=20, tracts=2)
    frame["geoid"] = frame["geoid"].astype(float)  # as a spreadsheet or pandas writes them
    frame.to_csv(tmp_path / "in.csv", index=False)
    df = read_partition(input_config(tmp_path / "in.csv", fmt="csv").input, "all")
    with pytest.raises(ValidationFailed) as err:
        apply_policy(df, "fail", "other", tmp_path / "internal")
    said = " ".join(str(err.value).split())
    assert "20 GEOIDs end in a decimal part, e.g. '37001000100.0'" in said, said
    assert "written from a numeric column" in said and "must be text" in said


def test_a_csv_file_configured_as_parquet_is_said_to_be_not_parquet(tmp_path):
    state_records("37", n=20, tracts=2).to_csv(tmp_path / "in.parquet", index=False)
    with pytest.raises(InputError, match="is not a Parquet file.*input.format: csv"):
        partitions(input_config(tmp_path / "in.parquet").input)
