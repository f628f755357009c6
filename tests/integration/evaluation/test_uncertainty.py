"""Issue 18: conditional coverage of the DP intervals on stress states, and the estimand.

Each interval covers its row's estimand (dpatlas/interval_eval.ESTIMAND, docs/uncertainty.md):
the tract's least-squares line for NoisyStats, the tract's Theil–Sen line for DPExpTheilSen,
the chosen mechanism's for the rule. Required at nominal 95%: >= 0.94 overall and >= 0.90 in
every tract-size quintile, every interval-width quintile and among the intervals the map
shows as reliable (width <= low_reliability_width)."""

from __future__ import annotations

import numpy as np
import pytest

from dpatlas.evaluation.interval_eval import RELIABLE_WIDTH, evaluate_intervals, summarise
from mechanisms.intervals import Intervals, laplace_sum_quantile

MIN_RELIABLE = 200  # fewer reliable intervals than this: too few to judge their coverage


def assert_conditional_coverage(row, min_reliable: int = MIN_RELIABLE) -> None:
    where = f"{row['scenario']} {row['mechanism']} eps={row['epsilon']:g}"
    assert row["coverage"] >= 0.94, f"{where}: coverage {row['coverage']:.3f}"
    assert row["worst Q"] >= 0.90, f"{where}: worst size quintile {row['worst Q']:.3f}"
    assert row["worst W"] >= 0.90, f"{where}: worst width quintile {row['worst W']:.3f}"
    if row["reliable intervals"] >= min_reliable:
        assert row["reliable"] >= 0.90, f"{where}: reliable {row['reliable']:.3f}"


def test_the_check_fails_on_intervals_that_are_narrow_and_wrong():
    """A point ± 0.01 'interval' around a biased estimate must fail every criterion."""
    rng = np.random.default_rng(3)
    truth = {"p25": rng.uniform(0.2, 0.6, 50), "p75": rng.uniform(0.4, 0.8, 50)}
    point = {k: v + rng.normal(0.05, 0.02, (10, 50)) for k, v in truth.items()}
    res = Intervals(point["p25"] - 0.01, point["p25"] + 0.01, point["p75"] - 0.01,
                    point["p75"] + 0.01)
    n = np.arange(50) + 5
    ones = {"p25": np.ones(50), "p75": np.ones(50)}
    row = summarise(res, truth, n, ones, np.arange(50) % 5)
    row.update(scenario="fake", mechanism="fake", epsilon=1.0)
    with pytest.raises(AssertionError, match="coverage"):
        assert_conditional_coverage(row)
    assert row["reliable share"] == 1.0 and row["reliable"] < 0.2


@pytest.mark.parametrize("scenario", ["small", "narrow_x", "skewed", "heteroskedastic",
                                      "censored", "tied_x", "outliers", "demo"])
def test_conditional_coverage_on_stress_states(scenario):
    summary, _, _ = evaluate_intervals(tracts=150, reps=30, seed=1801, scenarios=(scenario,),
                                       reliable_width=RELIABLE_WIDTH)
    for _, row in summary.iterrows():
        assert_conditional_coverage(row)


def test_noisy_stats_narrow_intervals_cover_on_small_tracts():
    """The issue's worst case: small tracts at epsilon 1 had reliable coverage 0.04 (here
    0.056 over 89 reliable intervals before the fix; now none is narrow enough)."""
    summary, _, _ = evaluate_intervals(tracts=400, reps=30, seed=1802, epsilons=(1.0,),
                                       mechanisms=("NoisyStats",), scenarios=("small",))
    for _, row in summary.iterrows():
        assert_conditional_coverage(row, min_reliable=30)


@pytest.mark.parametrize("mechanism", ["DPExpTheilSen", "rule"])
def test_reliable_intervals_cover_where_x_is_narrow(mechanism):
    """Issue 18's remaining cell: x in a narrow band at epsilon 8, where the Theil-Sen ends met
    long runs of clipped predictions and the rule's NoisyStats rows a selection draw far in
    its tail. Before the fix (seed 5): reliable coverage 0.72 (DPExpTheilSen, 65 intervals)
    and 0.68 (rule, 25); seed 1803 is neither the calibration nor the report seed."""
    summary, _, _ = evaluate_intervals(tracts=1000, reps=50, seed=1803, epsilons=(8.0,),
                                       mechanisms=(mechanism,), scenarios=("narrow_x",))
    for _, row in summary.iterrows():
        assert_conditional_coverage(row, min_reliable=5)


