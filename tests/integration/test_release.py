"""The release flow end to end on a small synthetic state, and its documented bad-input outcomes."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import yaml

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from dpatlas.core.config import ConfigError, parse_config  # noqa: E402
from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402
from dpatlas.release.validate import ValidationFailed  # noqa: E402
from mechanisms import noise  # noqa: E402
from mechanisms.privacy import PureDP, ZCDP, ApproxDP, sequential, to_approx  # noqa: E402
from dpatlas.release.validate import BoundaryCoverageError  # noqa: E402

from tests.support.inputs import write_config  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def prefect_server():
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="session")
def small_state(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=5, params=StateParams(n_tracts=150, counties=6))
    return out


def make_config(tmp: Path, data: Path, **over) -> Path:
    cfg = {
        "input": {"path": str(data / "microdata")},
        "boundaries": {"path": str(data / "tracts.parquet")},
        "privacy": {"epsilon_per_tract": 1.0},
        "selection": {"rule": "dp", "threshold": 3.0},
        "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
        "partition_tracts": 60,
    }
    return write_config(tmp / "config.yaml", cfg, **over)


def run(config: Path, release_id: str = "r1", seed: int | None = 7) -> Path:
    from flows.release import release

    return Path(release(str(config), release_id, seed))


def copy_input(small_state: Path, tmp: Path) -> Path:
    dst = tmp / "data"
    shutil.copytree(small_state, dst)
    return dst


def part_file(data: Path) -> Path:
    return data / "microdata" / "state=17" / "part-0.parquet"


class NoiseWatch:
    """Counts draws of random bits: 'no noise drawn' is checked, not assumed."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for cls in (noise.OSRandomness, noise.SeededRandomness):
            original = cls.words

            def counted(obj, n, _orig=original):
                self.calls += 1
                return _orig(obj, n)

            monkeypatch.setattr(cls, "words", counted)


# --- the happy path ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def published(small_state, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("release")
    folder = run(make_config(tmp, small_state, profile={"name": "full-suite"}))
    return tmp, folder


def test_release_publishes_map_ready_files(published, small_state):
    tmp, folder = published
    names = {p.name for p in folder.iterdir()}
    assert names >= {"config.json", "manifest.json", "p25_map.png", "tracts.csv",
                     "tracts.geojson", "tracts.parquet"}
    listed = json.loads((folder / "manifest.json").read_text())["files"]
    assert names == {n.split("/")[0] for n in listed} | {"manifest.json"}  # nothing unlisted
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} == \
        set(listed) | {"manifest.json"}
    gdf = gpd.read_parquet(folder / "tracts.parquet")
    geo = gpd.read_file(folder / "tracts.geojson")
    csv = pd.read_csv(folder / "tracts.csv", dtype={"geoid": str, "state": str, "county": str})
    boundaries = gpd.read_parquet(small_state / "tracts.parquet")
    assert geo.crs.to_epsg() == 4326 and gdf.crs.to_epsg() == 4326
    assert len(gdf) == len(geo) == len(csv) == len(boundaries)
    assert set(gdf["geoid"]) == set(boundaries["GEOID"])  # every boundary tract has a row
    assert set(gdf["status"]) <= {"released", "suppressed", "failed"}
    released = gdf[gdf.status == "released"]
    assert len(released) > 0.9 * len(gdf)
    assert released[["p25", "p75"]].notna().all().all()
    assert ((released.p25 >= 0) & (released.p25 <= 1)).all()
    assert np.allclose(released.p25, released.p25_raw.clip(0, 1))
    assert gdf.loc[gdf.status != "released", ["p25", "p75"]].isna().all().all()
    assert (gdf.loc[gdf.n < 2, "status"] == "suppressed").all()


