"""The grid samplers: exact discrete distributions, mechanism scales, grids, sources."""

import math

import numpy as np
import pytest
from scipy import stats

from mechanisms.noise import (OSRandomness, SeededRandomness, bernoulli_exp, discrete_gaussian,
                              discrete_laplace, gaussian_mechanism, gaussian_sigma,
                              laplace_mechanism, laplace_scale)
from mechanisms.privacy_maps import GridGaussian, GridLaplace


def chi2_pvalue(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square goodness of fit, lumping the tails beyond ``support`` into one cell."""
    counts = np.array([(samples == k).sum() for k in support] + [(~np.isin(samples, support)).sum()])
    expected = np.append(pmf, max(1.0 - pmf.sum(), 1e-12)) * samples.size
    keep = expected > 5
    obs, exp = counts[keep], expected[keep]
    exp = exp * obs.sum() / exp.sum()
    return stats.chisquare(obs, exp).pvalue


def test_below_is_uniform(rand):
    m = np.full(60000, 7, dtype=np.uint64)
    v = rand.below(m)
    assert v.max() < 7
    assert chi2_pvalue(v.astype(int), np.arange(7), np.full(7, 1 / 7)) > 1e-3


def test_below_redraws_rejected_words_and_keeps_shape(rand):
    # m = 3·2^62: a quarter of all words are rejected and redrawn; thirds stay equally likely.
    m = np.full((300, 200), 3 * 2**62, dtype=np.uint64)
    v = rand.below(m)
    assert v.shape == m.shape and v.dtype == np.uint64
    assert np.all(v < m)
    third = (v // np.uint64(2**62)).astype(int).ravel()
    assert chi2_pvalue(third, np.arange(3), np.full(3, 1 / 3)) > 1e-3
    with pytest.raises(ValueError):
        rand.below(np.array([3, 0], dtype=np.uint64))


@pytest.mark.parametrize("num,den", [(1, 3), (1, 1), (5, 2), (7, 1)])
def test_bernoulli_exp_rate(rand, num, den):
    n = 200000
    b = bernoulli_exp(rand, np.full(n, num), np.full(n, den))
    p = math.exp(-num / den)
    assert abs(b.mean() - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-4


@pytest.mark.parametrize("scale_num,scale_den", [(640, 256), (256 * 30, 256), (100, 256)])
def test_discrete_laplace_pmf(rand, scale_num, scale_den):
    t = scale_num / scale_den
    k = discrete_laplace(rand, np.full(200000, scale_num), scale_den)
    support = np.arange(-int(6 * t) - 2, int(6 * t) + 3)
    pmf = np.exp(-np.abs(support) / t) * (1 - math.exp(-1 / t)) / (1 + math.exp(-1 / t))
    assert chi2_pvalue(k, support, pmf) > 1e-3
    var = 2 * math.exp(-1 / t) / (1 - math.exp(-1 / t)) ** 2
    assert k.var() == pytest.approx(var, rel=0.03)


@pytest.mark.parametrize("sigma2", [2, 9, 400])
def test_discrete_gaussian_pmf(rand, sigma2):
    k = discrete_gaussian(rand, np.full(150000, sigma2))
    s = math.sqrt(sigma2)
    support = np.arange(-int(7 * s) - 1, int(7 * s) + 2)
    w = np.exp(-support**2 / (2 * sigma2))
    big = np.arange(-int(40 * s) - 5, int(40 * s) + 6)
    pmf = w / np.exp(-big**2 / (2 * sigma2)).sum()
    assert chi2_pvalue(k, support, pmf) > 1e-3
    assert abs(k.mean()) < 5 * s / math.sqrt(k.size)


def test_laplace_mechanism_scale_grid_and_unbiased(rand):
    values = np.full((100000, 1), 0.123456789)
    out = laplace_mechanism(rand, values, 0.5, GridLaplace.calibrate(2.0))[:, 0]
    b = laplace_scale(0.5, 2.0)
    assert b == pytest.approx(0.25 * (1 + 1 / 4096), rel=1e-3)  # Δ/ε inflated by (N+1)/N
    unit = 0.5 / 4096
    assert np.allclose(out / unit, np.round(out / unit), atol=1e-6)  # on the public grid
    assert out.var() == pytest.approx(2 * b * b, rel=0.03)
    assert abs(np.mean(out) - 0.123456789) < 5 * math.sqrt(2) * b / math.sqrt(out.size) + unit
    # Laplace quantiles: P(|X - mu| > b ln 10) = 0.1
    assert np.mean(np.abs(out - 0.123456789) > b * math.log(10)) == pytest.approx(0.1, abs=0.005)


def test_gaussian_mechanism_variance(rand):
    out = gaussian_mechanism(rand, np.zeros((60000, 2)), 2.0, GridGaussian.calibrate(0.05, 2))
    sigma = gaussian_sigma(2.0, 0.05, d=2)
    assert sigma >= 2.0 / math.sqrt(2 * 0.05)  # never less noise than the target
    assert sigma == pytest.approx(2.0 / math.sqrt(0.1), rel=0.01)
    assert out.var(axis=0) == pytest.approx([sigma**2] * 2, rel=0.03)


def test_tiny_rho_is_refused(rand):
    with pytest.raises(ValueError, match="too small"):  # by the calibration the sampler takes
        GridGaussian.calibrate(1e-9, 1)


def test_sources():
    a, b = SeededRandomness(5).words(10), SeededRandomness(5).words(10)
    assert np.array_equal(a, b)
    os_words = OSRandomness().words(100000)
    assert os_words.dtype == np.uint64 and len(np.unique(os_words)) == 100000
    # top bit of OS words is a fair coin
    assert abs(np.mean(os_words >> np.uint64(63)) - 0.5) < 0.01


def test_bad_inputs(rand):
    with pytest.raises(ValueError):
        laplace_mechanism(rand, np.array([[np.nan]]), 1.0, GridLaplace.calibrate(1.0))
    with pytest.raises(ValueError):
        laplace_mechanism(rand, np.array([[0.0]]), 0.0, GridLaplace.calibrate(1.0))
    with pytest.raises(ValueError, match="calibrated noise"):  # a bare ε reaches no sampler
        laplace_mechanism(rand, np.array([[0.0]]), 1.0, 1.0)
    with pytest.raises(ValueError):
        rand.below(np.array([0]))