def test_laplace_sum_quantile_matches_simulation():
    rng = np.random.default_rng(4)
    for scales in ((1.0, 0.0, 0.0), (1.0, 1.0, 0.0), (1.0, 0.3, 2.0), (0.5, 0.5, 0.5)):
        draws = sum(a * rng.laplace(size=400_000) for a in scales)
        q = float(laplace_sum_quantile(tuple(np.array([a]) for a in scales), 0.99)[0])
        # exact for distinct scales; equal scales are pushed apart by 2% (a little wider)
        assert np.quantile(draws, 0.99) * 0.99 <= q <= np.quantile(draws, 0.99) * 1.05


def test_standard_errors_of_real_intervals_shrink_with_the_budget():
    from dpatlas.evaluation.interval_eval import released_by
    from dpatlas.evaluation.stress import scenario_state
    from mechanisms.intervals import intervals
    from mechanisms.noise import SeededRandomness

    batch = scenario_state("large", 12, 5).batch
    out = {}
    for eps in (1.0, 8.0):
        rand = SeededRandomness(6)
        rel = released_by("NoisyStats", batch, 0.75 * eps, rand, 4, 0.0)
        out[eps] = intervals("NoisyStats", batch, rel, 0.25 * eps, rand, 0.95, 4)
    assert np.nanmedian(out[8.0].p25_se) < np.nanmedian(out[1.0].p25_se) / 2
    assert np.all(out[8.0].p75_se > 0)


def test_published_probability_is_the_laplace_tail():
    from mechanisms.intervals import _published_probability

    rng = np.random.default_rng(8)
    draws = rng.laplace(0.0, 2.0, 1_000_000)
    for gap in (-5.0, -1.0, 0.0, 1.0, 6.0):
        assert float(_published_probability(gap, 2.0)) == pytest.approx(
            np.mean(draws >= gap), abs=2e-3)


def test_a_selection_floor_on_nvar_only_widens_the_noisy_stats_interval():
    """The dp rule publishes NoisyStats only where ε·nvar~ >= threshold: given that event the
    released nvar~ overstates nvar, so the interval must not trust it as much (issue 18)."""
    from dataclasses import replace

    from dpatlas.evaluation.interval_eval import released_by
    from dpatlas.evaluation.stress import scenario_state
    from mechanisms.intervals import intervals
    from mechanisms.noise import SeededRandomness

    batch = scenario_state("demo", 120, 9).batch
    rel = released_by("NoisyStats", batch, 6.0, SeededRandomness(10), 5, 0.0)
    widths = []
    for floor in (0.0, 5.0, 50.0):
        res = intervals("NoisyStats", batch, replace(rel, nvar_floor=floor), 2.0,
                        SeededRandomness(11), 0.95, 5)
        widths.append(res.p25_hi - res.p25_lo)
    ok = np.isfinite(widths[0])
    assert np.all(widths[1][ok] >= widths[0][ok] - 1e-12)
    assert np.all(widths[2][ok] >= widths[1][ok] - 1e-12)
    assert np.mean(widths[2][ok] > widths[0][ok]) > 0.2


def test_evaluate_intervals_unknown_scenario_is_one_line_exit_2_and_writes_nothing(tmp_path):
    from tests.support.cli import run_in_process

    out = tmp_path / "ev"
    res = run_in_process("evaluate-intervals", "--scenario", "nope", "--tracts", "10", "--reps",
                         "1", "--out", str(out))
    assert res.returncode == 2
    assert "unknown scenario" in res.stdout + res.stderr
    assert len((res.stdout + res.stderr).strip().splitlines()) == 1
    assert not out.exists()


def test_evaluate_intervals_cli_runs_a_scenario_and_reports_its_tables(tmp_path):
    from tests.support.cli import run_in_process

    out = tmp_path / "ev"
    res = run_in_process("evaluate-intervals", "--scenario", "small", "--scenario", "tied_x",
                         "--tracts", "20", "--reps", "2", "--epsilon", "8", "--out", str(out))
    assert res.returncode == 0, res.stderr
    text = (out / "summary.md").read_text()
    assert "small: tract-size quintiles" in text and "tied_x" in text
    for col in ("W1", "W5", "reliable", "reliable intervals", "[0,1] share"):
        assert f" {col} |" in text, col