def test_manifest_totals_recompute_and_hashes_match(published):
    tmp, folder = published
    m = json.loads((folder / "manifest.json").read_text())
    for key in ("release_id", "published", "code_version", "config_sha256", "input_commitment",
                "privacy_unit", "neighbouring_relation", "budget", "composition",
                "total_per_person", "counts", "noise_sampler", "ledger_entry", "files"):
        assert key in m, key
    # The input is committed to under a key kept internal, never hashed in the clear: the
    # plain sha256 of the microdata is a non-DP function of it (issue 17 review).
    assert "input_sha256" not in m
    internal = tmp / "internal" / folder.name  # make_config's internal root
    key = (internal / "input_commitment.key").read_bytes()
    assert len(key) == 32 and (internal / "input_commitment.key").stat().st_mode & 0o077 == 0
    plain = json.loads((internal / "draws.jsonl").read_text().splitlines()[0])["input_sha256"] \
        if (internal / "draws.jsonl").exists() else None
    if plain is not None:
        want = hmac.new(key, plain.encode(), hashlib.sha256).hexdigest()
        assert m["input_commitment"] == {"scheme": "hmac-sha256", "value": want,
                                         "key": m["input_commitment"]["key"]}
    assert plain is None or plain not in json.dumps(m)
    # an auditor's recomputation from the per-step entries
    parts = []
    for step in m["budget"]["steps"]:
        g = step["guarantee"]
        parts.append({"pure": lambda: PureDP(g["epsilon"]), "zcdp": lambda: ZCDP(g["rho"]),
                      "approx": lambda: ApproxDP(g["epsilon"], g["delta"])}[g["type"]]())
    total = sequential(parts, delta=m["budget"]["conversion_delta"] or None)
    total = to_approx(total, max(getattr(total, "delta", 0.0), 1e-300))
    assert total.epsilon == pytest.approx(m["total_per_person"]["epsilon"], rel=1e-9)
    assert total.delta == pytest.approx(m["total_per_person"]["delta"], rel=1e-9)
    assert total.epsilon <= m["budget"]["epsilon_per_tract_and_cell"] * (1 + 1e-9)
    assert total.delta <= m["budget"]["delta_per_tract_and_cell"] * (1 + 1e-9)
    # every published file is hashed
    from dpatlas.publication.tract_files import sha256_file
    for name, info in m["files"].items():
        assert sha256_file(folder / name) == info["sha256"]
    # counts agree with the table
    gdf = gpd.read_parquet(folder / "tracts.parquet")
    assert m["counts"]["by_status"] == gdf["status"].value_counts().to_dict()
    # charged budget: exactly the per-tract total where estimated, zero where suppressed
    est = gdf[gdf.status != "suppressed"]
    assert np.allclose(est.epsilon_spent, m["budget"]["epsilon_per_tract_and_cell"])
    assert (gdf.loc[gdf.status == "suppressed", "epsilon_spent"] == 0).all()


def test_no_published_column_is_unaccounted_for(published):
    tmp, folder = published
    m = json.loads((folder / "manifest.json").read_text())
    accounted = {c.strip() for key in m["published_columns"] for c in key.split(",")}
    columns = set(pd.read_csv(folder / "tracts.csv", nrows=1).columns) | {"geometry"}
    assert columns <= accounted, columns - accounted
    suite_steps = {s["estimator"] for s in m["budget"]["steps"] if s["estimator"]}
    suite_cols = {c.rsplit("_", 1)[0] for c in columns if c.endswith(("_p25", "_p75"))
                  and not c.startswith(("p25", "p75"))}
    assert suite_cols == suite_steps  # each suite column is paid for by its own step
    # validation results are internal: nothing of them in the published folder
    assert "validation" not in m and not (folder / "validation.json").exists()
    assert (tmp / "internal" / "r1" / "validation.json").exists()
    # one Data Docs site per release, listing the partition's and the output's validations
    docs = tmp / "internal" / "r1" / "data_docs"
    assert (docs / "index.html").exists()
    assert sorted(p.name for p in docs.iterdir() if p.is_dir()) == ["expectations", "static",
                                                                     "validations"]
    runs = {p.name for p in (docs / "validations").glob("*/*")}
    assert runs == {"input-17", "published"}


