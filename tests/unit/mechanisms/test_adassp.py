"""AdaSSP (mechanisms/adassp.py): the sensitivities against brute force, the released noise
against its calibration, the derived (ε, δ) guarantee, the meter, empirical audits that catch
half the noise or a halved sensitivity, both calls, failures, and accuracy against OLS."""

import contextlib
import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

import mechanisms as M
from mechanisms import adassp  # registers AdaSSP until mechanisms/__init__.py imports it
from mechanisms.adassp import (GRAM, LAMBDA_MIN, MOMENT, SENSITIVITY, STEP_NAMES, gram,
                               noise_sd, release, ridge, solve_ridge)
from mechanisms.batch import TractBatch, ols, sufficient_stats
from mechanisms.noise import SeededRandomness
from mechanisms.privacy import ApproxDP, ZCDP, to_approx
from mechanisms.privacy_maps import GridGaussian, NoiseStep, compose

from tests.support.empirical_audit import audit_sample, budget_scaled
from tests.support.inputs import line_tract

NAME = "AdaSSP"
LOOSE = 1e-3


def _steps(eps, delta=None, **hp):
    return {s.name: s for s in M.get(NAME).noise_steps(eps, delta, **hp)}


def _batch(*tracts):
    labels = np.concatenate([np.full(len(x), i) for i, (x, _) in enumerate(tracts)])
    x = np.concatenate([t[0] for t in tracts])
    y = np.concatenate([t[1] for t in tracts])
    return TractBatch.from_labels(labels, x, y)


# --- 1. the sensitivities, by brute force over neighbours -----------------------------------


def _stats_of(x, y):
    g = gram(TractBatch.single(x, y), np.array([0]))
    return (g.lambda_min[0], np.array([g.sum_x[0], g.sum_xx[0]]),
            np.array([g.sum_y[0], g.sum_xy[0]]))


def _all_stats(x, y):
    """(λ_min, (Σx, Σx²), (Σy, Σxy)) of every row of x, y (datasets of equal size)."""
    trials, n = x.shape
    batch = TractBatch(x.ravel(), y.ravel(), np.arange(0, trials * n + 1, n),
                       np.arange(trials))
    g = gram(batch, np.arange(trials))
    return (g.lambda_min, np.stack([g.sum_x, g.sum_xx], 1), np.stack([g.sum_y, g.sum_xy], 1))


def _neighbour_changes(rng, n, trials):
    """Largest change of each statistic over random replace-one neighbours, half of them
    built from the corners {0, 1} where the bounds are attained."""
    corner = rng.integers(0, 2, (trials, n, 2)).astype(float)
    x, y = np.where(np.arange(trials)[:, None] % 2 == 0, rng.uniform(size=(2, trials, n)),
                    np.moveaxis(corner, 2, 0))
    x2, y2 = x.copy(), y.copy()
    who = rng.integers(n, size=trials)
    rows = np.arange(trials)
    x2[rows, who] = np.where(rows % 2 == 0, rng.uniform(size=trials), rng.integers(0, 2, trials))
    y2[rows, who] = np.where(rows % 2 == 0, rng.uniform(size=trials), rng.integers(0, 2, trials))
    a, b = _all_stats(x, y), _all_stats(x2, y2)
    return np.array([np.abs(a[0] - b[0]).max(), np.linalg.norm(a[1] - b[1], axis=1).max(),
                     np.linalg.norm(a[2] - b[2], axis=1).max()])


@pytest.mark.parametrize("n", [2, 3, 7, 40])
def test_sensitivities_bound_every_neighbour(n):
    worst = _neighbour_changes(np.random.default_rng(n), n, 50_000)
    bounds = np.array([SENSITIVITY[LAMBDA_MIN], SENSITIVITY[GRAM], SENSITIVITY[MOMENT]])
    # 1e-9: tract_sum's cumulative sums over a 50,000-tract batch carry ~1e-10 of rounding
    assert np.all(worst <= bounds + 1e-9), (worst, bounds)


def test_sensitivities_are_attained():
    # λ_min: n − 1 records at x = 0, one moved from 0 to 1: 0 → 1 − O(1/n).
    n = 2000
    x, y = np.zeros(n), np.zeros(n)
    x1 = x.copy()
    x1[0] = 1.0
    y1 = y.copy()
    y1[0] = 1.0
    a, b = _stats_of(x, y), _stats_of(x1, y1)
    assert a[0] == 0.0 and 0.999 < b[0] - a[0] <= 1.0
    assert np.linalg.norm(b[1] - a[1]) == pytest.approx(math.sqrt(2), rel=1e-12)
    assert np.linalg.norm(b[2] - a[2]) == pytest.approx(math.sqrt(2), rel=1e-12)


