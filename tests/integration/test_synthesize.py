"""dpatlas synthesize (dpatlas/release/synthetic_data.py): DP synthetic microdata for a published release,
charged once as its own ledger entry, audited from its folder, and faithful to BinAgg's
estimate (Cor. 3.1). The fast tests stand up a "published release" directly (ledger entry and
staged input); the slow one runs a real release with BinAgg in its suite first."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mechanisms as M
from dpatlas.audit import run as audit
from dpatlas.core.config import load_config
from dpatlas.ledger import Charge, Ledger
from dpatlas.release.synthetic_data import (PARQUET, STEP, SynthesizeError, plan_synthetic,
                                            synthesize_release)
from mechanisms.batch import X_HIGH, X_LOW
from mechanisms.binagg import binagg_synthetic
from mechanisms.noise import SeededRandomness

from tests.support.inputs import write_config

SOURCE, SEED, EPS = "r1", 11, 2.0


def _microdata(n_tracts=12, seed=0):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(40, 400, n_tracts)
    sizes[0] = 3  # below min_n: no rows
    geoid = np.repeat([f"17001{i:06d}" for i in range(n_tracts)], sizes)
    x = np.round(rng.uniform(0, 1, geoid.size), 2)
    y = np.clip(0.3 + 0.35 * x + rng.normal(0, 0.2, geoid.size), 0, 1)
    return pd.DataFrame({"row": np.arange(geoid.size), "geoid": geoid, "x": x, "y": y,
                         "cell": "all", "person_id": [f"p{i}" for i in range(geoid.size)]})


@pytest.fixture
def published(tmp_path):
    """A config and a release ``r1`` as the flow leaves it: staged input, validation report,
    ledger entry published (charged eps 1 per cell)."""
    (tmp_path / "data").mkdir()
    df = _microdata()
    df.drop(columns="row").to_parquet(tmp_path / "data" / "microdata.parquet")
    (tmp_path / "data" / "tracts.parquet").write_bytes(b"")  # never read here
    cfg_path = write_config(tmp_path / "config.yaml", {
        "input": {"path": str(tmp_path / "data" / "microdata.parquet")},
        "boundaries": {"path": str(tmp_path / "data" / "tracts.parquet")},
        "privacy": {"epsilon_per_tract": 1.0},
        "selection": {"rule": "dp", "threshold": 3.0},
        "publish": {"root": str(tmp_path / "releases"),
                    "internal_root": str(tmp_path / "internal"), "min_n": 10},
        "partition_tracts": 5})
    cfg = load_config(cfg_path)
    staged = cfg.publish.internal / SOURCE / "staged"
    staged.mkdir(parents=True)
    df.to_parquet(staged / "input-17.parquet")
    (staged.parent / "validation.json").write_text("{}")
    ledger = Ledger(cfg.ledger.url)
    ledger.begin_release(SOURCE, cfg.ledger.dataset, [Charge("all", "primary", "pure", 1.0, 0.0)],
                         "cfg", "test-owner")
    ledger.complete_release(SOURCE, "manifest-sha", "test-owner")
    ledger.close()
    return cfg_path, df


def _ledger_rows(cfg_path):
    cfg = load_config(cfg_path)
    ledger = Ledger(cfg.ledger.url)
    try:
        return ledger.entries(cfg.ledger.dataset), ledger.spent(cfg.ledger.dataset)
    finally:
        ledger.close()


def _refit(rows: pd.DataFrame, sigma2: float, grid_steps: int):
    """BinAgg's Alg. 2 from one tract's synthetic rows and the manifest's noise parameters."""
    per_bin = rows.groupby(["bin_lo", "bin_hi"]).agg(c=("x", "size"), s=("x", "sum"),
                                                     t=("y", "sum")).reset_index()
    c, s, t = (per_bin[k].to_numpy(float) for k in ("c", "s", "t"))
    var = (per_bin["bin_hi"].to_numpy() / grid_steps) ** 2 * sigma2
    z, w = np.stack([c, s], axis=1), 1.0 / c
    a = (z * w[:, None]).T @ z - np.diag([0.0, np.sum(w * var)])
    beta = np.linalg.solve(a, (z * w[:, None]).T @ t)
    return beta[0] + beta[1] * X_LOW, beta[0] + beta[1] * X_HIGH


