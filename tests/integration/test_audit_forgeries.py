"""Consistent forgeries of a published release that `dpatlas audit` must fail (issue 17).

Each test forges a copy of a real (seeded, test-mode) release the way a careful forger would:
every format rewritten together (GeoParquet, CSV, GeoJSON, and the vector tiles rebuilt by
tippecanoe), the budget's figures recomputed, and every file re-hashed in the manifest, so the
files check passes. The audit must still fail, and name the check that caught it. The
untouched release passes (with --allow-test: it is a test release). Forgeries that only an
external anchor can see (rows deleted, a cheaper charge) fail with --boundaries / --ledger.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest

from dpatlas.audit import run as audit
from dpatlas.audit import base as audit_base
from dpatlas.audit import geometry as audit_geometry
from dpatlas.audit import noise as audit_noise
from dpatlas.audit import paths as audit_paths
from dpatlas.audit import schema as audit_schema
from dpatlas.audit import sensitivities as audit_sensitivities
from dpatlas.audit import tables as audit_tables
from dpatlas.audit import tiles as audit_tiles
from dpatlas.release.allocate import plan as make_plan
from dpatlas.core.config import fingerprint
from dpatlas.publication.geojson import write_geojson_rfc7946
from dpatlas.core.hashing import sha256_file
from dpatlas.ledger import Ledger, charges
from dpatlas.core.columns import MOE_COLUMNS as MOE90_COLUMNS
from dpatlas.publication.tract_files import (_FIELDS, INTERVAL_COLUMNS, SE_COLUMNS,
                                             write_csv_with_schema)
from dpatlas.publication.tiles import build_tiles
from dpatlas.publication import tract_values as V

from tests.integration.test_release_audit import RID, build_release, make_cfg, state  # noqa: F401 (fixture)
from tests.integration.test_synthesize import published  # noqa: F401 (fixture)
from tests.support.pg_server import ledger_url, pg  # noqa: F401 (fixtures)
from tests.support.paths import REPO

DATASET = "il"
OWNER = "forgery-tests"


# --- a release charged in a real ledger, and copies of it to forge -----------------------------


@pytest.fixture(scope="module")
def anchored(state, tmp_path_factory):  # noqa: F811 (the imported fixture)
    """(folder, ledger URL, boundaries path): a release whose ledger charged and published it."""
    tmp = tmp_path_factory.mktemp("anchored")
    cfg = make_cfg(tmp, state)
    plan = make_plan(cfg, cfg.selection.threshold)
    ledger = Ledger(cfg.ledger.url)
    ledger.set_cap(DATASET, 50.0, 1e-3, "forgery tests")
    assert ledger.begin_release(RID, DATASET, charges(plan, ["all"]), fingerprint(cfg),
                                OWNER) == "new"
    _, _, _, folder = build_release(tmp, state, cfg=cfg, plan=plan)
    ledger.complete_release(RID, sha256_file(folder / "manifest.json"), OWNER)
    ledger.close()
    return folder, cfg.ledger.url, Path(cfg.boundaries.path)


@pytest.fixture
def forged(anchored, tmp_path) -> Path:
    dst = tmp_path / RID
    shutil.copytree(anchored[0], dst)
    return dst


def run_audit(folder: Path, **kw) -> tuple[int, dict[str, str], list[str]]:
    """(exit code, {failed check: detail}, output lines) of ``audit.main``."""
    out = io.StringIO()
    code = audit.main(folder, out, **{"allow_test": True, **kw})
    lines = out.getvalue().splitlines()
    bad = {ln[6:].split(":", 1)[0]: ln.split(": ", 1)[1] for ln in lines
           if ln.startswith("FAIL  ")}
    return code, bad, lines


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def write_manifest(folder: Path, m: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(m, indent=2))


def rehash_all(folder: Path) -> None:
    """Every file listed in the manifest re-hashed: the files check passes on the forgery."""
    m = manifest_of(folder)
    for name in m["files"]:
        m["files"][name] = {"sha256": sha256_file(folder / name),
                            "bytes": (folder / name).stat().st_size}
    write_manifest(folder, m)


def table_of(folder: Path) -> gpd.GeoDataFrame:
    return gpd.read_parquet(folder / "tracts.parquet")


def rewrite_map_files(folder: Path, table: gpd.GeoDataFrame) -> None:
    """The map's tract files rewritten from ``table`` the way publish writes them: the values
    documents (the manifest's list and ``tract_values`` restated) and ``tracts.pmtiles``
    from the polygons; not re-hashed."""
    from concurrent.futures import ThreadPoolExecutor

    from dpatlas.publication import tract_values as V
    from dpatlas.publication.geojson import geojson_parts, geometry_texts, json_columns

    props, geoms, _ = geojson_parts(table.reset_index(drop=True), folder / "tracts.geojson",
                                    per_cell=False)
    shutil.rmtree(folder / V.VALUES_FOLDER, ignore_errors=True)
    config = json.loads((folder / "config.json").read_text())
    with ThreadPoolExecutor(1) as tiler:
        writer = V.TractMapWriter(folder, RID, config, list(props["cell"].astype(str)), tiler)
        writer.add(json_columns(props), geometry_texts(geoms))
        entry = writer.finish().result()
    m = manifest_of(folder)
    m["files"] = {n: v for n, v in m["files"].items() if not V.is_values_document(n)}
    m["files"].update({n: {} for n in writer.documents})
    m[V.MANIFEST_KEY] = entry
    write_manifest(folder, m)


def republish(folder: Path, table: gpd.GeoDataFrame) -> None:
    """Every format of the table rewritten the way publish writes it, then re-hashed."""
    table = table.reset_index(drop=True)
    table.to_parquet(folder / "tracts.parquet", index=False)
    write_geojson_rfc7946(table, folder / "tracts.geojson")
    rewrite_map_files(folder, table)
    flat = pd.DataFrame(table.drop(columns="geometry"))
    known = set(_FIELDS) | set(INTERVAL_COLUMNS) | set(SE_COLUMNS) | set(MOE90_COLUMNS)
    if all(c in known or c.endswith(("_p25", "_p75")) for c in flat.columns):
        write_csv_with_schema(flat, folder)
    else:  # a column publish would refuse: the forger writes the CSV alone
        flat.to_csv(folder / "tracts.csv", index=False, na_rep="")
    rehash_all(folder)


def recount(m: dict, table: pd.DataFrame) -> None:
    m["counts"] = {"tracts": int(table["geoid"].nunique()), "rows": int(len(table)),
                   "by_status": {k: int(v) for k, v in table["status"].value_counts().items()},
                   "by_mechanism": {k: int(v) for k, v in
                                    table["mechanism"].value_counts().items()}}


def restate_totals(m: dict) -> float:
    """The budget's figures recomputed from the (pure) steps, as a forger would; returns
    the new per-tract epsilon."""
    budget, cells = m["budget"], len(m["cells"])
    eps = sum(s["guarantee"]["epsilon"] for s in budget["steps"])
    budget["epsilon_per_tract_and_cell"] = eps
    budget["per_tract_and_cell"] = {**budget["per_tract_and_cell"], "epsilon": eps}
    m["total_per_person"].update(
        epsilon=eps * cells, rho=cells * sum(s["guarantee"]["epsilon"] ** 2 / 2
                                             for s in budget["steps"]))
    m["total_per_person"]["guarantee"] = {**m["total_per_person"]["guarantee"],
                                          "epsilon": eps * cells}
    m["ledger_entry"].update(charges=len(budget["steps"]) * cells, epsilon=eps * cells)
    return eps


def step_named(m: dict, name: str) -> dict:
    return next(s for s in m["budget"]["steps"] if s["step"] == name)


# --- the untouched release ----------------------------------------------------------------------


def test_the_untouched_release_passes_with_both_anchors(anchored):
    folder, url, boundaries = anchored
    code, bad, lines = run_audit(folder, ledger=url, boundaries=boundaries)
    assert code == 0 and not bad, lines
    assert lines[-1].startswith("PASSED") and "--allow-test" in lines[-1]
    assert any(ln.startswith("ok    ledger: the ledger published this manifest") for ln in lines)
    assert any(ln.startswith("ok    boundaries: ") for ln in lines)
    assert [ln[6:].split(":", 1)[0] for ln in lines[:-1]] == [
        name for name, _ in audit.CHECKS] + list(audit.ANCHORS)


# --- 5. a test release is reported as TEST -------------------------------------------------------


def test_the_latest_link_audits_as_the_release_it_names(anchored, tmp_path):
    """`releases/latest` is a link to the newest release folder: auditing it is auditing that
    release (its id is the linked folder's name, not 'latest')."""
    link = tmp_path / "latest"
    link.symlink_to(anchored[0].resolve(), target_is_directory=True)
    code, bad, lines = run_audit(link)
    assert code == 0, lines
    # and a link to a release folder under another name is still caught as a rename
    renamed = tmp_path / "other-name"
    shutil.copytree(anchored[0], renamed)
    assert run_audit(renamed)[0] == 1


def test_a_test_release_is_test_not_pass(anchored):
    out = io.StringIO()
    assert audit.main(anchored[0], out) == 3
    lines = out.getvalue().splitlines()
    assert lines[-1].startswith("TEST: ") and "--allow-test" in lines[-1]
    assert any(ln.startswith("TEST  mode: mode test") for ln in lines)
    assert not any(ln.startswith("PASSED") for ln in lines)


def test_seeded_noise_relabelled_os_urandom_in_test_mode_is_still_test(forged):
    m = manifest_of(forged)
    m["noise_sampler"]["random_bits"] = "os.urandom"
    write_manifest(forged, m)
    out = io.StringIO()
    assert audit.main(forged, out) == 3 and out.getvalue().splitlines()[-1].startswith("TEST")


# --- 1. interval columns without the interval step ---------------------------------------------


def test_interval_columns_without_the_interval_step(forged):
    m = manifest_of(forged)
    m["budget"]["steps"] = [s for s in m["budget"]["steps"]
                            if s["step"] != "interval: p25 and p75"]
    eps = restate_totals(m)
    write_manifest(forged, m)
    table = table_of(forged)
    table.loc[table.status != "suppressed", "epsilon_spent"] = eps
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"columns"}, lines
    assert "needs the budget step 'interval: p25 and p75'" in bad["columns"]


# --- 2. interval values on unpaid rows ------------------------------------------------------------


def test_interval_values_on_suppressed_rows(forged):
    table = table_of(forged)
    table.loc[table.status == "suppressed", list(INTERVAL_COLUMNS)] = [0.2, 0.6, 0.3, 0.7]
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"table"}, lines
    assert "not released (nothing spent on an interval) carry interval values" in bad["table"]


