"""Cells at scale (issue 22, item 3): the synthetic generator's cells, a seeded release that
publishes every cell, and the memory-bounded paths giving what the whole-frame paths give."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from dpatlas.evaluation.synthetic_input import (StateParams, cell_names,  # noqa: E402
                                                write_synthetic)
from dpatlas.release import contributions  # noqa: E402
from dpatlas.release.contributions import check_contributions  # noqa: E402

from tests.support.inputs import cells_release_config, write_config  # noqa: E402
from tests.support.published import read_published  # noqa: E402

CELLS = 3


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("cells") / "data"
    info = write_synthetic(out, ["17", "18"], seed=5, params=StateParams(n_tracts=40, counties=3),
                           cells=CELLS)
    return out, info


def test_the_generator_gives_every_person_one_record_in_each_named_cell(data):
    out, info = data
    df = pd.read_parquet(out / "microdata")
    assert info["cells"] == ["outcome-1", "outcome-2", "outcome-3"] == cell_names(CELLS)
    assert sorted(df["cell"].unique()) == info["cells"]
    assert info["records"] == len(df)
    # one record per (person, cell), and each person in every cell: the shape the release's
    # accounting assumes (cells share people and compose sequentially)
    per_pair = df.groupby(["person_id", "cell"]).size()
    assert (per_pair == 1).all()
    persons = df["person_id"].nunique()
    assert len(df) == persons * CELLS
    # a person keeps the same tract and parent rank in every cell
    same = df.groupby("person_id")[["geoid", "parent_rank"]].nunique()
    assert (same == 1).all().all()
    # the cells are different outcomes: their tract means and slopes differ
    means = df.groupby("cell")["child_rank"].mean()
    assert means.max() - means.min() > 0.01
    one = df[df["cell"] == "outcome-1"]
    two = df[df["cell"] == "outcome-2"]
    assert not np.array_equal(one["child_rank"].to_numpy(), two["child_rank"].to_numpy())


def test_without_cells_the_generator_writes_what_it_wrote_before(tmp_path):
    write_synthetic(tmp_path / "a", ["17"], seed=2, params=StateParams(n_tracts=15, counties=2))
    df = pd.read_parquet(tmp_path / "a" / "microdata")
    assert "cell" not in df.columns
    assert list(df.columns) == ["person_id", "geoid", "parent_rank", "child_rank", "state"]


def test_bucketed_contribution_check_finds_what_the_whole_sort_finds(data, tmp_path,
                                                                     monkeypatch):
    """The same repeats, reports and quarantine whether the hashes are sorted at once or a
    bucket of leading bits at a time (forced here with a tiny bucket)."""
    out, _ = data
    staged = []
    for k, part in enumerate(sorted((out / "microdata").glob("state=*/*.parquet"))):
        frame = pd.read_parquet(part)
        if k == 0:  # a few persons twice in a cell (another tract), one in two cells anew
            extra = frame[frame["cell"] == "outcome-2"].head(5).assign(geoid="17999999999")
            frame = pd.concat([frame, extra], ignore_index=True)
        frame = frame.rename(columns={"parent_rank": "x", "child_rank": "y"})
        frame.insert(0, "row", np.arange(len(frame)))
        staged.append(tmp_path / f"input-{k}.parquet")
        frame.to_parquet(staged[-1], index=False)

    def run(folder: str) -> tuple[dict, pd.DataFrame]:
        with pytest.raises(contributions.ContributionError) as err:
            check_contributions(staged, "fail", tmp_path / folder)
        return str(err.value), pd.read_parquet(
            tmp_path / folder / "quarantine" / contributions.QUARANTINE_NAME)

    whole_message, whole = run("whole")
    monkeypatch.setattr(contributions, "_BUCKET_BYTES", 16 * 1024)  # 16 buckets
    monkeypatch.setattr(contributions, "_BATCH_ROWS", 100)
    bucket_message, bucketed = run("buckets")
    assert "5 person(s)" in whole_message
    assert bucket_message.replace("buckets", "whole") == whole_message
    pd.testing.assert_frame_equal(bucketed, whole)
    assert len(whole) == 10
    # the scratch hashes are removed
    assert not list((tmp_path / "buckets").glob("contribution-hashes-*"))


def release_cells(out: Path, tmp: Path, release_id: str, **bounds: int) -> Path:
    """The release of the generated cells ``out`` (noise seed 7) with its work under ``tmp``;
    ``bounds``: module constants set for the run (``"dpatlas.release.ingest.PARTITION_RECORDS"``
    and the like, by dotted name), the published folder returned."""
    cfg = cells_release_config(out, tmp)
    with pytest.MonkeyPatch.context() as mp, prefect_test_harness(server_startup_timeout=180):
        for name, value in bounds.items():
            mp.setattr(name, value)
        from flows.release import release

        outcome = release(str(write_config(tmp / "config.yaml", cfg)), release_id, 7)
    assert outcome.status == "published"
    return Path(outcome.folder)


@pytest.fixture(scope="module")
def released(data, tmp_path_factory) -> Path:
    out, _ = data
    return release_cells(out, tmp_path_factory.mktemp("cells-release"), "c1")


def test_a_release_with_cells_publishes_every_tract_county_and_state_in_every_cell(released):
    tracts = read_published(released, "tracts")
    names = cell_names(CELLS)
    assert sorted(tracts["cell"].unique()) == names
    per_tract = tracts.groupby("geoid")["cell"].apply(sorted)
    assert len(per_tract) == 80 and all(cells == names for cells in per_tract)
    released_rows = tracts[tracts["status"] == "released"]
    assert set(released_rows["cell"]) == set(names)
    # every cell is estimated from its own outcome: the cells' released values differ
    wide = released_rows.pivot(index="geoid", columns="cell", values="p25").dropna()
    assert len(wide) > 10 and not np.allclose(wide[names[0]], wide[names[1]])
    for stem in ("counties", "states"):
        level = pd.read_parquet(released / f"{stem}.parquet")
        assert level.groupby("geoid")["cell"].apply(sorted).map(lambda c: c == names).all()
    m = json.loads((released / "manifest.json").read_text())
    # cells compose sequentially: the ledger charged each cell, the total is CELLS times one
    assert m["total_per_person"]["cells"] == CELLS
    per_cell = m["budget"]["epsilon_per_tract_and_cell"]
    assert m["ledger_entry"]["epsilon"] == pytest.approx(CELLS * per_cell)


def test_tasks_split_by_cells_publish_the_same_tract_cells_with_their_own_draws(
        data, released, tmp_path):
    """A record bound small enough to split every chunk and state by cells (what many cells
    do to a national release): the same tract-cells, sizes and budget, published from draws
    named per group of cells."""
    out, _ = data
    folder = release_cells(out, tmp_path, "c2",
                           **{"dpatlas.release.cell_groups.TASK_RECORDS": 1500})
    internal = tmp_path / "internal" / "c2"
    chunk_draws = sorted(p.stem for p in (internal / "results").glob("*.parquet"))
    level_draws = sorted(p.stem for p in (internal / "levels").glob("*.parquet"))
    assert chunk_draws and all("-c" in name for name in chunk_draws)
    assert level_draws == [f"state-{s}-c{j}" for s in ("17", "18") for j in range(CELLS)]
    key = ["geoid", "cell"]
    for stem in ("tracts", "counties", "states"):
        split = read_published(folder, stem).sort_values(key)
        whole = read_published(released, stem).sort_values(key)
        pd.testing.assert_frame_equal(split[key + ["n"]].reset_index(drop=True),
                                      whole[key + ["n"]].reset_index(drop=True))
        assert (split["status"] == "released").sum() > 0
    m_split = json.loads((folder / "manifest.json").read_text())
    m_whole = json.loads((released / "manifest.json").read_text())
    assert m_split["ledger_entry"]["epsilon"] == m_whole["ledger_entry"]["epsilon"]


@pytest.fixture(scope="module")
def split_released(data, tmp_path_factory) -> tuple[Path, Path, Path]:
    """The release of ``released`` (same input, config and noise seed) with a bound of 5,000
    records per partition: each state's ~7,000 records (~2,350 per cell) are split into two
    partitions, its first two cells and its third."""
    out, info = data
    tmp = tmp_path_factory.mktemp("cells-split")
    folder = release_cells(out, tmp, "c1",
                           **{"dpatlas.release.ingest.PARTITION_RECORDS": 5_000})
    return folder, tmp / "internal", out


def _published(folder: Path, stem: str) -> pd.DataFrame:
    cols = ["geoid", "cell", "n", "status"]
    return (read_published(folder, stem, columns=cols)
            .sort_values(["geoid", "cell"], ignore_index=True))


def test_a_release_with_large_states_split_by_cells_publishes_the_same_tracts(
        released, split_released):
    folder, internal, out = split_released
    records = pd.read_parquet(out / "microdata", columns=["cell", "state"])
    per_cell = records.groupby(["state", "cell"]).size()
    assert (per_cell.groupby("state").sum() > 5_000).all()  # every state is split ...
    assert (per_cell.groupby("state").head(2).groupby("state").sum() <= 5_000).all()  # 2+1
    # the same tract-cells, counts and statuses as the release with one partition per state
    # (their noise differs: the chunks are named after their partitions)
    for stem in ("tracts", "counties", "states"):
        pd.testing.assert_frame_equal(_published(folder, stem), _published(released, stem))
    # validation reports, Data Docs runs and staged files, one per split partition
    keys = ["17-c0", "17-c1", "18-c0", "18-c1"]
    [validation] = list(internal.rglob("validation.json"))
    reports = json.loads(validation.read_text())["partitions"]
    assert [r["partition"] for r in reports] == keys
    assert sum(r["rows_in"] for r in reports) == len(records)
    staged = sorted(validation.parent.glob("staged/*.parquet"))
    assert [p.name for p in staged] == [f"input-{k}.parquet" for k in keys]
    names = cell_names(CELLS)
    assert [sorted(pd.read_parquet(p, columns=["cell"])["cell"].unique()) for p in staged] == [
        names[:2], names[2:]] * 2
    [index] = list(internal.rglob("validation_report/index.html"))
    page = index.read_text()
    assert all(f"input-{k}" in page for k in keys)
    assert "input partition 17-c1 (state 17, cell group 1)" in "".join(
        p.read_text() for p in index.parent.rglob("*.html"))


# --- the county and state archives of each cell (issue 35, item 3, for the levels) ------------


def _archive_features(path: Path, layer: str) -> list[dict]:
    import gzip

    import mapbox_vector_tile
    from pmtiles.reader import MmapSource, Reader, all_tiles

    with open(path, "rb") as fh:
        reader = Reader(MmapSource(fh))
        return [f["properties"] for _, tile in all_tiles(reader.get_bytes)
                for f in mapbox_vector_tile.decode(gzip.decompress(tile))[layer]["features"]]


def test_each_cell_has_its_own_county_and_state_archives_holding_its_rows_alone(released):
    from dpatlas.audit import audit_release

    m = json.loads((released / "manifest.json").read_text())
    names = cell_names(CELLS)
    assert m["level_cell_tiles"] == {
        "county": {c: f"counties-{c}.pmtiles" for c in names},
        "state": {c: f"states-{c}.pmtiles" for c in names}}
    assert not {"counties.pmtiles", "states.pmtiles"} & set(m["files"])
    for level, layer in (("county", "counties"), ("state", "states")):
        table = read_published(released, layer)
        for cell, name in m["level_cell_tiles"][level].items():
            assert name in m["files"]
            features = _archive_features(released / name, layer)
            assert {str(f["cell"]) for f in features} == {cell}
            assert {f["geoid"] for f in features} == set(table["geoid"])
    checks = {n: (good, detail) for n, good, detail in audit_release(released).checks}
    assert all(good for good, _ in checks.values()), checks


def test_the_audit_fails_a_county_archive_swapped_with_another_cells(released, tmp_path):
    import hashlib
    import shutil

    from dpatlas.audit import audit_release

    folder = tmp_path / "forged"
    shutil.copytree(released, folder)
    one, two = folder / "counties-outcome-1.pmtiles", folder / "counties-outcome-2.pmtiles"
    data = one.read_bytes()
    one.write_bytes(two.read_bytes())
    two.write_bytes(data)
    manifest = json.loads((folder / "manifest.json").read_text())
    for name in (one.name, two.name):  # a forger's rehash: only the contents can tell
        body = (folder / name).read_bytes()
        manifest["files"][name].update(sha256=hashlib.sha256(body).hexdigest(),
                                       bytes=len(body))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    checks = {n: (good, detail) for n, good, detail in audit_release(folder).checks}
    assert not checks["levels"][0] and "counties-outcome-1.pmtiles" in checks["levels"][1]