def test_same_seed_same_numbers_and_rerun_of_published_id_is_a_noop(small_state, tmp_path,
                                                                       published):
    _, first = published
    before = (first / "manifest.json").read_bytes()
    rerun = run(make_config(published[0], small_state, profile={"name": "full-suite"}))
    assert rerun == first and (first / "manifest.json").read_bytes() == before
    again = run(make_config(tmp_path, small_state, profile={"name": "full-suite"}))
    a = pd.read_csv(first / "tracts.csv")
    b = pd.read_csv(again / "tracts.csv")
    pd.testing.assert_frame_equal(a, b)


# --- bad inputs --------------------------------------------------------------------------------


def test_out_of_bound_ranks_stop_before_noise(small_state, tmp_path, monkeypatch):
    data = copy_input(small_state, tmp_path)
    df = pd.read_parquet(part_file(data))
    df.loc[[3, 10, 11], "parent_rank"] = 1.7
    df.to_parquet(part_file(data), index=False)
    watch = NoiseWatch(monkeypatch)
    with pytest.raises(ValidationFailed) as err:
        run(make_config(tmp_path, data))
    msg = str(err.value)
    assert "expect_column_values_to_be_between" in msg and "3 row(s)" in msg
    assert watch.calls == 0  # no noise drawn
    assert not (tmp_path / "releases").exists()  # publish root untouched
    quarantine = tmp_path / "internal" / "r1" / "quarantine" / "input-17.parquet"
    assert str(quarantine) in msg
    assert sorted(pd.read_parquet(quarantine)["row"]) == [3, 10, 11]
    # the raw input is never modified
    assert (pd.read_parquet(part_file(data)).loc[[3, 10, 11], "parent_rank"] == 1.7).all()


def test_partitions_are_checked_two_at_a_time_and_refuse_in_partition_order(tmp_path,
                                                                            monkeypatch):
    """Issue 22: partitions are read and validated two at a time (their windows overlap);
    with two broken partitions the refusal is the first one's in partition order, whichever
    finished first, and every partition's run is in the Data Docs."""
    import threading
    import time

    import tasks.validate as validate_task

    data = tmp_path / "data"
    write_synthetic(data, ["17", "18", "19"], seed=9, params=StateParams(n_tracts=20, counties=2))
    for state, rows in (("18", [2]), ("19", [4, 5])):
        part = data / "microdata" / f"state={state}" / "part-0.parquet"
        df = pd.read_parquet(part)
        df.loc[rows, "parent_rank"] = 1.7
        df.to_parquet(part, index=False)
    spans, lock = {}, threading.Lock()
    read = validate_task.ingest_partition

    def slow_read(cfg, key, cells=None):
        start = time.perf_counter()
        time.sleep(0.6 if key == "18" else 0.3)  # 19 finishes first
        out = read(cfg, key, cells)
        with lock:
            spans[key] = (start, time.perf_counter())
        return out
    monkeypatch.setattr(validate_task, "ingest_partition", slow_read)
    with pytest.raises(ValidationFailed) as err:
        run(make_config(tmp_path, data), "order")
    assert "input partition 18 " in str(err.value) and "1 row(s)" in str(err.value)
    (a0, a1), (b0, b1) = spans["17"], spans["18"]
    assert a0 < b1 and b0 < a1, spans  # 17 and 18 were read side by side
    docs = tmp_path / "internal" / "order" / "data_docs" / "validations"
    assert sorted(p.name for p in docs.glob("*/*")) == ["input-17", "input-18", "input-19"]