# --- 2b. a standard error that is not its interval's (issue 18, item 5) ---------------------------


def test_the_untouched_release_publishes_standard_errors_the_audit_recomputes(anchored):
    """Issue 32: the SEs of the total error, in (0, 0.5] exactly where released, their 90%
    margins ceil(1.645·se) beside them, declared as post-processing of the interval step."""
    table = table_of(anchored[0])
    released = table.status == "released"
    assert table.loc[released, list(SE_COLUMNS)].notna().all().all()
    assert table.loc[~released, list(SE_COLUMNS)].isna().all().all()
    m = manifest_of(anchored[0])
    assert "post-processing of the step 'interval: p25 and p75'" in \
        m["published_columns"]["p25_se, p75_se"]
    se = table.loc[released, "p25_se"].astype(float)
    assert ((se > 0) & (se <= audit_base.SE_CAP)).all()
    assert np.allclose(table.loc[released, "p25_moe90"],
                       np.ceil(audit_base.MOE90_Z * se * 1e4) / 1e4, rtol=0, atol=1e-9)


def as_version_3(folder: Path) -> None:
    """The release as published before the one estimand (manifest_version 3): its standard
    errors were the interval's (hi - lo)/(2z) rounded up, with no margins of error beside
    them, and are audited so."""
    table = table_of(folder).drop(columns=list(MOE90_COLUMNS))
    for p in ("p25", "p75"):
        se = audit_tables.interval_standard_error(table[f"{p}_lo"], table[f"{p}_hi"], 0.95)
        table[f"{p}_se"] = (np.ceil(np.round(se * 1e4, 9)) / 1e4).round(4) + 0.0
    republish(folder, table)
    m = manifest_of(folder)
    m["manifest_version"] = 3
    m["published_columns"].pop("p25_moe90, p75_moe90", None)
    write_manifest(folder, m)
    rehash_all(folder)


def test_a_standard_error_narrowed_in_every_format(forged):
    """A forger shows one tract as more precise than its interval says: its p25_se halved,
    in every file (parquet, CSV, GeoJSON, tiles), the manifest re-hashed."""
    as_version_3(forged)
    table = table_of(forged)
    i = table.index[table.status == "released"][0]
    table.loc[i, "p25_se"] = round(table.loc[i, "p25_se"] / 2, 4)
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"table"}, lines
    assert "1 p25_se value(s) are not (p25_hi - p25_lo)/(2z) at level 0.95" in bad["table"]


def test_a_standard_error_two_rounding_steps_above_its_interval(forged):
    as_version_3(forged)
    table = table_of(forged)
    i = table.index[table.status == "released"][1]
    table.loc[i, "p75_se"] = round(table.loc[i, "p75_se"] + 2e-4, 4)
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"table"}, lines
    assert "1 p75_se value(s) are not (p75_hi - p75_lo)/(2z)" in bad["table"]


# --- issue 32: standard errors of the total error, their 90% margins, one declared estimand ----


def with_margins(table: pd.DataFrame) -> pd.DataFrame:
    """The table with p25_moe90, p75_moe90 as publish computes them: ceil(1.645·se) at 4
    decimals, NaN where the SE is."""
    out = table.copy()
    for p in ("p25", "p75"):
        se = out[f"{p}_se"].astype(float)
        out[f"{p}_moe90"] = (np.ceil(audit_base.MOE90_Z * se * 1e4) / 1e4).round(4) + 0.0
    return out


def test_the_audits_estimand_rules_are_the_products():
    """The audit imports nothing of ours: its fixed copies of the estimand's id, the SE cap
    and the margin's z are mechanisms/estimand.py's."""
    from mechanisms import estimand

    assert (audit_base.ESTIMAND_ID, audit_base.SE_CAP, audit_base.MOE90_Z) == (
        estimand.ESTIMAND_ID, estimand.SE_CAP, estimand.MOE90_Z)