# --- it works, is charged once, audits clean, and matches BinAgg's estimate -----------------


def test_synthesize_writes_audits_and_charges_once(published, tmp_path):
    cfg_path, df = published
    seen = []
    folder = synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED,
                                progress=lambda *a: seen.append(a))
    assert folder == tmp_path / "releases" / "r1-synthetic" and seen == [("synthesize", 1, 1)]
    rows = pd.read_parquet(folder / PARQUET)
    assert list(rows.columns) == ["GEOID", "cell", "bin_lo", "bin_hi", "x", "y"]
    csv = pd.read_csv(folder / "synthetic.csv", dtype={"GEOID": str})
    assert len(csv) == len(rows) and (csv["GEOID"] == rows["GEOID"]).all()
    assert "17001000000" not in set(rows["GEOID"])  # n = 3 < min_n: suppressed, no rows
    n_true = df.groupby("geoid").size()
    big = n_true[n_true >= 10]
    # c̃_k rows per bin: each tract's row count is its noisy n, close to the true n
    n_synth = rows.groupby("GEOID").size().reindex(big.index)
    assert np.all(np.abs(n_synth - big) < 0.2 * big + 20)

    report = audit.audit_release(folder)
    assert report.ok, report.lines()
    assert [name for name, _, _ in report.checks][-1] == "synthetic rows"

    entries, spent = _ledger_rows(cfg_path)
    mine = entries[entries["release_id"] == "r1-synthetic"]
    assert len(mine) == 1 and mine["step"].iloc[0] == STEP
    m = json.loads((folder / "manifest.json").read_text())
    assert mine["epsilon"].iloc[0] == pytest.approx(m["budget"]["epsilon_per_tract_and_cell"])
    assert m["budget"]["epsilon_per_tract_and_cell"] <= EPS
    assert m["budget"]["epsilon_per_tract_and_cell"] >= EPS * (1 - 1e-6)
    assert spent["epsilon"] == pytest.approx(1.0 + mine["epsilon"].iloc[0])
    assert m["source_release"] == SOURCE and m["ledger_entry"]["charges"] == 1


def test_regression_on_the_rows_is_binaggs_estimate(published):
    cfg_path, df = published
    folder = synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    rows = pd.read_parquet(folder / PARQUET)
    m = json.loads((folder / "manifest.json").read_text())
    noise = {s["name"]: s for s in m["budget"]["steps"][0]["noise"]["alternatives"]["BinAgg"]}
    sx = noise["bin sums of x"]["parameters"]
    # The same draws, replayed: the file is written chunk by chunk (5 tracts) from one seeded
    # stream, so BinAgg run on the same chunks in the same order gives the same estimates.
    rand = SeededRandomness(SEED)
    plan = plan_synthetic(cfg_path, SOURCE, EPS, synthetic_id="replay", noise_seed=SEED)
    big = df.groupby("geoid").size().pipe(lambda n: n[n >= 10]).index.to_numpy(dtype=str)
    checked = 0
    for i in range(0, big.size, 5):
        part = df[df["geoid"].isin(big[i:i + 5])]
        batch = M.TractBatch.from_labels(part["geoid"].to_numpy(str), part["x"].to_numpy(),
                                         part["y"].to_numpy())
        est, _ = binagg_synthetic(batch, plan.epsilon_param, rand)
        for k, geoid in enumerate(batch.labels):
            if est.failed[0, k]:
                continue
            p25, p75 = _refit(rows[rows["GEOID"] == geoid], sx["sigma2"], sx["grid_steps"])
            assert p25 == pytest.approx(est.p25[0, k], abs=1e-9)
            assert p75 == pytest.approx(est.p75[0, k], abs=1e-9)
            checked += 1
    assert checked >= 8


