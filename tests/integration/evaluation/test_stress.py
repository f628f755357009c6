"""Stress scenarios (dpatlas/evaluation/stress.py): each has the property it claims, its truth is the
tract's expected outcome (the population least-squares line of E[y | x]) and its census reading
the tract's own least-squares line, draws are reproducible, and the release path never imports
it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy.stats import skew

from dpatlas.evaluation.stress import (LARGE_SIZES, NARROW_HALF_WIDTH, SCENARIOS, SMALL_SIZES,
                                       scenario_state, theil_sen_line)
from mechanisms.batch import ols, sufficient_stats

TRACTS = 150


@pytest.fixture(scope="module")
def states():
    return {name: scenario_state(name, TRACTS, seed=101) for name in SCENARIOS}


def _residuals(state):
    b = state.batch
    fit = ols(sufficient_stats(b))
    slope, icpt = fit.slope, fit.intercept
    t = b.tract_of_record
    return b.y - (icpt[t] + slope[t] * b.x)


@pytest.mark.parametrize("name", SCENARIOS)
def test_census_reading_is_the_tracts_least_squares_line(states, name):
    st = states[name]
    b = st.batch
    assert b.n_tracts == TRACTS
    checked = 0
    for t in range(0, TRACTS, 15):
        x, y = b.x[b.starts[t]:b.starts[t + 1]], b.y[b.starts[t]:b.starts[t + 1]]
        if x.size < 2 or np.ptp(x) == 0:
            assert np.isnan(st.census["p25"][t]) and np.isnan(st.truth["p25"][t])
            continue
        slope, icpt = np.polyfit(x, y, 1)
        assert st.census["p25"][t] == pytest.approx(np.clip(icpt + 0.25 * slope, 0, 1), abs=1e-9)
        assert st.census["p75"][t] == pytest.approx(np.clip(icpt + 0.75 * slope, 0, 1), abs=1e-9)
        checked += 1
    assert checked >= 8
    for reading in (st.truth, st.census):
        assert np.nanmin(reading["p25"]) >= 0 and np.nanmax(reading["p75"]) <= 1


def test_the_estimand_is_clipped_to_ranks_where_a_narrow_line_leaves_them(states):
    fit = ols(sufficient_stats(states["narrow_x"].batch))
    outside = (fit.p25 < 0) | (fit.p25 > 1)
    assert outside.mean() > 0.05  # a line fitted on x within ±0.025 extrapolates far
    assert np.all(np.isin(states["narrow_x"].census["p25"][outside], (0.0, 1.0)))


def test_draws_are_reproducible_and_differ_by_seed():
    a, b, c = (scenario_state("skewed", 20, s) for s in (7, 7, 8))
    assert np.array_equal(a.batch.y, b.batch.y)
    assert not np.array_equal(a.batch.y, c.batch.y)
    with pytest.raises(ValueError, match="unknown scenario"):
        scenario_state("nope", 20, 1)


def test_heteroskedastic_error_spread_grows_with_x(states):
    e, x = _residuals(states["heteroskedastic"]), states["heteroskedastic"].batch.x
    assert e[x > 0.7].std() > 2 * e[x < 0.3].std()  # sd 0.03 + 0.25x, truncated to [0, 1]
    for name in ("small", "large"):  # the homoskedastic ones do not
        e, x = _residuals(states[name]), states[name].batch.x
        assert e[x > 0.7].std() < 1.5 * e[x < 0.3].std()


def test_skewed_errors_are_right_skewed_and_gaussian_ones_are_not(states):
    assert skew(_residuals(states["skewed"])) > 1.0
    assert abs(skew(_residuals(states["large"]))) < 0.3


def test_censored_piles_records_at_both_ends_and_the_others_do_not(states):
    y = states["censored"].batch.y
    assert (y == 0).mean() > 0.04 and (y == 1).mean() > 0.04
    for name in ("heteroskedastic", "skewed", "outliers", "narrow_x", "small", "large"):
        y = states[name].batch.y
        assert ((y == 0) | (y == 1)).mean() < 0.002, name


def test_outliers_have_high_leverage(states):
    b = states["outliers"].batch
    st = sufficient_stats(b)
    t = b.tract_of_record
    lev = 1 / b.n[t] + (b.x - st.xbar[t]) ** 2 / st.nvar[t]
    max_lev = np.array([lev[b.starts[i]:b.starts[i + 1]].max() for i in range(b.n_tracts)])
    # the usual flag for a high-leverage point in a simple regression: h > 2p/n with p = 2
    assert np.mean(max_lev * b.n > 4) > 0.9
    plain = states["small"].batch
    pst = sufficient_stats(plain)
    plain_lev = (1 / plain.n[plain.tract_of_record]
                 + (plain.x - pst.xbar[plain.tract_of_record]) ** 2 / pst.nvar[plain.tract_of_record])
    assert np.mean(np.maximum.reduceat(plain_lev, plain.starts[:-1]) * plain.n > 4) < 0.9


def test_narrow_x_has_a_narrow_x_range_per_tract(states):
    b = states["narrow_x"].batch
    ranges = np.maximum.reduceat(b.x, b.starts[:-1]) - np.minimum.reduceat(b.x, b.starts[:-1])
    assert ranges.max() <= 2 * NARROW_HALF_WIDTH + 1e-12
    wide = states["small"].batch
    assert np.median(np.maximum.reduceat(wide.x, wide.starts[:-1])
                     - np.minimum.reduceat(wide.x, wide.starts[:-1])) > 0.3


def test_small_and_large_tract_sizes(states):
    assert states["small"].batch.n.min() >= SMALL_SIZES[0]
    assert states["small"].batch.n.max() <= SMALL_SIZES[1]
    assert states["large"].batch.n.min() >= LARGE_SIZES[0]
    assert states["large"].batch.n.max() <= LARGE_SIZES[1]
    assert np.median(states["heteroskedastic"].batch.n) < 100  # the others are demo-sized


def test_tied_x_are_percentile_ranks_with_many_ties(states):
    b = states["tied_x"].batch
    assert np.allclose(b.x * 100, np.round(b.x * 100))
    assert np.allclose(b.y * 100, np.round(b.y * 100))
    tied = []
    for i in range(b.n_tracts):
        x = b.x[b.starts[i]:b.starts[i + 1]]
        if x.size >= 20:
            _, counts = np.unique(x, return_counts=True)
            tied.append(counts[counts > 1].sum() / x.size)
    assert np.median(tied) > 0.5
    # the continuous scenarios have no ties at all
    x = states["small"].batch.x
    assert np.unique(x).size == x.size


def test_theil_sen_line_differs_from_least_squares_under_skew(states):
    """The reason DPExpTheilSen's rows get their own estimand (docs/uncertainty.md)."""
    for name, gap_at_least in (("skewed", 0.03), ("large", 0.0)):
        st = states[name]
        ts = theil_sen_line(st.batch)
        gap = np.nanmedian(ts["p25"] - st.census["p25"])
        if gap_at_least:
            assert gap < -gap_at_least  # the median line runs below the mean line
        else:
            assert abs(gap) < 0.01


def test_release_path_never_imports_the_stress_module():
    code = ("import sys, flows.release, tasks.publish, dpatlas.cli.commands; "
            "print('dpatlas.evaluation.stress' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