def test_gram_matches_numpy():
    x, y = line_tract(50, seed=4)
    lam, xx, xy = _stats_of(x, y)
    u = np.stack([np.ones_like(x), x], axis=1)
    assert lam == pytest.approx(np.linalg.eigvalsh(u.T @ u)[0], rel=1e-9)
    assert np.allclose(xx, [(u.T @ u)[0, 1], (u.T @ u)[1, 1]])
    assert np.allclose(xy, u.T @ y)
    # every x equal: XᵀX is singular, and the stable formula gives exactly 0
    assert _stats_of(np.full(9, 0.3), y[:9])[0] == pytest.approx(0.0, abs=1e-12)


# --- 2. the released statistics have the calibrated discrete-Gaussian variance -------------


def _variance_p_value(residuals, variance):
    """Two-sided p-value of Σr²/σ² ~ χ²(n) (the noise mean is known to be 0)."""
    stat = float(np.sum(residuals**2) / variance)
    cdf = stats.chi2.cdf(stat, residuals.size)
    return 2 * min(cdf, 1 - cdf)


def test_released_noise_has_the_calibrated_variance():
    x, y = line_tract(300, seed=5)
    reps, eps = 4000, 1.5
    steps = _steps(eps)
    res = M.estimate_batch(NAME, TractBatch.single(x, y), eps, seed=11, reps=reps)
    lam, xx, xy = _stats_of(x, y)
    truth = {"noisy_lambda_min": (lam, LAMBDA_MIN), "noisy_sum_x": (xx[0], GRAM),
             "noisy_sum_xx": (xx[1], GRAM), "noisy_sum_y": (xy[0], MOMENT),
             "noisy_sum_xy": (xy[1], MOMENT)}
    for key, (value, step) in truth.items():
        resid = res.extras[key][:, 0] - value
        sd = noise_sd(steps[step])
        unit = SENSITIVITY[step] / steps[step].noise.grid_steps
        # rounding to the grid moves the centre by at most half a unit, far below the sd
        assert abs(resid.mean()) < 4 * sd / math.sqrt(reps) + unit, key
        assert _variance_p_value(resid, sd**2) > 1e-3, (key, resid.var() / sd**2)


def test_variance_test_can_fail():
    rng = np.random.default_rng(0)
    assert _variance_p_value(rng.normal(0, 1.1, 4000), 1.0) < 1e-3  # 10% more noise: caught


def test_noise_sd_is_the_maps_sigma():
    for step in _steps(2.0).values():
        g = step.noise
        rho = g.guarantee().rho
        # σ in data units is Δ·(1 + √dims/steps)/√(2ρ): the map's ρ, with the rounding term
        assert noise_sd(step) == pytest.approx(
            SENSITIVITY[step.name] * (g.grid_steps + math.sqrt(g.dims)) / g.grid_steps
            / math.sqrt(2 * rho), rel=1e-12)


# --- 3. the guarantee is derived from the noise, fits the budget and follows δ --------------


@pytest.mark.parametrize("eps", [0.1, 1.0, 8.0, 50.0])
@pytest.mark.parametrize("delta", [1e-6, 1e-9])
def test_guarantee_is_the_composition_and_fits_the_budget(eps, delta):
    est = M.get(NAME)
    steps = est.noise_steps(eps, delta)
    assert [s.name for s in steps] == list(STEP_NAMES)
    assert all(s.mechanism == "grid-gaussian" for s in steps)
    g = est.guarantee(eps, delta)
    assert g == to_approx(compose(steps), delta)
    assert isinstance(g, ApproxDP) and g.delta == delta
    assert eps * (1 - LOOSE) <= g.epsilon <= eps
    # Wang's split: equal thirds of ρ
    rhos = [s.guarantee.rho for s in steps]
    assert max(rhos) / min(rhos) < 1 + 1e-3


def test_guarantee_follows_delta_and_hyperparameters():
    est = M.get(NAME)
    assert est.guarantee(1.0) == est.guarantee(1.0, 1e-6)  # the default δ
    loose, tight = est.guarantee(1.0, 1e-3), est.guarantee(1.0, 1e-9)
    assert loose.delta == 1e-3 and tight.delta == 1e-9
    # a smaller δ buys the same ε with more noise
    assert (est.noise_steps(1.0, 1e-9)[0].noise.sigma2
            > est.noise_steps(1.0, 1e-3)[0].noise.sigma2)
    assert est.guarantee(1.0, default_delta=1e-8).delta == 1e-8


