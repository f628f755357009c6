"""ModulatedLR (mechanisms/modulated.py): the paper's unbiasedness claim for the debiased
moments (against the truth, with a test that can fail and does on a broken debiasing), the
client messages' noise against its calibration, its NOT-DP status (refused by a real meter and
on the release path), both calls, failures and accuracy at a large budget."""

import contextlib
import math

import numpy as np
import pytest
from scipy import stats

import mechanisms as M
from mechanisms import modulated  # registers ModulatedLR until mechanisms/__init__.py does
from mechanisms.batch import TractBatch, ols, sufficient_stats
from mechanisms.modulated import (Protocol, client_messages, client_noise, noise_variance, solve)
from mechanisms.noise import SeededRandomness
from mechanisms.privacy import NotDP, PureDP, rho_for_approx

from tests.support.inputs import line_tract

NAME = "ModulatedLR"
PROTOCOL = Protocol.of(M.get(NAME).hyper({}))
Z = 4.5  # two-sided z bound per comparison: ~7e-6 false alarms each


def _batch(*tracts):
    labels = np.concatenate([np.full(len(x), i) for i, (x, _) in enumerate(tracts)])
    return TractBatch.from_labels(labels, np.concatenate([t[0] for t in tracts]),
                                  np.concatenate([t[1] for t in tracts]))


def _truth(x, y):
    """The paper's targets for u = (1, x): Σ_x = mean(u uᵀ), Γ = mean(y u)."""
    return {"cov_11": 1.0, "cov_12": x.mean(), "cov_22": np.mean(x * x),
            "moment_1": y.mean(), "moment_2": np.mean(x * y)}


def _z_scores(res, truth):
    """Per moment, (mean over runs − truth) / its standard error."""
    out = {}
    for key, value in truth.items():
        v = res.extras[key][:, 0]
        out[key] = (v.mean() - value) / (v.std(ddof=1) / math.sqrt(v.size))
    return out


# --- 1. the unbiasedness claim: E[Σ̂] = Σ_x and E[Γ̂] = Γ given the data (eqs. 9, 10–12) -----

UNBIASED_REPS = 20_000


@pytest.fixture(scope="module")
def unbiased_data():
    return line_tract(40, seed=12)


@pytest.fixture(scope="module")
def unbiased_runs(unbiased_data):
    x, y = unbiased_data
    return {eps: M.estimate_batch(NAME, TractBatch.single(x, y), eps, seed=int(eps),
                                  reps=UNBIASED_REPS) for eps in (2.0, 8.0)}


@pytest.mark.parametrize("eps", [2.0, 8.0])
def test_debiased_moments_are_unbiased(unbiased_data, unbiased_runs, eps):
    z = _z_scores(unbiased_runs[eps], _truth(*unbiased_data))
    assert all(abs(v) < Z for v in z.values()), z


def test_unbiasedness_test_catches_a_broken_debiasing(unbiased_data, monkeypatch):
    # The same test on a server that forgets to subtract the noise variance σ² is refused...
    x, y = unbiased_data
    monkeypatch.setattr(modulated, "noise_variance", lambda noise, protocol: 0.0)
    res = M.estimate_batch(NAME, TractBatch.single(x, y), 8.0, seed=8, reps=UNBIASED_REPS)
    z = _z_scores(res, _truth(x, y))
    assert z["cov_11"] > Z and z["cov_22"] > Z, z


def test_unbiasedness_test_would_see_the_modulation_term(unbiased_runs):
    # ... and one that forgot the modulation's (λ²/2)vvᵀ would be off by λ²/(2(1 − α)²) in
    # Σ̂₂₂: many standard errors at these settings.
    v = unbiased_runs[8.0].extras["cov_22"][:, 0]
    missing = PROTOCOL.amplitude**2 / 2 / (1 - PROTOCOL.alpha) ** 2
    assert missing > 3 * Z * v.std(ddof=1) / math.sqrt(v.size)


# --- 2. the client messages: the calibrated noise and the modulation ------------------------


def _variance_p_value(residuals, variance):
    stat = float(np.sum(residuals**2) / variance)
    cdf = stats.chi2.cdf(stat, residuals.size)
    return 2 * min(cdf, 1 - cdf)