def test_standard_errors_need_not_be_the_interval_width_but_stay_within_the_cap(forged):
    """From version 4 the SE estimates the total error's SD (not (hi - lo)/(2z)): a value
    other than the width's passes; one above SE_CAP, negative, or missing where the interval
    is, or present where it is not, fails, naming the column."""
    table = table_of(forged)
    released = table.index[table.status == "released"]
    table.loc[released[0], "p25_se"] = round(table.loc[released[0], "p25_se"] / 2, 4)
    table = with_margins(table)
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert "table" not in bad and "columns" not in bad, lines
    for column, value, words in (("p25_se", 0.5001, "p25_se value(s) where the interval is "
                                  "published are not finite in [0, 0.5]"),
                                 ("p75_se", -0.01, "p75_se value(s) where the interval is "
                                  "published are not finite"),
                                 ("p25_se", np.nan, "p25_se value(s) where the interval is "
                                  "published are not finite")):
        forged_table = table.copy()
        forged_table.loc[released[1], column] = value
        republish(forged, forged_table)
        code, bad, lines = run_audit(forged)
        assert code == 1 and set(bad) == {"table"}, lines
        assert f"1 {words}" in bad["table"], bad["table"]
    unreleased = table.index[table.status != "released"][0]
    forged_table = table.copy()
    forged_table.loc[unreleased, "p75_se"] = 0.1
    republish(forged, forged_table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and "1 p75_se value(s) where no interval is published" in bad["table"]


def test_margins_of_error_are_ceil_of_z_times_the_standard_error_where_it_is(forged):
    """p25_moe90 = ceil(1.645·p25_se, 4 decimals), there exactly where p25_se is: right ones
    pass; one a step short, one where the SE is not, one missing where it is, fail."""
    table = with_margins(table_of(forged))
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert "table" not in bad and "columns" not in bad, lines
    released = table.index[table.status == "released"]
    unreleased = table.index[table.status != "released"][0]
    for row, column, value, words in (
            (released[0], "p25_moe90", round(table.loc[released[0], "p25_moe90"] - 1e-4, 4),
             "1 p25_moe90 value(s) are not ceil(1.6449·p25_se, 4 decimals)"),
            (unreleased, "p75_moe90", 0.1, "1 p75_moe90 value(s) are not there exactly"),
            (released[1], "p75_moe90", np.nan, "1 p75_moe90 value(s) are not there exactly")):
        forged_table = table.copy()
        forged_table.loc[row, column] = value
        republish(forged, forged_table)
        code, bad, lines = run_audit(forged)
        assert code == 1 and "table" in bad and words in bad["table"], lines


def test_margins_of_error_without_their_standard_errors(forged):
    table = with_margins(table_of(forged)).drop(columns=list(SE_COLUMNS))
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and "margins of error ['p25_moe90', 'p75_moe90'] without the standard " \
        "errors" in bad["columns"], lines


@pytest.mark.parametrize("column", ["p25_lo", "p75_se", "p25"])
def test_a_column_not_declared_with_the_estimand_in_the_manifest(forged, column):
    """A release whose interval/SE/value column is described as something else (the old
    census reading) than the one estimand fails the columns check, naming the column."""
    m = manifest_of(forged)
    key = next(k for k in m["published_columns"] if column in [c.strip() for c in k.split(",")])
    m["published_columns"][key] = m["published_columns"][key].replace(
        audit_base.ESTIMAND_ID, "tract's own least-squares line")
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"columns"}, lines
    assert f"{column!r} is not declared with the tract expected outcome in published_columns" \
        in bad["columns"]


def test_a_column_not_declared_with_the_estimand_in_the_table_schema(forged):
    schema = json.loads((forged / "tracts.schema.json").read_text())
    for field in schema["fields"]:
        if field["name"] == "p75_hi":
            field["description"] = "Upper bound of the interval for the tract's own line"
    (forged / "tracts.schema.json").write_text(json.dumps(schema, indent=2))
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"columns"}, lines
    assert "'p75_hi' is not declared with the tract expected outcome in tracts.schema.json" \
        in bad["columns"]
    # a version 3 release stated the estimand per mechanism: not required of it
    as_version_3(forged)
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert "columns" not in bad, lines


def test_standard_errors_dropped_or_declared_a_budget_of_their_own(forged):
    table = table_of(forged).drop(columns=list(SE_COLUMNS) + list(MOE90_COLUMNS))
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"columns"}, lines
    assert "interval columns without their standard errors" in bad["columns"]


def test_a_version_2_release_without_standard_errors_still_audits(forged):
    """Releases published before the standard errors (manifest_version 2) are audited as they
    were published; from version 3 on, the columns are required (the test above)."""
    table = table_of(forged).drop(columns=list(SE_COLUMNS) + list(MOE90_COLUMNS))
    republish(forged, table)
    m = manifest_of(forged)
    m["manifest_version"] = 2
    del m["published_columns"]["p25_se, p75_se"]
    del m["published_columns"]["p25_moe90, p75_moe90"]
    write_manifest(forged, m)
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert "columns" not in bad and "table" not in bad, lines
    m["manifest_version"] = 1
    write_manifest(forged, m)
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and "manifest_version 1 is not one this audit reads" in bad["schema"]


def test_standard_errors_not_stated_as_post_processing(forged):
    m = manifest_of(forged)
    m["published_columns"]["p25_se, p75_se"] = "free"
    write_manifest(forged, m)
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"columns"}, lines
    assert "as post-processing of the step 'interval: p25 and p75'" in bad["columns"]


# --- 3. min_n deleted, tracts suppressed by their value -----------------------------------------


def test_min_n_deleted_and_tracts_suppressed_by_value(forged):
    table = table_of(forged)
    high = table.index[(table.status == "released")
                       & (table.p25 >= table.loc[table.status == "released", "p25"].median())]
    paid = ["p25", "p75", "p25_raw", "p75_raw", *INTERVAL_COLUMNS]
    table.loc[high, paid] = np.nan
    table.loc[high, ["status", "mechanism", "reason"]] = ["suppressed", "none", "withheld"]
    table.loc[high, ["epsilon_spent", "delta_spent"]] = 0.0
    republish(forged, table)
    m = manifest_of(forged)
    del m["min_n"]
    recount(m, table)
    write_manifest(forged, m)
    config = json.loads((forged / "config.json").read_text())
    del config["publish"]["min_n"]
    (forged / "config.json").write_text(json.dumps(config))
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and {"schema", "table", "sensitivities"} <= set(bad), lines
    assert "min_n missing" in bad["schema"]


def test_tracts_suppressed_by_value_with_min_n_kept(forged):
    """The same forgery with min_n left in place: suppression is not 'n < min_n'."""
    table = table_of(forged)
    i = table.index[table.status == "released"][0]
    table.loc[i, ["p25", "p75", "p25_raw", "p75_raw", *INTERVAL_COLUMNS]] = np.nan
    table.loc[i, ["status", "mechanism", "reason"]] = ["suppressed", "none",
                                                       "fewer than 2 records"]
    table.loc[i, ["epsilon_spent", "delta_spent"]] = 0.0
    republish(forged, table)
    m = manifest_of(forged)
    recount(m, table)
    write_manifest(forged, m)
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"table"}, lines
    assert "suppression is not 'n < min_n = 2'" in bad["table"]


# --- 4. released rows deleted (the boundaries anchor) ---------------------------------------------


def test_deleted_rows_fail_only_against_the_boundaries(anchored, forged):
    table = table_of(forged)
    table = table.drop(index=table.index[table.status == "released"][:3])
    republish(forged, table)
    m = manifest_of(forged)
    recount(m, table)
    write_manifest(forged, m)
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 0 and not bad, lines  # nothing in the folder shows it ...
    assert any(ln.startswith("skip  boundaries: not done (no --boundaries FILE)")
               for ln in lines)
    code, bad, lines = run_audit(forged, boundaries=anchored[2])  # ... the anchor does
    assert code == 1 and set(bad) == {"boundaries"}, lines
    assert "3 (tract, cell) row(s) missing" in bad["boundaries"]


def test_boundaries_of_another_file_fail(anchored, tmp_path):
    other = tmp_path / "tracts.parquet"
    gdf = gpd.read_parquet(anchored[2])
    gdf.iloc[:-1].to_parquet(other)
    code, bad, _ = run_audit(anchored[0], boundaries=other)
    assert code == 1 and "not the file this release was made from" in bad["boundaries"]
    assert "row(s) not in the boundaries" in bad["boundaries"]


