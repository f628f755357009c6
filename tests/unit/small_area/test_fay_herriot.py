"""The Fay–Herriot fit on data drawn from the model itself: it recovers what it should."""

import numpy as np
import pytest

from dpatlas.small_area import fay_herriot as fh

BETA = np.array([0.4, 0.8])
SIGMA2 = 0.01


def simulate(seed: int, m: int = 1500):
    """(y, X, D, θ): FH data with sampling variances spread over two decades."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(m), rng.uniform(0, 1, m)])
    D = SIGMA2 * 10 ** rng.uniform(-1, 1, m)
    theta = X @ BETA + rng.normal(0, np.sqrt(SIGMA2), m)
    return theta + rng.normal(0, np.sqrt(D)), X, D, theta


def test_fit_recovers_beta_and_sigma2_within_their_standard_errors_over_seeds():
    z_beta, z_s2 = [], []
    for seed in range(20):
        y, X, D, _ = simulate(seed)
        f = fh.fit(y, X, D)
        z_beta.append((f.beta - BETA) / np.sqrt(np.diag(f.beta_cov)))
        z_s2.append((f.sigma2 - SIGMA2) / np.sqrt(f.sigma2_var))
    z_beta, z_s2 = np.array(z_beta), np.array(z_s2)
    # standardised errors: centred, unit spread, none beyond 4 (theory: N(0, 1) asymptotically)
    assert np.all(np.abs(z_beta) < 4) and np.all(np.abs(z_s2) < 4)
    assert abs(z_beta.mean()) < 0.6 and abs(z_s2.mean()) < 0.6
    assert 0.5 < z_beta.std() < 1.6 and 0.5 < z_s2.std() < 1.6


def test_plain_reml_may_reach_zero_where_the_adjusted_fit_stays_positive():
    rng = np.random.default_rng(3)
    m = 200
    X = np.ones((m, 1))
    D = np.full(m, 1.0)
    y = rng.normal(0, 1, m) * 0.8  # less spread than the sampling variance alone
    assert fh.fit(y, X, D, adjusted=False).sigma2 == 0.0
    assert fh.fit(y, X, D).sigma2 > 0.0


@pytest.mark.parametrize("seed", [1, 2])
def test_eblup_is_the_direct_when_the_sampling_variance_vanishes_and_the_synthetic_when_it_explodes(seed):
    y, X, D, _ = simulate(seed)
    f = fh.fit(y, X, D)
    tiny, huge = np.full(len(y), 1e-12), np.full(len(y), 1e12)
    est, mse = fh.eblup(f, X, y, tiny)
    assert np.allclose(est, y, atol=1e-8) and np.all(mse < 1e-9)
    est, mse = fh.eblup(f, X, y, huge)
    synthetic = X @ f.beta
    assert np.allclose(est, synthetic, atol=1e-8)
    g2 = np.einsum("ij,jk,ik->i", X, f.beta_cov, X)
    assert np.allclose(mse, f.sigma2 + g2, rtol=1e-6)
    # no direct at all: the synthetic estimate, with the same MSE
    est_none, mse_none = fh.eblup(f, X)
    assert np.allclose(est_none, synthetic) and np.allclose(mse_none, f.sigma2 + g2)


def test_eblup_intervals_cover_near_nominal_on_model_data():
    hits = []
    for seed in range(10, 15):
        y, X, D, theta = simulate(seed, m=2000)
        est, mse = fh.eblup(fh.fit(y, X, D), X, y, D)
        hits.append(np.abs(est - theta) <= 1.959964 * np.sqrt(mse))
    coverage = np.concatenate(hits).mean()
    assert 0.94 <= coverage <= 0.96, coverage


def test_eblup_beats_the_direct_and_the_synthetic_on_model_data():
    y, X, D, theta = simulate(7)
    f = fh.fit(y, X, D)
    est, _ = fh.eblup(f, X, y, D)
    mse = lambda a: np.mean((a - theta) ** 2)
    assert mse(est) < mse(y) and mse(est) < mse(X @ f.beta)


def test_fit_refuses_bad_input():
    y, X, D, _ = simulate(0, m=20)
    with pytest.raises(ValueError, match="D > 0"):
        fh.fit(y, X, np.zeros_like(D))
    with pytest.raises(ValueError, match="one row per area"):
        fh.fit(y[:-1], X, D)
