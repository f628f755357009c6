"""Tract files partitioned by state (issue 35, item 2): a two-state release publishes
``tracts/state=XX/`` parts that the manifest hashes and ``dpatlas audit`` checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
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


def _rehash(folder: Path) -> None:
    """The manifest's hashes and sizes made the files' again (a forger's last step)."""
    import hashlib

    manifest = json.loads((folder / "manifest.json").read_text())
    for name, info in manifest["files"].items():
        data = (folder / name).read_bytes()
        info.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


def test_the_audit_reads_the_parts_contents_a_rehashed_altered_part_fails(two_states, tmp_path):
    folder = _forged(two_states, tmp_path)
    path = folder / part("csv", "18")
    frame = pd.read_csv(path, dtype={"geoid": str, "state": str, "county": str})
    released = frame["status"] == "released"
    frame.loc[released, "p25"] = frame.loc[released, "p25"] + 5
    frame.to_csv(path, index=False, na_rep="")
    _rehash(folder)
    checks = _audit(folder)
    assert checks["files"][0] and not checks["formats"][0], checks["formats"]


def test_the_audit_fails_a_part_holding_another_states_rows(two_states, tmp_path):
    folder = _forged(two_states, tmp_path)
    p17, p18 = folder / part("parquet", "17"), folder / part("parquet", "18")
    t17, t18 = pq.read_table(p17), pq.read_table(p18)
    moved = t17.slice(0, 2)
    pq.write_table(t17.slice(2), p17)
    pq.write_table(pa.concat_tables([t18, moved.cast(t18.schema)]), p18)
    _rehash(folder)
    checks = _audit(folder)
    assert not checks["parts"][0] and "holds rows of states ['17']" in checks["parts"][1]


def test_the_datapackage_and_the_stac_item_list_the_parts(two_states):
    package = json.loads((two_states / "datapackage.json").read_text())
    resources = {r["name"]: r for r in package["resources"]}
    assert resources["tracts"]["path"] == [part("csv", s) for s in ("17", "18")]
    assert resources["tracts-geoparquet"]["path"] == [part("parquet", s) for s in ("17", "18")]
    items = [json.loads(p.read_text()) for p in two_states.parent.rglob("*.json")
             if json.loads(p.read_text()).get("type") == "Feature"]
    [item] = [i for i in items if i["id"] == "p1"]
    for kind in KINDS:
        for state in ("17", "18"):
            assert item["assets"][part(kind, state)]["href"] == f"../p1/{part(kind, state)}"


def test_the_codebook_says_how_to_read_the_parts(two_states):
    import geopandas as gpd

    readme = (two_states / "README.md").read_text()
    assert 'gpd.read_parquet("tracts/", partitioning=None)' in readme
    tracts = gpd.read_parquet(two_states / "tracts", partitioning=None)  # as it says
    assert len(tracts) == 80 and tracts.crs.to_epsg() == 4326


def test_a_release_by_state_and_of_two_cells_has_one_polygons_archive_and_each_cells_values(
        two_states):
    """Parts by state and several cells together (the national case): one archive of every
    state's polygons, each with its GEOID alone (read with another PMTiles and MVT reader
    than the audit's), and a values document per cell and state, which the audit compares."""
    import gzip

    import mapbox_vector_tile
    from pmtiles.reader import MmapSource, Reader, all_tiles

    m = json.loads((two_states / "manifest.json").read_text())
    cells = sorted(m["tract_values"]["folders"])
    assert len(cells) == 2 and "tracts.pmtiles" in m["files"]
    assert {f"tract-values/{c}/{s}.json" for c in cells for s in ("17", "18")} == {
        name for name in m["files"] if name.startswith("tract-values/")}
    with open(two_states / "tracts.pmtiles", "rb") as fh:
        reader = Reader(MmapSource(fh))
        geoids, keys = set(), set()
        for _, tile in all_tiles(reader.get_bytes):
            for feature in mapbox_vector_tile.decode(gzip.decompress(tile))["tracts"][
                    "features"]:
                geoids.add(feature["properties"]["geoid"])
                keys.update(feature["properties"])
    assert keys == {"geoid"}
    assert {g[:2] for g in geoids} == {"17", "18"} and len(geoids) == 40
    assert _audit(two_states)["formats"][0]


# --- a state cut by its cells (issue 35, item 1: parts per state × group of cells) -------------


@pytest.fixture(scope="module")
def cut_states(tmp_path_factory) -> Path:
    """The same data as ``two_states``, released with parts of at most 30 tract-cells: each
    state (20 tracts × 2 cells) is written by two parts, a cell each."""
    tmp = tmp_path_factory.mktemp("cut")
    write_synthetic(tmp / "data", ["17", "18"], seed=5,
                    params=StateParams(n_tracts=20, counties=2), cells=2)
    return release_cells(tmp / "data", tmp, "p2",
                         **{"dpatlas.publication.release_parts.PART_ROWS": 30})


def _sorted(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["geoid", "cell"]).reset_index(drop=True)


def test_a_state_cut_by_its_cells_publishes_a_geoparquet_per_part_and_one_csv_and_geojson(
        cut_states, two_states):
    files = json.loads((cut_states / "manifest.json").read_text())["files"]
    for state in ("17", "18"):
        pieces = [pq.read_table(cut_states / f"tracts/state={state}/part-{k}.parquet")
                  for k in (0, 1)]
        cells = [set(map(str, p.column("cell").to_pylist())) for p in pieces]
        assert [len(c) for c in cells] == [1, 1] and cells[0] != cells[1]  # a cell each
        assert f"tracts/state={state}/part-1.parquet" in files
        assert part("csv", state) in files and part("geojson", state) in files
        # the state's CSV and GeoJSON are one file each with all its rows, as when uncut
        cut_csv = pd.read_csv(cut_states / part("csv", state), dtype=str)
        whole_csv = pd.read_csv(two_states / part("csv", state), dtype=str)
        pd.testing.assert_frame_equal(_sorted(cut_csv), _sorted(whole_csv))
        cut_json = json.loads((cut_states / part("geojson", state)).read_text())
        whole_json = json.loads((two_states / part("geojson", state)).read_text())
        assert cut_json["bbox"] == whole_json["bbox"]
        assert (sorted(cut_json["features"], key=lambda f: f["id"])
                == sorted(whole_json["features"], key=lambda f: f["id"]))
    cut = pd.read_parquet(cut_states / "tracts", partitioning=None)
    whole = pd.read_parquet(two_states / "tracts", partitioning=None)
    pd.testing.assert_frame_equal(_sorted(cut), _sorted(whole))


def test_the_audit_passes_a_release_whose_states_are_cut_by_cells(cut_states):
    checks = _audit(cut_states)
    assert all(good for good, _ in checks.values()), checks
    assert "2 states' parts" in checks["parts"][1]
    package = json.loads((cut_states / "datapackage.json").read_text())
    parquet = {r["name"]: r for r in package["resources"]}["tracts-geoparquet"]["path"]
    assert parquet == [f"tracts/state={s}/part-{k}.parquet" for s in ("17", "18") for k in (0, 1)]
    assert "part-1.parquet" in (cut_states / "README.md").read_text()


def test_the_audit_fails_a_cut_states_geoparquet_piece_left_out(cut_states, tmp_path):
    """A piece removed from the folder and the manifest: the rows are short and the pieces
    have a gap."""
    folder = _forged(cut_states, tmp_path)
    (folder / "tracts/state=18/part-0.parquet").unlink()
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["files"]["tracts/state=18/part-0.parquet"]
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    checks = _audit(folder)
    assert not checks["parts"][0] and "numbered [1]" in checks["parts"][1]
