"""Tract files partitioned by state (issue 35, item 2): a two-state release publishes
``tracts/state=XX/`` parts that the manifest hashes and ``dpatlas audit`` checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from dpatlas.audit import audit_release
from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

from tests.integration.test_cells_release import release_cells

KINDS = {"parquet": ("tracts", "part-0.parquet"), "csv": ("tracts-csv", "tracts.csv"),
         "geojson": ("tracts-geojson", "tracts.geojson")}


def part(kind: str, state: str) -> str:
    folder, file = KINDS[kind]
    return f"{folder}/state={state}/{file}"


@pytest.fixture(scope="module")
def two_states(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("parts")
    write_synthetic(tmp / "data", ["17", "18"], seed=5,
                    params=StateParams(n_tracts=20, counties=2), cells=2)
    return release_cells(tmp / "data", tmp, "p1")


def test_a_two_state_release_publishes_one_part_per_state_hashed_in_the_manifest(two_states):
    files = json.loads((two_states / "manifest.json").read_text())["files"]
    for state in ("17", "18"):
        for kind in KINDS:
            assert part(kind, state) in files
        table = pq.read_table(two_states / part("parquet", state))
        assert set(table.column("state").to_pylist()) == {state}
        assert b"geo" in table.schema.metadata  # each part is GeoParquet on its own
    assert not {"tracts.parquet", "tracts.csv", "tracts.geojson"} & set(files)
    whole = pd.read_parquet(two_states / "tracts", partitioning=None)
    assert len(whole) == 40 * 2 and whole["geoid"].nunique() == 40


def _audit(folder: Path) -> dict:
    return {name: (good, detail) for name, good, detail in audit_release(folder).checks}


def test_the_audit_passes_a_partitioned_release(two_states):
    checks = _audit(two_states)
    assert all(good for good, _ in checks.values()), checks
    assert "2 states' parts" in checks["parts"][1]


def _forged(two_states: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "forged"
    shutil.copytree(two_states, copy)
    return copy


def test_the_audit_fails_a_part_whose_rows_are_altered(two_states, tmp_path):
    folder = _forged(two_states, tmp_path)
    path = folder / part("parquet", "18")
    table = pq.read_table(path)
    frame = table.to_pandas()
    frame["n"] = frame["n"] + 1
    pq.write_table(table.from_pandas(frame, schema=table.schema, preserve_index=False), path)
    checks = _audit(folder)
    assert not checks["files"][0] and part("parquet", "18") in checks["files"][1]


def test_the_audit_fails_a_part_missing(two_states, tmp_path):
    folder = _forged(two_states, tmp_path)
    (folder / part("csv", "17")).unlink()
    checks = _audit(folder)
    assert not checks["files"][0] and f'{part("csv", "17")} missing' in checks["files"][1]


def test_the_audit_fails_a_part_not_listed(two_states, tmp_path):
    folder = _forged(two_states, tmp_path)
    (folder / "tracts-csv" / "state=19").mkdir()
    shutil.copy(folder / part("csv", "17"), folder / part("csv", "19"))
    checks = _audit(folder)
    assert not checks["files"][0] and part("csv", "19") in checks["files"][1]