def test_unreadable_boundaries_exit_2(anchored, tmp_path):
    out = io.StringIO()
    assert audit.main(anchored[0], out, boundaries=tmp_path / "nowhere.parquet") == 2
    shp = tmp_path / "tracts.zip"
    shp.write_bytes(b"PK")
    assert audit.main(anchored[0], out, boundaries=shp) == 2
    kml = tmp_path / "tracts.kml"
    kml.write_text("<kml/>")
    assert audit.main(anchored[0], out, boundaries=kml) == 2
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and all(ln.startswith("unreadable: --boundaries") for ln in lines)


@pytest.mark.parametrize("suffix", [".gpkg", ".zip", ".geojson"])
def test_boundaries_in_every_format_a_release_reads(state, tmp_path, suffix):  # noqa: F811
    """A release made from a GeoPackage, a zipped shapefile (TIGER/Line's own format) or a
    GeoJSON file: the audit reads its GEOIDs with the standard library and finds a deleted
    row."""
    gdf = gpd.read_parquet(state / "tracts.parquet")
    path = tmp_path / f"tracts{suffix}"
    if suffix == ".zip":
        import zipfile

        gdf.to_file(tmp_path / "tracts.shp")
        with zipfile.ZipFile(path, "w") as z:
            for part in tmp_path.glob("tracts.*"):
                if part.suffix != ".zip":
                    z.write(part, part.name)
    else:
        gdf.to_file(path, driver="GPKG" if suffix == ".gpkg" else "GeoJSON")
    cfg = make_cfg(tmp_path, state, boundaries={"path": str(path)})
    _, _, _, folder = build_release(tmp_path, state, cfg=cfg)
    code, bad, lines = run_audit(folder, boundaries=path)
    assert code == 0 and not bad, lines
    table = table_of(folder).iloc[1:]
    republish(folder, table)
    m = manifest_of(folder)
    recount(m, table)
    write_manifest(folder, m)
    rehash_all(folder)
    code, bad, lines = run_audit(folder, boundaries=path)
    assert code == 1 and set(bad) == {"boundaries"}, lines
    assert "1 (tract, cell) row(s) missing" in bad["boundaries"]


# --- 6, 9, 15. required fields with fixed meanings ------------------------------------------------


@pytest.mark.parametrize("field", ["ledger_entry", "min_n", "public", "public_values",
                                   "assumptions", "manifest_version", "published"])
def test_required_field_removed(forged, field):
    m = manifest_of(forged)
    del m[field]
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1, lines
    assert field in bad.get("schema", "") + bad.get("public", ""), bad


def test_ledger_entry_removed(forged):
    m = manifest_of(forged)
    del m["ledger_entry"]
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and "ledger_entry missing" in bad["schema"], lines


def test_plain_input_hash_published_fails(forged):
    """The input's plain sha256 is a non-DP function of the microdata: a manifest that
    carries it (instead of, or beside, the keyed commitment) fails."""
    m = manifest_of(forged)
    m["input_sha256"] = "0" * 64
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and "input_sha256 is published" in bad["schema"], lines


def test_input_commitment_of_another_form_fails(forged):
    m = manifest_of(forged)
    m["input_commitment"] = {"scheme": "sha256", "value": "0" * 64}
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and "input_commitment" in bad["schema"], lines


def test_n_is_public_assumption_deleted(forged):
    m = manifest_of(forged)
    m["assumptions"]["unverified"] = [a for a in m["assumptions"]["unverified"]
                                      if "n per tract and cell is public" not in a]
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"public"}, lines
    assert "'n per tract and cell is public' is not listed" in bad["public"]


@pytest.mark.parametrize("change, expected", [
    (lambda m: m["public_values"].remove("n (records per tract and cell)"), "public_values"),
    (lambda m: m["public"]["columns"].append("p25"), "public.columns"),
    (lambda m: m["public"].pop("timing"), "`public` has keys"),
    (lambda m: m["public"].update(existence=""), "states nothing for ['existence']"),
])
def test_public_section_and_values_have_fixed_meanings(forged, change, expected):
    m = manifest_of(forged)
    change(m)
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"public"} and expected in bad["public"], lines


@pytest.mark.parametrize("version", [None, 1, 5, "3", True])
def test_manifest_version_must_be_one_the_audit_reads(forged, version):
    m = manifest_of(forged)
    m["manifest_version"] = version
    write_manifest(forged, m)
    code, bad, _ = run_audit(forged)
    assert code == 1 and "manifest_version" in bad["schema"], bad


# --- 7. intervals.epsilon disagreeing with its step -----------------------------------------------


def test_intervals_epsilon_set_to_99(forged):
    m = manifest_of(forged)
    m["intervals"]["epsilon"] = 99
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"columns"}, lines
    assert "intervals.epsilon 99 is not the interval step's" in bad["columns"]


def test_the_manifest_no_longer_records_a_low_reliability_width_and_old_ones_still_pass(forged):
    """Maps hatch an interval that spans colour classes (publication.colours.spans_classes),
    so the manifest no longer records intervals.low_reliability_width; a release published
    with it still passes the audit."""
    m = manifest_of(forged)
    assert m["intervals"] and "low_reliability_width" not in m["intervals"]
    m["intervals"]["low_reliability_width"] = 0.5
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 0 and not bad, lines


# --- 8. every format holds the same values ------------------------------------------------------


def test_p25_changed_in_the_parquet_only(forged):
    table = table_of(forged)
    r = table.index[(table.status == "released") & (table.p25_hi - table.p25_lo > 0.01)][0]
    new = round(float(table.loc[r, "p25_lo"] + table.loc[r, "p25_hi"]) / 2, 4)
    if abs(new - table.loc[r, "p25"]) < 1e-4:
        new = round(float(table.loc[r, "p25_lo"]), 4)
    table.loc[r, ["p25", "p25_raw"]] = new
    table.to_parquet(forged / "tracts.parquet", index=False)
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"formats"}, lines
    values = V.values_file(table.loc[r, "cell"], table.loc[r, "geoid"][:2])
    for fmt in ("tracts.csv", "tracts.geojson", values):
        assert f"{fmt}: p25 differs from tracts.parquet in 1 row(s)" in bad["formats"]


def _polygons_input(folder: Path, out: Path, with_values: bool = False) -> Path:
    """The release's tracts as the archive's input: each polygon once with its GEOID
    (``with_values``: every property, as the archives carried them before)."""
    g = json.loads((folder / "tracts.geojson").read_text())
    for feature in g["features"]:
        feature.pop("id", None)
        if not with_values:
            feature["properties"] = {"geoid": feature["properties"]["geoid"]}
    out.write_text(json.dumps(g))
    return out


def test_p75_changed_in_the_values_document_only(forged):
    """A value of the map's document changed (re-hashed): the formats check names it."""
    path = next((forged / V.VALUES_FOLDER).rglob("*.json"))
    doc = json.loads(path.read_text())
    p75, status = doc["columns"].index("p75"), doc["columns"].index("status")
    row = next(r for r in doc["rows"] if r[status] == "released")
    row[p75] = 0.0 if row[p75] else 0.5
    path.write_text(json.dumps(doc))
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"formats"}, lines
    name = str(path.relative_to(forged))
    assert f"{name}: p75 differs from tracts.parquet in 1 row(s)" in bad["formats"]
    assert "csv" not in bad["formats"]


def test_values_put_back_into_the_tiles_fail(forged, tmp_path):
    """The archive rebuilt with every property (the values beside the documents): the map
    would read the documents, a reader of the tiles these; the formats check refuses it."""
    build_tiles(_polygons_input(forged, tmp_path / "all.geojson", with_values=True),
                forged / "tracts.pmtiles")
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"formats"}, lines
    assert "tracts.pmtiles carries properties" in bad["formats"]