def test_client_messages_have_the_calibrated_noise_and_modulation():
    eps, reps = 3.0, 2000
    x = np.array([0.0, 0.3, 1.0])
    noise = client_noise(eps, 1e-6, PROTOCOL)
    var = noise_variance(noise, PROTOCOL)
    h = client_messages(x, PROTOCOL, noise, SeededRandomness(4), reps)
    a = 1 - PROTOCOL.alpha
    # Coordinate 1 (orthogonal to v): (1 − α) plus the Gaussian alone, variance σ².
    r1 = (h[..., 0] - a).ravel()
    assert abs(r1.mean()) < Z * math.sqrt(var / r1.size)
    assert _variance_p_value(r1, var) > 1e-3
    # Coordinate 2 (along v): (1 − α)x + λcos(·) + noise: mean (1 − α)x, variance σ² + λ²/2.
    r2 = h[..., 1] - a * x
    target = var + PROTOCOL.amplitude**2 / 2
    assert np.all(np.abs(r2.mean(axis=0)) < Z * math.sqrt(target / reps))
    # the variance of a variance estimate: (μ4 − σ⁴)/N with μ4 = 3σ⁴ + 6σ²·λ²/2 + 3λ⁴/8
    mu4 = 3 * var**2 + 6 * var * PROTOCOL.amplitude**2 / 2 + 3 * PROTOCOL.amplitude**4 / 8
    se = math.sqrt((mu4 - target**2) / r2.size)
    assert abs(np.mean(r2**2) - target) < Z * se


def test_client_noise_is_the_papers_section_4_calibration():
    for eps in (0.5, 1.0, 8.0):
        noise = client_noise(eps, 1e-6, PROTOCOL)
        rho = rho_for_approx(eps, 1e-6)
        # σ² = L²/(2ρ), up to the grid's rounding (factor (1 + √2/steps)², σ² rounded up)
        ratio = noise_variance(noise, PROTOCOL) / (PROTOCOL.lipschitz**2 / (2 * rho))
        assert 1.0 <= ratio <= (1 + math.sqrt(2) / noise.grid_steps) ** 2 * (1 + 1e-6)
    assert PROTOCOL.lipschitz == pytest.approx(0.7)  # contractive: L < 1


@contextlib.contextmanager
def recorded_draws(calls):
    original = modulated.gaussian_mechanism

    def wrapped(rand, values, sens, noise):
        calls.append((noise, np.shape(values), float(sens)))
        return original(rand, values, sens, noise)

    modulated.gaussian_mechanism = wrapped
    try:
        yield
    finally:
        modulated.gaussian_mechanism = original


def test_a_run_draws_one_calibrated_message_per_record_and_rep():
    calls = []
    batch = _batch(line_tract(30, seed=1), line_tract(12, seed=2), (np.array([0.4]),
                                                                     np.array([0.6])))
    with recorded_draws(calls):
        M.estimate_batch(NAME, batch, 2.0, seed=1, reps=3)
    noise = client_noise(2.0, 1e-6, PROTOCOL)
    # the tract of one record draws nothing; 42 records × 3 reps, 2 coordinates each
    assert calls == [(noise, (3, 42, 2), PROTOCOL.lipschitz)]


# --- 3. NOT DP: labelled, refused by a real meter and by the release path ------------------


def test_not_dp_and_not_publishable():
    est = M.get(NAME)
    g = est.guarantee(1.0)
    assert isinstance(g, NotDP) and "x only" in g.reason and "y" in g.reason
    assert not est.private and not est.publishable
    assert "(x, y)" in est.not_publishable_reason
    assert est.noise_steps(1.0) == []  # no privacy map describes it for (x, y)
    x, y = line_tract(20)
    with pytest.raises(M.NotPublishable, match="ModulatedLR cannot be published"):
        M.estimate_batch(NAME, TractBatch.single(x, y), 1.0, publishable_only=True)


