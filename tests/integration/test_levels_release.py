"""A seeded release with county and state levels (issue 20, item 1), through the flow: the
three levels' files, declared in the manifest, STAC and the feed, and audited; forgeries of a
level (a county value without a paying step, a level step dropped from the total, county
tiles that differ from the table) fail."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import geopandas as gpd
import pandas as pd
import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from dpatlas.audit import run as audit  # noqa: E402
from dpatlas.core.hashing import sha256_file  # noqa: E402
from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402
from dpatlas.publication.tiles import build_level_tiles, read_metadata  # noqa: E402
from dpatlas.publication.tract_files import read_csv_with_schema  # noqa: E402

from tests.support.inputs import levels_release_config, write_config  # noqa: E402

LEVELS = ["tract", "county", "state"]


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A seeded release of a 90-tract, 3-county state with all three levels and the
    small-area model."""
    tmp = tmp_path_factory.mktemp("levels")
    write_synthetic(tmp / "data", ["17"], seed=5, params=StateParams(n_tracts=90, counties=3))
    cfg = levels_release_config(tmp)
    with prefect_test_harness(server_startup_timeout=180):
        from flows.release import release

        outcome = release(str(write_config(tmp / "config.yaml", cfg)), "r1", 11)
    assert outcome.status == "published"
    return Path(outcome.folder)


def run_audit(folder: Path) -> tuple[int, dict[str, str]]:
    out = io.StringIO()
    code = audit.main(folder, out, allow_test=True)
    bad = {ln[6:].split(":", 1)[0]: ln.split(": ", 1)[1]
           for ln in out.getvalue().splitlines() if ln.startswith("FAIL  ")}
    return code, bad