def test_pmtiles_reader_reads_every_tract_and_attribute(anchored):
    """The audit's own PMTiles/MVT reader against tippecanoe-decode, the reference decoder."""
    from dpatlas.publication.tiles import decode_tile

    path = anchored[0] / "tracts.pmtiles"
    header, tiles = audit_tiles.pmtiles_tiles(path)
    ours = sorted((f["geoid"], json.dumps(f, sort_keys=True))
                  for t in tiles for f in audit_tiles.mvt_features(t))
    z = header["min_zoom"]
    theirs = []
    for x in range(2 ** z):
        for y in range(2 ** z):
            try:
                decoded = decode_tile(path, z, x, y)
            except Exception:  # noqa: BLE001 - no such tile
                continue
            for layer in decoded.get("features", []):
                for f in layer.get("features", []):
                    theirs.append((f["properties"]["geoid"],
                                   json.dumps(f["properties"], sort_keys=True)))
    assert ours and sorted(theirs) == ours
    assert {g for g, _ in ours} == set(table_of(anchored[0]).geoid)


# --- 10. reason carrying a number ---------------------------------------------------------------


def test_reason_carrying_a_non_dp_number(forged):
    table = table_of(forged)
    i = table.index[table.status == "released"][0]
    table.loc[i, "reason"] = "0.4731"
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"table"}, lines
    assert "give a reason that is not theirs" in bad["table"] and "'0.4731'" in bad["table"]


@pytest.mark.parametrize("reason", ["noisy nvar <= 0", "no pairs with distinct x"])
def test_a_released_value_hidden_as_a_failure(forged, reason):
    """status 'failed' only with the mechanism's own DP failure: the exponential-mechanism
    Theil-Sen never fails (neither by NoisyStats' noisy nvar nor by the non-private median's
    lack of pairs)."""
    table = table_of(forged)
    i = table.index[(table.status == "released") & (table.mechanism == "DPExpTheilSen")][0]
    table.loc[i, ["p25", "p75", "p25_raw", "p75_raw", *INTERVAL_COLUMNS]] = np.nan
    table.loc[i, ["status", "reason"]] = ["failed", reason]
    republish(forged, table)
    m = manifest_of(forged)
    recount(m, table)
    write_manifest(forged, m)
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"table"}, lines
    assert f"{reason!r} where failed" in bad["table"]


def test_total_guarantee_restated(forged):
    m = manifest_of(forged)
    m["total_per_person"]["guarantee"]["epsilon"] /= 2
    write_manifest(forged, m)
    code, bad, _ = run_audit(forged)
    assert code == 1 and set(bad) == {"totals"} and "total per person" in bad["totals"]


# --- 11. an extra column declared public -----------------------------------------------------


def test_extra_column_declared_public(forged):
    table = table_of(forged)
    table.insert(5, "x_mean", np.round(np.linspace(0.3, 0.6, len(table)), 4))
    republish(forged, table)
    m = manifest_of(forged)
    m["published_columns"]["x_mean"] = "public"
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"columns"}, lines
    assert "'x_mean' is paid for by no step" in bad["columns"]
    assert "declares ['x_mean'] public" in bad["columns"]


def test_a_paid_column_declared_public(forged):
    m = manifest_of(forged)
    m["published_columns"]["p25, p75"] = "public"
    write_manifest(forged, m)
    code, bad, _ = run_audit(forged)
    assert code == 1 and "declares ['p25', 'p75'] public" in bad["columns"]


# --- 12. every noise scale doubled, epsilon halved (the ledger anchor) ----------------------------


def halve_epsilon_everywhere(folder: Path) -> None:
    """Twice the noise on paper: every scale doubled and every epsilon halved, consistently."""
    m = manifest_of(folder)
    for step in m["budget"]["steps"]:
        worst = 0.0
        for noise_steps in step["noise"]["alternatives"].values():
            total = 0.0
            for ns in noise_steps:
                p = ns["parameters"]
                if ns["mechanism"] == "grid-laplace":
                    p["scale_num"] *= 2
                else:
                    assert ns["mechanism"] == "exponential-median" and p["rate"] % 2 == 0
                    p["rate"] //= 2
                ns["guarantee"]["epsilon"] = audit_noise.noise_guarantee(ns).epsilon
                total += ns["guarantee"]["epsilon"] * ns["repeat"]
            worst = max(worst, total)
        step["guarantee"]["epsilon"] = worst
        step["epsilon_param"] /= 2
    m["intervals"]["epsilon"] = step_named(m, "interval: p25 and p75")["epsilon_param"]
    eps = restate_totals(m)
    write_manifest(folder, m)
    table = table_of(folder)
    table.loc[table.status != "suppressed", "epsilon_spent"] = eps
    republish(folder, table)


def test_noise_doubled_and_epsilon_halved_fails_only_against_the_ledger(anchored, forged):
    halve_epsilon_everywhere(forged)
    code, bad, lines = run_audit(forged)
    assert code == 0 and not bad, lines  # consistent: the folder alone cannot tell
    assert any(ln.startswith("skip  ledger: not done (no --ledger URL)") for ln in lines)
    code, bad, lines = run_audit(forged, ledger=anchored[1])
    assert code == 1 and set(bad) == {"ledger"}, lines
    assert "charge(s) differ from the steps' guarantees" in bad["ledger"]
    assert "not the manifest the ledger recorded" in bad["ledger"]


def test_ledger_over_its_cap_fails(anchored, tmp_path):
    db = tmp_path / "ledger.db"
    shutil.copy(anchored[1].removeprefix("sqlite:///"), db)
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE ledger_caps SET cap_epsilon = 0.5")
    code, bad, _ = run_audit(anchored[0], ledger=f"sqlite:///{db}")
    assert code == 1 and "over its cap" in bad["ledger"]


def test_ledger_anchor_reads_sqlite_and_postgresql(anchored, state, ledger_url,  # noqa: F811
                                                  tmp_path):
    """The same charges recorded in a fresh ledger of each backend: the anchor passes, and
    a password in the URL never reaches the output."""
    cfg = make_cfg(tmp_path, state)
    ledger = Ledger(ledger_url)
    ledger.set_cap(DATASET, 50.0, 1e-3, "forgery tests")
    ledger.begin_release(RID, DATASET, charges(make_plan(cfg, cfg.selection.threshold),
                                               ["all"]), "cfg", OWNER)
    ledger.complete_release(RID, sha256_file(anchored[0] / "manifest.json"), OWNER)
    ledger.close()
    code, bad, lines = run_audit(anchored[0], ledger=ledger_url)
    assert code == 0 and not bad, lines
    secret = ledger_url.split("@")[0].rsplit(":", 1)[-1] if "@" in ledger_url else None
    assert not secret or secret not in "\n".join(lines)


def test_unreadable_ledger_exits_2(anchored, tmp_path):
    out = io.StringIO()
    assert audit.main(anchored[0], out, ledger=f"sqlite:///{tmp_path / 'none.db'}") == 2
    assert audit.main(anchored[0], out, ledger="not a url") == 2
    assert audit.main(anchored[0], out,
                      ledger="postgresql+psycopg://op:s3cretpw@127.0.0.1:1/ledger") == 2
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and all(ln.startswith("unreadable: --ledger") for ln in lines)
    assert "s3cretpw" not in out.getvalue()


# --- 13. sensitivities are derived, not read ---------------------------------------------------


