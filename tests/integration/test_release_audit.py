"""The public manifest, atomic publishing outside the public tree, and `dpatlas audit`.

Most tests build a release with the plain stage functions (select, estimate, assemble,
build_manifest, write_release: no Prefect, a few seconds) and tamper with copies of it; the
last one runs the whole Prefect flow and audits what it published.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest

from dpatlas.audit import run as audit
from dpatlas.audit import accounting as audit_accounting
from dpatlas.audit import base as audit_base
from dpatlas.audit import noise as audit_noise
from dpatlas.release.allocate import plan as make_plan
from dpatlas.core.config import parse_config, public_config
from dpatlas.release.estimate import estimate_partition, select_partition
from dpatlas.release.boundaries import load_boundaries
from dpatlas.core.hashing import sha256_file
from dpatlas.release.manifest import (RANDOM_BITS_OS, RANDOM_BITS_SEEDED, build_manifest,
                                      input_commitment, machine_paths)
from dpatlas.publication.cell_stream import write_release
from dpatlas.publication.tract_files import PublishError, assemble
from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
from mechanisms import noise as N
from mechanisms.noise import SeededRandomness
from mechanisms.privacy import ZCDP, to_approx
from tests.support.paths import REPO

RID = "r1"
COMMITMENT = {"scheme": "hmac-sha256", "value": "0" * 64, "key": "not used by this test"}
SEEDED = "seeded (test only, NOT FOR RELEASE)"
FACTS = {"person_id_checked": True, "person_id_column": "person_id",
         "contributions_policy": "fail", "validation_policy": "fail"}


# --- a small release built from the plain stage functions -------------------------------------


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=5, params=StateParams(n_tracts=40, counties=3))
    return out


def make_cfg(tmp: Path, data: Path, **over):
    raw = {"input": {"path": str(data / "microdata"),
                     "columns": {"person_id": "person_id"}},
           "boundaries": {"path": str(data / "tracts.parquet"),
                          "vintage": "synthetic 2026"},
           "selection": {"rule": "dp", "threshold": 3.0},
           "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal"),
                       "mode": "test"},
           "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"}}
    for key, value in over.items():
        raw[key] = {**raw.get(key, {}), **value}
    return parse_config(raw, base=tmp)


def ledger_entry(plan, cells, dataset="il") -> dict:
    """What the flow passes: the sums of the ledger's charges (dpatlas.ledger.charges)."""
    from dpatlas.ledger import charges

    charged = charges(plan, cells)
    return {"ledger_backend": "sqlite", "dataset": dataset, "release_id": RID,
            "charges": len(charged), "epsilon": sum(c.epsilon for c in charged),
            "delta": sum(c.delta for c in charged)}


def build_release(tmp: Path, data: Path, rid: str = RID, cfg=None, facts=FACTS,
                  random_source=SEEDED, write=True, plan=None, **write_kw):
    """(cfg, table, manifest, folder): a real (seeded) release of the small state (``plan``:
    the budget plan, by default ``allocate.plan`` of ``cfg``)."""
    cfg = cfg or make_cfg(tmp, data)
    boundaries = load_boundaries(cfg.boundaries.path)
    raw = pd.read_parquet(data / "microdata")
    df = pd.DataFrame({"geoid": raw["geoid"].astype(str), "cell": "all",
                       "x": raw["parent_rank"], "y": raw["child_rank"]})
    plan = plan or make_plan(cfg, cfg.selection.threshold)
    rand = SeededRandomness(11)
    results = estimate_partition(df, select_partition(df, plan, rand, cfg.publish.min_n),
                                 plan, rand, cfg.publish.min_n)
    table = assemble(results, boundaries)
    commitment = input_commitment("0" * 64, cfg.publish.internal / rid)
    manifest = build_manifest(cfg, rid, plan, table, commitment, random_source, "2026-01-01",
                              facts, ledger_entry(plan, ["all"]))
    folder = None
    if write:
        folder = write_release(table, manifest, cfg.publish.root, rid,
                               config=public_config(cfg),
                               internal_dir=cfg.publish.internal / rid, **write_kw)
    return cfg, table, manifest, folder


