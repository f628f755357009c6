"""Publishing a group of cells at a time (issue 22, item 3): a release of several cells
streamed cell by cell holds in its files what the libraries write for the whole table
(geopandas' GeoParquet, the RFC 7946 GeoJSON writer, the CSV with its Table Schema; rows in
cell order), as does the whole table published as one group; every group is checked against
the contract, and nothing is published when one breaks."""

from __future__ import annotations

import json
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from geopandas.testing import assert_geodataframe_equal

from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.publication import cell_stream as S
from dpatlas.publication import release_parts
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication.cell_stream import write_release
from dpatlas.publication.geojson import write_geojson_rfc7946
from dpatlas.publication.tract_files import (PublishError, assemble, release_folder,
                                             verify_release, write_csv_with_schema)
from dpatlas.release.manifest import TractSummary

CELLS = ["outcome-1", "outcome-2", "outcome-3"]
CONFIG = {"release": "r1", "intervals": {"enabled": True, "level": 0.95,
                                         "low_reliability_width": 0.3}}


@pytest.fixture(scope="module")
def boundaries() -> gpd.GeoDataFrame:
    # one state: the single tract files (a release of several states writes each state's
    # parts: tests/integration/test_state_parts.py)
    return synth_boundaries(list(tract_geoids("17", 28, 3)[0]), seed=3)


@pytest.fixture(scope="module")
def result_files(boundaries, tmp_path_factory) -> list[Path]:
    """Two chunks' results over three cells: released rows with intervals and a suite
    estimator, failed rows, tracts without records (suppressed by assemble); in the first
    cell every tract is present and released (its ``reason`` all missing: arrow's null type
    in that group alone)."""
    rng = np.random.default_rng(11)
    frames = []
    for k, cell in enumerate(CELLS):
        present = rng.random(len(boundaries)) < 0.85 if k else np.ones(len(boundaries), bool)
        keep = boundaries["geoid"].to_numpy()[present]
        n = len(keep)
        status = np.where(rng.random(n) < 0.1, "failed", "released") if k else np.full(
            n, "released")
        p25, p75 = rng.normal(0.4, 0.2, n), rng.normal(0.6, 0.2, n)
        ok = status == "released"
        frames.append(pd.DataFrame({
            "geoid": keep, "cell": cell, "n": rng.integers(20, 400, n),
            "mechanism": np.where(rng.random(n) < 0.5, "NoisyStats", "DPExpTheilSen"),
            "status": status, "reason": np.where(ok, None, "noisy nvar <= 0"),
            "p25_raw": np.where(ok, p25, np.nan), "p75_raw": np.where(ok, p75, np.nan),
            "epsilon_spent": 1.0, "delta_spent": 0.0,
            "p25_lo": np.where(ok, p25 - 0.1, np.nan), "p25_hi": np.where(ok, p25 + 0.1, np.nan),
            "p75_lo": np.where(ok, p75 - 0.2, np.nan), "p75_hi": np.where(ok, p75 + 0.2, np.nan),
            "p25_se": np.where(ok, 0.05, np.nan), "p75_se": np.where(ok, 0.1, np.nan),
            "Hybrid_p25": np.where(ok, p25 + 0.01, np.nan),
            "Hybrid_p75": np.where(ok, p75 - 0.01, np.nan)}))
    whole = pd.concat(frames, ignore_index=True).sample(frac=1.0, random_state=2)
    folder = tmp_path_factory.mktemp("results")
    paths = []
    half = len(whole) // 2
    for i, part in enumerate((whole.iloc[:half], whole.iloc[half:])):
        paths.append(folder / f"chunk-{i}.parquet")
        part.to_parquet(paths[-1], index=False)
    return paths


class RecordingChecks:
    """The output checks as the release runs them, recorded: each group's rows, then the
    finish with the suites."""

    def __init__(self, fail_group: int | None = None):
        self.groups, self.finished, self.fail_group = [], None, fail_group

    def as_checks(self) -> S.CellGroupChecks:
        return S.CellGroupChecks(group=self.group, finish=self.finish)

    def group(self, rows: pd.DataFrame, index: int, count: int) -> str:
        self.groups.append((sorted(rows["cell"].unique()), len(rows), index, count))
        if index == self.fail_group:
            raise PublishError("the release table breaks its output contract")
        return "published_tracts"

    def finish(self, suites: list[str]) -> dict:
        self.finished = suites
        return {"output_contract": {"suite": suites[0], "success": True}}