def test_sensitivity_text_changed(forged):
    m = manifest_of(forged)
    nvar = step_named(m, "selection: noisy n*var(x)")["noise"]["alternatives"][
        "dp selection rule"][0]
    nvar["sensitivity"] = nvar["sensitivity"].replace("1 - 1/n", "1/(2n)")
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"sensitivities"}, lines
    assert "states sensitivity '1/(2n)" in bad["sensitivities"]


def test_a_noise_step_the_audit_cannot_derive_fails(forged):
    m = manifest_of(forged)
    alts = step_named(m, "primary: p25 and p75")["noise"]["alternatives"]
    alts["DPExpTheilSen"][0]["name"] = "p25 median (tuned)"
    write_manifest(forged, m)
    code, bad, _ = run_audit(forged)
    assert code == 1 and "derives no sensitivity" in bad["sensitivities"]


def test_every_publishable_estimators_noise_has_a_derived_sensitivity():
    """The audit's table covers every noise step an estimator of mechanisms.PUBLISHABLE, the
    selection rule and the intervals can put in a manifest, and agrees with what it states."""
    import mechanisms as M
    from mechanisms import intervals as CI
    from dpatlas.release.selection import SELECTION_LABEL, nvar_step

    found = [(SELECTION_LABEL, nvar_step(0.1))]
    for name in M.PUBLISHABLE:
        found += [(name, s) for s in M.get(name).noise_steps(1.0, 1e-6)]
    for label in ("NoisyStats", "DPExpTheilSen"):
        found += [(label, s) for s in CI.interval_noise_steps(label, 0.25)]
    for label, step in found:
        d = step.as_dict()
        siblings = [s.as_dict() for lab, s in found if lab == label]
        assert audit_sensitivities.sensitivity_problem(label, d, siblings, 2) is None, (label, d)
        forged = {**d, "sensitivity": "0"}
        assert audit_sensitivities.sensitivity_problem(label, forged, siblings, 2), (label, d)


# --- 14. forged id, dates, code version; oversized and nested manifests (D9) ----------------------


@pytest.mark.parametrize("change, expected", [
    (lambda m: m.update(release_id="r2"), "not the folder's name"),
    (lambda m: m.update(release_id="latest\n"), "is not 1-64 characters"),
    (lambda m: m.update(published="2026-13-45"), "is not a valid date"),
    (lambda m: m.update(published="yesterday"), "is not a valid date"),
    (lambda m: m.update(published="2025-12-31"), "is before started"),
    (lambda m: m.update(published="2999-01-01"), "is in the future"),
    (lambda m: m.update(code_version={"package": "0.1.0; rm -rf /", "git_commit": None}),
     "is not a version"),
    (lambda m: m.update(code_version={"package": "0.1.0", "git_commit": "HEAD"}),
     "is not a 40-digit git commit"),
    (lambda m: m.update(code_version="0.1.0"), "code_version"),
])
def test_forged_id_dates_and_code_version_fail(forged, change, expected):
    m = manifest_of(forged)
    change(m)
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 1 and expected in bad.get("schema", ""), lines


def test_a_renamed_release_is_not_in_the_ledger(anchored, tmp_path):
    """A valid id, consistent everywhere, that the ledger never charged."""
    other = tmp_path / "r2"
    shutil.copytree(anchored[0], other)
    m = manifest_of(other)
    m["release_id"] = m["ledger_entry"]["release_id"] = "r2"
    write_manifest(other, m)
    code, bad, lines = run_audit(other)
    assert code == 0, lines
    code, bad, _ = run_audit(other, ledger=anchored[1])
    assert code == 1 and bad["ledger"] == "release 'r2' is not in the ledger"