def test_a_partition_breaking_its_contract_on_the_dask_runner_refuses_before_any_draw(
        tmp_path):
    """Issue 35: with runner dask the partitions are validated on the release's workers, in
    a subflow of their own (``validate-<id>``, a ``validate-<key>`` task each, each in a GX
    project of its own); a partition that breaks the contract refuses the release with its
    own message, before anything is drawn or charged, its offending rows quarantined and its
    refused run in the release's Data Docs and offline report beside the others."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from dpatlas.core.config import load_config
    from dpatlas.ledger import Ledger
    from dpatlas.release.validation_report import load_runs
    from flows.release import release
    from tests.integration.test_flow_structure import flow_task_runs

    data = tmp_path / "data"
    write_synthetic(data, ["17", "18"], seed=9, params=StateParams(n_tracts=20, counties=2))
    part = data / "microdata" / "state=18" / "part-0.parquet"
    df = pd.read_parquet(part)
    df.loc[[2, 6], "parent_rank"] = 1.7
    df.to_parquet(part, index=False)
    config = make_config(tmp_path, data, runner="dask", dask_workers=1)
    state = release(str(config), "refused", 7, return_state=True)
    with pytest.raises(ValidationFailed) as err:
        state.result()
    message = str(err.value)
    internal = tmp_path / "internal" / "refused"
    quarantine = internal / "quarantine" / "input-18.parquet"
    assert "input partition 18 " in message and "2 row(s)" in message, message
    assert str(quarantine) in message and "validation report:" in message
    assert len(pd.read_parquet(quarantine)) == 2
    docs = internal / "data_docs" / "validations"
    assert sorted(p.name for p in docs.glob("*/*")) == ["input-17", "input-18"]
    assert [r["run_name"] for r in load_runs(internal)] == ["input-17", "input-18"]
    # nothing drawn or charged, no part's project left behind
    assert not any((internal / folder).exists() for folder in ("selection", "results"))
    assert Ledger(load_config(config).ledger.url).release("refused") is None
    assert not (internal / "validation-parts").exists()
    with get_client(sync_client=True) as client:
        [sub] = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=["validate-refused"])))
    names = {t.name for t in flow_task_runs(sub.state, ready=lambda runs: len(runs) == 2)}
    assert names == {"validate-17", "validate-18"}


def test_clip_and_drop_policies(small_state, tmp_path):
    data = copy_input(small_state, tmp_path)
    df = pd.read_parquet(part_file(data))
    df.loc[[0, 1], "child_rank"] = -0.2
    df.to_parquet(part_file(data), index=False)
    clipped = run(make_config(tmp_path, data, validation={"policy": "clip"}), "clip")
    assert (clipped / "tracts.parquet").exists()
    dropped = run(make_config(tmp_path, data, validation={"policy": "drop"}), "drop")
    q = pd.read_parquet(tmp_path / "internal" / "drop" / "quarantine" / "input-17.parquet")
    assert sorted(q["row"]) == [0, 1]
    n_total = gpd.read_parquet(dropped / "tracts.parquet")["n"].sum()
    assert n_total == len(df) - 2


def test_bad_geoids_fail(small_state, tmp_path, monkeypatch):
    data = copy_input(small_state, tmp_path)
    df = pd.read_parquet(part_file(data))
    df["geoid"] = df["geoid"].astype(str)
    df.loc[5, "geoid"] = "0300100010"  # 10 digits, and state 03 does not exist
    df.to_parquet(part_file(data), index=False)
    watch = NoiseWatch(monkeypatch)
    with pytest.raises(ValidationFailed, match="geoid"):
        run(make_config(tmp_path, data))
    assert watch.calls == 0


def test_missing_column_is_named(small_state, tmp_path):
    from dpatlas.release.ingest import InputError

    data = copy_input(small_state, tmp_path)
    df = pd.read_parquet(part_file(data)).drop(columns="child_rank")
    df.to_parquet(part_file(data), index=False)
    with pytest.raises(InputError, match="child_rank"):
        run(make_config(tmp_path, data))


def test_boundary_file_lacking_tracts_stops_before_noise(small_state, tmp_path, monkeypatch):
    data = copy_input(small_state, tmp_path)
    b = gpd.read_parquet(data / "tracts.parquet")
    b.iloc[5:].to_parquet(data / "tracts.parquet")
    watch = NoiseWatch(monkeypatch)
    with pytest.raises(BoundaryCoverageError, match="5 tract"):
        run(make_config(tmp_path, data))
    assert watch.calls == 0
    assert not (tmp_path / "releases").exists()


def test_a_broken_input_is_refused_before_a_broken_boundary_file_is_read(
        small_state, tmp_path, monkeypatch):
    """What the operator is told keeps the stages' order: with the input and the boundary
    file both broken, the input's refusal; with only the boundary file broken, its own error,
    after validation and before any noise."""
    from dpatlas.core.places import BoundaryError

    data = copy_input(small_state, tmp_path)
    (data / "tracts.parquet").write_bytes(b"not a parquet file")
    df = pd.read_parquet(part_file(data))
    df.loc[[3], "parent_rank"] = 1.7
    df.to_parquet(part_file(data), index=False)
    watch = NoiseWatch(monkeypatch)
    for folder in ("both", "boundaries"):
        (tmp_path / folder).mkdir()
    with pytest.raises(ValidationFailed, match="expect_column_values_to_be_between"):
        run(make_config(tmp_path / "both", data))
    df.loc[[3], "parent_rank"] = 0.5
    df.to_parquet(part_file(data), index=False)
    with pytest.raises(BoundaryError, match="tracts.parquet"):
        run(make_config(tmp_path / "boundaries", data))
    assert (tmp_path / "boundaries" / "internal" / "r1" / "validation.json").is_file()
    assert watch.calls == 0
    assert not (tmp_path / "both" / "releases").exists()
    assert not (tmp_path / "boundaries" / "releases").exists()


def test_empty_tracts_are_listed_as_suppressed(small_state, tmp_path):
    data = copy_input(small_state, tmp_path)
    df = pd.read_parquet(part_file(data))
    empty = sorted(df["geoid"].astype(str).unique())[:4]
    df[~df["geoid"].astype(str).isin(empty)].to_parquet(part_file(data), index=False)
    folder = run(make_config(tmp_path, data))
    gdf = gpd.read_parquet(folder / "tracts.parquet").set_index("geoid")
    assert (gdf.loc[empty, "status"] == "suppressed").all()
    assert (gdf.loc[empty, "reason"] == "no records").all()
    assert (gdf.loc[empty, "n"] == 0).all()


def test_percentile_csv_input(small_state, tmp_path):
    df = pd.read_parquet(part_file(small_state))
    df = df.rename(columns={"geoid": "tract", "parent_rank": "par", "child_rank": "kid"})
    df[["par", "kid"]] *= 100
    df.to_csv(tmp_path / "in.csv", index=False)
    cfg = make_config(tmp_path, small_state,
                      input={"path": str(tmp_path / "in.csv"), "format": "csv",
                             "rank_scale": "percentile",
                             "columns": {"geoid": "tract", "parent_rank": "par",
                                         "child_rank": "kid"}})
    folder = run(cfg)
    gdf = gpd.read_parquet(folder / "tracts.parquet")
    assert gdf["n"].sum() == len(df)


def test_invalid_config_names_the_key():
    with pytest.raises(ConfigError) as err:
        parse_config({"input": {"path": "x"}, "boundaries": {"path": "y"},
                      "selection": {"rule": "magic", "threshold": 1},
                      "privacy": {"epsilon_per_tract": 0, "epsilonn": 1}})
    msg = str(err.value)
    assert "selection.rule" in msg and "'dp', 'public', 'fixed' or 'banded'" in msg
    assert "privacy.epsilon_per_tract" in msg and "greater than 0" in msg
    assert "privacy.epsilonn: unknown key" in msg


def test_example_config_validates(tmp_path):
    from dpatlas.core.config import EXAMPLE

    cfg = parse_config(yaml.safe_load(EXAMPLE))
    assert cfg.validation.policy == "fail" and cfg.selection.rule == "dp"


def test_released_tracts_carry_confidence_intervals(published):
    """Every released tract has p25/p75 intervals at the configured level that contain the
    published value; other rows have none; the output contract checks the same, and the
    interval's budget is a named step of the plan and the manifest."""
    from data_contracts import validate_published

    tmp, folder = published
    gdf = gpd.read_parquet(folder / "tracts.parquet")
    released = gdf[gdf.status == "released"]
    for p in ("p25", "p75"):
        lo, hi = released[f"{p}_lo"], released[f"{p}_hi"]
        assert lo.notna().all() and hi.notna().all()
        assert ((0 <= lo) & (lo <= released[p]) & (released[p] <= hi) & (hi <= 1)).all()
        assert gdf.loc[gdf.status != "released", [f"{p}_lo", f"{p}_hi"]].isna().all().all()
    m = json.loads((folder / "manifest.json").read_text())
    steps = {s["step"]: s for s in m["budget"]["steps"]}
    assert "interval: p25 and p75" in steps
    assert m["intervals"]["level"] == 0.95 and m["intervals"]["epsilon"] > 0
    assert set(steps["interval: p25 and p75"]["noise"]["alternatives"]) == {"NoisyStats",
                                                                           "DPExpTheilSen"}
    # the contract catches an interval that does not contain its value
    table = pd.DataFrame(gdf.drop(columns="geometry"))
    assert validate_published(table).success
    bad = table.copy()
    i = bad.index[bad.status == "released"][0]
    bad.loc[i, "p25_lo"] = min(1.0, bad.loc[i, "p25"] + 0.01) if bad.loc[i, "p25"] < 1 else 0.5
    bad.loc[i, "p25_hi"] = bad.loc[i, "p25_lo"]
    assert not validate_published(bad).success