@pytest.fixture(scope="module")
def release(state, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("release")
    return tmp, *build_release(tmp, state)


@pytest.fixture
def copy(release, tmp_path) -> Path:
    """A copy of the published folder to tamper with."""
    dst = tmp_path / RID
    shutil.copytree(release[-1], dst)
    return dst


def edit_manifest(folder: Path, change) -> None:
    m = json.loads((folder / "manifest.json").read_text())
    change(m)
    (folder / "manifest.json").write_text(json.dumps(m, indent=2))


def rehash(folder: Path, name: str) -> None:
    def fix(m):
        m["files"][name] = {"sha256": sha256_file(folder / name),
                            "bytes": (folder / name).stat().st_size}
    edit_manifest(folder, fix)


def edit_table(folder: Path, change, rehashed: bool) -> None:
    gdf = gpd.read_parquet(folder / "tracts.parquet")
    change(gdf)
    gdf.to_parquet(folder / "tracts.parquet", index=False)
    if rehashed:
        rehash(folder, "tracts.parquet")


def failed(folder: Path) -> dict[str, str]:
    report = audit.audit_release(folder)
    assert report.ok == (not [c for c in report.checks if not c[1]])
    return {name: detail for name, ok, detail in report.checks if not ok}


# --- the audit: passes on a release, fails on each kind of tampering --------------------------


def test_audit_passes_on_a_published_release(release):
    folder = release[-1]
    report = audit.audit_release(folder)
    assert report.ok, report.lines()
    assert [name for name, _, _ in report.checks] == [name for name, _ in audit.CHECKS]
    out = io.StringIO()
    # a test release (seeded noise) passes only with allow_test; anchors not given are skipped
    assert audit.main(folder, out, allow_test=True) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == len(audit.CHECKS) + len(audit.ANCHORS) + 1
    assert lines[-1].startswith("PASSED")


STANDALONE = """
import runpy, sys
for name in ("dpatlas", "mechanisms", "tasks", "flows", "prefect", "geopandas"):
    sys.modules[name] = None  # any import of them now raises ImportError
sys.argv = ["audit", {folder!r}, "--allow-test"]
runpy.run_module("audit", run_name="__main__", alter_sys=True)
"""


def test_audit_runs_as_its_folder_alone_without_the_project(release, tmp_path):
    """An auditor needs only the audit's folder and its public dependencies: the project's
    packages are made unimportable and a copy of the folder, under another name, checks the
    release (``python -m audit RELEASE_DIR``)."""
    shutil.copytree(Path(audit.__file__).parent, tmp_path / "audit",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = STANDALONE.format(folder=str(release[-1]))
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    n = len(audit.CHECKS)
    assert run.stdout.splitlines()[-1].startswith(f"PASSED: {n} of {n}")


def test_changed_value_caught_by_the_value_check_when_rehashed(copy):
    def halve_spend(gdf):
        i = gdf.index[gdf.status == "released"][0]
        gdf.loc[i, "epsilon_spent"] = gdf.loc[i, "epsilon_spent"] / 2
    edit_table(copy, halve_spend, rehashed=True)
    bad = failed(copy)
    assert set(bad) == {"table", "formats"}, bad  # formats: the CSV, GeoJSON, tiles disagree
    assert "epsilon_spent differs" in bad["table"]


def test_value_on_a_suppressed_row_is_caught(copy):
    def leak(gdf):
        i = gdf.index[gdf.status == "suppressed"][0]
        gdf.loc[i, ["p25", "p25_raw"]] = 0.5
    edit_table(copy, leak, rehashed=True)
    bad = failed(copy)
    assert set(bad) == {"table", "formats"} and "not released carry" in bad["table"], bad


def test_changed_value_without_rehash_fails_files_and_table(copy):
    def shift(gdf):
        i = gdf.index[gdf.status == "released"][0]
        gdf.loc[i, "p25"] = min(gdf.loc[i, "p25"] + 0.1, 1.0) if gdf.loc[i, "p25"] < 0.9 else 0.0
    edit_table(copy, shift, rehashed=False)
    bad = failed(copy)
    assert set(bad) == {"files", "table", "formats"}, bad
    assert "tracts.parquet" in bad["files"] and "clipped" in bad["table"]


def test_changed_hash_fails(copy):
    edit_manifest(copy, lambda m: m["files"]["tracts.csv"].update(sha256="0" * 64))
    bad = failed(copy)
    assert set(bad) == {"files"} and "tracts.csv sha256" in bad["files"], bad
    out = io.StringIO()
    assert audit.main(copy, out) == 1
    assert any(ln.startswith("FAIL  files") for ln in out.getvalue().splitlines())


def test_extra_file_fails(copy):
    (copy / "notes.txt").write_text("x")
    assert "notes.txt" in failed(copy)["files"]


def test_removed_budget_step_fails(copy):
    edit_manifest(copy, lambda m: m["budget"]["steps"].pop(0))
    bad = failed(copy)
    assert "totals" in bad and "recomposed" in bad["totals"], bad


def test_altered_budget_step_fails(copy):
    def cheaper(m):
        step = m["budget"]["steps"][1]
        step["guarantee"]["epsilon"] = step["guarantee"]["epsilon"] / 2
    edit_manifest(copy, cheaper)
    bad = failed(copy)
    # the noise no longer fits the step, and the totals no longer add up
    assert {"noise", "totals"} <= set(bad), bad
    assert "> stated" in bad["noise"]


def test_extra_unaccounted_column_fails(copy):
    edit_table(copy, lambda gdf: gdf.insert(3, "x_mean", 0.5), rehashed=True)
    bad = failed(copy)
    assert set(bad) == {"table", "columns", "formats"} and "x_mean" in bad["table"], bad
    assert "x_mean" in bad["columns"]


def first_noise_step(m: dict, step: int = 0) -> dict:
    alternatives = m["budget"]["steps"][step]["noise"]["alternatives"]
    return next(iter(alternatives.values()))[0]


def test_tampered_noise_parameter_fails(copy):
    def less_noise(m):
        ns = first_noise_step(m)
        assert ns["mechanism"] == "grid-laplace"
        ns["parameters"]["scale_num"] //= 2
    edit_manifest(copy, less_noise)
    bad = failed(copy)
    assert set(bad) == {"noise"} and "stated" in bad["noise"], bad


def test_consistently_tampered_noise_step_fails(copy):
    """Parameter and stated guarantee changed together: the noise no longer pays for the step."""
    def less_noise(m):
        ns = first_noise_step(m)
        ns["parameters"]["scale_num"] //= 2
        p = ns["parameters"]
        ns["guarantee"]["epsilon"] = (p["grid_steps"] + p["dims"]) * p["scale_den"] / p["scale_num"]
    edit_manifest(copy, less_noise)
    bad = failed(copy)
    assert set(bad) == {"noise"} and "noise gives epsilon" in bad["noise"], bad


def test_noise_step_left_out_fails(copy):
    """One median's noise described for a step that pays for two: the description is
    incomplete even though it claims no more than the step."""
    def fewer(m):
        m["budget"]["steps"][1]["noise"]["alternatives"]["DPExpTheilSen"].pop()
    edit_manifest(copy, fewer)
    bad = failed(copy)
    assert set(bad) == {"noise"} and "does not describe its noise" in bad["noise"], bad


def test_repeat_count_raised_fails(copy):
    def more(m):
        first_noise_step(m, 1)["repeat"] = 2
    edit_manifest(copy, more)
    assert "> stated" in failed(copy)["noise"]


def test_public_mode_with_seeded_noise_fails(copy):
    def public(m):
        m["mode"] = "public"
    edit_manifest(copy, public)
    bad = failed(copy)
    assert "seeded" in bad["mode"] and "publish.mode" in bad["config"], bad


def test_config_disagreeing_with_manifest_fails(copy):
    cfg = json.loads((copy / "config.json").read_text())
    cfg["privacy"]["epsilon_per_tract"] = 2.0
    (copy / "config.json").write_text(json.dumps(cfg))
    rehash(copy, "config.json")
    bad = failed(copy)
    assert set(bad) == {"config"} and "epsilon_per_tract" in bad["config"], bad


def test_unreadable_folder_exits_2(tmp_path, copy):
    out = io.StringIO()
    assert audit.main(tmp_path / "nowhere", out) == 2
    (copy / "manifest.json").write_text("{not json")
    assert audit.main(copy, out) == 2
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all(ln.startswith("unreadable: ") for ln in lines)


def test_malformed_manifest_is_a_failed_check_not_a_crash(copy):
    edit_manifest(copy, lambda m: m.pop("budget"))
    bad = failed(copy)
    assert {"config", "noise", "totals", "table"} <= set(bad)
    assert "malformed" in bad["totals"]


# --- the audit's formulas against the mechanisms and the accountant -------------------------


@pytest.mark.parametrize("eps, dims", [(0.05, 1), (0.45, 2), (1.0, 1), (8.0, 3)])
def test_laplace_formula_matches_the_sampler_scale(eps, dims):
    """The audit's ε from (grid_steps, dims, scale_num, scale_den) is the sampler's: the scale
    it uses (noise.laplace_scale, in units of the sensitivity) gives ε' = (N + d)/(N·t)."""
    scale = N.laplace_scale(1.0, eps, dims)  # sensitivity 1: t grid units of 1/N each
    num = round(scale * N.LAPLACE_GRID_STEPS * 256)
    g = audit_noise.noise_guarantee({"mechanism": "grid-laplace", "parameters": {
        "grid_steps": N.LAPLACE_GRID_STEPS, "dims": dims, "scale_num": num, "scale_den": 256}})
    assert g.kind == "pure" and eps * (1 - 1e-4) <= g.epsilon <= eps


@pytest.mark.parametrize("rho, dims", [(1e-4, 1), (0.02, 2), (0.5, 1)])
def test_gaussian_formula_matches_the_sampler(rho, dims):
    steps, sigma2 = N._gauss_grid(np.asarray(rho), dims)
    g = audit_noise.noise_guarantee({"mechanism": "grid-gaussian", "parameters": {
        "grid_steps": float(steps), "dims": dims, "sigma2": int(sigma2)}})
    assert g.kind == "zcdp" and rho * (1 - 1e-6) <= g.rho <= rho


def test_students_t_formula_matches_the_estimator():
    from mechanisms.theil_sen import DPSSTheilSen

    beta, s = DPSSTheilSen.noise_parameters(0.5, 3, 0.5)
    g = audit_noise.noise_guarantee({"mechanism": "students-t-smooth-sensitivity",
                               "parameters": {"d": 3, "beta": beta, "s": s}})
    assert g.epsilon == pytest.approx(0.5, rel=1e-12)


def test_zcdp_conversion_agrees_with_the_pipeline():
    from mechanisms.privacy import ZCDP_CONVERSION_ORDERS

    # The audit builds its own list (it imports nothing from mechanisms): the same orders.
    assert audit_accounting.zcdp_conversion_orders() == ZCDP_CONVERSION_ORDERS
    # Down to the tiny rho whose best order is far above dp-accounting's default 1024.
    for rho in (1e-10, 1e-7, 1e-4, 0.05, 0.5):
        for delta in (1e-9, 1e-6):
            assert audit_accounting.zcdp_to_epsilon(rho, delta) == pytest.approx(
                to_approx(ZCDP(rho), delta).epsilon, rel=1e-12)


@pytest.mark.parametrize("suite, delta_spent", [
    (["NoisyIntercept", "DPGDPure", "DPGDzCDP", "DPGDApprox"], 1e-6),  # pure, zCDP, (ε, δ)
    (["DPGDzCDP"], 1e-6),                   # pure and zCDP: the whole δ converts the zCDP step
    (["NoisyStats", "DPGDApprox"], 5e-7),   # pure and (ε, δ): only the estimator's δ/2 is spent
])
def test_totals_recompose_for_mixed_plans(state, tmp_path, suite, delta_spent):
    """The audit's recomposition equals the manifest's totals, the δ stated as spent is what
    the ledger charges (not the configured δ), and tampered δ figures are caught."""
    profile = {"name": "full-suite", "suite": suite}
    cfg = make_cfg(tmp_path, state, profile=profile)
    _, _, m, _ = build_release(tmp_path, state, cfg=cfg, write=False)
    assert audit_accounting.check_totals(tmp_path, m)
    b = m["budget"]
    assert b["delta_per_tract_and_cell"] == pytest.approx(delta_spent, rel=1e-12)
    assert b["delta_available"] == 1e-6
    assert m["total_per_person"]["delta"] == pytest.approx(delta_spent, rel=1e-12)
    assert m["ledger_entry"]["delta"] == pytest.approx(delta_spent, rel=1e-12)
    for key in ("delta_per_tract_and_cell", "conversion_delta"):
        if b[key]:
            tampered = json.loads(json.dumps(m))
            tampered["budget"][key] *= 2
            with pytest.raises(audit_base.Mismatch):
                audit_accounting.check_totals(tmp_path, tampered)


# --- the manifest ------------------------------------------------------------------------------


def test_manifest_has_no_machine_paths(release):
    tmp, cfg, _, m, folder = release
    published = json.loads((folder / "manifest.json").read_text())
    strings = []

    def walk(obj):
        if isinstance(obj, str):
            strings.append(obj)
        elif isinstance(obj, dict):
            for k, v in obj.items():
                strings.append(str(k))
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)
    walk(published)
    assert len(strings) > 100
    for s in strings:
        assert not os.path.isabs(s) and not s.startswith("~"), s
        assert str(tmp) not in s and "ledger.db" not in s, s
        assert not s.lower().startswith(("sqlite:", "postgresql")), s
    assert machine_paths(published) == []
    # the scanner itself finds what it must
    assert machine_paths({"a": ["x", {"b": "/home/op/x"}], "sqlite:///l.db": 1}) == [
        ".a[1].b='/home/op/x'", ".sqlite:///l.db='sqlite:///l.db'"]


def test_manifest_fields(release):
    _, cfg, _, m, folder = release
    assert m["boundaries"] == {"file": "tracts.parquet",
                               "sha256": sha256_file(cfg.boundaries.path),
                               "hashed_as": "file", "vintage": "synthetic 2026"}
    assert m["ledger_entry"]["backend"] == "sqlite"
    assert set(m["ledger_entry"]) == {"backend", "dataset", "release_id", "charges",
                                      "epsilon", "delta"}
    b = m["budget"]
    assert b["delta_per_tract_and_cell"] == 0.0 and b["delta_available"] == 1e-6
    assert b["epsilon_available"] == 1.0
    assert 1.0 - 1e-4 < b["epsilon_per_tract_and_cell"] <= 1.0  # the noise's ε, rounded down
    assert m["total_per_person"]["delta"] == 0.0  # primary profile: pure steps only
    assert m["mode"] == "test" and m["noise_sampler"]["random_bits"] == RANDOM_BITS_SEEDED
    assert m["assumptions"]["verified"] == [
        "one record per person and cell (checked across all partitions with person id "
        "column person_id)"]
    assert any("n per tract and cell is public" in a for a in m["assumptions"]["unverified"])
    # config.json: published, hashed, the public config
    on_disk = json.loads((folder / "config.json").read_text())
    assert on_disk == json.loads(json.dumps(public_config(cfg)))
    files = json.loads((folder / "manifest.json").read_text())["files"]
    assert files["config.json"]["sha256"] == sha256_file(folder / "config.json")
    assert on_disk["ledger"]["url"] == "sqlite: (withheld)"


def test_seed_value_never_reaches_the_manifest(state, tmp_path):
    _, _, m, _ = build_release(tmp_path, state, random_source="seeded PCG64 (424242)",
                               write=False)
    assert m["noise_sampler"]["random_bits"] == RANDOM_BITS_SEEDED
    assert "424242" not in json.dumps(m)
    _, _, m, _ = build_release(tmp_path, state, random_source=RANDOM_BITS_OS, write=False)
    assert m["noise_sampler"]["random_bits"] == "os.urandom"


def test_assumptions_follow_the_input_facts(state, tmp_path):
    cfg = make_cfg(tmp_path, state, privacy={"assume_one_record_per_person": True},
                   input={"columns": {}})
    facts = {"person_id_checked": False, "person_id_column": None,
             "contributions_policy": "fail", "validation_policy": "drop"}
    _, _, m, _ = build_release(tmp_path, state, cfg=cfg, facts=facts, write=False)
    a = m["assumptions"]
    assert a["verified"] == []
    assert ("one record per person and cell (operator's statement: "
            "privacy.assume_one_record_per_person)") in a["unverified"]
    assert ("n counts only rows that passed validation; dropped rows (count internal) "
            "change n") in a["unverified"]
    bound = {**FACTS, "contributions_policy": "bound", "validation_policy": "clip"}
    _, _, m, _ = build_release(tmp_path, state, facts=bound, write=False)
    verified = m["assumptions"]["verified"]
    assert "enforced" in verified[0] and "clipped" in verified[1]
    assert not any("dropped" in a for a in m["assumptions"]["unverified"])


def test_inconsistent_ledger_sums_refuse_the_manifest(state, tmp_path):
    cfg = make_cfg(tmp_path, state)
    plan = make_plan(cfg, 3.0)
    table = pd.DataFrame({"geoid": ["17001000100"], "cell": ["all"], "status": ["released"],
                          "mechanism": ["NoisyStats"]})
    wrong = {**ledger_entry(plan, ["all"]), "epsilon": 2.0}
    with pytest.raises(PublishError, match="ledger epsilon"):
        build_manifest(cfg, RID, plan, table, COMMITMENT, SEEDED, "t", FACTS, wrong)


# --- publishing: staging outside the public tree, refusals ------------------------------------


def release_entries(root) -> list[str]:
    """The publish root's entries but the web map's shared library folder (LIB_DIR, written
    before any release folder is renamed into place; no release's file)."""
    from dpatlas.publication.webmap import LIB_DIR
    return sorted(f for f in os.listdir(root) if f != LIB_DIR)


def test_staging_is_never_inside_the_publish_root(state, tmp_path, monkeypatch):
    import dpatlas.publication.cell_stream as P

    seen = {}
    original = P.write_map

    def spy(table, path, title, *args):
        seen["staging"] = Path(path).parent
        seen["root_during"] = sorted(os.listdir((tmp_path / "releases").resolve()))
        original(table, path, title, *args)
    monkeypatch.setattr(P, "write_map", spy)
    cfg, _, _, folder = build_release(tmp_path, state)
    root = Path(cfg.publish.root)
    assert root not in seen["staging"].parents
    assert seen["staging"].parent == cfg.publish.internal / RID
    # nothing of the release visible while it is staged (the web map's shared library copy,
    # LIB_DIR, is written first so that the release's page never points at a missing file)
    from dpatlas.publication.webmap import LIB_DIR
    assert [f for f in seen["root_during"] if f != LIB_DIR] == []
    assert not seen["staging"].exists() and sorted(os.listdir(root)) == sorted([RID, LIB_DIR])


def test_other_file_system_stages_under_a_dot_name(state, tmp_path, monkeypatch):
    import dpatlas.publication.cell_stream as P
    import dpatlas.publication.tract_files as T

    seen = {}
    monkeypatch.setattr(T, "_same_file_system", lambda a, b: False)
    original = P.write_map
    monkeypatch.setattr(P, "write_map", lambda t, p, title, *args: (
        seen.setdefault("staging", Path(p).parent), original(t, p, title, *args)))
    cfg, _, _, folder = build_release(tmp_path, state)
    assert seen["staging"].name.startswith(f".staging-{RID}-")
    assert seen["staging"].parent == Path(cfg.publish.root)
    assert release_entries(cfg.publish.root) == [RID]


def test_exdev_rename_falls_back_to_a_copy_in_the_root(state, tmp_path, monkeypatch):
    """Two mount points of one file system: same st_dev, but rename(2) says EXDEV."""
    import dpatlas.publication.tract_files as P

    real_replace = os.replace
    calls = []

    def replace(src, dst):
        if "staging" in Path(src).name:
            calls.append(Path(src).name)
        if Path(src).name.startswith("staging-"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_replace(src, dst)
    monkeypatch.setattr(P.os, "replace", replace)
    cfg, _, _, folder = build_release(tmp_path, state)
    assert calls[0].startswith("staging-") and calls[1].startswith(f".staging-{RID}-")
    assert audit.audit_release(folder).ok
    assert release_entries(cfg.publish.root) == [RID]
    assert not list((cfg.publish.internal / RID).glob("staging-*"))


@pytest.mark.parametrize("kind", ["dangling link", "link to a folder", "file"])
def test_something_at_the_release_path_is_refused(state, tmp_path, kind):
    cfg = make_cfg(tmp_path, state)
    root = Path(cfg.publish.root)
    root.mkdir(parents=True)
    target = root / RID
    if kind == "dangling link":
        target.symlink_to(tmp_path / "gone")
    elif kind == "link to a folder":
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.write_text("x")
    with pytest.raises(PublishError) as err:
        build_release(tmp_path, state, cfg=cfg)
    assert "\n" not in str(err.value) and str(target) in str(err.value)
    assert ("symbolic link" if "link" in kind else "not a folder") in str(err.value)
    assert os.path.lexists(target) and release_entries(root) == [RID]


def test_lease_lost_before_the_rename_publishes_nothing(state, tmp_path):
    class LeaseLost(RuntimeError):
        pass

    def check():
        raise LeaseLost("the release's lease is held by another host")
    cfg = make_cfg(tmp_path, state)
    with pytest.raises(LeaseLost):
        build_release(tmp_path, state, cfg=cfg, check_lease=check)
    assert not os.path.lexists(Path(cfg.publish.root) / RID)
    assert not list((cfg.publish.internal / RID).glob("staging-*"))


def test_stale_staging_of_the_same_id_is_removed(state, tmp_path):
    cfg = make_cfg(tmp_path, state)
    root, internal = Path(cfg.publish.root), cfg.publish.internal / RID
    stale = [internal / "staging-999", root / f".staging-{RID}-999"]
    other = root / f".staging-{RID}-x-999"  # release "r1-x": not ours to touch
    for p in (*stale, other):
        p.mkdir(parents=True)
        (p / "tracts.parquet").write_text("half")
    build_release(tmp_path, state, cfg=cfg)
    assert not any(p.exists() for p in stale) and other.exists()


KILLED_CHILD = """
import pickle, sys, time
from pathlib import Path
import dpatlas.publication.cell_stream as P
table, manifest, config, root, internal, marker = pickle.load(open(sys.argv[1], "rb"))
def stall(t, path, title, *args):
    Path(marker).write_text(str(Path(path).parent))
    time.sleep(120)
P.write_map = stall
P.write_release(table, manifest, Path(root), "r1", config=config, internal_dir=Path(internal))
"""


def test_kill_9_while_staging_leaves_nothing_in_the_public_tree(release, tmp_path):
    _, cfg, table, manifest, _ = release
    root, internal = tmp_path / "releases", tmp_path / "internal" / RID
    marker = tmp_path / "marker"
    job = tmp_path / "job.pickle"
    job.write_bytes(pickle.dumps((table, manifest, public_config(cfg), str(root),
                                  str(internal), str(marker))))
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, str(job)],
                             cwd=REPO)
    try:
        # No deadline: the child either reaches the staging step (it then stalls there) or
        # exits; a hang is the run's timeout, not a race against this machine's speed.
        # the marker is there once it names the staging folder: ``write_text`` creates the
        # file before it writes the name, and a kill between the two left an empty marker
        while not (marker.exists() and marker.read_text()):
            assert child.poll() is None, "the child exited before staging"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    staging = Path(marker.read_text())
    # killed mid-staging, files half written (the GeoJSON is written before the writers that
    # run side by side, the map among them, so it is there whichever of them started first)
    assert (staging / "tracts.geojson").exists()
    assert root not in staging.parents
    assert release_entries(root) == []  # the public tree holds nothing of it
    # a rerun removes the leftover and publishes
    folder = write_release(table, manifest, root, RID, config=public_config(cfg),
                           internal_dir=internal)
    assert not staging.exists() and release_entries(root) == [RID]
    assert audit.audit_release(folder).ok