def test_deeply_nested_manifest_exits_2_in_one_line(forged):
    out = io.StringIO()
    (forged / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert audit.main(forged, out) == 2
    (forged / "manifest.json").write_text('{"a": ' + "[" * 200 + "]" * 200 + "}")
    assert audit.main(forged, out) == 2
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all(ln.startswith("unreadable: ") for ln in lines), lines
    assert "nests" in lines[0] and "nests deeper than 64" in lines[1]


def test_deeply_nested_config_is_a_finding_not_a_crash(forged):
    (forged / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    rehash_all(forged)
    code, bad, _ = run_audit(forged)
    assert code == 1 and "nests too deeply" in bad["config"]


def test_huge_manifest_is_refused_before_reading(forged, monkeypatch):
    with open(forged / "manifest.json", "r+b") as fh:
        fh.truncate(300 * 1024 * 1024)  # sparse: 300 MB that nobody should read
    reads = []
    real_open = open

    def spy(path, *args, **kw):
        if str(path).endswith("manifest.json"):
            reads.append(path)
        return real_open(path, *args, **kw)
    monkeypatch.setattr("builtins.open", spy)
    out = io.StringIO()
    assert audit.main(forged, out) == 2
    assert reads == []
    line, = out.getvalue().splitlines()
    assert line.startswith("unreadable: ") and "314,572,800 bytes, over the 16,777,216" in line


def test_cli_nested_manifest_exits_2_without_a_traceback(forged):
    (forged / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    dpatlas = Path(sys.executable).with_name("dpatlas")
    run = subprocess.run([str(dpatlas), "audit", str(forged)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "NO_COLOR": "1"})
    assert run.returncode == 2, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert len(run.stdout.strip().splitlines()) == 1


def test_cli_passes_the_anchors_and_allow_test(anchored):
    folder, url, boundaries = anchored
    dpatlas = Path(sys.executable).with_name("dpatlas")
    base = [str(dpatlas), "audit", str(folder)]
    run = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert run.returncode == 3 and run.stdout.splitlines()[-1].startswith("TEST")
    run = subprocess.run(base + ["--allow-test", "--ledger", url, "--boundaries",
                                 str(boundaries)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ok    ledger" in run.stdout and "ok    boundaries" in run.stdout


# --- B. the manifest states the threat model ----------------------------------------------------


def test_manifest_states_what_is_public_and_rounds_times_to_the_day(anchored):
    m = manifest_of(anchored[0])
    assert m["manifest_version"] == 4
    assert m["public"]["columns"] == list(audit_base.PUBLIC_COLUMNS)
    assert sorted(m["public"]) == sorted(audit_schema.PUBLIC_SECTION_KEYS)
    assert "n per tract and cell" in m["public"]["counts"]
    assert "rounded to the day" in m["public"]["timing"]
    assert m["public"]["threat_model"] == "docs/threat-model.md"
    assert (REPO / m["public"]["threat_model"]).is_file()
    for key in ("started", "published"):
        assert audit_schema.DAY.fullmatch(m[key]), m[key]


def test_synthetic_folder_rounds_its_time_and_audits_with_its_ledger(published):
    """A synthesize folder: its time is a day, it is TEST without --allow-test (seeded), and
    the ledger anchor finds its charge and its manifest."""
    from dpatlas.core.config import load_config
    from dpatlas.release.synthetic_data import synthesize_release
    from tests.integration.test_synthesize import EPS, SEED, SOURCE

    cfg_path, _ = published
    folder = synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    m = manifest_of(folder)
    assert audit_schema.DAY.fullmatch(m["created"]), m["created"]
    assert audit.main(folder, io.StringIO()) == 3
    url = load_config(cfg_path).ledger.url
    code, bad, lines = run_audit(folder, ledger=url)
    assert code == 0 and not bad, lines
    assert any(ln.startswith("ok    ledger: the ledger published this manifest") for ln in lines)


def test_day_of_rounds_to_the_utc_day():
    from dpatlas.release.manifest import day_of

    assert day_of("2026-11-25T23:59:59+00:00") == "2026-11-25"
    assert day_of("2026-11-26T01:00:00+05:00") == "2026-11-25"
    assert day_of("2026-11-25") == "2026-11-25"


# --- 16. geometry: every format's polygons, and the boundaries' (issue 31, item 3) ---------------


def extreme_tracts(folder: Path) -> tuple[str, str]:
    """The GEOIDs of the released tracts with the highest and the lowest p25."""
    released = table_of(folder).query("status == 'released'").sort_values("p25")
    return released.geoid.iloc[-1], released.geoid.iloc[0]


def swap_geojson_polygons(path: Path, a: str, b: str) -> None:
    g = json.loads(path.read_text())
    features = {f["properties"]["geoid"]: f for f in g["features"]}
    features[a]["geometry"], features[b]["geometry"] = (features[b]["geometry"],
                                                        features[a]["geometry"])
    path.write_text(json.dumps(g))


def swap_table_polygons(table: gpd.GeoDataFrame, a: str, b: str) -> gpd.GeoDataFrame:
    ia, ib = table.index[table.geoid == a], table.index[table.geoid == b]
    geometry = table.geometry.copy()
    geometry.loc[ia] = table.geometry.loc[ib].values
    geometry.loc[ib] = table.geometry.loc[ia].values
    return table.set_geometry(geometry)


def test_the_untouched_release_states_its_polygons_checked(anchored):
    folder, _, boundaries = anchored
    code, bad, lines = run_audit(folder, boundaries=boundaries)
    assert code == 0 and not bad, lines
    formats = next(ln for ln in lines if ln.startswith("ok    formats: "))
    assert "polygons are the table's" in formats
    assert "is its boundary tract's" in next(ln for ln in lines
                                              if ln.startswith("ok    boundaries: "))


def test_polygons_swapped_in_the_geojson_fail_the_formats_check_and_the_boundaries(anchored,
                                                                                   forged):
    """The issue's repro: the highest and the lowest p25 tracts' polygons swapped in
    tracts.geojson, the manifest re-hashed (it passed 16 of 16 with --boundaries)."""
    a, b = extreme_tracts(forged)
    swap_geojson_polygons(forged / "tracts.geojson", a, b)
    rehash_all(forged)
    code, bad, lines = run_audit(forged, boundaries=anchored[2])
    assert code == 1 and set(bad) == {"formats", "boundaries"}, lines
    assert "tracts.geojson: the polygon of 2 row(s) is not tracts.parquet's" in bad["formats"]
    assert "tracts.geojson: the polygon of 2 row(s) is not the boundary file" in \
        bad["boundaries"]
    assert "tracts.parquet: the polygon" not in bad["boundaries"]
    assert "tracts.pmtiles: the polygon" not in bad["boundaries"]


def test_polygons_swapped_in_the_geoparquet_only(anchored, forged):
    a, b = extreme_tracts(forged)
    swap_table_polygons(table_of(forged), a, b).to_parquet(forged / "tracts.parquet",
                                                           index=False)
    rehash_all(forged)
    code, bad, lines = run_audit(forged, boundaries=anchored[2])
    assert code == 1 and set(bad) == {"formats", "boundaries"}, lines
    for fmt in ("tracts.geojson", "tracts.pmtiles"):
        assert f"{fmt}: the polygon of 2 row(s) is not tracts.parquet's" in bad["formats"]
    assert "tracts.parquet: the polygon of 2 row(s) is not the boundary file" in \
        bad["boundaries"]


def test_polygons_swapped_in_every_format_fail_only_against_the_boundaries(anchored, forged):
    """A consistent swap (GeoParquet, GeoJSON and tiles rewritten together) agrees across the
    formats; only the boundary file can show it, in every format."""
    a, b = extreme_tracts(forged)
    republish(forged, swap_table_polygons(table_of(forged), a, b))
    code, bad, lines = run_audit(forged)
    assert code == 0 and not bad, lines
    code, bad, lines = run_audit(forged, boundaries=anchored[2])
    assert code == 1 and set(bad) == {"boundaries"}, lines
    for fmt in ("tracts.parquet", "tracts.geojson", "tracts.pmtiles"):
        assert f"{fmt}: the polygon of 2 row(s) is not the boundary file" in bad["boundaries"]


def test_polygons_swapped_in_the_tiles_only(forged, tmp_path):
    """The PMTiles archive rebuilt from a GeoJSON with two polygons swapped, the GeoJSON put
    back: the tiles' polygons are compared at their lowest zoom, within its grid's tolerance."""
    a, b = extreme_tracts(forged)
    changed = tmp_path / "swapped.geojson"
    shutil.copy(forged / "tracts.geojson", changed)
    swap_geojson_polygons(changed, a, b)
    build_tiles(changed, forged / "tracts.pmtiles")
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"formats"}, lines
    assert "tracts.pmtiles: the polygon of 2 row(s) is not tracts.parquet's" in bad["formats"]
    assert "units of the z4 tile grid" in bad["formats"]


def test_the_tile_reader_decodes_polygons_where_tippecanoe_decode_puts_them(anchored):
    """The audit's MVT polygons (in tile units at the lowest zoom), projected back to degrees,
    against tippecanoe-decode's GeoJSON of the same tiles: the same places, to a unit."""
    import shapely

    from dpatlas.publication.tiles import decode_tile

    path = anchored[0] / "tracts.pmtiles"
    header, entries = audit_tiles.pmtiles_tile_entries(path)
    keys, geoms, z, extent = audit_tiles.tile_geometries(entries, "tracts")
    ours = dict(zip((k[0] for k in keys), geoms))
    theirs: dict[str, list] = {}
    for tile_id, _, _ in entries:
        _, x, y = audit_tiles.tile_zxy(tile_id)
        for layer in decode_tile(path, z, x, y).get("features", []):
            for f in layer.get("features", []):
                theirs.setdefault(f["properties"]["geoid"], []).append(
                    shapely.geometry.shape(f["geometry"]))
    assert set(theirs) == set(ours)
    projected = audit_geometry.to_tile_units(
        {g: shapely.union_all(p) for g, p in theirs.items()}, z, extent)
    distance = shapely.hausdorff_distance(np.array([ours[g] for g in projected], dtype=object),
                                          np.array(list(projected.values()), dtype=object))
    assert distance.max() <= 1.0, distance.max()
    assert audit_tiles.tile_zxy(0) == (0, 0, 0) and audit_tiles.tile_zxy(1) == (1, 0, 0)
    assert [audit_tiles.tile_zxy(i) for i in (2, 3, 4, 5)] == [
        (1, 0, 1), (1, 1, 1), (1, 1, 0), (2, 0, 0)]


# --- 17. machine paths in every published file (issue 31) ----------------------------------------


def published_beside(folder: Path, name: str, text: str) -> None:
    """A file ``name`` holding ``text`` added to the release, listed and hashed."""
    (folder / name).write_text(text)
    files = manifest_of(folder)["files"]
    write_manifest(folder, {**manifest_of(folder), "files": {**files, name: {}}})
    rehash_all(folder)


@pytest.mark.parametrize("name, text", [
    ("index.html", '<a href="file:///home/op/dpatlas/demo/data">data</a>'),
    ("README.txt", "built on /tmp/build-7/dpatlas from the operator's copy"),
    ("tracts.schema.json", None),
])
def test_a_machine_path_in_any_published_text_file_fails(forged, name, text):
    if text is None:  # a path written into a field of a published JSON file
        schema = json.loads((forged / name).read_text())
        schema["description"] = "made from C:\\Users\\op\\tracts.parquet"
        (forged / name).write_text(json.dumps(schema))
        rehash_all(forged)
    else:
        published_beside(forged, name, text)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"machine paths"}, lines
    assert f"e.g. {name}: " in bad["machine paths"]


def test_a_machine_path_in_the_csv_fails(forged):
    """A path in a CSV cell: the values differ from the table too, and the path is named."""
    rows = (forged / "tracts.csv").read_text().splitlines()
    first = rows[1].split(",")
    first[0] = "/home/op/x"  # the first row's geoid
    rows[1] = ",".join(first)
    (forged / "tracts.csv").write_text("\n".join(rows) + "\n")
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and "machine paths" in bad, lines
    assert "e.g. tracts.csv: '/home/op/x" in bad["machine paths"]


def test_a_machine_path_in_the_tile_metadata_fails(forged, tmp_path):
    from dpatlas.publication.tiles import TileText

    build_tiles(_polygons_input(forged, tmp_path / "polygons.geojson"),
                forged / "tracts.pmtiles",
                text=TileText("tracts", "built in /home/op/work/release", "dpatlas"))
    rehash_all(forged)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"machine paths"}, lines
    assert "tracts.pmtiles: '/home/op/work/release" in bad["machine paths"]


def test_the_published_tile_metadata_has_no_machine_path(anchored):
    """tippecanoe writes its command line into the archive (generator_options): the binary's
    absolute path was in it; now the program's bare name and relative file names."""
    from dpatlas.publication.tiles import read_metadata

    metadata = read_metadata(anchored[0] / "tracts.pmtiles")
    assert metadata["generator_options"].startswith("tippecanoe -o ")
    assert audit_paths.machine_path_in_text(json.dumps(metadata).encode()) is None
    code, bad, lines = run_audit(anchored[0])
    assert code == 0, lines
    assert any(ln.startswith("ok    machine paths: ") and "tile and Parquet metadata" in ln
               for ln in lines)


# --- 18. hostile files: the audit never hangs or reads without end (issue 31, O10) -------------


def audit_in_a_subprocess(folder: Path, *options: str
                          ) -> tuple[subprocess.CompletedProcess, float]:
    """``dpatlas audit`` of ``folder`` in a subprocess with a timeout and its memory limited
    (a reader of /dev/zero fails there rather than on this machine); (the run, seconds)."""
    import resource
    import time

    def limit_memory():  # the whole audit of the demo release runs within 2 GiB
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    # one BLAS thread: each reserves address space, which the limit counts
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "dpatlas.audit", str(folder),
                          "--allow-test", *options], capture_output=True, text=True,
                         timeout=60, preexec_fn=limit_memory, env=env)
    return run, time.monotonic() - started


