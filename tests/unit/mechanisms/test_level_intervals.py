"""The NoisyStats interval with nvar bounded from both noisy draws (the county and state
levels' intervals, issue 20): valid, conditionally safe on near-zero nvar, and informative where
the single-draw scheme gives [0, 1]."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mechanisms.batch import TractBatch, ols, sufficient_stats
from mechanisms.intervals import (EXP_THEIL_SEN, NOISY_STATS, Released,
                                  _combined_nvar_lower, intervals)
from mechanisms.noise import SeededRandomness

from tests.unit.mechanisms.test_intervals import (assert_at_least_nominal, coverage,
                                                  noisy_stats_released, synthetic)

# A county of the demo at the default split: ε 0.27 per person, a quarter of it for the interval.
COUNTY_EPS, INTERVAL_SHARE = 0.27, 0.25


def _county_intervals(batch, seed, both, reps=20, level=0.95):
    rand = SeededRandomness(seed)
    est_eps = COUNTY_EPS * (1 - INTERVAL_SHARE)
    rel = noisy_stats_released(batch, est_eps, rand, reps)
    return intervals(NOISY_STATS, batch, rel, COUNTY_EPS * INTERVAL_SHARE, rand, level,
                     reps=reps, nvar_from_both_draws=both)


def _trivial_share(res) -> float:
    trivial = [(getattr(res, f"{q}_lo") <= 0) & (getattr(res, f"{q}_hi") >= 1)
               for q in ("p25", "p75")]
    return float(np.mean(trivial))


@pytest.mark.parametrize("level", [0.9, 0.95])
def test_county_sized_units_are_covered_at_least_nominally(level):
    batch, truth = synthetic(30, 2000, seed=21)
    res = _county_intervals(batch, 5, both=True, level=level)
    assert_at_least_nominal(*coverage(res, truth), level)


def test_both_draws_make_county_intervals_informative_where_one_draw_gives_0_1():
    """Units of 3,000 records at ε 0.27: nvar = n·var(x) ≈ 150 against Laplace scales of
    15 (released nvar~) and 30 (the interval's own draw); the single-draw scheme cannot bound
    nvar above 0 in most of them, the average of both draws can."""
    batch, _ = synthetic(30, 3000, seed=22)
    nvar = sufficient_stats(batch).nvar
    assert 100 < np.median(nvar) < 200, np.median(nvar)  # the demo counties: 93-250, median 152
    one = _trivial_share(_county_intervals(batch, 6, both=False))
    both = _trivial_share(_county_intervals(batch, 6, both=True))
    assert one > 0.4, one          # the defect the combined bound removes (0.64 in the demo)
    assert both < one / 2, (one, both)


def test_near_zero_nvar_gets_no_more_narrow_wrong_intervals():
    """Issue 18's conditional-coverage guard carries over: small units with nearly constant x
    (nvar near 0, so a published nvar~ is overstated) must not get narrow intervals that miss."""
    rng = np.random.default_rng(7)
    n_units, n = 400, 40
    x = np.clip(0.5 + rng.normal(0, 0.01, (n_units, n)), 0, 1)
    y = np.clip(0.3 + 0.3 * x + rng.normal(0, 0.1, (n_units, n)), 0, 1)
    labels = np.repeat(np.array([f"u{i:04d}" for i in range(n_units)]), n)
    batch = TractBatch.from_labels(labels, x.ravel(), y.ravel())
    fit = ols(sufficient_stats(batch))
    truth = {"p25": fit.p25, "p75": fit.p75}
    res = _county_intervals(batch, 8, both=True, reps=10)
    narrow_miss = narrow = 0
    for q in ("p25", "p75"):
        lo, hi = getattr(res, f"{q}_lo"), getattr(res, f"{q}_hi")
        is_narrow = np.isfinite(lo) & (hi - lo <= 0.5)
        narrow += int(is_narrow.sum())
        narrow_miss += int((is_narrow & ((truth[q] < lo) | (truth[q] > hi))).sum())
    assert narrow_miss <= max(1, 0.05 * narrow), (narrow_miss, narrow)


@pytest.mark.parametrize("nvar", [0.0, 5.0, 150.0])
def test_combined_lower_bound_fails_at_most_its_tail_and_the_gate_is_lax_only_away_from_0(nvar):
    """P(bound > nvar) <= tail for the unconditional law (Monte Carlo, 3 binomial SE), and at
    nvar = 0 the gate (the own draw above b·ln 20) passes with probability 1/40."""
    rng = np.random.default_rng(int(nvar) + 1)
    m, b_rel, b_own, tail = 400_000, 15.0, 30.0, 0.01
    nvar_t = nvar + rng.laplace(0, b_rel, m)
    nvar2_t = nvar + rng.laplace(0, b_own, m)
    lower = _combined_nvar_lower(nvar_t, b_rel, nvar2_t, b_own, np.full(m, tail))
    fails = float(np.mean(lower > nvar))
    assert fails <= tail + 3 * math.sqrt(tail * (1 - tail) / m), fails
    gate = float(np.mean(np.isfinite(lower)))
    if nvar == 0.0:
        assert abs(gate - 1 / 40) < 0.002, gate
    if nvar == 150.0:
        assert gate > 0.9 and float(np.median(lower)) > 60, (gate, np.median(lower))


def test_refused_where_the_argument_does_not_hold():
    batch, _ = synthetic(3, 50, seed=1)
    rel = Released(np.zeros((1, 3)), np.zeros((1, 3)), np.ones((1, 3)), 0.1, 0.1, 0.1,
                   nvar_floor=2.0)
    with pytest.raises(ValueError, match="selection floor"):
        intervals(NOISY_STATS, batch, rel, 0.1, SeededRandomness(1), nvar_from_both_draws=True)
    with pytest.raises(ValueError, match="NoisyStats"):
        intervals(EXP_THEIL_SEN, batch, Released(np.zeros((1, 3)), np.zeros((1, 3))), 0.1,
                  SeededRandomness(1), nvar_from_both_draws=True)


def test_tied_percentile_ranks_are_covered_and_the_bound_reads_only_dp_outputs():
    """Parent and child ranks tied to a 0.05 grid (percentile ranks): coverage holds, and the
    two-draw bound is a function of the noisy draws and public scales alone (the same draws
    give the same bound whatever the records' ties)."""
    batch, truth = synthetic(30, 3000, seed=23)
    tied = TractBatch.from_labels(np.repeat(batch.labels, batch.n),
                                  np.round(batch.x / 0.05) * 0.05, np.round(batch.y / 0.05) * 0.05)
    fit = ols(sufficient_stats(tied))
    res = _county_intervals(tied, 9, both=True)
    assert_at_least_nominal(*coverage(res, {"p25": fit.p25, "p75": fit.p75}), 0.95)
    a = _combined_nvar_lower(np.array([150.0]), 15.0, np.array([140.0]), 30.0, np.array([0.01]))
    b = _combined_nvar_lower(np.array([150.0]), 15.0, np.array([140.0]), 30.0, np.array([0.01]))
    assert np.array_equal(a, b) and np.isfinite(a).all()
