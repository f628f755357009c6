"""Sampling variances estimated from the directs themselves (not given), as ``fit_model``
must: the rate-shaped variance function separates the model's own error σ² from D, and the
intervals built on it cover on Fay–Herriot data."""

import numpy as np
import pytest

from dpatlas.small_area import fay_herriot as fh
from dpatlas.small_area.model import sampling_variance, variance_function

SIGMA2 = 0.0015  # the p25 truth's variance about the synthetic estimate in the generator
A, C = 4.0, 0.15  # DP noise ~ 1/n², sampling ~ 1/n: D spans 0.04 (n = 10) to 0.001 (n = 300)


def simulate(seed: int, m: int = 3000, a: float = A):
    """(y, X, n, D, θ): FH data whose D_i follow the mechanisms' rates in the public n."""
    rng = np.random.default_rng(seed)
    n = np.exp(rng.uniform(np.log(8), np.log(400), m))
    X = np.column_stack([np.ones(m), rng.uniform(0.3, 0.5, m)])
    D = a / n ** 2 + C / n
    theta = X @ np.array([0.0, 1.0]) + rng.normal(0, np.sqrt(SIGMA2), m)
    return theta + rng.normal(0, np.sqrt(D)), X, n, D, theta


def estimated_variances(y, X, n):
    """(τ, D) from the squared residuals about the least-squares fit, as the model does."""
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    tau, params = variance_function((y - X @ beta) ** 2, n, np.full(len(y), "all"))
    return tau, sampling_variance(params["all"], n)


def test_variance_function_recovers_tau_and_both_rates_from_exact_bin_means():
    n = np.repeat(np.geomspace(5, 500, 10), 50)
    resid2 = SIGMA2 + A / n ** 2 + C / n  # each bin's mean is exactly the curve
    tau, params = variance_function(resid2, n, np.full(len(n), "NoisyStats"))
    a, c, cap = params["NoisyStats"]
    assert tau == pytest.approx(SIGMA2, rel=1e-3)
    assert a == pytest.approx(A, rel=1e-3) and c == pytest.approx(C, rel=1e-3)
    assert cap == pytest.approx(resid2.max())


def test_sigma2_on_estimated_d_is_the_model_error_within_its_sampling_spread():
    ratios = []
    for seed in range(5):
        y, X, n, _, _ = simulate(seed)
        _, D = estimated_variances(y, X, n)
        ratios.append(fh.fit(y, X, D).sigma2 / SIGMA2)
    assert 0.6 < np.median(ratios) < 1.6 and min(ratios) > 0.4, ratios


def test_intervals_on_estimated_d_cover_near_nominal_overall_and_by_size():
    hits, small = [], []
    for seed in range(10, 14):
        y, X, n, _, theta = simulate(seed)
        _, D = estimated_variances(y, X, n)
        est, mse = fh.eblup(fh.fit(y, X, D), X, y, D)
        hit = np.abs(est - theta) <= 1.959964 * np.sqrt(mse)
        hits.append(hit)
        small.append(hit[n < np.quantile(n, 0.2)])
    assert 0.93 <= np.concatenate(hits).mean() <= 0.97
    assert np.concatenate(small).mean() >= 0.92


def test_mse_of_weights_is_prasad_rao_at_the_fitted_weights_and_grows_with_sigma2():
    y, X, n, D, _ = simulate(3, m=500)
    f = fh.fit(y, X, D)
    _, mse = fh.eblup(f, X, y, D)
    gamma = f.sigma2 / (f.sigma2 + D)
    same = fh.mse_of_weights(gamma, D, fh.synthetic_variance(f, X), f.sigma2, f.sigma2_var)
    assert np.allclose(same, mse, rtol=1e-10)
    larger = fh.mse_of_weights(gamma, D, fh.synthetic_variance(f, X), 4 * f.sigma2,
                               f.sigma2_var)
    assert np.all(larger > mse)
    # no direct: γ = 0 and D = 0 give the synthetic estimate's σ² + g2
    none = fh.mse_of_weights(np.zeros(3), np.zeros(3), np.full(3, 1e-4), f.sigma2, 1.0)
    assert np.allclose(none, f.sigma2 + 1e-4)