def manifest_of(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def write_rehashed(folder: Path, m: dict) -> None:
    for name in m["files"]:
        m["files"][name] = {"sha256": sha256_file(folder / name),
                            "bytes": (folder / name).stat().st_size}
    (folder / "manifest.json").write_text(json.dumps(m, indent=2))


def restate_totals(m: dict) -> None:
    """The budget's figures recomputed from the (pure) steps left, as a forger would."""
    budget = m["budget"]
    eps = sum(s["guarantee"]["epsilon"] for s in budget["steps"])
    budget["epsilon_per_tract_and_cell"] = eps
    budget["per_tract_and_cell"] = {**budget["per_tract_and_cell"], "epsilon": eps}
    m["total_per_person"].update(epsilon=eps, rho=sum(s["guarantee"]["epsilon"] ** 2 / 2
                                                      for s in budget["steps"]))
    m["total_per_person"]["guarantee"] = {**m["total_per_person"]["guarantee"],
                                          "epsilon": eps}
    m["ledger_entry"].update(charges=len(budget["steps"]), epsilon=eps)


@pytest.fixture
def forged(released, tmp_path) -> Path:
    dst = tmp_path / "r1"
    shutil.copytree(released, dst)
    return dst


def test_the_release_publishes_three_levels_and_passes_the_audit(released):
    m = manifest_of(released)
    # below z6 the counties and the state stand in for the tracts (issue 22)
    (layer,) = read_metadata(released / "tracts.pmtiles")["vector_layers"]
    assert (layer["id"], layer["minzoom"], layer["maxzoom"]) == ("tracts", 6, 9)
    for stem, level, digits in (("counties", "county", 5), ("states", "state", 2)):
        for suffix in ("parquet", "geojson", "csv", "schema.json", "pmtiles"):
            assert f"{stem}.{suffix}" in m["files"]
        # the web map's layer of the level, from z0 (issue 20, item 4)
        (layer,) = read_metadata(released / f"{stem}.pmtiles")["vector_layers"]
        assert (layer["id"], layer["minzoom"]) == (stem, 0)
        table = gpd.read_parquet(released / f"{stem}.parquet")  # GeoParquet
        assert table.crs is not None and table.geometry.notna().all()
        assert (table["geoid"].str.len() == digits).all() and (table["level"] == level).all()
        assert {"p25", "p75", "p25_lo", "p25_hi", "p25_se", "p75_se", "status"} <= set(
            table.columns)
        csv = read_csv_with_schema(released / f"{stem}.csv", released / f"{stem}.schema.json")
        assert list(csv["geoid"]) == list(table["geoid"])
        doc = json.loads((released / f"{stem}.geojson").read_text())
        assert "crs" not in doc and len(doc["features"]) == len(table)  # RFC 7946
        section = m["levels"][level]
        assert section["steps"] == [f"level {level}: NoisyStats", f"level {level}: interval"]
        steps = {s["step"] for s in m["budget"]["steps"]}
        assert set(section["steps"]) <= steps
    tracts = pd.read_parquet(released / "tracts.parquet")
    counties = gpd.read_parquet(released / "counties.parquet")
    assert sorted(counties["geoid"]) == sorted(tracts["geoid"].str[:5].unique())
    assert counties.set_index("geoid")["n"].to_dict() == tracts.groupby(
        tracts["geoid"].str[:5])["n"].sum().to_dict()
    # dissolved: a county's area is its tracts' area
    tract_geo = gpd.read_parquet(released / "tracts.parquet").to_crs(5070)
    by_county = tract_geo.groupby(tract_geo["geoid"].str[:5]).geometry.apply(
        lambda g: g.area.sum())
    assert counties.to_crs(5070).set_index("geoid").area.to_dict() == pytest.approx(
        by_county.to_dict(), rel=1e-6)
    # the per-person total composes every level's steps
    assert m["budget"]["epsilon_per_tract_and_cell"] == pytest.approx(1.0, rel=1e-6)
    assert "across_levels" in m["composition"]
    code, bad = run_audit(released)
    assert bad == {} and code == 0  # every check passed (a seeded release, allowed as a test)


def test_the_stac_item_and_feed_list_the_level_files(released):
    root = released.parent
    from dpatlas.publication.feed import read_feed

    entry = next(r for r in read_feed(root)["releases"] if r["release_id"] == "r1")
    item = json.loads((root / "catalog" / "r1.json").read_text())
    for name in ("counties.parquet", "counties.geojson", "states.csv", "states.schema.json",
                 "counties.pmtiles", "states.pmtiles"):
        assert name in entry["files"]
        assert item["assets"][name]["href"] == f"../r1/{name}"
    assert item["assets"]["counties.geojson"]["title"] == "Counties (GeoJSON, RFC 7946)"
    # a viewer's archive (issue 21: STAC best practices' "visual"; it was "data")
    assert item["assets"]["states.pmtiles"]["roles"] == ["visual", "tiles"]
    assert item["assets"]["states.pmtiles"]["type"] == "application/vnd.pmtiles"


def test_level_tiles_and_the_datapackage_describe_every_level(released):
    """Issue 21, item 5: each level's GeoJSON features have their GEOID as id, its archive
    says what it is; datapackage.json has a CSV and a GeoParquet resource per level and
    `frictionless validate` passes it."""
    import subprocess
    import sys

    for stem in ("counties", "states"):
        doc = json.loads((released / f"{stem}.geojson").read_text())
        assert [f["id"] for f in doc["features"]] == [f["properties"]["geoid"]
                                                      for f in doc["features"]]
        meta = read_metadata(released / f"{stem}.pmtiles")
        assert meta["name"] == f"dpatlas release r1: {stem}"
        assert "release r1" in meta["description"] and "licence CC-BY-4.0" in meta["attribution"]
    package = json.loads((released / "datapackage.json").read_text())
    assert [r["name"] for r in package["resources"]] == [
        "tracts", "tracts-geoparquet", "counties", "counties-geoparquet", "states",
        "states-geoparquet"]
    done = subprocess.run([sys.executable, "-m", "frictionless", "validate", "--json",
                           str(released / "datapackage.json")], capture_output=True, text=True,
                          timeout=600)
    report = json.loads(done.stdout)
    assert report["valid"] and done.returncode == 0, json.dumps(report["tasks"])[:3000]
    assert {t["name"]: t["stats"].get("rows") for t in report["tasks"] if t["type"] == "table"
            } == {stem: len(pd.read_csv(released / f"{stem}.csv"))
                  for stem in ("tracts", "counties", "states")}


def level_steps_epsilon(m: dict, level: str) -> float:
    """What the manifest charges a level's own steps (pure: their epsilons summed)."""
    steps = {s["step"]: s for s in m["budget"]["steps"]}
    return sum(steps[name]["guarantee"]["epsilon"] for name in m["levels"][level]["steps"])


def test_each_level_file_states_its_own_steps_spend(released):
    """Issue 33, item 3: a county's or state's epsilon_spent is what the level's steps
    charge (e.g. 0.31 and 0.03), not the per-person total the tract rows state, in every
    format, and the schema and manifest say per what."""
    m = manifest_of(released)
    total = m["budget"]["epsilon_per_tract_and_cell"]
    tracts = pd.read_parquet(released / "tracts.parquet")
    assert (tracts.loc[tracts["status"] != "suppressed", "epsilon_spent"] == total).all()
    for stem, level in (("counties", "county"), ("states", "state")):
        own = level_steps_epsilon(m, level)
        assert 0 < own < total and own == pytest.approx(m["levels"][level]["epsilon"])
        table = gpd.read_parquet(released / f"{stem}.parquet")
        spent = ~table["status"].eq("suppressed")
        assert spent.any()
        assert table.loc[spent, "epsilon_spent"].to_numpy() == pytest.approx(own, rel=1e-9)
        assert (table.loc[spent, "delta_spent"] == 0).all()
        csv = read_csv_with_schema(released / f"{stem}.csv", released / f"{stem}.schema.json")
        assert csv.loc[spent.to_numpy(), "epsilon_spent"].to_numpy() == pytest.approx(own)
        doc = json.loads((released / f"{stem}.geojson").read_text())
        assert [f["properties"]["epsilon_spent"] for f in doc["features"]
                if f["properties"]["status"] != "suppressed"] == pytest.approx(
                    [own] * int(spent.sum()))
        schema = json.loads((released / f"{stem}.schema.json").read_text())
        text = next(f["description"] for f in schema["fields"] if f["name"] == "epsilon_spent")
        assert f"this {level}'s records in this cell by the {level} steps" in text
        assert f"by the {level} steps" in m["levels"][level]["published_columns"][
            "epsilon_spent, delta_spent"]
    text = json.loads((released / "tracts.schema.json").read_text())
    assert "county and state" in next(f["description"] for f in text["fields"]
                                      if f["name"] == "epsilon_spent")


def test_county_files_stating_the_per_person_total_fail(forged):
    """The old misstatement, consistent in every format (parquet, CSV, GeoJSON, tiles) and
    rehashed: county rows saying they spent the per-person total fail the levels check."""
    from dpatlas.publication.geojson import write_geojson_rfc7946

    m = manifest_of(forged)
    table = gpd.read_parquet(forged / "counties.parquet")
    spent = table["status"] != "suppressed"
    table.loc[spent, "epsilon_spent"] = m["budget"]["epsilon_per_tract_and_cell"]
    table.to_parquet(forged / "counties.parquet", index=False)
    pd.DataFrame(table.drop(columns="geometry")).to_csv(forged / "counties.csv", index=False,
                                                        na_rep="")
    write_geojson_rfc7946(table, forged / "counties.geojson")
    build_level_tiles(forged / "counties.geojson", forged, "county")
    write_rehashed(forged, m)
    code, bad = run_audit(forged)
    assert code == 1 and set(bad) == {"levels"}, bad
    assert "counties.parquet: epsilon_spent is not 0 where suppressed" in bad["levels"]
    assert "charge of levels.county.steps" in bad["levels"]


def test_a_county_value_without_a_paying_step_fails(forged):
    m = manifest_of(forged)
    # the careful forger: no county level, its steps gone, the totals restated, files rehashed
    del m["levels"]["county"]
    m["budget"]["steps"] = [s for s in m["budget"]["steps"]
                            if not s["step"].startswith("level county")]
    restate_totals(m)
    write_rehashed(forged, m)
    code, bad = run_audit(forged)
    assert code == 1 and "levels" in bad
    assert "counties.parquet" in bad["levels"] and "paid by no step" in bad["levels"]


def test_a_level_step_dropped_from_the_budget_fails(forged):
    m = manifest_of(forged)
    m["budget"]["steps"] = [s for s in m["budget"]["steps"]
                            if s["step"] != "level state: NoisyStats"]
    restate_totals(m)
    write_rehashed(forged, m)
    code, bad = run_audit(forged)
    assert code == 1 and "not in the budget" in bad["levels"]


def test_a_total_that_leaves_out_the_level_steps_fails(forged):
    m = manifest_of(forged)
    level_eps = sum(s["guarantee"]["epsilon"] for s in m["budget"]["steps"]
                    if s["step"].startswith("level "))
    for key in ("epsilon_per_tract_and_cell",):
        m["budget"][key] -= level_eps
    m["budget"]["per_tract_and_cell"]["epsilon"] -= level_eps
    m["total_per_person"]["epsilon"] -= level_eps
    m["total_per_person"]["guarantee"]["epsilon"] -= level_eps
    write_rehashed(forged, m)
    code, bad = run_audit(forged)
    assert code == 1 and "totals" in bad and "recomposed" in bad["totals"]


def test_a_county_value_changed_in_the_parquet_only_fails(forged):
    table = gpd.read_parquet(forged / "counties.parquet")
    released = table.index[table["status"] == "released"][0]
    table.loc[released, ["p25", "p25_raw"]] = 0.9
    table.to_parquet(forged / "counties.parquet", index=False)
    write_rehashed(forged, manifest_of(forged))
    code, bad = run_audit(forged)
    assert code == 1 and "counties.csv: p25 differs" in bad["levels"]


def test_county_tiles_that_differ_from_the_table_fail(forged):
    """The map's county colours are the published values: tiles rebuilt from a GeoJSON with
    one county's p25 changed (and rehashed) fail the audit, naming the tiles."""
    doc = json.loads((forged / "counties.geojson").read_text())
    props = next(f["properties"] for f in doc["features"]
                 if f["properties"]["status"] == "released")
    props["p25"] = 0.0 if props["p25"] > 0.5 else 1.0
    changed = forged.parent / "changed" / "counties.geojson"
    changed.parent.mkdir()
    changed.write_text(json.dumps(doc))
    build_level_tiles(changed, forged, "county")
    write_rehashed(forged, manifest_of(forged))
    code, bad = run_audit(forged)
    assert code == 1 and "counties.pmtiles: p25 differs" in bad["levels"], bad


def swap_two_counties(folder: Path, suffixes: tuple[str, ...]) -> None:
    """The polygons of the first two counties swapped in counties.<suffix>, then rehashed."""
    if "geojson" in suffixes:
        doc = json.loads((folder / "counties.geojson").read_text())
        first, second = doc["features"][0], doc["features"][1]
        first["geometry"], second["geometry"] = second["geometry"], first["geometry"]
        (folder / "counties.geojson").write_text(json.dumps(doc))
    if "parquet" in suffixes:
        table = gpd.read_parquet(folder / "counties.parquet")
        geometry = table.geometry.copy()
        geometry.iloc[0], geometry.iloc[1] = table.geometry.iloc[1], table.geometry.iloc[0]
        table.set_geometry(geometry).to_parquet(folder / "counties.parquet", index=False)
    write_rehashed(folder, manifest_of(folder))


def test_county_polygons_swapped_in_the_geojson_fail(forged):
    """Issue 31: the levels' polygons are compared across their formats as the tracts' are."""
    swap_two_counties(forged, ("geojson",))
    code, bad = run_audit(forged)
    assert code == 1 and set(bad) == {"levels"}, bad
    assert "counties.geojson: the polygon of 2 row(s) is not counties.parquet's" in bad["levels"]


def test_county_polygons_that_are_not_the_union_of_their_tracts_fail(forged):
    """Swapped alike in the GeoParquet and the GeoJSON, two counties' polygons agree across
    those formats; each is no longer the union of its tracts' in tracts.parquet."""
    swap_two_counties(forged, ("geojson", "parquet"))
    code, bad = run_audit(forged)
    assert code == 1 and "levels" in bad, bad
    assert "counties.parquet: the polygon of 2 row(s) is not the union of its tracts' in " \
        "tracts.parquet" in bad["levels"]
    assert "counties.geojson: the polygon" not in bad["levels"]


def test_a_county_n_that_is_not_its_tracts_fails(forged):
    for suffix in ("parquet", "csv"):
        path = forged / f"counties.{suffix}"
        if suffix == "parquet":
            table = gpd.read_parquet(path)
            table.loc[0, "n"] += 1
            table.to_parquet(path, index=False)
        else:
            flat = pd.read_csv(path, dtype={"geoid": str, "state": str, "county": str})
            flat.loc[0, "n"] += 1
            flat.to_csv(path, index=False, na_rep="")
    write_rehashed(forged, manifest_of(forged))
    code, bad = run_audit(forged)
    assert code == 1 and "sum of its tracts' n" in bad["levels"]


def test_a_level_budget_that_is_not_the_configs_share_fails(forged):
    config = json.loads((forged / "config.json").read_text())
    config["level_shares"] = {"tract": 0.9, "county": 0.05, "state": 0.05}
    (forged / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    write_rehashed(forged, manifest_of(forged))
    code, bad = run_audit(forged)
    assert code == 1 and "level_shares.county" in bad["levels"]


# --------------------------------------------- the small-area model (issue 20, item 2)

MODEL = ["p25_model", "p25_model_lo", "p25_model_hi", "p25_model_se", "p25_model_z",
         "p75_model", "p75_model_lo", "p75_model_hi", "p75_model_se", "p75_model_z"]
ESTIMATES = [c for c in MODEL if not c.endswith("_z")]  # z: only where there is a direct


def refit_from_files(folder: Path) -> pd.DataFrame:
    """The model re-fitted from the published files alone (what dpatlas audit does): the
    tables, and the plan's budget steps in the manifest (the directs' known noise)."""
    from dpatlas.small_area.published import fit_published, noise_from_steps

    values, _ = fit_published(gpd.read_parquet(folder / "tracts.parquet"),
                              pd.read_parquet(folder / "counties.parquet"),
                              pd.read_parquet(folder / "states.parquet"),
                              noise_from_steps(manifest_of(folder)["budget"]["steps"]))
    return values


def test_the_release_publishes_model_columns_the_audit_refits(released):
    m = manifest_of(released)
    tracts = gpd.read_parquet(released / "tracts.parquet")
    assert set(MODEL) <= set(tracts.columns) and tracts[ESTIMATES].notna().all().all()
    for q in ("p25", "p75"):  # the check of the direct against the model: where one is
        direct = (tracts["status"] == "released") & tracts[q].notna()
        assert (tracts[f"{q}_model_z"].notna() == direct).all()
    # rounded like the other published values: 4 decimals, intervals around the estimate
    assert (tracts[MODEL] * 1e4 - (tracts[MODEL] * 1e4).round()).abs().max().max() < 1e-6
    for q in ("p25", "p75"):
        assert (tracts[f"{q}_model_lo"] <= tracts[f"{q}_model"]).all()
        assert (tracts[f"{q}_model"] <= tracts[f"{q}_model_hi"]).all()
    csv = read_csv_with_schema(released / "tracts.csv", released / "tracts.schema.json")
    assert csv[MODEL].to_numpy() == pytest.approx(tracts[MODEL].to_numpy(), nan_ok=True)
    fields = {f["name"]: f for f in json.loads(
        (released / "tracts.schema.json").read_text())["fields"]}
    assert "model-based (Fay–Herriot) estimate from published values only" in fields[
        "p25_model"]["description"]
    assert "|z| > 2.58: the model may not apply" in fields["p25_model_z"]["description"]
    assert "|z| > 2.58 means the model may not apply" in m["small_area"]["method"]
    doc = json.loads((released / "tracts.geojson").read_text())
    assert set(MODEL) <= set(doc["features"][0]["properties"])
    section = m["small_area"]
    assert section["columns"] == MODEL and "post-processing" in section["budget"]
    [fit] = section["fits"]  # one cell, one state
    assert fit["fitted"] and fit["cell"] == "all" and fit["state"] == "17"
    assert fit["p25"]["sigma2"] > 0 and len(fit["p25"]["beta"]) == len(fit["p25"]["covariates"])
    assert any("epsilon 8" in text for text in section["limits"])
    assert "post-processing" in m["published_columns"][", ".join(MODEL)]
    assert not any("model" in s["step"] for s in m["budget"]["steps"])  # no budget
    assert set(MODEL) <= set(m["rounding"]["to_nearest"] + m["rounding"]["outwards"]["down"]
                             + m["rounding"]["outwards"]["up"])
    # the proof that the model's inputs are the published columns: re-fitted from the
    # published files alone it gives the published numbers (within one rounding step)
    refit = refit_from_files(released)
    assert (refit[MODEL] - tracts[MODEL]).abs().max().max() <= 1e-4 + 1e-12
    code, bad = run_audit(released)
    assert code == 0 and bad == {}


def test_the_model_reads_only_its_published_input_columns(released):
    """Scrambling every other column (raw values, intervals, the model's own columns) leaves
    the re-fit unchanged; changing a published direct changes it."""
    from dpatlas.small_area.published import fit_published

    tracts = gpd.read_parquet(released / "tracts.parquet")
    levels = [pd.read_parquet(released / f"{s}.parquet") for s in ("counties", "states")]
    base, _ = fit_published(tracts, *levels)
    scrambled = tracts.copy()
    for c in ["p25_raw", "p75_raw", "p25_lo", "p25_hi", "p75_lo", "p75_hi", "p25_se",
              "p75_se", "epsilon_spent", *MODEL]:
        scrambled[c] = 0.5
    again, _ = fit_published(scrambled, *levels)
    pd.testing.assert_frame_equal(again, base)
    moved = tracts.copy()
    k = moved.index[moved["status"] == "released"][0]
    moved.loc[k, "p25"] = 1.0 - moved.loc[k, "p25"]
    changed, _ = fit_published(moved, *levels)
    assert abs(changed.loc[k, "p25_model"] - base.loc[k, "p25_model"]) > 1e-4


def test_a_model_value_changed_in_the_parquet_fails(forged):
    table = gpd.read_parquet(forged / "tracts.parquet")
    table.loc[0, "p25_model"] = round(1.0 - table.loc[0, "p25_model"], 4)
    table.to_parquet(forged / "tracts.parquet", index=False)
    write_rehashed(forged, manifest_of(forged))
    code, bad = run_audit(forged)
    assert code == 1 and "p25_model differs from the re-fit" in bad["small_area"]


def test_model_columns_not_declared_as_post_processing_fail(forged):
    m = manifest_of(forged)
    m["published_columns"][", ".join(MODEL)] = "the step 'model' (its own budget)"
    del m["small_area"]
    write_rehashed(forged, m)
    code, bad = run_audit(forged)
    assert code == 1
    assert "not declared in published_columns as post-processing" in bad["columns"]
    assert "small_area section absent" in bad["small_area"]


def test_a_model_value_moved_towards_the_truth_fails(released, forged):
    """A model value computed from something not published (here the tract's own records:
    their least-squares p25, the truth the model estimates), in the Parquet, CSV and GeoJSON,
    the manifest rehashed: the re-fit from the published files tells."""
    import numpy as np

    micro = pd.read_parquet(released.parent.parent / "data" / "microdata")
    tracts = gpd.read_parquet(forged / "tracts.parquet")
    released_rows = tracts.index[tracts["status"] == "released"]
    k = released_rows[0]
    mine = micro[micro["geoid"].astype(str) == tracts.loc[k, "geoid"]]
    slope, intercept = np.polyfit(mine["parent_rank"], mine["child_rank"], 1)
    truth = float(np.clip(intercept + 0.25 * slope, 0, 1))
    assert abs(truth - tracts.loc[k, "p25_model"]) > 2e-4
    tracts.loc[k, "p25_model"] = round(truth, 4)
    tracts.to_parquet(forged / "tracts.parquet", index=False)
    flat = pd.read_csv(forged / "tracts.csv", dtype=str, keep_default_na=False)
    flat.loc[k, "p25_model"] = repr(round(truth, 4))
    flat.to_csv(forged / "tracts.csv", index=False)
    doc = json.loads((forged / "tracts.geojson").read_text())
    doc["features"][k]["properties"]["p25_model"] = round(truth, 4)
    (forged / "tracts.geojson").write_text(json.dumps(doc))
    write_rehashed(forged, manifest_of(forged))
    code, bad = run_audit(forged)
    assert code == 1 and "p25_model differs from the re-fit" in bad["small_area"]


def test_a_state_with_too_few_directs_gets_empty_model_columns_the_contract_accepts(released):
    """The release's model stage on the published tables with all but 40 of the state's
    directs suppressed: no fit, empty model columns, the reason in the fits; the output
    contract (GX suite) takes the empty columns, and rejects a model value outside its
    interval."""
    from data_contracts import validate_published
    from dpatlas.publication.model_estimates import add_model_estimates

    tracts = gpd.read_parquet(released / "tracts.parquet").drop(columns=MODEL)
    levels = {"county": gpd.read_parquet(released / "counties.parquet"),
              "state": gpd.read_parquet(released / "states.parquet")}
    hidden = tracts.index[tracts["status"] == "released"][40:]
    tracts.loc[hidden, "status"] = "suppressed"
    table, [fit] = add_model_estimates(tracts, levels)
    assert not fit["fitted"] and "40 tract(s) with a direct estimate" in fit["reason"]
    assert table[MODEL].isna().all().all() and list(table.columns)[-1] == "geometry"
    plain = pd.DataFrame(table.drop(columns="geometry"))
    checked = plain.drop(columns=[c for c in plain.columns
                                  if c.endswith(("_lo", "_hi", "_se", "_moe90"))
                                  and not c.endswith(("_model_lo", "_model_hi", "_model_se"))])
    checked.loc[hidden, ["p25", "p75", "p25_raw", "p75_raw"]] = None
    assert validate_published(checked).success
    checked.loc[0, ["p25_model", "p25_model_lo", "p25_model_hi"]] = [0.9, 0.1, 0.2]
    broken = validate_published(checked)
    assert not broken.success and "p25_model_hi" in broken.summary()


def test_a_model_z_emptied_where_a_direct_is_fails(forged):
    table = gpd.read_parquet(forged / "tracts.parquet")
    k = table.index[table["status"] == "released"][0]
    table.loc[k, "p25_model_z"] = None
    table.to_parquet(forged / "tracts.parquet", index=False)
    write_rehashed(forged, manifest_of(forged))
    code, bad = run_audit(forged)
    assert code == 1 and "p25_model_z is not finite exactly where a direct p25 is" in \
        bad["small_area"]


@pytest.mark.parametrize("variance", ["sigma2"])
def test_a_fit_stated_with_another_sigma2_fails(forged, variance):
    m = manifest_of(forged)
    assert m["small_area"]["fits"][0]["p25"][variance] > 0
    m["small_area"]["fits"][0]["p25"][variance] *= 2
    write_rehashed(forged, m)
    code, bad = run_audit(forged)
    assert code == 1 and "are not the re-fit's" in bad["small_area"]
