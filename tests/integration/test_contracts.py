"""Data contracts (Great Expectations suites in data_contracts/expectation_suites)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import warnings

import numpy as np
import pandas as pd
import pytest

import great_expectations as gx
from great_expectations.core.expectation_suite import ExpectationSuiteSchema

from data_contracts import (
    INPUT_SUITE,
    PUBLISHED_LEVEL_SUITES,
    PUBLISHED_SUITE,
    STATE_FIPS,
    SUITES_DIR,
    ContractResult,
    Failure,
    ReleaseDocs,
    build_release_docs,
    load_suite,
    validate_input,
    validate_published,
    validate_published_level,
)
from tests.support.paths import REPO



# ----------------------------------------------------------------------------- data


def make_input(n: int = 500, seed: int = 0, person_id: bool = True) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    states = np.array(STATE_FIPS)[rng.integers(0, len(STATE_FIPS), n)]
    rest = np.char.zfill(rng.integers(0, 10**9, n).astype(str), 9)
    df = pd.DataFrame(
        {
            "geoid": np.char.add(states.astype(str), rest),
            "x": np.round(rng.uniform(0, 1, n), 2),
            "y": rng.uniform(0, 1, n),
        }
    )
    if person_id:
        df["person_id"] = np.arange(n, dtype=np.int64) + 1000
    return df


def make_published(n_tracts: int = 60, seed: int = 0) -> tuple[pd.DataFrame, list[str]]:
    rng = np.random.default_rng(seed)
    geoids = [f"{STATE_FIPS[i % len(STATE_FIPS)]}{i:03d}{100 * (i + 1):06d}" for i in range(n_tracts)]
    rows = []
    for k, g in enumerate(geoids):
        for cell in ("all", "female", "male"):
            status = ("released", "released", "suppressed", "failed")[(k + len(cell)) % 4]
            released = status == "released"
            p25_raw = float(rng.normal(0.35, 0.1)) if released else np.nan
            p75_raw = float(rng.normal(0.6, 0.1)) if released else np.nan
            rows.append(
                {
                    "geoid": g,
                    "state": g[:2],
                    "county": g[2:5],
                    "name": f"Census Tract {int(g[5:9])}",
                    "cell": cell,
                    "n": int(rng.integers(0, 400)),
                    "mechanism": "DPExpTheilSen" if released else "none",
                    "status": status,
                    "reason": "" if released else "too few people",
                    "p25": float(np.clip(p25_raw, 0, 1)) if released else np.nan,
                    "p75": float(np.clip(p75_raw, 0, 1)) if released else np.nan,
                    "p25_raw": p25_raw,
                    "p75_raw": p75_raw,
                    "epsilon_spent": 1.0 if released else 0.0,
                    "delta_spent": 1e-6 if released else 0.0,
                }
            )
    return pd.DataFrame(rows), geoids


@pytest.fixture(scope="module")
def good_input() -> pd.DataFrame:
    return make_input()


@pytest.fixture(scope="module")
def published() -> tuple[pd.DataFrame, list[str]]:
    return make_published()


def only_failure(res: ContractResult) -> Failure:
    assert not res.success
    assert len(res.failures) == 1, res.summary()
    return res.failures[0]


def flagged(res: ContractResult) -> list[int]:
    return np.flatnonzero(res.bad_rows).tolist()


# ----------------------------------------------------------------------------- suites


@pytest.mark.parametrize("name", [INPUT_SUITE, PUBLISHED_SUITE,
                                  *PUBLISHED_LEVEL_SUITES.values()])
def test_suite_files_load_as_gx_suites(name):
    path = SUITES_DIR / f"{name}.json"
    raw = json.loads(path.read_text())
    data = ExpectationSuiteSchema().loads(path.read_text())
    gx.get_context(mode="ephemeral")
    suite = gx.ExpectationSuite(**data)
    assert isinstance(suite, gx.ExpectationSuite)
    assert suite.name == name
    # GX silently drops invalid configurations; every one must survive
    assert len(suite.expectations) == len(raw["expectations"]) > 5
    assert len(load_suite(name).expectations) == len(raw["expectations"])


def test_build_suites_regenerates_identical_files(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "data_contracts.build_suites", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    for name in (INPUT_SUITE, PUBLISHED_SUITE, *PUBLISHED_LEVEL_SUITES.values()):
        assert (tmp_path / f"{name}.json").read_bytes() == (SUITES_DIR / f"{name}.json").read_bytes()


def test_state_regex_lists_real_states_only():
    suite = json.loads((SUITES_DIR / f"{INPUT_SUITE}.json").read_text())
    regexes = [e["kwargs"]["regex"] for e in suite["expectations"] if "regex" in e["kwargs"]]
    state_regex = next(r for r in regexes if "|" in r)
    assert state_regex.startswith("^(?:01|02|04|") and state_regex.endswith("|56|72)[0-9]{9}\\Z")
    codes = state_regex[len("^(?:") : state_regex.index(")")].split("|")
    assert codes == list(STATE_FIPS) and "03" not in codes
    assert len(STATE_FIPS) == 52


# ----------------------------------------------------------------------------- input


def test_good_input_passes(good_input):
    res = validate_input(good_input)
    assert res.success, res.summary()
    assert res.failures == []
    assert res.bad_rows.dtype == bool and res.bad_rows.shape == (len(good_input),)
    assert not res.bad_rows.any()
    assert res.docs_index is None
    assert res.suite == INPUT_SUITE


def test_no_result_or_data_docs_page_carries_an_unkeyed_digest_of_the_rows(good_input, tmp_path):
    """GX's own batch fingerprint (an md5 of the whole frame) is off (data_contracts/_context.py):
    a stored input validation and its Data Docs page name no digest of the person-level rows;
    the load time is still recorded."""
    docs = ReleaseDocs.in_folder(tmp_path)
    res = validate_input(good_input, release=docs, run_name="input-01")
    assert res.success, res.summary()
    markers = res.validation_result.meta["batch_markers"]
    assert "ge_load_time" in markers and "pandas_data_fingerprint" not in markers
    build_release_docs(docs)
    stored = [p for p in tmp_path.rglob("*") if p.suffix in (".json", ".html") and p.is_file()]
    assert any("input-01" in str(p) for p in stored)
    assert not [p for p in stored if "pandas_data_fingerprint" in p.read_text()]


def test_good_input_without_person_id_passes(good_input):
    res = validate_input(good_input.drop(columns=["person_id"]))
    assert res.success, res.summary()


@pytest.mark.parametrize(
    "column, value, expectation",
    [
        ("x", 1.5, "expect_column_values_to_be_between"),
        ("y", -0.1, "expect_column_values_to_be_between"),
        ("x", np.nan, "expect_column_values_to_not_be_null"),
        ("y", np.nan, "expect_column_values_to_not_be_null"),
    ],
)
def test_bad_rank_caught(good_input, column, value, expectation):
    df = good_input.copy()
    df.loc[17, column] = value
    res = validate_input(df)
    f = only_failure(res)
    assert (f.expectation, f.column, f.unexpected_count) == (expectation, column, 1)
    assert flagged(res) == [17]
    assert expectation in res.summary() and column in res.summary()


def test_non_numeric_value_caught(good_input):
    df = good_input.copy()
    df["x"] = df["x"].astype(object)
    df.loc[21, "x"] = "0.5"
    res = validate_input(df)
    types = [f for f in res.failures if f.expectation == "expect_column_values_to_be_in_type_list"]
    assert [(f.column, f.unexpected_count) for f in types] == [("x", 1)]
    assert flagged(res) == [21]


def test_geoid_with_10_digits_caught(good_input):
    df = good_input.copy()
    df.loc[3, "geoid"] = df.loc[3, "geoid"][:10]
    res = validate_input(df)
    assert not res.success
    assert {f.expectation for f in res.failures} == {"expect_column_values_to_match_regex"}
    # both the 11-digit and the state-prefix pattern reject it
    assert [(f.column, f.unexpected_count) for f in res.failures] == [("geoid", 1), ("geoid", 1)]
    assert flagged(res) == [3]


def test_geoid_with_unknown_state_caught(good_input):
    df = good_input.copy()
    df.loc[8, "geoid"] = "03" + df.loc[8, "geoid"][2:]
    res = validate_input(df)
    f = only_failure(res)
    assert (f.expectation, f.column, f.unexpected_count) == (
        "expect_column_values_to_match_regex",
        "geoid",
        1,
    )
    assert "state FIPS" in f.details
    assert flagged(res) == [8]


def test_missing_column_is_a_failure_not_an_exception(good_input):
    df = good_input.drop(columns=["y"])
    res = validate_input(df)
    assert not res.success
    exists = [f for f in res.failures if f.expectation == "expect_column_to_exist"]
    assert len(exists) == 1 and exists[0].column == "y"
    assert "missing" in exists[0].details
    assert res.summary().splitlines()[0].startswith("expect_column_to_exist column=y")
    # the other y expectations are reported as not evaluated, none on other columns
    assert {f.column for f in res.failures} == {"y"}
    assert all(f.details.startswith("not evaluated") for f in res.failures if f is not exists[0])
    assert res.bad_rows.shape == (len(df),) and not res.bad_rows.any()


def test_repeated_person_id_is_not_decided_per_partition(good_input):
    """Records per person are counted across all partitions (dpatlas.release.contributions), and a
    person may be in several cells: the per-partition suite must not decide it."""
    df = good_input.copy()
    df.loc[40, "person_id"] = df.loc[12, "person_id"]
    res = validate_input(df)
    assert res.success, res.summary()
    suite = json.loads((SUITES_DIR / f"{INPUT_SUITE}.json").read_text())
    assert not [e for e in suite["expectations"] if "unique" in e["type"]]


def test_null_person_id_caught(good_input):
    df = good_input.copy()
    df["person_id"] = df["person_id"].astype("Int64")
    df.loc[33, "person_id"] = pd.NA
    res = validate_input(df)
    f = only_failure(res)
    assert (f.expectation, f.column, f.unexpected_count) == (
        "expect_column_values_to_not_be_null",
        "person_id",
        1,
    )
    assert flagged(res) == [33]


def test_bad_rows_are_positional_and_union_of_failures(good_input):
    df = good_input.copy()
    df.loc[5, "x"] = 1.5
    df.loc[9, "y"] = np.nan
    df.loc[11, "geoid"] = "72" + "x" * 9
    df.index = pd.Index(np.arange(len(df)) * 3 + 7, name="pid")  # not positional
    res = validate_input(df)
    assert len(res.failures) == 4, res.summary()
    assert flagged(res) == [5, 9, 11]
    assert len(res.summary().splitlines()) == 4


def test_release_checks_first_pass_is_basic_and_still_finds_every_bad_row(good_input,
                                                                          tmp_path):
    """A release's Checkpoint runs its first pass in BASIC (counts and a sample, without the
    index lists SUMMARY computes for every expectation), also when the Checkpoint was stored
    in SUMMARY, or with an action, by an earlier run (a resume); the rows of a failed
    expectation still come from the COMPLETE pass."""
    import data_contracts.api as api

    df = good_input.copy()
    df.loc[5, "x"] = 1.5
    df.loc[9, "y"] = np.nan
    docs = ReleaseDocs.in_folder(tmp_path / "release")
    summary = {"result_format": "SUMMARY", "partial_unexpected_count": 5}
    original = api.FIRST_PASS_FORMAT
    try:  # an earlier run stores the Checkpoint with SUMMARY
        api.FIRST_PASS_FORMAT = summary
        before = validate_input(df, release=docs, run_name="first")
    finally:
        api.FIRST_PASS_FORMAT = original
    # and with the UpdateDataDocsAction of a release begun before the site was built per batch
    from great_expectations.checkpoint import UpdateDataDocsAction

    context = api.release_context(docs.project_dir, docs.docs_dir)
    (stored,) = context.checkpoints.all()
    stored.actions = [UpdateDataDocsAction(name="update_data_docs")]
    stored.save()
    res = validate_input(df, release=docs, run_name="resumed")
    assert context.checkpoints.get(stored.name).actions == []
    for r in res.validation_result.results:
        assert "partial_unexpected_index_list" not in (r.result or {}), r.result
    assert any("partial_unexpected_index_list" in (r.result or {})
               for r in before.validation_result.results)  # the test can tell them apart
    assert flagged(res) == flagged(before) == [5, 9]
    assert [f.expectation for f in res.failures] == [f.expectation for f in before.failures]
    assert [f.unexpected_count for f in res.failures] == [1, 1]


def test_validation_is_quiet(good_input, published, capfd, tmp_path):
    """No progress bars, prints or user-visible warnings (e.g. pandas regex-group warnings)."""
    df = good_input.copy()
    df.loc[0, "x"] = 2.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        validate_input(df)
        validate_published(published[0], boundary_geoids=published[1], docs_dir=tmp_path)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    shown = [w for w in caught if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    assert shown == [], [str(w.message) for w in shown]


def test_input_220k_rows_finds_every_bad_row(record_property):
    # The time is reported, not asserted (a clock bound fails on a busy machine).
    df = make_input(220_000, seed=1)
    df.loc[::1000, "x"] = 1.5  # force the second (COMPLETE) pass too
    start = time.perf_counter()
    res = validate_input(df)
    record_property("validate_input_220k_seconds", round(time.perf_counter() - start, 3))
    assert res.failures[0].unexpected_count == 220
    assert res.bad_rows.sum() == 220


# ----------------------------------------------------------------------------- published


def test_good_published_passes(published):
    table, geoids = published
    res = validate_published(table, boundary_geoids=geoids)
    assert res.success, res.summary()
    assert not res.bad_rows.any() and res.bad_rows.shape == (len(table),)
    assert res.suite == PUBLISHED_SUITE


def test_weird_status_caught(published):
    table, geoids = published
    df = table.copy()
    row = int(np.flatnonzero(df["status"] == "suppressed")[0])
    df.loc[row, "status"] = "weird"
    res = validate_published(df, boundary_geoids=geoids)
    f = only_failure(res)
    assert (f.expectation, f.column, f.unexpected_count) == (
        "expect_column_values_to_be_in_set",
        "status",
        1,
    )
    assert "weird" in f.details
    assert flagged(res) == [row]


def test_p25_out_of_range_caught(published):
    table, geoids = published
    df = table.copy()
    row = int(np.flatnonzero(df["status"] == "released")[1])
    df.loc[row, "p25"] = 1.2
    res = validate_published(df, boundary_geoids=geoids)
    f = only_failure(res)
    assert (f.expectation, f.column, f.unexpected_count) == (
        "expect_column_values_to_be_between",
        "p25",
        1,
    )
    assert flagged(res) == [row]


def test_p25_null_exactly_where_not_released(published):
    table, _ = published
    df = table.copy()
    released = int(np.flatnonzero(df["status"] == "released")[0])
    failed = int(np.flatnonzero(df["status"] == "failed")[0])
    df.loc[released, "p75"] = np.nan
    df.loc[failed, "p25"] = 0.4
    res = validate_published(df)
    got = {(f.expectation, f.column, f.unexpected_count) for f in res.failures}
    assert got == {
        ("expect_column_values_to_not_be_null", "p75", 1),
        ("expect_column_values_to_be_null", "p25", 1),
    }
    assert flagged(res) == sorted([released, failed])


def with_standard_errors(table: pd.DataFrame, se: float = 0.1,
                         moe: float | None = None) -> pd.DataFrame:
    """The table with intervals, their standard errors and, with ``moe``, 90% margins of
    error on released rows (issues 18 and 32)."""
    df = table.copy()
    released = df["status"] == "released"
    for p in ("p25", "p75"):
        df[f"{p}_lo"] = np.where(released, np.clip(df[p] - 0.2, 0, 1), np.nan)
        df[f"{p}_hi"] = np.where(released, np.clip(df[p] + 0.2, 0, 1), np.nan)
    for p in ("p25", "p75"):
        df[f"{p}_se"] = np.where(released, se, np.nan)
        if moe is not None:
            df[f"{p}_moe90"] = np.where(released, moe, np.nan)
    return df


def test_standard_errors_in_their_range_present_exactly_where_released(published):
    """Issue 32: SEs of the total error in [0, 0.5], margins in [0, 0.8225], both exactly on
    released rows."""
    table, _ = published
    df = with_standard_errors(table, 0.1, 0.1645)
    assert validate_published(df).success, validate_published(df).summary()
    assert validate_published(with_standard_errors(table, 0.5, 0.8225)).success  # the caps
    released = np.flatnonzero(df["status"] == "released")
    failed = int(np.flatnonzero(df["status"] == "failed")[0])
    df.loc[released[0], "p25_se"] = 0.5001  # above the cap
    df.loc[released[1], "p75_se"] = np.nan  # missing on a released row
    df.loc[failed, "p25_se"] = 0.1  # on a row without an interval
    df.loc[released[2], "p25_moe90"] = 0.8226  # above the margin's cap
    df.loc[failed, "p75_moe90"] = 0.1  # on a row without an interval
    res = validate_published(df)
    got = {(f.expectation, f.column, f.unexpected_count) for f in res.failures}
    assert got == {
        ("expect_column_values_to_be_between", "p25_se", 1),
        ("expect_column_values_to_not_be_null", "p75_se", 1),
        ("expect_column_values_to_be_null", "p25_se", 1),
        ("expect_column_values_to_be_between", "p25_moe90", 1),
        ("expect_column_values_to_be_null", "p75_moe90", 1),
    }
    assert flagged(res) == sorted([int(released[0]), int(released[1]), int(released[2]),
                                   failed])
    # the bound is a parameter: a release may pass a tighter one
    assert not validate_published(with_standard_errors(table, 0.3), standard_error_max=0.25).success
    negative = with_standard_errors(table, -0.001)
    assert not validate_published(negative).success


def test_duplicate_geoid_cell_and_bad_mechanism_caught(published):
    table, _ = published
    df = pd.concat([table, table.iloc[[4]]], ignore_index=True)
    df.loc[0, "mechanism"] = "Laplace"
    res = validate_published(df)
    got = {(f.expectation, f.column, f.unexpected_count) for f in res.failures}
    assert got == {
        ("expect_compound_columns_to_be_unique", "geoid,cell", 2),
        ("expect_column_values_to_be_in_set", "mechanism", 1),
    }
    assert flagged(res) == [0, 4, len(df) - 1]


def test_missing_boundary_tract_caught(published):
    table, geoids = published
    missing = geoids[7]
    df = table[table["geoid"] != missing]
    res = validate_published(df, boundary_geoids=geoids)
    f = only_failure(res)
    # checked on a frame of its own (published_coverage): a row per boundary tract, its
    # GEOID in missing_geoid where the table has none
    assert (f.expectation, f.column, f.unexpected_count) == (
        "expect_column_values_to_be_null",
        "missing_geoid",
        1,
    )
    assert missing in f.details
    assert not res.bad_rows.any()  # a table-level failure flags no row
    # without boundary geoids the completeness check is not applied
    assert validate_published(df).success


def test_data_docs_written(published, tmp_path):
    table, geoids = published
    df = table.copy()
    df.loc[0, "status"] = "weird"
    docs = tmp_path / "docs"
    res = validate_published(df, boundary_geoids=geoids, docs_dir=docs)
    assert res.docs_index == docs.resolve() / "index.html"
    assert res.docs_index.is_file()
    html = res.docs_index.read_text()
    assert PUBLISHED_SUITE in html
    assert list((docs / "validations").rglob("*.html"))
    assert not res.success  # docs do not change the verdict

    res_in = validate_input(make_input(50), docs_dir=tmp_path / "docs_in")
    assert res_in.success and res_in.docs_index.is_file()


def test_a_release_context_is_loaded_once_and_follows_its_project_folder(tmp_path):
    """Issue 22 item 2: the checks of a release reuse one loaded GX context (loading it once
    per partition was a fifth of a partition's check), whatever else is validated in between,
    and a project folder deleted and begun again is loaded afresh, not served from memory."""
    import shutil

    from data_contracts import ReleaseDocs, build_release_docs
    from data_contracts._context import release_context

    a, b = ReleaseDocs.in_folder(tmp_path / "a"), ReleaseDocs.in_folder(tmp_path / "b")
    good, bad = make_input(50, person_id=False), make_input(50, seed=1, person_id=False)
    bad.loc[3, "x"] = 2.0
    assert validate_input(good, release=a, run_name="input-01").success
    context = release_context(a.project_dir, a.docs_dir)
    assert validate_input(good, release=b, run_name="input-01").success
    assert not validate_input(bad).success  # a throw-away context in between
    second = validate_input(bad, release=a, run_name="input-02")
    assert not second.success and list(np.flatnonzero(second.bad_rows)) == [3]
    assert release_context(a.project_dir, a.docs_dir) is context  # not loaded again
    assert validate_input(good, release=b, run_name="input-02").success
    shutil.rmtree(tmp_path / "a")  # e.g. a purged release whose id is run again
    assert validate_input(good, release=a, run_name="input-03").success
    assert release_context(a.project_dir, a.docs_dir) is not context
    build_release_docs(a), build_release_docs(b)
    listed = {d: sorted(p.name for p in (d.docs_dir / "validations").glob("*/*")) for d in (a, b)}
    assert listed == {a: ["input-03"], b: ["input-01", "input-02"]}


def test_a_release_context_keeps_no_frame_or_metric_after_a_run(tmp_path):
    """The release's context lives as long as the process (it is loaded once per release), and
    GX's pandas engine in it kept the last run's frame and per-row metrics until the next run:
    ~200 MiB of a national input's 4 M-record group, held while the next group was read. After
    each run nothing of the frame is left; and a run after another of the same suite and the
    same batch id finds the rows it is given, not the metrics of the run before."""
    import weakref

    from data_contracts._context import release_context

    docs = ReleaseDocs.in_folder(tmp_path)
    good, bad = make_input(200, person_id=False), make_input(200, seed=1, person_id=False)
    bad.loc[[5, 150], "y"] = 1.5
    for run, frame, rows in (("input-01", good, []), ("input-02", bad, [5, 150]),
                             ("input-03", good, [])):
        result = validate_input(frame, release=docs, run_name=run)
        assert result.success is (not rows) and flagged(result) == rows
        engine = release_context(docs.project_dir, docs.docs_dir).data_sources.get(
            "dpatlas").execution_engine
        assert engine._metric_cache == {}
        assert engine.batch_manager.batch_data_cache == {}
        assert engine.batch_manager.batch_cache == {}
    # and the frame itself is free once the caller drops it (nothing in GX still holds it)
    held = make_input(200, seed=2, person_id=False)
    assert validate_input(held, release=docs, run_name="input-04").success
    probe = weakref.ref(held)
    del held
    import gc

    gc.collect()
    assert probe() is None


# ----------------------------------------------------------------------------- levels


def make_level(tracts: pd.DataFrame, level: str) -> pd.DataFrame:
    """A county or state table shaped like dpatlas.publication.level_files writes it, one row
    per unit and cell of the tract table (values from its first tract in the unit)."""
    digits = {"county": 5, "state": 2}[level]
    table = (tracts.assign(geoid=tracts["geoid"].str[:digits])
             .drop_duplicates(["geoid", "cell"]).reset_index(drop=True))
    table.insert(1, "level", level)
    if level == "county":
        table["county"] = table["geoid"]
    else:
        table = table.drop(columns="county")
    return table


@pytest.mark.parametrize("level", ["county", "state"])
def test_a_good_level_table_passes_its_own_contract(published, level):
    tracts, geoids = published
    table = make_level(tracts, level)
    digits = {"county": 5, "state": 2}[level]
    res = validate_published_level(table, level, boundary_units=[g[:digits] for g in geoids])
    assert res.success, res.summary()
    assert res.suite == PUBLISHED_LEVEL_SUITES[level]


@pytest.mark.parametrize("level", ["county", "state"])
def test_a_level_table_with_a_tract_geoid_or_another_level_fails(published, level):
    tracts, geoids = published
    table = make_level(tracts, level)
    table.loc[0, "geoid"] = geoids[0]  # an 11-digit tract code in a county/state table
    table.loc[3, "level"] = "tract"
    res = validate_published_level(table, level)
    failed = {(f.expectation, f.column) for f in res.failures}
    assert failed == {("expect_column_values_to_match_regex", "geoid"),
                      ("expect_column_values_to_be_in_set", "level")}, res.summary()
    assert flagged(res) == [0, 3]


def test_a_level_table_missing_a_unit_of_the_boundaries_fails(published):
    tracts, geoids = published
    table = make_level(tracts, "county")
    gone = table["geoid"].iloc[0]
    res = validate_published_level(table[table["geoid"] != gone], "county",
                                   boundary_units=[g[:5] for g in geoids])
    f = only_failure(res)
    assert (f.expectation, f.column, f.unexpected_count) == (
        "expect_column_values_to_be_null", "missing_geoid", 1)
    assert gone in f.details


def test_the_tract_contract_refuses_a_county_table(published):
    tracts, _ = published
    res = validate_published(make_level(tracts, "county"))
    assert not res.success
    assert ("expect_column_values_to_match_regex", "geoid") in {
        (f.expectation, f.column) for f in res.failures}


def test_an_unknown_level_is_refused(published):
    with pytest.raises(ValueError, match="no published contract for level 'tract'"):
        validate_published_level(published[0], "tract")


@pytest.mark.parametrize("label", ["", " ", "\u3000", "\u00a0\t", "\x85"])
def test_a_blank_cell_label_is_caught_whatever_the_whitespace(good_input, label):
    """Blank as Python's ``\\s`` has it (Unicode whitespace), not only ASCII: the pattern
    runs in pyarrow, whose own ``\\s`` is ASCII (data_contracts._spec.NOT_BLANK_REGEX)."""
    df = good_input.copy()
    df["cell"] = pd.array(["outcome-1"] * len(df), dtype=pd.StringDtype("pyarrow"))
    df.loc[[5, 44], "cell"] = [label, "outcome-2\u3000"]  # the second has a character
    res = validate_input(df)
    f = only_failure(res)
    assert (f.expectation, f.column, f.unexpected_count) == (
        "expect_column_values_to_match_regex", "cell", 1)
    assert flagged(res) == [5]