def test_a_real_meter_refuses_it_before_any_draw():
    x, y = line_tract(20)
    batch = TractBatch.single(x, y)
    f = M.PrivacyFilter({"suite": PureDP(100.0)}, batch.labels)
    calls = []
    with recorded_draws(calls), pytest.raises(M.BudgetOverrun, match="non-private draw"):
        M.estimate_batch(NAME, batch, 1.0, seed=1, meter=f.meter("suite"))
    assert calls == []


# --- 4. both calls, failures, hyperparameters, accuracy ------------------------------------


def test_one_tract_and_batched_calls_agree():
    x, y = line_tract(300, seed=7)
    one = M.estimate(NAME, x, y, 50.0, seed=3)
    batch = M.estimate_batch(NAME, TractBatch.single(x, y), 50.0, seed=3)
    assert isinstance(one.guarantee, NotDP) and one.guarantee == batch.guarantee
    assert one.p25 == batch.p25[0] and one.p75 == batch.p75[0] and not one.failed
    assert set(one.extras) == {"cov_11", "cov_12", "cov_22", "moment_1", "moment_2"}
    many = M.estimate_batch(NAME, _batch((x, y), (np.array([0.5]), np.array([0.5])),
                                         line_tract(30, seed=8)), 50.0, seed=3, reps=7)
    assert many.p25.shape == many.failed.shape == many.extras["cov_12"].shape == (7, 3)
    assert many.failed[:, 1].all() and set(many.reason[:, 1]) == {"fewer than 2 records"}
    assert np.isfinite(many.p25[:, 0]).all()


def test_an_indefinite_covariance_fails_without_a_value():
    m = modulated.Moments(np.array([1.0, 1.0, 1.0]), np.array([0.5, 0.5, 0.5]),
                          np.array([-0.1, 0.25, 0.4]), np.array([0.5, 0.5, 0.5]),
                          np.array([0.3, 0.3, 0.3]))
    fit = solve(m, 0.0)
    assert fit.ok.tolist() == [False, False, True] and np.isnan(fit.slope[:2]).all()
    assert solve(m, 1.0).ok.all()  # a ridge makes them definite
    # At ε = 1 on 200 people the local noise makes most runs fail, each without a value.
    x, y = line_tract(200, seed=1)
    res = M.estimate_batch(NAME, TractBatch.single(x, y), 1.0, seed=2, reps=200)
    failed = res.failed[:, 0]
    assert failed.mean() > 0.2
    assert np.isnan(res.p25[failed, 0]).all() and np.isfinite(res.p25[~failed, 0]).all()
    assert set(res.reason[failed, 0]) == {"debiased covariance (+ ridge) is not positive "
                                          "definite"}
    with_ridge = M.estimate_batch(NAME, TractBatch.single(x, y), 1.0, seed=2, reps=200,
                                  ridge=1.0)
    assert with_ridge.failed.mean() < failed.mean()


def test_bad_hyperparameters_are_refused():
    x, y = line_tract(20)
    for hp, match in (({"alpha": 1.0}, "alpha must lie"), ({"alpha": 0.0}, "alpha must lie"),
                      ({"amplitude": 0.0}, "must be > 0"), ({"frequency": -1.0}, "must be > 0"),
                      ({"ridge": -0.1}, "ridge must be"), ({"ridge": math.nan}, "finite"),
                      ({"default_delta": 1.0}, "delta must lie"), ({"v": 1}, "unknown")):
        with pytest.raises(ValueError, match=match):
            M.estimate(NAME, x, y, 1.0, **hp)
    with pytest.raises(ValueError, match="too little for the grid Gaussian"):
        M.estimate(NAME, x, y, 1e-4)


def test_close_to_ols_at_a_large_budget():
    rng = np.random.default_rng(9)
    tracts = [line_tract(int(n), seed=s) for s, n in enumerate(rng.integers(500, 1500, 8))]
    batch = _batch(*tracts)
    target = ols(sufficient_stats(batch)).p25
    err = {eps: np.abs(M.estimate_batch(NAME, batch, eps, seed=2, reps=10).p25 - target)
           for eps in (8.0, 200.0)}
    assert np.median(err[200.0]) < 0.01
    assert np.median(err[200.0]) < np.nanmedian(err[8.0])