# --- the whole flow ----------------------------------------------------------------------------


def test_flow_release_passes_the_audit(state, tmp_path):
    """The Prefect flow's own release (pure, zCDP and (ε, δ) steps; seeded noise in a test
    root) passes every check."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    from prefect.testing.utilities import prefect_test_harness

    from tests.support.inputs import write_config
    from flows.release import release as release_flow

    cfg = write_config(tmp_path / "config.yaml", {
        "input": {"path": str(state / "microdata")},
        "boundaries": {"path": str(state / "tracts.parquet")},
        "selection": {"rule": "dp", "threshold": 3.0},
        "profile": {"name": "full-suite",
                    "suite": ["NoisyStats", "DPExpTheilSenMatch", "DPGDzCDP", "DPGDApprox"]},
        "publish": {"root": str(tmp_path / "releases"),
                    "internal_root": str(tmp_path / "internal")},
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"}})
    with prefect_test_harness(server_startup_timeout=180):
        folder = Path(release_flow(str(cfg), "flow1", 7))
    report = audit.audit_release(folder)
    assert report.ok, report.lines()
    m = json.loads((folder / "manifest.json").read_text())
    assert machine_paths(m) == [] and str(tmp_path) not in json.dumps(m)
    assert (folder / "config.json").exists() and "config.json" in m["files"]


# --- neighbouring relations: add-remove noise paying a replace-one step (FreeLunchSSP) --------


FREE_LUNCH = "FreeLunchSSP"


def free_lunch_plan(tmp: Path, data: Path):
    """(cfg, plan): a full-suite release whose one suite estimator is FreeLunchSSP, whose noise
    is stated for add-remove and converted to replace-one by group privacy of size 2 (the
    release plan's own conversion, allocate.Step.composed)."""
    import mechanisms as M
    from mechanisms.privacy import PROJECT_RELATION, Relation
    from mechanisms.privacy_maps import compose

    cfg = make_cfg(tmp, data, profile={"name": "full-suite", "suite": [FREE_LUNCH]})
    plan = make_plan(cfg, 3.0)
    step = next(s for s in plan.steps if s.estimator == FREE_LUNCH)
    noise = step.alternatives()[FREE_LUNCH]
    assert {ns.relation for ns in noise} == {Relation.ADD_REMOVE}
    assert step.guarantee.relation is PROJECT_RELATION
    assert compose(noise, relation=PROJECT_RELATION) == step.guarantee
    assert step.guarantee == M.get(FREE_LUNCH).guarantee(step.epsilon)
    return cfg, plan


@pytest.fixture(scope="module")
def free_lunch_release(state, tmp_path_factory):
    import mechanisms as M
    from dpatlas.core import config as C

    tmp = tmp_path_factory.mktemp("free_lunch")
    assert FREE_LUNCH in C.PUBLISHABLE and M.get(FREE_LUNCH).publishable
    cfg, plan = free_lunch_plan(tmp, state)
    return build_release(tmp, state, cfg=cfg, plan=plan)[-1]


@pytest.fixture
def free_lunch_copy(free_lunch_release, tmp_path) -> Path:
    dst = tmp_path / RID
    shutil.copytree(free_lunch_release, dst)
    return dst


def free_lunch_step(m: dict) -> dict:
    return next(s for s in m["budget"]["steps"] if s.get("estimator") == FREE_LUNCH)


def test_release_with_add_remove_noise_audits_clean(free_lunch_release):
    report = audit.audit_release(free_lunch_release)
    assert report.ok, report.lines()
    m = json.loads((free_lunch_release / "manifest.json").read_text())
    step = free_lunch_step(m)
    noise = step["noise"]["alternatives"][FREE_LUNCH]
    assert {ns["relation"] for ns in noise} == {"add-remove"}
    assert step["relation"] == "replace-one"
    assert step["relation_conversions"][FREE_LUNCH]["noise_relations"] == ["add-remove"]
    details = dict((name, detail) for name, _, detail in report.checks)
    assert "2 of them add-remove, converted" in details["noise"], details["noise"]
    assert "1 alternative(s) with add-remove noise" in details["relations"]
    # The step pays twice what its noise gives for add-remove neighbours (pure: 2 epsilon).
    assert step["guarantee"]["epsilon"] == pytest.approx(
        2 * sum(ns["guarantee"]["epsilon"] * ns["repeat"] for ns in noise), rel=1e-12)


def test_add_remove_noise_claimed_as_replace_one_fails(free_lunch_copy):
    """Noise stated for replace-one would pay the step at face value: half of what the step
    says, which its rounding cannot explain."""
    def relabel(m):
        step = free_lunch_step(m)
        for ns in step["noise"]["alternatives"][FREE_LUNCH]:
            ns["relation"] = ns["guarantee"]["relation"] = "replace-one"
        step.pop("relation_conversions")
    edit_manifest(free_lunch_copy, relabel)
    bad = failed(free_lunch_copy)
    # sensitivities: the audit derives FreeLunchSSP's sensitivity for add-remove neighbours
    assert set(bad) == {"noise", "sensitivities"}, bad
    assert "does not describe its noise" in bad["noise"]
    assert "its sensitivity is add-remove" in bad["sensitivities"]


def test_add_remove_noise_without_its_listed_conversion_fails(free_lunch_copy):
    edit_manifest(free_lunch_copy, lambda m: free_lunch_step(m).pop("relation_conversions"))
    bad = failed(free_lunch_copy)
    assert set(bad) == {"relations"} and "relation_conversions lists {}" in bad["relations"], bad


def test_step_charged_at_the_unconverted_figure_fails(free_lunch_copy):
    """A step charging what its add-remove noise gives unconverted is under-charged."""
    def unconverted(m):
        g = free_lunch_step(m)["guarantee"]
        g["epsilon"] /= 2
    edit_manifest(free_lunch_copy, unconverted)
    bad = failed(free_lunch_copy)
    assert "noise gives epsilon" in bad["noise"] and "> stated" in bad["noise"], bad


def test_noise_guarantee_of_another_relation_than_its_step_fails(free_lunch_copy):
    def split(m):
        ns = free_lunch_step(m)["noise"]["alternatives"][FREE_LUNCH][0]
        ns["guarantee"]["relation"] = "replace-one"
    edit_manifest(free_lunch_copy, split)
    bad = failed(free_lunch_copy)
    assert set(bad) == {"noise"}, bad
    assert "its guarantee is stated for replace-one, its sensitivity for add-remove" in bad[
        "noise"]


def test_replace_one_noise_in_an_add_remove_charge_fails(copy):
    """The whole release restated as charged for add-remove: its replace-one noise says
    nothing about adding a record, and the project charges replace-one only."""
    def add_remove(m):
        m["neighbouring_relation"] = "add-remove"
        m["relations"]["charged_in"] = "add-remove"
        for step in m["budget"]["steps"]:
            step["relation"] = step["guarantee"]["relation"] = "add-remove"
        m["budget"]["per_tract_and_cell"]["relation"] = "add-remove"
        m["total_per_person"]["guarantee"]["relation"] = "add-remove"
    edit_manifest(copy, add_remove)
    bad = failed(copy)
    assert {"relations", "noise"} <= set(bad), bad
    assert "neighbouring_relation is add-remove" in bad["relations"]
    assert "noise stated for replace-one cannot pay a step charged for add-remove" in bad["noise"]


def test_one_step_in_another_relation_fails(copy):
    def one(m):
        m["budget"]["steps"][1]["relation"] = "add-remove"
    edit_manifest(copy, one)
    bad = failed(copy)
    assert set(bad) == {"relations", "noise"}, bad
    assert "stated for add-remove, the release is charged for replace-one" in bad["relations"]
    assert "cannot pay a step charged for add-remove" in bad["noise"]


@pytest.mark.parametrize("where", ["charged_in", "per_tract_and_cell", "total", "unknown"])
def test_tampered_relation_labels_fail(copy, where):
    def tamper(m):
        if where == "charged_in":
            m["relations"]["charged_in"] = "add-remove"
        elif where == "per_tract_and_cell":
            m["budget"]["per_tract_and_cell"]["relation"] = "add-remove"
        elif where == "total":
            m["total_per_person"]["guarantee"]["relation"] = "add-remove"
        else:
            first_noise_step(m)["relation"] = "remove-only"
    edit_manifest(copy, tamper)
    bad = failed(copy)
    assert "relations" in bad, bad
    if where == "unknown":
        assert "unknown neighbouring relation 'remove-only'" in bad["noise"]


def test_manifest_without_relations_is_read_as_replace_one(copy):
    """Manifests written before relations were stated (no relation anywhere) still audit."""
    def strip(obj):
        if isinstance(obj, dict):
            for key in ("relation", "relations", "relation_conversions"):
                obj.pop(key, None)
            for v in obj.values():
                strip(v)
        elif isinstance(obj, list):
            for v in obj:
                strip(v)
    edit_manifest(copy, strip)
    text = (copy / "manifest.json").read_text()
    assert '"relation"' not in text and '"relations"' not in text
    report = audit.audit_release(copy)
    assert report.ok, report.lines()


@pytest.mark.parametrize("g", [
    {"type": "pure", "epsilon": 0.7}, {"type": "approx", "epsilon": 0.5, "delta": 1e-7},
    {"type": "zcdp", "rho": 0.03}, {"type": "gdp", "mu": 0.4}])
def test_group_of_two_is_the_pipelines_conversion(g):
    from mechanisms.privacy import Relation, as_dict, convert_relation, from_dict

    converted = convert_relation(from_dict({**g, "relation": "add-remove"}),
                                 Relation.REPLACE_ONE)
    restate, guarantee_from = audit_accounting.restate, audit_accounting.guarantee_from
    ours = restate(guarantee_from(g), "add-remove", "replace-one")
    assert audit_accounting.same_guarantee(ours, guarantee_from(as_dict(converted)))
    assert restate(guarantee_from(g), "replace-one", "replace-one") == guarantee_from(g)
    with pytest.raises(audit_base.Mismatch, match="cannot pay a step charged for add-remove"):
        restate(guarantee_from(g), "replace-one", "add-remove")
    with pytest.raises(audit_base.Mismatch, match=">= 1"):
        audit_accounting.group_of_two(audit_accounting.G("approx", 20.0, 1e-6))