# --- in the feed and the catalogue, with its schema (issue 21, item 5) ----------------------


def _list_source_in_feed(root: Path) -> None:
    """A stand-in for release r1's folder in the publish root, listed in its feed."""
    from dpatlas.core.hashing import sha256_file
    from dpatlas.publication import feed as F

    folder = root / SOURCE
    folder.mkdir(parents=True)
    (folder / "tracts.csv").write_text("geoid\n17001000001\n")
    extent = {"bbox": [-90.0, 40.0, -89.0, 41.0], "geometry": {"type": "Polygon", "coordinates": [
        [[-90.0, 40.0], [-89.0, 40.0], [-89.0, 41.0], [-90.0, 41.0], [-90.0, 40.0]]]}}
    (folder / "manifest.json").write_text(json.dumps({
        "release_id": SOURCE, "published": "2026-11-25", "extent": extent,
        "files": {"tracts.csv": {"sha256": sha256_file(folder / "tracts.csv"),
                                 "bytes": (folder / "tracts.csv").stat().st_size}}}))
    F.update_feed(root, SOURCE)


def test_synthetic_data_has_its_schema_and_is_in_the_feed_and_the_catalogue(published):
    import xml.etree.ElementTree as ET

    from dpatlas.publication import stac
    from dpatlas.publication.tract_files import read_csv_with_schema

    cfg_path, _ = published
    root = load_config(cfg_path).publish.root
    _list_source_in_feed(root)
    folder = synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    schema = json.loads((folder / "synthetic.schema.json").read_text())
    assert [f["name"] for f in schema["fields"]] == ["GEOID", "cell", "bin_lo", "bin_hi", "x", "y"]
    assert all(f["description"] for f in schema["fields"])
    rows = read_csv_with_schema(folder / "synthetic.csv", folder / "synthetic.schema.json")
    assert rows["GEOID"].str.fullmatch(r"17001\d{6}").all()  # text: leading digits kept
    m = json.loads((folder / "manifest.json").read_text())
    assert "synthetic.schema.json" in m["files"] and m["license"] == "CC-BY-4.0"
    assert audit.audit_release(folder).ok

    from dpatlas.publication.feed import read_feed

    feed = read_feed(root)
    assert feed["latest"] == SOURCE and [r["release_id"] for r in feed["releases"]] == [SOURCE]
    (entry,) = feed["synthetic"]
    assert entry["release_id"] == "r1-synthetic" and entry["source_release"] == SOURCE
    assert set(entry["files"]) == set(m["files"])
    atom = ET.parse(root / "feed.atom").getroot()
    ns = "{http://www.w3.org/2005/Atom}"
    (syn,) = [e for e in atom.findall(f"{ns}entry")
              if e.find(f"{ns}id").text == "urn:dpatlas:synthetic:r1-synthetic"]
    types = {ln.get("title"): ln.get("type") for ln in syn.findall(f"{ns}link")
             if ln.get("rel") == "enclosure"}
    assert types == {"synthetic.parquet": "application/vnd.apache.parquet",
                     "synthetic.csv": "text/csv", "synthetic.schema.json": "application/json",
                     "config.json": "application/json"}

    assert stac.validate_catalog(root) == 2
    item = json.loads((root / "catalog" / "r1-synthetic.json").read_text())
    assert item["properties"]["dpatlas:source_release"] == SOURCE
    assert item["properties"]["license"] == "CC-BY-4.0"
    assert item["bbox"] == [-90.0, 40.0, -89.0, 41.0]  # the source's footprint
    assert [ln["href"] for ln in item["links"] if ln["rel"] == "derived_from"] == ["./r1.json"]
    assert item["assets"]["synthetic.csv"]["roles"] == ["data"]
    assert item["assets"]["synthetic.schema.json"]["roles"] == ["metadata"]

    from dpatlas.publication import feed as F

    F.withdraw(root, SOURCE, "wrong boundaries")  # the synthetic data shows its source's status
    item = json.loads((root / "catalog" / "r1-synthetic.json").read_text())
    assert item["properties"]["dpatlas:status"] == "withdrawn"
    assert "(source withdrawn)" in (root / "feed.atom").read_text()
    assert read_feed(root)["synthetic"] == [entry]
    assert stac.validate_catalog(root) == 2