def test_released_tracts_carry_standard_errors_paid_by_the_interval_step(published):
    """Issue 32 through the flow: p25_se/p75_se where the interval is, estimates of the total
    error's SD in (0, 0.5] (not a transform of the interval's width: a [0, 1] interval may
    carry a small SE where the DP statistics show one), their 90% margins beside them,
    accounted for as post-processing of the interval step, checked by the output contract."""
    tmp, folder = published
    gdf = gpd.read_parquet(folder / "tracts.parquet")
    for p in ("p25", "p75"):
        se, moe = gdf[f"{p}_se"], gdf[f"{p}_moe90"]
        assert (se.notna() == (gdf.status == "released")).all()
        assert ((se > 0) & (se <= 0.5))[se.notna()].all()
        assert np.allclose(moe[se.notna()], np.ceil(1.6448536269514722 * se[se.notna()] * 1e4)
                           / 1e4, atol=1e-9)
        # an SE of the total error, not the interval's half-width over z
        width_se = (gdf[f"{p}_hi"] - gdf[f"{p}_lo"]) / (2 * 1.959964)
        assert (np.abs(se - width_se) > 1e-3)[se.notna()].any()
    m = json.loads((folder / "manifest.json").read_text())
    assert m["published_columns"]["p25_se, p75_se"].startswith(
        "post-processing of the step 'interval: p25 and p75'")
    assert {"p25_se", "p25_moe90"} <= set(m["rounding"]["outwards"]["up"])
    assert m["output_contract"] == {"suite": "published_tracts", "success": True}


