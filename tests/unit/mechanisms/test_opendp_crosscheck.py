"""Our exact samplers against an independent implementation: OpenDP's discrete Laplace and
discrete Gaussian (its integer-domain ``make_laplace`` / ``make_gaussian``, exact samplers after
Canonne, Kamath and Steinke 2020, like ours). test_noise.py checks our draws against the
closed-form PMFs; this checks that our parametrisation means what OpenDP's does (P(k) ∝
exp(-|k|/scale) and exp(-k²/(2σ²))), with a two-sample chi-square test. OpenDP draws from the
OS's randomness, so its half is not seeded: the thresholds (p > 1e-4) leave a chance of a false
alarm of 1 in 10,000 per case; a wrong scale (the last test) gives p far below 1e-12."""

from __future__ import annotations

import math

import numpy as np
import opendp.prelude as dp  # the test extra (pyproject.toml), pinned in requirements.lock
import pytest
from scipy import stats

from mechanisms.noise import discrete_gaussian, discrete_laplace

dp.enable_features("contrib")

N = 60_000


def opendp_discrete_laplace(scale: float, n: int = N) -> np.ndarray:
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int)
    return np.asarray(dp.m.make_laplace(*space, scale=scale)([0] * n))


def opendp_discrete_gaussian(sigma: float, n: int = N) -> np.ndarray:
    space = dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int)
    return np.asarray(dp.m.make_gaussian(*space, scale=sigma)([0] * n))


def two_sample_pvalue(a: np.ndarray, b: np.ndarray) -> float:
    """Chi-square test that two integer samples share a distribution (bins of >= 20 draws
    each, the tails pooled)."""
    values = np.concatenate([a, b])
    lo, hi = np.quantile(values, [0.001, 0.999]).astype(int)
    edges = np.arange(lo, hi + 2)
    table = np.array([np.histogram(np.clip(x, lo - 1, hi + 1), np.r_[-np.inf, edges, np.inf])[0]
                      for x in (a, b)])
    table = table[:, table.min(axis=0) >= 20]
    return stats.chi2_contingency(table).pvalue


@pytest.mark.parametrize("scale_num,scale_den", [(640, 256), (256 * 12, 256), (100, 256)])
def test_discrete_laplace_matches_opendp(rand, scale_num, scale_den):
    ours = discrete_laplace(rand, np.full(N, scale_num), scale_den)
    theirs = opendp_discrete_laplace(scale_num / scale_den)
    assert two_sample_pvalue(ours, theirs) > 1e-4
    assert ours.var() == pytest.approx(theirs.var(), rel=0.05)


@pytest.mark.parametrize("sigma2", [2, 9, 400])
def test_discrete_gaussian_matches_opendp(rand, sigma2):
    ours = discrete_gaussian(rand, np.full(N, sigma2))
    theirs = opendp_discrete_gaussian(math.sqrt(sigma2))
    assert two_sample_pvalue(ours, theirs) > 1e-4
    assert ours.var() == pytest.approx(theirs.var(), rel=0.05)


def test_the_cross_check_sees_a_wrong_scale(rand):
    ours = discrete_laplace(rand, np.full(N, 640), 256)  # scale 2.5
    assert two_sample_pvalue(ours, opendp_discrete_laplace(3.0)) < 1e-12
    ours = discrete_gaussian(rand, np.full(N, 9))  # sigma 3
    assert two_sample_pvalue(ours, opendp_discrete_gaussian(3.6)) < 1e-12