def test_synthetic_data_of_a_release_the_feed_does_not_list_stays_out_of_it(published):
    cfg_path, _ = published
    folder = synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    assert (folder / "synthetic.schema.json").is_file()
    assert not (folder.parent / "feed.json").exists()  # no feed made for it


# --- refusals: before any charge, with one line -------------------------------------------


def test_second_call_is_refused_without_a_second_charge(published):
    cfg_path, _ = published
    synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    before, spent_before = _ledger_rows(cfg_path)
    # The folder exists, and so does the ledger entry: either way, refused, nothing charged.
    for out in (None, Path(cfg_path).parent / "elsewhere"):
        with pytest.raises(SynthesizeError, match="already") as err:
            synthesize_release(cfg_path, SOURCE, EPS, out, noise_seed=SEED)
        assert "\n" not in str(err.value)
    after, spent_after = _ledger_rows(cfg_path)
    assert len(after) == len(before) and spent_after["epsilon"] == spent_before["epsilon"]


@pytest.mark.parametrize("kwargs,match", [
    ({"epsilon": 0.0}, "--epsilon must be > 0"),
    ({"epsilon": float("nan")}, "finite"),
    ({"epsilon": 1e-4}, "too (small|little) for the grid"),
    ({"delta": 1.0}, "--delta must lie in"),
    ({"release_id": "../etc"}, "invalid release id"),
    ({"release_id": "latest"}, "reserved"),
    ({"release_id": "r2"}, "r2 is not in the ledger"),
    ({"synthetic_id": "r1"}, "must differ"),
    ({"epsilon": 50.0}, "left epsilon"),
    ({"noise_seed": None, "public": True}, "noise seed"),
])
def test_bad_requests_are_refused_before_any_charge(published, kwargs, match):
    cfg_path, _ = published
    args = {"release_id": SOURCE, "epsilon": EPS, "noise_seed": SEED, **kwargs}
    if args.pop("public", False):
        text = Path(cfg_path).read_text().replace("mode: test", "mode: public")
        Path(cfg_path).write_text(text)
        args["noise_seed"] = SEED
    _, before = _ledger_rows(cfg_path)
    with pytest.raises(SynthesizeError, match=match) as err:
        synthesize_release(cfg_path, args.pop("release_id"), args.pop("epsilon"), **args)
    assert "\n" not in str(err.value)
    _, after = _ledger_rows(cfg_path)
    assert after["epsilon"] == before["epsilon"]
    assert not (Path(cfg_path).parent / "releases" / "r1-synthetic").exists()


def test_bad_output_paths_are_refused(published, tmp_path):
    cfg_path, _ = published
    cfg = load_config(cfg_path)
    for out, match in ((cfg.publish.internal / "x", "overlaps the internal folder"),
                       (tmp_path / "missing" / "x", "does not exist")):
        with pytest.raises(SynthesizeError, match=match):
            synthesize_release(cfg_path, SOURCE, EPS, out, noise_seed=SEED)
    link = tmp_path / "link"
    os.symlink(tmp_path, link)
    with pytest.raises(SynthesizeError, match="symbolic link"):
        synthesize_release(cfg_path, SOURCE, EPS, link, noise_seed=SEED)
    # the source release's staged input gone: refused before the charge
    for f in (cfg.publish.internal / SOURCE / "staged").iterdir():
        f.unlink()
    with pytest.raises(SynthesizeError, match="no validated staged input"):
        synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    entries, _ = _ledger_rows(cfg_path)
    assert set(entries["release_id"]) == {SOURCE}