def test_three_state_release_has_one_data_docs_site(tmp_path):
    """Great Expectations as its users expect: one file-backed context and one Data Docs
    site per release, whatever the number of partitions; each partition's check and the
    output check are runs of their Checkpoints, listed in that site."""
    data = tmp_path / "data"
    write_synthetic(data, ["17", "18", "19"], seed=9, params=StateParams(n_tracts=30, counties=2))
    folder = run(make_config(tmp_path, data), "three")
    assert (folder / "manifest.json").is_file()
    internal = tmp_path / "internal" / "three"
    docs = internal / "data_docs"
    # the GX site, and beside it the offline report of the same runs (issue 21 item 2)
    assert sorted(p.relative_to(internal) for p in internal.rglob("index.html")) == \
        [Path("data_docs/index.html"), Path("validation_report/index.html")]
    suite_runs = sorted(p.relative_to(docs / "validations").as_posix()
                        for p in (docs / "validations").glob("*/*"))
    # the output check's run is two, of the same name: the table's and its boundary
    # coverage's (published_coverage)
    assert "published_coverage/published" in suite_runs
    runs = sorted({r.split("/")[1] for r in suite_runs})
    assert runs == ["input-17", "input-18", "input-19", "published"]
    assert len(suite_runs) == 5
    index = (docs / "index.html").read_text()
    assert all(name in index for name in runs)
    report = (internal / "validation_report" / "index.html").read_text()
    assert all(f'data-run="{name}"' in report for name in runs)
    import yaml as _yaml

    gx_config = _yaml.safe_load((internal / "gx" / "gx" / "great_expectations.yml").read_text())
    assert list(gx_config["data_docs_sites"]) == ["dpatlas_contracts"]
    checkpoints = sorted(p.stem for p in (internal / "gx" / "gx" / "checkpoints").iterdir())
    # one checkpoint per suite; a release without the small-area model validates the tract
    # suite without its model expectations, a suite variant named for what it leaves out;
    # likewise an input without a cell column is checked without the cell's expectations
    assert checkpoints == ["input_microdata-without-cell", "published_coverage",
                           "published_tracts-without-p25_model-without-p75_model"]