def whole_table(result_files, boundaries) -> gpd.GeoDataFrame:
    results = pd.concat([pd.read_parquet(p) for p in result_files], ignore_index=True)
    return assemble(results, boundaries)


def whole_release(result_files, boundaries, root) -> Path:
    """Every result at once, assembled, published as one group (write_release)."""
    table = whole_table(result_files, boundaries)
    manifest = {"release_id": "r1", **_manifest_counts(TractSummary.of(table))}
    return write_release(table, manifest, root, "r1", config=CONFIG)


def reference_files(result_files, boundaries, folder: Path) -> Path:
    """The reference: the whole table's tract files as the libraries write them at once
    (the writers publish used before it streamed)."""
    table = whole_table(result_files, boundaries)
    folder.mkdir(parents=True)
    table.to_parquet(folder / "tracts.parquet", index=False)
    write_geojson_rfc7946(table, folder / "tracts.geojson")
    write_csv_with_schema(pd.DataFrame(table.drop(columns="geometry")), folder, 0.95)
    return folder


def _manifest_counts(summary: TractSummary) -> dict:
    return {"cells": summary.cells, "counts": summary.counts()}


def streamed_release(result_files, boundaries, root, max_rows, checks) -> Path:
    cells = S.release_cells(result_files)
    groups = S.cell_groups(cells, len(boundaries), max_rows)
    return S.write_release_by_cells(
        S.assembled_groups(result_files, groups, boundaries), cells,
        lambda summary: {"release_id": "r1", **_manifest_counts(summary)}, root, "r1",
        config=CONFIG, checks=checks.as_checks(), group_count=len(groups))