def test_guarantee_follows_a_changed_calibration(monkeypatch):
    # Halve every step's σ² after calibration: the guarantee, computed from the steps, grows.
    est = M.get(NAME)
    original = adassp.adassp_steps

    def louder(epsilon, delta, hp):
        return [NoiseStep(s.name, GridGaussian(s.noise.grid_steps, s.noise.dims,
                                               s.noise.sigma2 // 2), s.sensitivity)
                for s in original(epsilon, delta, hp)]

    monkeypatch.setattr(adassp, "adassp_steps", louder)
    assert est.guarantee(1.0).epsilon > 1.3


def test_bad_budgets_and_hyperparameters_are_refused():
    x, y = line_tract(30)
    with pytest.raises(ValueError, match="too little for the grid Gaussian"):
        M.get(NAME).guarantee(1e-4)
    with pytest.raises(ValueError, match="fail_prob must lie"):
        M.estimate(NAME, x, y, 1.0, fail_prob=1.0)
    with pytest.raises(ValueError, match="delta must lie"):
        M.estimate(NAME, x, y, 1.0, default_delta=0.0)
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        M.estimate(NAME, x, y, 1.0, ridge=3.0)


# --- 4. every draw is a calibrated step, paid from the meter first --------------------------


@contextlib.contextmanager
def recorded_draws(calls):
    original = adassp.gaussian_mechanism

    def wrapped(rand, values, sens, noise):
        calls.append((noise, np.shape(values)[-1], float(sens)))
        return original(rand, values, sens, noise)

    adassp.gaussian_mechanism = wrapped
    try:
        yield
    finally:
        adassp.gaussian_mechanism = original


def test_runs_draw_exactly_their_noise_steps():
    eps, delta = 2.0, 1e-7
    steps = M.get(NAME).noise_steps(eps, delta)
    calls = []
    x, y = line_tract(40, seed=2)
    with recorded_draws(calls):
        M.estimate_batch(NAME, _batch((x, y), line_tract(9, seed=3)), eps, delta, seed=1)
    assert calls == [(s.noise, s.noise.dims, SENSITIVITY[s.name]) for s in steps]


def test_meter_is_spent_before_each_draw_and_refuses_an_overrun():
    est, eps, delta = M.get(NAME), 2.0, 1e-6
    x, y = line_tract(60, seed=1)
    batch = TractBatch.single(x, y)
    g = est.guarantee(eps, delta)
    f = M.PrivacyFilter({"adassp": g}, batch.labels)
    M.estimate_batch(NAME, batch, eps, delta, seed=1, meter=f.meter("adassp"))
    spent = f.spent()["adassp"]["tract"]
    assert spent.epsilon == pytest.approx(g.epsilon, rel=1e-9) and spent.delta == delta
    # A charge that covers the first two releases only: the third is refused before its draw.
    steps = est.noise_steps(eps, delta)
    short = M.PrivacyFilter({"adassp": to_approx(compose(steps[:2]), delta)}, batch.labels)
    calls = []
    with recorded_draws(calls), pytest.raises(M.BudgetOverrun):
        M.estimate_batch(NAME, batch, eps, delta, seed=1, meter=short.meter("adassp"))
    assert len(calls) == 2


# --- 5. empirical audits: one release on extreme neighbours ---------------------------------

AUDIT_DELTA = 0.01
AUDIT_RHO = 0.5  # one release at ρ = 1/2 (μ = 1): the audit's claim is its (ε, 0.01)
AUDIT_N = 2000
_ZEROS = np.zeros(AUDIT_N)
_MOVED = np.r_[1.0, np.zeros(AUDIT_N - 1)]
# x and y of D and D': one record moved from (0, 0) to (1, 1). λ_min moves by 1 − O(1/n),
# (Σy, Σxy) by (1, 1): both their sensitivities.
AUDIT_DATA = [(_ZEROS, _ZEROS), (_MOVED, _MOVED)]


def _audit_step(name):
    return NoiseStep(name, GridGaussian.calibrate(AUDIT_RHO, adassp.DIMS[name]),
                     adassp.STEP_SENSITIVITY[name])


def _release_sample(name):
    def sample(i, reps, seed):
        g = gram(TractBatch.single(*AUDIT_DATA[i]), np.array([0]))
        values = {LAMBDA_MIN: g.lambda_min[:, None],
                  MOMENT: np.stack([g.sum_y, g.sum_xy], axis=1)}[name]
        out = release(_audit_step(name), np.array(["tract"]), values, SeededRandomness(seed),
                      reps, M.NO_METER)
        return out[:, 0, :].sum(axis=1)  # the shift is along (1, …, 1): the sum carries it
    return sample


def _claim():
    return to_approx(ZCDP(_audit_step(LAMBDA_MIN).guarantee.rho), AUDIT_DELTA).epsilon


@pytest.mark.slow
@pytest.mark.parametrize("name", [LAMBDA_MIN, MOMENT])
def test_audit_release(name):
    claim = _claim()
    lb = audit_sample(_release_sample(name), delta=AUDIT_DELTA)
    assert 1.0 < lb <= claim, (lb, claim)
    with budget_scaled(adassp, "gaussian_mechanism", 4.0):  # half the noise sd
        broken = audit_sample(_release_sample(name), delta=AUDIT_DELTA)
    assert broken > claim, (broken, claim)


@pytest.mark.slow
def test_audit_catches_a_halved_lambda_min_sensitivity(monkeypatch):
    # Wang's add/remove bound is 2; the derivation here says 1. Had it said 1/2, the noise
    # would be half what the neighbours need, and the audit sees it.
    halved = dataclasses.replace(adassp.STEP_SENSITIVITY[LAMBDA_MIN], fixed=(("number", 0.5),))
    monkeypatch.setitem(adassp.STEP_SENSITIVITY, LAMBDA_MIN, halved)
    lb = audit_sample(_release_sample(LAMBDA_MIN), delta=AUDIT_DELTA)
    assert lb > _claim(), lb


# --- 6. both calls, failures, accuracy ------------------------------------------------------


def test_one_tract_and_batched_calls_agree():
    x, y = line_tract(80, seed=7)
    one = M.estimate(NAME, x, y, 4.0, seed=3)
    batch = M.estimate_batch(NAME, TractBatch.single(x, y), 4.0, seed=3)
    assert isinstance(one.guarantee, ApproxDP) and one.guarantee == batch.guarantee
    assert one.p25 == batch.p25[0] and one.p75 == batch.p75[0] and not one.failed
    assert set(one.extras) == {"noisy_lambda_min", "noisy_sum_x", "noisy_sum_xx",
                               "noisy_sum_y", "noisy_sum_xy", "ridge"}
    many = M.estimate_batch(NAME, _batch((x, y), (np.array([0.5]), np.array([0.5])),
                                         line_tract(30, seed=8)), 4.0, seed=3, reps=7)
    assert many.p25.shape == many.failed.shape == many.extras["ridge"].shape == (7, 3)
    assert many.failed[:, 1].all() and set(many.reason[:, 1]) == {"fewer than 2 records"}
    assert np.isnan(many.extras["noisy_sum_x"][:, 1]).all()  # nothing drawn for it
    assert np.isfinite(many.p25[:, [0, 2]]).all() and not many.failed[:, [0, 2]].any()


def test_ridge_follows_wangs_rule():
    steps, delta, p = _steps(1.0), 1e-6, 0.05
    top = noise_sd(steps[GRAM]) * math.sqrt(2 * math.log(8 / p))
    shift = noise_sd(steps[LAMBDA_MIN]) * math.sqrt(math.log(6 / delta))
    lam = ridge(np.array([-5.0, 0.0, shift + 1.0, shift + top + 10.0]), steps, delta, p)
    assert lam == pytest.approx([top, top, top - 1.0, 0.0])


def test_a_matrix_that_is_not_positive_definite_fails_without_a_value():
    # [[n, Σx], [Σx, Σx²]] with Σx² < Σx²/n: indefinite; and a singular one.
    fit = solve_ridge(np.array([10.0, 10.0, 10.0]), np.array([5.0, 5.0, 5.0]),
                      np.array([1.0, 2.5, 3.0]), np.array([4.0, 4.0, 4.0]),
                      np.array([2.0, 2.0, 2.0]), np.zeros(3))
    assert fit.ok.tolist() == [False, False, True]
    assert np.isnan(fit.slope[:2]).all() and np.isfinite(fit.slope[2])
    # In a run at a small budget on a tiny tract some draws fail, each without a value.
    x, y = np.array([0.1, 0.9, 0.5]), np.array([0.2, 0.8, 0.4])
    res = M.estimate_batch(NAME, TractBatch.single(x, y), 0.5, seed=5, reps=20_000)
    failed = res.failed[:, 0]
    assert 0 < failed.sum() < 0.05 * failed.size
    assert np.isnan(res.p25[failed, 0]).all() and np.isfinite(res.p25[~failed, 0]).all()
    assert set(res.reason[failed, 0]) == {"noisy X'X + ridge is not positive definite"}


def test_close_to_ols_at_a_large_budget_and_better_with_more_budget():
    rng = np.random.default_rng(9)
    tracts = [line_tract(int(n), seed=s) for s, n in enumerate(rng.integers(300, 1500, 12))]
    batch = _batch(*tracts)
    target = ols(sufficient_stats(batch)).p25
    err = {eps: np.abs(M.estimate_batch(NAME, batch, eps, seed=2, reps=20).p25 - target)
           for eps in (1.0, 8.0, 200.0)}
    assert np.median(err[200.0]) < 0.005 and err[200.0].max() < 0.03
    assert np.median(err[200.0]) < np.median(err[8.0]) < np.median(err[1.0])