def test_a_broken_output_contract_publishes_nothing(small_state, tmp_path, monkeypatch):
    """The output checks run while the files are written (issue 22): when the table breaks
    its contract the release fails with the check's message, nothing is visible, the staged
    files are gone, and the refused run is in the release's Data Docs."""
    import tasks.publish as publish_task

    monkeypatch.setattr(publish_task, "standard_error_maximum", lambda: 1e-9)
    with pytest.raises(Exception, match="breaks its output contract; nothing was published"):
        run(make_config(tmp_path, small_state), "broken")
    assert not os.path.lexists(tmp_path / "releases" / "broken")
    internal = tmp_path / "internal" / "broken"
    assert not [p for p in internal.iterdir() if p.name.startswith("staging-")]
    assert not list((tmp_path / "releases").glob(".staging-*"))
    runs = sorted(p.relative_to(internal / "data_docs" / "validations").as_posix()
                  for p in (internal / "data_docs" / "validations").glob("*/*"))
    # the table's run and, of the same name, its boundary coverage's (published_coverage)
    assert [r.split("/")[1] for r in runs] == ["input-17", "published", "published"]
    assert "published_coverage/published" in runs


def test_a_county_table_breaking_its_contract_publishes_nothing(small_state, tmp_path,
                                                                 monkeypatch):
    """The county and state files are written and checked in a task of their own (issue 35,
    item 1: on the workers with runner dask): a county table that breaks its contract refuses
    the release with its check's message, nothing is visible, and the refused run is in the
    release's Data Docs beside the tract table's."""
    import data_contracts

    checked = data_contracts.validate_published_level

    def strict(table, level, **kwargs):  # every county standard error is over this cap
        if level == "county":
            kwargs["standard_error_max"] = 1e-9
        return checked(table, level, **kwargs)

    monkeypatch.setattr(data_contracts, "validate_published_level", strict)
    config = make_config(tmp_path, small_state, levels=["tract", "county", "state"])
    with pytest.raises(Exception, match="the county table breaks its output contract; "
                                        "nothing was published"):
        run(config, "broken-county")
    assert not os.path.lexists(tmp_path / "releases" / "broken-county")
    docs = tmp_path / "internal" / "broken-county" / "data_docs" / "validations"
    runs = sorted(p.name for p in docs.glob("*/*"))
    assert "published-county" in runs and "published" in runs, runs


