"""``dpatlas evaluate-small-area``: the emulated release, the model on its published columns,
the report; and (slow) the issue's targets on a report seed."""

import numpy as np
import pandas as pd
import pytest

from dpatlas.evaluation import small_area_eval as E
from tests.support.cli import invoke


def test_quick_run_writes_its_table_figure_and_targets(tmp_path):
    out = tmp_path / "sae"
    res = invoke("evaluate-small-area", "--quick", "--out", out)
    assert res.exit_code == 0, res.output
    assert "targets at epsilon 1, split 0.66/0.31/0.03" in res.output
    rows = pd.read_csv(out / "rows.csv")
    assert len(rows) == 1 and rows.loc[0, "seed"] == 201 and rows.loc[0, "epsilon"] == 1.0
    # the model borrows strength: far closer to the truth than the directs
    assert rows.loc[0, "p25 model RMSE"] < 0.5 * rows.loc[0, "p25 direct RMSE"]
    md = (out / "summary.md").read_text()
    assert "| p25 model RMSE |" in md and "| met |" in md
    assert (out / "p25_maps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_split_is_refused_before_any_work(tmp_path):
    res = invoke("evaluate-small-area", "--quick", "--split", "0.5/0.2/0.1", "--out", tmp_path)
    assert res.exit_code == 2 and "summing to 1" in res.output
    assert not (tmp_path / "rows.csv").exists()


def test_emulated_frames_hold_the_published_columns_only():
    state = E.synthetic_state(201, tracts=150)
    tracts = E.tract_release(state, 0.7, 1)
    counties = E.level_release(state, 5, 0.2, 2)
    assert list(tracts.columns) == E.TRACT_COLUMNS
    assert list(counties.columns) == E.LEVEL_COLUMNS
    assert counties["geoid"].str.len().eq(5).all() and len(counties) == 5
    assert tracts["p25"].dropna().between(0, 1).all()
    released = counties["status"] == "released"
    assert (counties.loc[released, "p25_lo"] <= counties.loc[released, "p25"]).all()


def test_report_seeds_are_not_the_calibration_seeds_nor_the_demos():
    assert not set(E.REPORT_SEEDS) & set(E.CALIBRATION_SEEDS)
    assert 0 not in E.REPORT_SEEDS + E.CALIBRATION_SEEDS  # the demo's seed


@pytest.mark.slow
def test_targets_on_a_report_seed_at_epsilon_1():
    """Issue 32's interval targets on one report seed, default split: coverage in its band
    (no longer over-wide), narrow enough to use. Not met on this seed and stated in
    docs/small-area.md: the worst size quintile (0.87), the highest decile (0.72) and the
    median width (0.22 > 0.20; the report seeds' mean meets it)."""
    rows, _ = E.evaluate_small_area(seeds=(201,), epsilons=(1.0,),
                                    splits={E.DEFAULT_SPLIT: E.SPLITS[E.DEFAULT_SPLIT]})
    r = rows.iloc[0]
    assert 0.92 <= r["coverage"] <= 0.97
    assert r["coverage, worst size quintile"] >= 0.85
    assert r["coverage, lowest decile"] >= 0.85
    # 0.221 on this seed; 0.195 (first releases) and 0.212 (second) over report seeds 201-203
    assert r["median p25 width"] <= 0.23
    assert r["p25 model RMSE"] < r["p25 state-mean RMSE"] < r["p25 direct RMSE"]
    assert r["p25 model corr"] > 0.6 and r["p25 model corr, two releases"] > 0.6


@pytest.mark.slow
def test_interval_coverage_targets_on_a_report_seed_at_epsilon_8():
    """The intervals' band holds at a large budget too (extreme deciles: 0.88 and 0.82)."""
    rows, _ = E.evaluate_small_area(seeds=(201,), epsilons=(8.0,),
                                    splits={E.DEFAULT_SPLIT: E.SPLITS[E.DEFAULT_SPLIT]})
    r = rows.iloc[0]
    assert 0.93 <= r["coverage"] <= 0.97
    assert r["coverage, worst size quintile"] >= 0.90
    assert min(r["coverage, lowest decile"], r["coverage, highest decile"]) >= 0.80


def test_summary_checks_the_coverage_targets_at_every_budget():
    rows = pd.DataFrame([{"seed": 201, "epsilon": eps, "split": E.DEFAULT_SPLIT,
                          **{m: 0.5 for m in E.TARGETS}} for eps in (1.0, 8.0)])
    rows.loc[1, "coverage"] = 0.95
    check = E.target_check(E.summarise(rows), E.DEFAULT_SPLIT, 8.0, E.COVERAGE_TARGETS)
    assert list(check["metric"]) == list(E.COVERAGE_TARGETS)
    assert check.set_index("metric").loc["coverage", "met"] == "yes"
    assert check.set_index("metric").loc["coverage, lowest decile", "met"] == "no"


def test_synthetic_state_takes_other_generator_parameters():
    from dpatlas.evaluation.synthetic_input import StateParams
    params = StateParams(spatial_share=0.3, county_share=0.3, length_scale_km=20.0)
    state = E.synthetic_state(201, tracts=90, params=params)
    assert len(state.truth) == 90 and state.records["geoid"].str[:5].nunique() == 3
    default = E.synthetic_state(201, tracts=90)
    assert not np.allclose(state.truth["p25"], default.truth["p25"])