def test_a_failure_after_the_charge_is_marked_failed_and_stays_spent(published, monkeypatch):
    cfg_path, _ = published
    import dpatlas.release.synthetic_data as S

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(S, "_move_into_place", broken)
    with pytest.raises(OSError, match="disk full"):
        synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    cfg = load_config(cfg_path)
    ledger = Ledger(cfg.ledger.url)
    row = ledger.release("r1-synthetic")
    ledger.close()
    assert row["status"] == "failed" and row["epsilon"] > 0
    # A rerun finishes it from the recorded draw (issue 31, O3b): no second charge.
    monkeypatch.undo()
    before, _ = _ledger_rows(cfg_path)
    folder = synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    after, _ = _ledger_rows(cfg_path)
    assert (folder / "manifest.json").is_file() and len(after) == len(before)


def test_audit_catches_a_tampered_synthetic_folder(published):
    cfg_path, _ = published
    folder = synthesize_release(cfg_path, SOURCE, EPS, noise_seed=SEED)
    m = json.loads((folder / "manifest.json").read_text())
    privtree = m["budget"]["steps"][0]["noise"]["alternatives"]["BinAgg"][0]
    privtree["parameters"]["scale_num"] //= 2
    (folder / "manifest.json").write_text(json.dumps(m))
    report = audit.audit_release(folder)
    failed = {name for name, ok, _ in report.checks if not ok}
    assert failed == {"noise"}
    # a person id column slipped in: the rows check fails
    rows = pd.read_parquet(folder / PARQUET)
    rows.insert(0, "person_id", "p")
    rows.to_parquet(folder / PARQUET)
    failed = {name for name, ok, _ in audit.audit_release(folder).checks if not ok}
    assert {"files", "synthetic rows"} <= failed


# --- end to end: a release with BinAgg in its suite, audited, then its synthetic file --------


@pytest.mark.slow
def test_release_with_binagg_in_the_suite_audits_clean_and_synthesizes(tmp_path):
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    data = tmp_path / "data"
    write_synthetic(data, ["17"], seed=5, params=StateParams(n_tracts=120, counties=6))
    cfg_path = write_config(tmp_path / "config.yaml", {
        "input": {"path": str(data / "microdata")},
        "boundaries": {"path": str(data / "tracts.parquet")},
        "privacy": {"epsilon_per_tract": 2.0},
        "selection": {"rule": "dp", "threshold": 3.0},
        "profile": {"name": "full-suite", "suite": ["NoisyStats", "BinAgg"]},
        "publish": {"root": str(tmp_path / "releases"),
                    "internal_root": str(tmp_path / "internal")},
        "partition_tracts": 60})
    with prefect_test_harness(server_startup_timeout=180):
        from flows.release import release

        folder = Path(release(str(cfg_path), "r1", 7))
    report = audit.audit_release(folder)
    assert report.ok, report.lines()
    table = pd.read_parquet(folder / "tracts.parquet")
    # BinAgg's share here is rho = 0.0066 per tract (epsilon 0.5 at delta 1e-6): most tracts of
    # ~70 records keep fewer than 3 bins and fail without a value; some are estimated.
    assert table["BinAgg_p25"].notna().sum() > 0
    assert table.loc[table["status"] == "suppressed", "BinAgg_p25"].isna().all()
    m = json.loads((folder / "manifest.json").read_text())
    kinds = {ns["mechanism"] for s in m["budget"]["steps"]
             for alt in s["noise"]["alternatives"].values() for ns in alt}
    assert "privtree-grid-laplace" in kinds

    synthetic = synthesize_release(cfg_path, "r1", 1.0, noise_seed=3)
    report = audit.audit_release(synthetic)
    assert report.ok, report.lines()
    rows = pd.read_parquet(synthetic / PARQUET)
    assert set(rows["GEOID"]) <= set(table.loc[table["status"] != "suppressed", "geoid"])