def test_estimand_is_stated_in_the_manifest_and_the_schema(published):
    """Issue 32: one estimand, the tract expected outcome, for every value, interval and SE,
    stated once in the manifest and by every such column of the manifest and the schema."""
    from mechanisms.estimand import ESTIMAND, ESTIMAND_ID, TOTAL_ERROR

    tmp, folder = published
    m = json.loads((folder / "manifest.json").read_text())
    assert m["estimand"]["id"] == ESTIMAND_ID and m["estimand"]["definition"] == ESTIMAND
    assert m["estimand"]["error"] == TOTAL_ERROR
    assert ESTIMAND_ID in m["intervals"]["estimand"] and "sampling" in m["intervals"]["estimand"]
    declared = {c.strip(): text for key, text in m["published_columns"].items()
                for c in key.split(",")}
    schema = json.loads((folder / "tracts.schema.json").read_text())
    text = {f["name"]: f.get("description", "") for f in schema["fields"]}
    for column in ("p25", "p75", "p25_lo", "p25_hi", "p75_lo", "p75_hi", "p25_se", "p75_se"):
        assert ESTIMAND_ID in text[column] and ESTIMAND_ID in declared[column], column
        assert "least-squares line of its own" not in text[column] + declared[column], column
    for column in ("p25_lo", "p25_se"):
        assert "sampling error" in text[column] and "privacy noise" in text[column], column


def test_the_publish_subflows_parameters_are_measured_before_the_charge(
        small_state, tmp_path, monkeypatch):
    """Every subflow the release calls after the charge is measured against the Prefect
    server's limit before it: the publish subflow's parameters (parts, the job with the
    public config, the county and state units) as they will be passed, so a release whose
    publish call the server would refuse is refused with nothing drawn or charged, instead of
    failing after its budget is spent."""
    import json as _json

    from prefect.settings import PREFECT_SERVER_API_MAX_PARAMETER_SIZE, temporary_settings

    import flows.release as release_flow
    import tasks.preflight as preflight_task
    from dpatlas.core.config import load_config
    from dpatlas.ledger import Ledger
    from dpatlas.release.preflight import PreflightError, check_subflow_parameters
    from flows.release import release

    measured, planned = {}, []

    def spy(subflow, parameters):
        measured[subflow.name] = _json.dumps(subflow.serialize_parameters(parameters),
                                             separators=(",", ":"))
        check_subflow_parameters(subflow, parameters)

    real_plan = release_flow.plan_publish

    def plan_spy(*args, **kwargs):
        planned.append(real_plan(*args, **kwargs))
        return planned[-1]

    monkeypatch.setattr(preflight_task, "check_subflow_parameters", spy)
    monkeypatch.setattr(release_flow, "plan_publish", plan_spy)
    config = make_config(tmp_path, small_state, levels=["tract", "county", "state"])
    run(config, "measured")
    assert set(measured) == {"dpatlas-select-estimate", "dpatlas-publish-parts"}
    # what was measured is what the publish call was given
    [plan] = planned
    given = release_flow.write_publish_parts.serialize_parameters(
        {"parts": plan.parts, "job": plan.job, "levels": plan.level_jobs})
    assert measured["dpatlas-publish-parts"] == _json.dumps(given, separators=(",", ":"))
    assert [job.level for job in plan.level_jobs] == ["county", "state"]

    # The publish subflow over the limit (the real check under a limit one byte below its
    # parameters, the estimation subflow's check unchanged): refused at the preflight, with
    # nothing drawn or charged.
    limits = []

    def tight_for_publish(subflow, parameters):
        if subflow.name != "dpatlas-publish-parts":
            return check_subflow_parameters(subflow, parameters)
        limits.append(len(_json.dumps(subflow.serialize_parameters(parameters),
                                      separators=(",", ":")).encode()) - 1)
        with temporary_settings({PREFECT_SERVER_API_MAX_PARAMETER_SIZE: limits[-1]}):
            return check_subflow_parameters(subflow, parameters)

    monkeypatch.setattr(preflight_task, "check_subflow_parameters", tight_for_publish)
    watch = NoiseWatch(monkeypatch)
    state = release(str(config), "refused", 7, return_state=True)
    with pytest.raises(PreflightError) as err:
        state.result()
    assert "dpatlas-publish-parts subflow's parameters" in str(err.value), err.value
    assert f"over the Prefect server's limit of {limits[0]:,}" in str(err.value)
    assert "nothing was charged" in str(err.value)
    assert watch.calls == 0
    assert Ledger(load_config(config).ledger.url).release("refused") is None
    assert not (tmp_path / "releases" / "refused").exists()