@pytest.mark.parametrize("name", ["tracts.geojson", "tracts.csv", "stray"])
def test_a_fifo_in_the_folder_is_named_not_opened(forged, name):
    (forged / name).unlink(missing_ok=True)
    os.mkfifo(forged / name)
    run, _ = audit_in_a_subprocess(forged)
    assert run.returncode == 1, run.stdout + run.stderr
    files = next(ln for ln in run.stdout.splitlines() if ln.startswith("FAIL  files: "))
    assert f"{name} (a FIFO (named pipe))" in files or \
        f"{name} is a FIFO (named pipe), not a regular file" in files
    if name != "stray":  # the checks that would read it say it was not read
        assert f"{name} is a FIFO (named pipe), not a regular file: not read" in \
            next(ln for ln in run.stdout.splitlines() if ln.startswith("FAIL  formats: "))


@pytest.mark.parametrize("name", ["tracts.geojson", "tracts.pmtiles"])
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_linked_in_as_a_published_file_is_not_read(forged, name, device):
    (forged / name).unlink()
    (forged / name).symlink_to(device)
    run, seconds = audit_in_a_subprocess(forged)
    assert run.returncode == 1, run.stdout + run.stderr
    failed = [ln for ln in run.stdout.splitlines() if ln.startswith("FAIL  ")]
    assert f"{name} is a symbolic link to '{device}', not a regular file" in failed[0]
    assert all(f"{name} is a symbolic link" in ln for ln in failed), failed
    assert seconds < 30


def test_a_fifo_as_the_manifest_is_unreadable_not_a_hang(forged):
    (forged / "manifest.json").unlink()
    os.mkfifo(forged / "manifest.json")
    run, _ = audit_in_a_subprocess(forged)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "manifest.json is a FIFO (named pipe), not a regular file" in run.stdout


def test_a_file_far_larger_than_its_recorded_size_is_not_read(forged):
    """A sparse file of 64 GiB in place of the tiles: named, never read."""
    with open(forged / "tracts.pmtiles", "r+b") as fh:
        fh.truncate(64 << 30)
    run, seconds = audit_in_a_subprocess(forged)
    assert run.returncode == 1, run.stdout + run.stderr
    formats = next(ln for ln in run.stdout.splitlines() if ln.startswith("FAIL  formats: "))
    assert "tracts.pmtiles is 68,719,476,736 bytes (the manifest records" in formats
    assert seconds < 30


def test_a_fifo_given_as_the_boundaries_is_unreadable_not_a_hang(anchored, tmp_path):
    fifo = tmp_path / "tracts.parquet"
    os.mkfifo(fifo)
    run, _ = audit_in_a_subprocess(anchored[0], "--boundaries", str(fifo))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "not a file or folder" in run.stdout


def test_tiles_that_inflate_past_the_limit_are_not_inflated(forged, monkeypatch):
    """A gzip bomb in a tile archive would exhaust the audit's memory: inflating stops at
    MAX_UNPACKED_BYTES (lowered here to below the test archive's tiles)."""
    monkeypatch.setattr(audit_tiles, "MAX_UNPACKED_BYTES", 64)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"formats", "machine paths"}, lines
    assert "tracts.pmtiles cannot be read: ValueError a gzip'd directory or tile of more " \
        "than 64 bytes: not inflated" in bad["formats"]


# --- names (issue 33 item 4): a public column recomputed from the GEOID -------------------------


def test_the_published_names_are_census_style_and_the_audit_recomputes_them(anchored):
    table = table_of(anchored[0])
    first = table.iloc[0]
    assert first["name"].startswith("Census Tract ") and first["name"].endswith("; Illinois")
    _, bad, lines = run_audit(anchored[0])
    assert "names" not in bad and any(ln.startswith("ok    names: ") for ln in lines), lines


def test_a_name_carrying_a_number_in_every_format_fails(forged):
    """A name is a channel no budget pays for: anything but its GEOID's Census-style name
    (here the tract's n smuggled into it) fails, though every format agrees."""
    table = table_of(forged)
    r = table.index[0]
    table.loc[r, "name"] = f"{table.loc[r, 'name']} (n {int(table.loc[r, 'n'])})"
    republish(forged, table)
    code, bad, lines = run_audit(forged)
    assert code == 1 and set(bad) == {"names"}, lines
    assert "tracts.parquet: 1 name(s) are not the Census-style name of their GEOID" \
        in bad["names"]


def test_a_release_of_before_names_still_audits(forged):
    """Releases published before names (no name column, public.columns without it) pass."""
    table = table_of(forged).drop(columns="name")
    republish(forged, table)
    m = manifest_of(forged)
    m["public"]["columns"].remove("name")
    m["published_columns"] = {k.replace(", name", ""): v
                              for k, v in m["published_columns"].items()}
    write_manifest(forged, m)
    code, bad, lines = run_audit(forged)
    assert code == 0, lines
    assert any(ln.startswith("ok    names: no names published") for ln in lines), lines


def test_a_file_left_under_the_values_folder_unlisted_fails_the_files_check(forged):
    """Anything under tract-values/ that the manifest does not list is named (the files
    check walks it as it walks the state parts' folders)."""
    stray = forged / V.VALUES_FOLDER / "all" / "99.json"
    stray.write_text("{}")
    code, bad, lines = run_audit(forged)
    assert code == 1 and "files" in bad, lines
    assert "files not in the manifest: ['tract-values/all/99.json']" in bad["files"]
