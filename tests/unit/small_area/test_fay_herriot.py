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


# ---------------------------------------------------------------------------------------------
# Bounded influence (robust_beta, robust_fit, robust_eblup)


def simulate_laplace(seed: int, m: int = 1500, outliers: float = 0.0):
    """FH data whose sampling errors are Laplace with variance D (heavy-tailed, as DP noise),
    a share ``outliers`` of them times 10."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(m), rng.uniform(0, 1, m)])
    D = SIGMA2 * 10 ** rng.uniform(-1, 1, m)
    theta = X @ BETA + rng.normal(0, np.sqrt(SIGMA2), m)
    e = rng.laplace(0, np.sqrt(D / 2), m) * np.where(rng.uniform(size=m) < outliers, 10.0, 1.0)
    return theta + e, X, D, theta


def test_robust_beta_is_gls_without_a_bound_and_recovers_beta_on_model_data():
    y, X, D, _ = simulate(4)
    f = fh.fit(y, X, D)
    V = f.sigma2 + D
    assert np.allclose(fh.robust_beta(y, X, V, b=np.inf), f.beta, rtol=0, atol=1e-10)
    z = []
    for seed in range(20):
        y, X, D, _ = simulate(seed)
        r = fh.robust_fit(y, X, D)
        z.append((r.beta - BETA) / np.sqrt(np.diag(r.beta_cov)))
        assert r.sigma2 == fh.fit(y, X, D).sigma2  # σ² is REML's
    z = np.array(z)
    assert np.all(np.abs(z) < 4) and abs(z.mean()) < 0.6 and 0.5 < z.std() < 1.6


def test_robust_eblup_weights_are_the_eblup_weights_bounded_by_huber():
    y, X, D, _ = simulate(5)
    f = fh.fit(y, X, D)
    est, w = fh.robust_eblup(f, X, y, D)
    gamma = f.sigma2 / (f.sigma2 + D)
    z = (y - X @ f.beta) / np.sqrt(f.sigma2 + D)
    inside = np.abs(z) <= fh.HUBER_B
    assert inside.mean() > 0.7 and (~inside).sum() > 20
    assert np.allclose(w[inside], gamma[inside])
    assert np.allclose(w[~inside], gamma[~inside] * fh.HUBER_B / np.abs(z[~inside]))
    # inside the bound it is the EBLUP; beyond it the direct moves it by at most b·γ·√V
    plain, _ = fh.eblup(f, X, y, D)
    assert np.allclose(est[inside], plain[inside])
    step = np.abs(est - X @ f.beta)
    assert np.all(step <= fh.HUBER_B * gamma * np.sqrt(f.sigma2 + D) + 1e-12)
    # no direct, or σ² = 0: the synthetic estimate, weight 0
    y_none = np.where(np.arange(len(y)) % 2 == 0, np.nan, y)
    est, w = fh.robust_eblup(f, X, y_none, np.where(np.isnan(y_none), np.inf, D))
    assert np.allclose(est[::2], (X @ f.beta)[::2]) and np.all(w[::2] == 0)
    zero = fh.FayHerriotFit(f.beta, f.beta_cov, 0.0, f.sigma2_var, f.areas)
    est, w = fh.robust_eblup(zero, X, y, D)
    assert np.allclose(est, X @ f.beta) and np.all(w == 0)


def test_robust_eblup_beats_the_eblup_under_heavy_tailed_noise():
    """Laplace sampling errors with 3% outliers: the bounded-influence EBLUP's error against
    θ is smaller than the EBLUP's on every seed."""
    gains = []
    for seed in range(30, 36):
        y, X, D, theta = simulate_laplace(seed, outliers=0.03)
        f, r = fh.fit(y, X, D), fh.robust_fit(y, X, D)
        plain, _ = fh.eblup(f, X, y, D)
        robust, _ = fh.robust_eblup(r, X, y, D)
        gains.append(np.mean((plain - theta) ** 2) - np.mean((robust - theta) ** 2))
    assert min(gains) > 0, gains
