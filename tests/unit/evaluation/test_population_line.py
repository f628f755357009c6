"""The expected outcome of a stress scenario (issue 32; dpatlas/evaluation/stress.py): the
least-squares line of E[y | x] at each tract's own x, E by Monte Carlo over the scenario's law."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from dpatlas.evaluation.stress import GaussianLaw, least_squares_line, population_line
from mechanisms.batch import TractBatch

TRACTS = 40


def _tracts(seed: int = 3):
    rng = np.random.default_rng(seed)
    n = rng.integers(5, 60, TRACTS)
    t = np.repeat(np.arange(TRACTS), n)
    x = rng.uniform(0.0, 1.0, t.size)
    icpt, slope = rng.uniform(0.3, 0.4, TRACTS), rng.uniform(0.1, 0.4, TRACTS)
    labels = np.array([f"t{i:03d}" for i in range(TRACTS)])[t]
    return TractBatch.from_labels(labels, x, np.zeros(t.size)), icpt, slope, t


def test_a_line_with_errors_that_never_leave_the_ranks_gives_the_generator_line():
    """Gaussian linear law, no truncation in effect (the line in [0.3, 0.8], sd 0.02): the
    expected outcome is the generator's line at 0.25 and 0.75, up to Monte Carlo error."""
    batch, icpt, slope, t = _tracts()
    law = GaussianLaw(icpt[t] + slope[t] * batch.x, np.full(batch.x.size, 0.02))
    got = population_line(batch, law, np.random.default_rng(1))
    np.testing.assert_allclose(got["p25"], icpt + 0.25 * slope, atol=3e-3)
    np.testing.assert_allclose(got["p75"], icpt + 0.75 * slope, atol=3e-3)
    exact = population_line(batch, GaussianLaw(law.mean, np.zeros(batch.x.size)),
                            np.random.default_rng(1), draws=2)
    np.testing.assert_allclose(exact["p25"], icpt + 0.25 * slope, atol=1e-12)


def test_monte_carlo_truth_matches_the_truncated_normal_mean():
    """sd 0.3 around lines near the ends: the truncated errors bend E[y | x] away from the
    line; the Monte Carlo truth is the LS line of the closed-form truncated-normal mean."""
    batch, icpt, slope, t = _tracts(4)
    mean, sd = icpt[t] + slope[t] * batch.x - 0.2, np.full(batch.x.size, 0.3)
    mean = np.clip(mean, 0.02, 0.98)
    a, b = -mean / sd, (1 - mean) / sd
    expected_y = mean + sd * (norm.pdf(a) - norm.pdf(b)) / (norm.cdf(b) - norm.cdf(a))
    exact = least_squares_line(TractBatch(batch.x, expected_y, batch.starts, batch.labels))
    line = least_squares_line(TractBatch(batch.x, mean, batch.starts, batch.labels))
    got = population_line(batch, GaussianLaw(mean, sd), np.random.default_rng(2), draws=400)
    assert np.max(np.abs(exact["p25"] - line["p25"])) > 0.05  # truncation matters here
    np.testing.assert_allclose(got["p25"], exact["p25"], atol=0.02)
    np.testing.assert_allclose(got["p75"], exact["p75"], atol=0.02)
    assert np.mean(np.abs(got["p25"] - exact["p25"])) < 0.006


def test_a_tract_whose_x_has_no_spread_has_no_expected_outcome():
    batch = TractBatch.from_labels(np.array(["a"] * 3 + ["b"] * 3),
                                   np.array([0.5, 0.5, 0.5, 0.1, 0.5, 0.9]), np.zeros(6))
    got = population_line(batch, lambda r: r.uniform(0, 1, 6), np.random.default_rng(0), 4)
    assert np.isnan(got["p25"][0]) and np.isfinite(got["p25"][1])