@pytest.fixture(scope="module")
def both(result_files, boundaries, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("both")
    checks = RecordingChecks()
    one_cell_a_group = len(boundaries)  # rows per group: one cell each
    return (whole_release(result_files, boundaries, tmp / "whole"),
            streamed_release(result_files, boundaries, tmp / "cells", one_cell_a_group, checks),
            checks, reference_files(result_files, boundaries, tmp / "reference"))


def by_key(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["geoid", "cell"], kind="stable").reset_index(drop=True)


def test_groups_of_cells_stay_under_the_bound():
    assert S.cell_groups(CELLS, 28, 28) == [[c] for c in CELLS]
    assert S.cell_groups(CELLS, 28, 60) == [CELLS[:2], CELLS[2:]]
    assert S.cell_groups(CELLS, 28, 10) == [[c] for c in CELLS]  # at least one cell a group
    assert S.cell_groups(CELLS, 28) == [CELLS]
    assert S.cell_groups([], 28) == [[]]


def test_results_are_read_for_the_group_cells_only(result_files):
    assert S.release_cells(result_files) == CELLS
    rows = S.read_results_of(result_files, ["outcome-2"])
    assert set(rows["cell"]) == {"outcome-2"} and len(rows) > 0
    every = pd.concat([pd.read_parquet(p) for p in result_files])
    assert len(rows) == (every["cell"] == "outcome-2").sum()


@pytest.mark.parametrize("published", ["cells", "whole"])
def test_the_geoparquet_holds_the_whole_tables_rows_and_metadata(both, published):
    whole, cells, _, reference = both
    folder = cells if published == "cells" else whole
    a, b = (gpd.read_parquet(reference / "tracts.parquet"),
            gpd.read_parquet(folder / "tracts.parquet"))
    assert len(b) == len(a) == 3 * 28 and list(b.columns) == list(a.columns)
    assert_geodataframe_equal(by_key(b), by_key(a))
    geo_a = json.loads(pq.read_schema(reference / "tracts.parquet").metadata[b"geo"])
    geo_b = json.loads(pq.read_schema(folder / "tracts.parquet").metadata[b"geo"])
    assert geo_b == geo_a  # bbox, geometry types, CRS, encoding: a reader sees no difference
    if published == "whole":  # one group: the table's own order, one row group
        assert pq.ParquetFile(folder / "tracts.parquet").metadata.num_row_groups == 1
        assert_geodataframe_equal(b, a)
        return
    assert pq.ParquetFile(cells / "tracts.parquet").metadata.num_row_groups == 3  # a cell each
    # cell order: every tract of a cell, in the boundaries' order, then the next cell
    assert list(b["cell"]) == [c for c in CELLS for _ in range(28)]
    assert list(b["geoid"][:28]) == list(a["geoid"].drop_duplicates())


@pytest.mark.parametrize("published", ["cells", "whole"])
def test_the_csv_and_its_schema_are_the_whole_tables(both, published):
    whole, cells, _, reference = both
    folder = cells if published == "cells" else whole
    a = pd.read_csv(reference / "tracts.csv", dtype=str)
    b = pd.read_csv(folder / "tracts.csv", dtype=str)
    pd.testing.assert_frame_equal(by_key(b), by_key(a))
    assert ((folder / "tracts.schema.json").read_text()
            == (reference / "tracts.schema.json").read_text())
    assert (folder / "tracts.csv").read_text().count("geoid,") == 1  # the header once


@pytest.mark.parametrize("published", ["cells", "whole"])
def test_the_geojson_holds_the_whole_tables_features(both, published):
    whole, cells, _, reference = both
    a = json.loads((reference / "tracts.geojson").read_text())
    b = json.loads(((cells if published == "cells" else whole) / "tracts.geojson").read_text())
    assert b["bbox"] == a["bbox"] and set(b) == set(a)
    assert len(b["features"]) == len(a["features"]) == 84
    ids = [f["id"] for f in b["features"]]
    assert len(set(ids)) == 84  # GEOID/cell, as the libraries' writer names them
    if published == "cells":
        assert ids[0].endswith("/outcome-1")
    assert {f["id"]: f for f in b["features"]} == {f["id"]: f for f in a["features"]}


def test_the_manifest_counts_and_extent_are_the_whole_tables(both):
    whole, cells, checks, _ = both
    a, b = verify_release(whole), verify_release(cells)
    for key in ("cells", "counts", "rounding", "extent"):
        assert b[key] == a[key], key
    assert set(b["files"]) == set(a["files"])
    assert b["counts"]["rows"] == 84 and b["counts"]["tracts"] == 28
    # each group checked once, with its own rows, then the finish with every group's suite
    assert checks.groups == [([c], 28, k, 3) for k, c in enumerate(CELLS)]
    assert checks.finished == ["published_tracts"] * 3
    assert b["output_contract"] == {"suite": "published_tracts", "success": True}


def test_one_group_of_all_cells_writes_the_same_files(result_files, boundaries, tmp_path, both):
    _, cells, _, _ = both
    one = streamed_release(result_files, boundaries, tmp_path / "one", 10_000, RecordingChecks())
    for name in ("tracts.parquet", "tracts.csv", "tracts.geojson"):
        if name == "tracts.parquet":  # row groups differ, the rows do not
            pd.testing.assert_frame_equal(pd.read_parquet(one / name), pd.read_parquet(cells / name))
        else:
            assert (one / name).read_bytes() == (cells / name).read_bytes(), name


def _polygons_and_documents(folder: Path, built: dict) -> tuple[list, dict]:
    """What the archive was built from (``built``: the input's features, recorded by a
    stand-in for tippecanoe) and each values document of ``folder``, by name."""
    from dpatlas.publication import tract_values as V

    documents = {str(p.relative_to(folder)): V.read_document(p)
                 for p in sorted((folder / V.VALUES_FOLDER).rglob("*.json"))}
    return built["features"], documents


def _recording_tiles(monkeypatch, built: dict, on_build=None) -> None:
    """tippecanoe replaced by a recorder of its input: each feature's properties and
    polygon; ``on_build`` called first (a test's synchronisation)."""
    from dpatlas.publication import tiles as T

    def build_tiles(geojson, out, **kwargs):
        if on_build is not None:
            on_build()
        doc = json.loads(Path(geojson).read_text())  # whole and closed
        built.setdefault("names", []).append(out.name)
        built["features"] = [(f["properties"], f["geometry"]) for f in doc["features"]]
        out.write_bytes(b"tiles")

    monkeypatch.setattr(T, "build_tiles", build_tiles)


def test_the_polygons_archive_starts_once_the_last_groups_geojson_is_written(
        result_files, boundaries, tmp_path, monkeypatch):
    """tippecanoe, the longest writer, starts as soon as the last group's GeoJSON is written
    (while that group's GeoParquet is held back), from the polygons of one cell's rows, each
    tract once with its GEOID alone, and builds the one ``tracts.pmtiles``."""
    import threading

    parquet_done, built = threading.Event(), {}
    append = S.GeoParquetAppender.append

    def slow_append(self, table):
        append(self, table)
        if (table["cell"] == CELLS[-1]).all():  # the last group: hold its GeoParquet back
            assert parquet_done.wait(timeout=60), "the tiles never started"

    monkeypatch.setattr(S.GeoParquetAppender, "append", slow_append)
    _recording_tiles(monkeypatch, built, on_build=parquet_done.set)
    folder = streamed_release(result_files, boundaries, tmp_path / "root", len(boundaries),
                              RecordingChecks())
    features, _ = _polygons_and_documents(folder, built)
    assert built["names"] == ["tracts.pmtiles"]
    assert [props for props, _ in features] == [{"geoid": g} for g in boundaries["geoid"]]
    whole = json.loads((folder / "tracts.geojson").read_text())["features"]
    first_cell = [f["geometry"] for f in whole if f["properties"]["cell"] == CELLS[0]]
    assert [geometry for _, geometry in features] == first_cell
    assert (folder / "tracts.pmtiles").read_bytes() == b"tiles"
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no input left


def test_each_cell_and_states_values_are_a_document_the_manifest_lists(
        result_files, boundaries, tmp_path, monkeypatch):
    """Several cells (issue 35): no archive per cell; each (cell, state)'s values are a
    document of their own, ``tract-values/<cell>/<state>.json``, holding that cell's rows of
    tracts.geojson (every property but the geometry and what the map never shows, the cell
    and state said once in its head); the manifest lists and hashes them and says the
    columns and each cell's folder."""
    from dpatlas.publication import tiles as T, tract_values as V

    built = {}
    _recording_tiles(monkeypatch, built)
    folder = streamed_release(result_files, boundaries, tmp_path / "root", len(boundaries),
                              RecordingChecks())
    _, documents = _polygons_and_documents(folder, built)
    assert sorted(documents) == [V.values_file(c, "17") for c in CELLS]
    whole = json.loads((folder / "tracts.geojson").read_text())["features"]
    columns = V.value_columns(list(whole[0]["properties"]), T.NOT_IN_TILES)
    for cell in CELLS:
        doc = documents[V.values_file(cell, "17")]
        assert (doc["cell"], doc["state"], doc["columns"]) == (cell, "17", columns)
        rows = [f["properties"] for f in whole if f["properties"]["cell"] == cell]
        assert doc["rows"] == [[r.get(c) for c in columns] for r in rows]
    m = json.loads((folder / "manifest.json").read_text())
    assert m[V.MANIFEST_KEY] == {"columns": columns,
                                 "folders": {c: f"tract-values/{c}" for c in CELLS}}
    assert set(documents) <= set(m["files"]) and "tracts.pmtiles" in m["files"]
    assert not [name for name in m["files"] if name.startswith("tracts-")]


def test_a_whole_table_in_any_row_order_gets_each_cells_documents(result_files, boundaries,
                                                                  tmp_path, monkeypatch):
    """write_release publishes a table in its own row order (cells interleaved): each
    document still holds its own cell's rows, every one, and the archive each tract once."""
    from dpatlas.publication import tract_values as V

    built = {}
    _recording_tiles(monkeypatch, built)
    table = whole_table(result_files, boundaries).sample(frac=1.0, random_state=4)
    manifest = {"release_id": "r1", **_manifest_counts(TractSummary.of(table))}
    folder = write_release(table, manifest, tmp_path / "root", "r1", config=CONFIG)
    features, documents = _polygons_and_documents(folder, built)
    for cell in CELLS:
        rows = table[table["cell"] == cell]
        doc = documents[V.values_file(cell, "17")]
        assert [r[0] for r in doc["rows"]] == list(rows["geoid"])
    assert sorted(p["geoid"] for p, _ in features) == sorted(boundaries["geoid"])


@pytest.mark.parametrize("fail_group", [0, 1, 2])  # found at the next group, or at the end
def test_a_group_breaking_its_contract_publishes_nothing(result_files, boundaries, tmp_path,
                                                         fail_group):
    checks = RecordingChecks(fail_group=fail_group)
    with pytest.raises(PublishError, match="output contract"):
        streamed_release(result_files, boundaries, tmp_path / "root", 28, checks)
    assert release_folder(tmp_path / "root", "r1") is None
    assert not [p for p in (tmp_path / "root").iterdir() if p.name.startswith(".staging")]
    assert checks.finished is None


# ------------------------------------------------- through the flow: groups of one cell each

@pytest.fixture(scope="module")
def flow_release(tmp_path_factory):
    """A seeded release of 3 cells over 2 states (40 tracts), all three levels and the
    small-area model, published one cell at a time, the county and state files cut by
    cells (the bounds forced down)."""
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    from prefect.testing.utilities import prefect_test_harness

    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
    from tests.support.inputs import cells_release_config, write_config

    tmp = tmp_path_factory.mktemp("flow-cells")
    write_synthetic(tmp / "data", ["17", "18"], seed=5,
                    params=StateParams(n_tracts=20, counties=2), cells=3)
    cfg = cells_release_config(tmp / "data", tmp, small_area={"model": True})
    patch = pytest.MonkeyPatch()
    patch.setattr(S, "CELL_GROUP_ROWS", 40)  # 40 tracts: a group per cell
    # the county files a cell a job (4 counties), the states' two cells then one
    patch.setattr(release_parts, "LEVEL_PART_ROWS", 4)
    try:
        with prefect_test_harness(server_startup_timeout=180):
            from flows.release import release

            outcome = release(str(write_config(tmp / "config.yaml", cfg)), "g1", 7)
    finally:
        patch.undo()
    assert outcome.status == "published"
    return Path(outcome.folder), tmp / "internal"


def test_a_release_published_a_cell_at_a_time_passes_the_audit(flow_release):
    import io

    from dpatlas.audit import run as audit

    folder, internal = flow_release
    out = io.StringIO()
    assert audit.main(folder, out, allow_test=True) == 0, out.getvalue()
    # two states: each state's part (tests/integration/test_state_parts.py)
    parts = [folder / "tracts" / f"state={state}" / "part-0.parquet" for state in ("17", "18")]
    tracts = pd.concat([gpd.read_parquet(p) for p in parts], ignore_index=True)
    m = json.loads((folder / "manifest.json").read_text())
    assert len(tracts) == 120 == m["counts"]["rows"] and m["counts"]["tracts"] == 40
    assert m["cells"] == CELLS and sorted(tracts["cell"].unique()) == CELLS
    for part in parts:  # cell order in each part, a row group per group of cells
        assert list(pd.read_parquet(part)["cell"]) == [c for c in CELLS for _ in range(20)]
        assert pq.ParquetFile(part).metadata.num_row_groups == 3
    assert "p25_model" in tracts.columns
    fits = m["small_area"]["fits"]  # every cell's, for each state, in order
    assert [(f["cell"], f["state"]) for f in fits] == [(c, s) for c in CELLS
                                                       for s in ("17", "18")]
    # each group checked against the tract contract in a run of its own, then the levels
    runs = {json.loads(p.read_text())["run_name"]: json.loads(p.read_text())
            for p in internal.rglob("runs/*.json")}
    published = sorted(r for r in runs if r.startswith("published"))
    # the two states are one publish part (issue 35: parts of whole states, checked where
    # they are written), the release's only one: its runs are the release's
    part = "published"
    levels = ["published-county-1-of-3", "published-county-2-of-3", "published-county-3-of-3",
              "published-state-1-of-2", "published-state-2-of-2"]
    assert published == sorted([f"{part}-1-of-3", f"{part}-2-of-3", f"{part}-3-of-3", *levels])
    assert all(runs[r]["success"] for r in published)
    # every boundary tract in the table: checked once, in the first group's run
    first, later = runs[f"{part}-1-of-3"], runs[f"{part}-3-of-3"]
    assert first["evaluated"] == later["evaluated"] + 1 == runs[f"{part}-2-of-3"]["evaluated"] + 1
    assert "missing_geoid" in json.dumps(first["expectations"])  # published_coverage's
    assert "missing_geoid" not in json.dumps(later["expectations"])
    # the part's GX runs are in the release's Data Docs site, beside the level checks
    docs = "".join(p.read_text(errors="replace") for p in (internal).rglob("data_docs/**/*.html"))
    assert f"{part}-1-of-3" in docs and all(run in docs for run in levels)
    assert m["output_contract"]["suite"] == "published_tracts"
    # each level's pieces joined into its files: every unit in every cell once, piece by piece
    a, b, c = CELLS
    for stem, units, cells in (("counties", 4, [a] * 4 + [b] * 4 + [c] * 4),
                               ("states", 2, [a, b, a, b, c, c])):  # pieces (a, b), (c)
        table = gpd.read_parquet(folder / f"{stem}.parquet")
        assert len(table) == units * 3 and not table.duplicated(["geoid", "cell"]).any()
        assert list(table["cell"]) == cells
        csv = pd.read_csv(folder / f"{stem}.csv", dtype=str)
        assert list(zip(csv["geoid"], csv["cell"])) == list(zip(table["geoid"], table["cell"]))
        features = json.loads((folder / f"{stem}.geojson").read_text())["features"]
        assert [f["id"] for f in features] == [f"{g}/{c}" for g, c in zip(table["geoid"],
                                                                         table["cell"])]


def _audit(folder: Path) -> tuple[int, str]:
    import io

    from dpatlas.audit import run as audit

    out = io.StringIO()
    return audit.main(folder, out, allow_test=True), out.getvalue()


def _rehashed(folder: Path) -> None:
    from dpatlas.core.hashing import sha256_file

    m = json.loads((folder / "manifest.json").read_text())
    for name in m["files"]:
        m["files"][name] = {"sha256": sha256_file(folder / name),
                            "bytes": (folder / name).stat().st_size}
    (folder / "manifest.json").write_text(json.dumps(m, indent=2))


def test_one_polygons_archive_and_each_cells_values_apart_the_audit_checks_each(
        flow_release):
    """Issue 35: the tracts' polygons tiled once, with the GEOID alone (read back with the
    audit's own PMTiles reader), and each (cell, state)'s values in a document the formats
    check compares with tracts.parquet."""
    from dpatlas.audit import tiles as audit_tiles

    folder, _ = flow_release
    m = json.loads((folder / "manifest.json").read_text())
    names = [f"tract-values/{c}/{s}.json" for c in CELLS for s in ("17", "18")]
    assert set(names) <= set(m["files"]) and "tracts.pmtiles" in m["files"]
    assert m["tract_values"]["folders"] == {c: f"tract-values/{c}" for c in CELLS}
    _, tiles = audit_tiles.pmtiles_tiles(folder / "tracts.pmtiles")
    properties = [f for t in tiles for f in audit_tiles.mvt_features(t)]
    assert properties and all(set(p) == {"geoid"} for p in properties)
    assert {p["geoid"][:2] for p in properties} == {"17", "18"}
    code, out = _audit(folder)
    formats = next(ln for ln in out.splitlines() if " formats" in ln[:14])
    assert code == 0 and "tract values documents" in formats, formats


@pytest.mark.parametrize("forgery", ["swapped", "unlisted", "edited"])
def test_a_cells_values_swapped_left_out_or_edited_fail_the_audit(flow_release, tmp_path,
                                                                  forgery):
    """Two cells' documents of a state swapped, one removed from the files, or a value
    changed (each re-hashed): the formats check FAILs (each document is compared with its
    own cell and state's rows of tracts.parquet)."""
    import shutil

    folder = tmp_path / flow_release[0].name
    shutil.copytree(flow_release[0], folder, symlinks=True)
    first, second = (folder / "tract-values" / c / "17.json" for c in CELLS[:2])
    if forgery == "swapped":
        first.rename(folder / "swap"), second.rename(first), (folder / "swap").rename(second)
    elif forgery == "unlisted":
        m = json.loads((folder / "manifest.json").read_text())
        del m["files"][str(first.relative_to(folder))]
        first.unlink()
        (folder / "manifest.json").write_text(json.dumps(m, indent=2))
    else:
        doc = json.loads(first.read_text())
        n = doc["columns"].index("n")
        doc["rows"][0][n] += 1
        first.write_text(json.dumps(doc))
    _rehashed(folder)
    code, out = _audit(folder)
    failed = [ln for ln in out.splitlines() if ln.startswith("FAIL  formats")]
    assert code != 0 and failed, out
    name = str(first.relative_to(folder))
    expected = {"swapped": f"{name} says cell {CELLS[1]!r}",
                "unlisted": f"{name} (the values of 20 row(s)) is not in the manifest's files",
                "edited": f"{name}: n differs from tracts.parquet in 1 row(s)"}[forgery]
    assert expected in failed[0], failed[0]
