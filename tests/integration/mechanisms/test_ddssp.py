"""DDSSP (mechanisms/ddssp.py): calibration and guarantee, the noise drawn against theory, the
meter, the Private-PGM (mbi) estimation, the regression from a table, both calls, accuracy at
a large budget, failures, and an empirical audit that catches broken variants."""

import dataclasses
import math

import numpy as np
import pytest
from scipy import optimize, stats

import mechanisms as M
from mechanisms import ddssp  # registers DDSSP until mechanisms/__init__.py imports it
from mechanisms.batch import TractBatch, ols, sufficient_stats
from mechanisms.privacy_filter import BudgetOverrun, PrivacyFilter
from mechanisms.ddssp import (COUNT_SENSITIVITY, STEP_NAMES, X_MARGINAL, XY_MARGINAL,
                              Y_MARGINAL, bin_index, estimate_tables, measure_marginals,
                              measurement_rhos, regression_from_tables, two_way_counts)
from mechanisms.noise import SeededRandomness
from mechanisms.privacy import ZCDP, ApproxDP, rho_for_approx, to_approx
from mechanisms.privacy_maps import GridGaussian, compose

from tests.support.empirical_audit import audit_sample, budget_scaled
from tests.support.inputs import line_tract

NAME = "DDSSP"
DELTA = 1e-6


def _steps(eps, delta=DELTA, **hp):
    return {s.name: s for s in M.get(NAME).noise_steps(eps, delta, **hp)}


# --- 1. calibration and the derived guarantee -----------------------------------------------


@pytest.mark.parametrize("eps", [0.3, 1.0, 2.5, 8.0, 50.0])
@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
@pytest.mark.parametrize("hp", [{}, {"bins": 10}, {"bins": 2, "w_x": 3.0, "w_xy": 0.5}])
def test_guarantee_is_the_converted_composition_and_fits_the_budget(eps, delta, hp):
    est = M.get(NAME)
    g = est.guarantee(eps, delta, **hp)
    steps = est.noise_steps(eps, delta, **hp)
    assert [s.name for s in steps] == list(STEP_NAMES)
    assert isinstance(g, ApproxDP) and g.delta == delta
    # Recomputed by hand from the published parameters: ρ = (N + √d)²/(2σ²) per step.
    rho = sum((s.parameters["grid_steps"] + math.sqrt(s.parameters["dims"])) ** 2
              / (2 * s.parameters["sigma2"]) for s in steps)
    assert g == to_approx(compose(steps), delta)
    assert g.epsilon == pytest.approx(to_approx(ZCDP(rho), delta).epsilon, rel=1e-12)
    assert eps * (1 - 1e-3) <= g.epsilon <= eps


def test_steps_follow_bins_and_shares():
    bins = 5
    steps = _steps(1.0, bins=bins, w_x=1.0, w_y=2.0, w_xy=5.0)
    assert [steps[n].parameters["dims"] for n in STEP_NAMES] == [bins, bins, bins * bins]
    rhos = [steps[n].guarantee.rho for n in STEP_NAMES]
    assert rhos[1] / rhos[0] == pytest.approx(2.0, rel=2e-3)
    assert rhos[2] / rhos[0] == pytest.approx(5.0, rel=2e-3)
    assert sum(rhos) <= rho_for_approx(1.0, DELTA)
    for s in steps.values():
        assert s.mechanism == "grid-gaussian" and s.repeat == 1
        assert "sqrt(2)" in s.sensitivity.statement


def test_guarantee_changes_with_its_parameters():
    est = M.get(NAME)
    assert est.guarantee(1.0, DELTA).epsilon < est.guarantee(2.0, DELTA).epsilon
    assert est.guarantee(1.0, 1e-3) != est.guarantee(1.0, 1e-9)
    assert est.guarantee(1.0).delta == est.defaults["default_delta"] == 1e-6
    # Different bins: different grids and σ² (rounding), each still within the budget.
    assert est.noise_steps(1.0, DELTA, bins=3) != est.noise_steps(1.0, DELTA, bins=8)


def test_guarantee_follows_the_noise_not_a_declaration(monkeypatch):
    """If the calibration drew more noise than asked, the guarantee would say so."""
    real = GridGaussian.calibrate

    def half_rho(rho, dims=1):
        return real(rho / 2, dims)

    before = M.get(NAME).guarantee(1.0, DELTA).epsilon
    monkeypatch.setattr(ddssp.GridGaussian, "calibrate", staticmethod(half_rho))
    assert M.get(NAME).guarantee(1.0, DELTA).epsilon < 0.8 * before


@pytest.mark.parametrize("hp,match", [
    ({"bins": 1}, "bins must be an integer"), ({"bins": 2.5}, "bins must be an integer"),
    ({"bins": True}, "bins must be an integer"), ({"bins": 65}, "bins must be an integer"),
    ({"w_x": 0.0}, "w_x must be"), ({"w_xy": float("nan")}, "w_xy must be"),
    ({"iters": 0}, "iters must be"), ({"w_y": "1"}, "w_y must be"),
])
def test_bad_hyperparameters_are_refused(hp, match):
    with pytest.raises(ValueError, match=match):
        M.get(NAME).guarantee(1.0, DELTA, **hp)
    x, y = line_tract(20)
    with pytest.raises(ValueError, match=match):
        M.estimate(NAME, x, y, 1.0, DELTA, seed=1, **hp)


def test_unknown_hyperparameter_and_bad_budgets_are_refused():
    x, y = line_tract(20)
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        M.estimate(NAME, x, y, 1.0, DELTA, seed=1, mu=2)
    with pytest.raises(ValueError, match="delta must lie in"):
        M.estimate(NAME, x, y, 1.0, 1.5, seed=1)
    with pytest.raises(ValueError, match="too little for the grid Gaussian"):
        M.get(NAME).guarantee(1e-4, DELTA)


def test_publishable_but_not_in_the_default_suite_and_noise_only_from_the_samplers():
    est = M.get(NAME)
    assert est.publishable and est.in_default_suite is False and est.needs_delta
    src = open(ddssp.__file__).read()
    assert "np.random" not in src and "numpy_generator" not in src


# --- 2. discretisation and measurement ------------------------------------------------------


def test_bins_and_counts():
    assert bin_index(np.array([0.0, 0.2499, 0.25, 0.999, 1.0]), 4).tolist() == [0, 0, 1, 3, 3]
    batch = TractBatch.from_labels(["a", "a", "a", "b"], [0.0, 0.9, 1.0, 0.5], [1.0, 0.1, 0.3, 0.5])
    c = two_way_counts(batch, np.array([0, 1]), 2)
    assert c.tolist() == [[[0, 1], [2, 0]], [[0, 0], [0, 1]]]


def test_marginal_noise_matches_theory():
    """Per cell: mean = the true count (the grid rounding of an integer count is below half a
    grid unit), variance = (√2·σ/steps)², the discrete Gaussian's (σ² ≥ 4096², so its variance
    equals σ² to far below the test's resolution); cells uncorrelated."""
    reps, bins = 6000, 3
    x, y = line_tract(40, seed=5)
    batch = TractBatch.single(x, y)
    steps = _steps(2.0, bins=bins)
    noisy = measure_marginals(batch, np.array([0]), steps, SeededRandomness(7), reps, bins,
                              M.NO_METER)
    counts = two_way_counts(batch, np.array([0]), bins)[0].astype(float)
    truth = {X_MARGINAL: counts.sum(1), Y_MARGINAL: counts.sum(0), XY_MARGINAL: counts.ravel()}
    got = {X_MARGINAL: noisy.x[:, 0], Y_MARGINAL: noisy.y[:, 0],
           XY_MARGINAL: noisy.xy[:, 0].reshape(reps, -1)}
    for name in STEP_NAMES:
        p = steps[name].parameters
        sd = COUNT_SENSITIVITY * math.sqrt(p["sigma2"]) / p["grid_steps"]
        assert noisy.sd[name] == pytest.approx(sd, rel=1e-12)
        err = got[name] - truth[name]
        k = err.size
        # Pooled variance against theory: chi-square, two-sided 1e-4.
        chi = float((err**2).sum() / sd**2)
        assert stats.chi2.ppf(1e-4, k) < chi < stats.chi2.ppf(1 - 1e-4, k), (name, chi / k)
        # Cell means: within 5 standard errors of the truth.
        assert np.all(np.abs(err.mean(axis=0)) < 5 * sd / math.sqrt(reps)), name
        if err.shape[1] > 1:
            corr = np.corrcoef(err.T)[np.triu_indices(err.shape[1], 1)]
            assert np.all(np.abs(corr) < 5 / math.sqrt(reps)), name
        # The law is Gaussian-shaped (KS against N(0, sd²) on one cell).
        assert stats.kstest(err[:, 0] / sd, "norm").pvalue > 1e-4, name


class RecordingMeter:
    def __init__(self, log):
        self.log = log

    def spend(self, labels, guarantee, times=1):
        self.log.append(("spend", tuple(labels), guarantee, times))


def test_every_draw_is_spent_first_with_exactly_its_steps_noise(monkeypatch):
    log = []
    real = ddssp.gaussian_mechanism

    def recorded(rand, values, sens, noise):
        assert noise.dims == np.shape(values)[-1]
        log.append(("draw", noise.parameters(), sens))
        return real(rand, values, sens, noise)

    monkeypatch.setattr(ddssp, "gaussian_mechanism", recorded)
    labels = np.repeat(["a", "b", "c"], [30, 1, 25])  # "b" has one record: never measured
    x, y = line_tract(56, seed=1)
    batch = TractBatch.from_labels(labels, x, y)
    eps, reps = 3.0, 2
    steps = M.get(NAME).noise_steps(eps, DELTA)
    M.estimate_batch(NAME, batch, eps, DELTA, seed=1, reps=reps, meter=RecordingMeter(log))
    expected = []
    for s in steps:
        expected.append(("spend", ("a", "c"), s.guarantee, reps))
        expected.append(("draw", s.parameters, COUNT_SENSITIVITY))
    assert log == expected


def test_a_filter_short_of_the_charge_stops_before_any_draw():
    x, y = line_tract(30, seed=2)
    batch = TractBatch.single(x, y)
    eps = 2.0
    g = M.get(NAME).guarantee(eps, DELTA)
    ok = PrivacyFilter({"ddssp": g}, batch.labels)
    M.estimate_batch(NAME, batch, eps, DELTA, seed=1, meter=ok.meter("ddssp"))
    short = PrivacyFilter({"ddssp": ApproxDP(g.epsilon * 0.5, DELTA)}, batch.labels)
    with pytest.raises(BudgetOverrun, match="nothing was drawn"):
        M.estimate_batch(NAME, batch, eps, DELTA, seed=1, meter=short.meter("ddssp"))


# --- 3. Private-PGM estimation and the regression -------------------------------------------


def test_vmapped_mbi_agrees_with_mbis_own_estimate():
    """The batched solver runs mbi's MirrorDescent steps under vmap: the same tables as mbi's
    ``Estimator.estimate`` on each problem alone."""
    import jax

    with jax.enable_x64(True):
        from mbi import Domain, LinearMeasurement, estimation

    bins, reps = 4, 3
    labels = np.repeat(["a", "b"], [40, 70])
    x, y = line_tract(110, seed=4)
    batch = TractBatch.from_labels(labels, x, y)
    steps = _steps(2.0, bins=bins)
    noisy = measure_marginals(batch, np.array([0, 1]), steps, SeededRandomness(3), reps, bins,
                              M.NO_METER)
    got = estimate_tables(noisy, batch.n, iters=1000)
    dom = Domain(["x", "y"], [bins, bins])
    for r in range(reps):
        for t in range(2):
            ms = [LinearMeasurement(noisy.x[r, t], ("x",), stddev=noisy.sd[X_MARGINAL]),
                  LinearMeasurement(noisy.y[r, t], ("y",), stddev=noisy.sd[Y_MARGINAL]),
                  LinearMeasurement(noisy.xy[r, t].ravel(), ("x", "y"),
                                    stddev=noisy.sd[XY_MARGINAL])]
            with jax.enable_x64(True):
                model = estimation.MirrorDescent().estimate(dom, ms, known_total=float(
                    batch.n[t]), iters=1000)
                ref = np.asarray(model.project(("x", "y")).datavector(flatten=False))
            assert got[r, t].sum() == pytest.approx(batch.n[t], rel=1e-9)
            assert np.all(got[r, t] >= 0)
            np.testing.assert_allclose(got[r, t], ref, atol=1e-3 * batch.n[t])


def test_estimated_table_is_the_constrained_least_squares_solution():
    """KKT of min Σ‖Qμ − y‖²/(2σ²) over μ ≥ 0, Σμ = n: the gradient is equal (to λ) on the
    cells that carry mass and not below λ on the empty ones."""
    bins = 3
    x, y = line_tract(60, seed=8)
    batch = TractBatch.single(x, y)
    steps = _steps(1.0, bins=bins)
    noisy = measure_marginals(batch, np.array([0]), steps, SeededRandomness(11), 4, bins,
                              M.NO_METER)
    tables = estimate_tables(noisy, batch.n, iters=20000)
    for r in range(4):
        mu = tables[r, 0]
        sx, sy, sxy = (noisy.sd[n] for n in STEP_NAMES)
        grad = ((mu - noisy.xy[r, 0]) / sxy**2
                + ((mu.sum(1) - noisy.x[r, 0]) / sx**2)[:, None]
                + ((mu.sum(0) - noisy.y[r, 0]) / sy**2)[None, :])
        mass = mu > 1e-3
        lam = grad[mass].mean()
        scale = np.abs(grad).max() + 1e-12
        assert np.all(np.abs(grad[mass] - lam) < 1e-3 * scale), (grad, mu)
        assert np.all(grad[~mass] >= lam - 1e-3 * scale)


def test_regression_from_a_table_of_the_true_counts():
    """The statistics by hand on a small table, and close to OLS on a realistic tract."""
    table = np.array([[[3.0, 1.0], [0.0, 4.0]]])  # x-bin rows, y-bin columns; bins = 2
    mid = np.array([0.25, 0.75])
    fit = regression_from_tables(table)
    xbar, ybar = (4 * 0.25 + 4 * 0.75) / 8, (3 * 0.25 + 5 * 0.75) / 8
    nvar = 4 * (0.25 - xbar) ** 2 + 4 * (0.75 - xbar) ** 2 - 8 / (12 * 4)
    ncov = sum(table[0, i, j] * (mid[i] - xbar) * (mid[j] - ybar)
               for i in range(2) for j in range(2))
    assert fit.nvar[0] == pytest.approx(nvar) and fit.ncov[0] == pytest.approx(ncov)
    assert fit.p25[0] == pytest.approx(ybar + ncov / nvar * (0.25 - xbar))
    assert fit.p75[0] == pytest.approx(ybar + ncov / nvar * (0.75 - xbar))
    # A large tract whose x spreads like the synthetic states' (sd about 0.25): the binned
    # fit is close to OLS at the default bins.
    rng = np.random.default_rng(0)
    x = np.clip(rng.normal(0.45, 0.25, 50_000), 0, 1)
    y = np.clip(0.3 + 0.35 * x + rng.normal(0, 0.2, x.size), 0, 1)
    batch = TractBatch.single(x, y)
    truth = ols(sufficient_stats(batch))
    for bins in (4, 10):
        fit = regression_from_tables(two_way_counts(batch, np.array([0]), bins).astype(float))
        assert fit.p25[0] == pytest.approx(truth.p25[0], abs=0.015), bins
        assert fit.p75[0] == pytest.approx(truth.p75[0], abs=0.015), bins
    # Degenerate: every x in one bin gives a corrected n·var(x) below zero: not ok.
    one_bin = np.zeros((1, 4, 4))
    one_bin[0, 1, 2] = 50
    fit = regression_from_tables(one_bin)
    assert not fit.ok[0] and np.isnan(fit.p25[0])


# --- 4. both calls, accuracy, failures ------------------------------------------------------


def test_both_calls_agree_and_are_repeatable():
    x, y = line_tract(80, seed=6)
    one = M.estimate(NAME, x, y, 4.0, DELTA, seed=9)
    assert one.estimator == NAME and not one.failed and one.reason == ""
    assert one.guarantee == M.get(NAME).guarantee(4.0, DELTA)
    assert set(one.extras) == {"table_nvar", "table_ncov"}
    batch = M.estimate_batch(NAME, TractBatch.single(x, y), 4.0, DELTA, seed=9)
    assert batch.p25[0] == one.p25 and batch.p75[0] == one.p75
    again = M.estimate(NAME, x, y, 4.0, DELTA, seed=9)
    assert again.p25 == one.p25
    labels = np.repeat(np.arange(5), [30, 1, 0, 45, 60])
    xs, ys = line_tract(136, seed=7)
    many = M.estimate_batch(NAME, TractBatch.from_labels(labels, xs, ys), 4.0, DELTA, seed=2,
                            reps=3)
    assert many.p25.shape == (3, 4)  # label 2 has no records: not a tract of the batch
    assert many.failed[:, 1].all() and many.reason[0, 1] == "fewer than 2 records"
    assert np.isfinite(many.p25[:, [0, 2, 3]]).all()


def test_accurate_at_a_large_budget():
    """ε = 50: the noise is far below one record, so the estimate is the fit of the binned
    true table, which is close to OLS."""
    labels = np.repeat(np.arange(4), [200, 300, 400, 500])
    x, y = line_tract(1400, seed=12)
    batch = TractBatch.from_labels(labels, x, y)
    res = M.estimate_batch(NAME, batch, 50.0, DELTA, seed=4, reps=3, bins=8)
    binned = regression_from_tables(two_way_counts(batch, np.arange(4), 8).astype(float))
    truth = ols(sufficient_stats(batch))
    assert not res.failed.any()
    np.testing.assert_allclose(res.p25, np.broadcast_to(binned.p25, res.p25.shape), atol=0.01)
    np.testing.assert_allclose(res.p75, np.broadcast_to(binned.p75, res.p75.shape), atol=0.01)
    np.testing.assert_allclose(res.p25.mean(0), truth.p25, atol=0.03)
    np.testing.assert_allclose(res.p75.mean(0), truth.p75, atol=0.03)


def test_degenerate_variance_fails_with_its_reason():
    x = np.full(60, 0.1)  # every parent rank in one bin: no variance to regress on
    y = np.linspace(0, 1, 60)
    res = M.estimate(NAME, x, y, 50.0, DELTA, seed=1)
    assert res.failed and res.p25 is None and res.p75 is None
    assert res.reason == "n*var(x) of the estimated marginal <= 0"


# --- 5. empirical audit: the released xy marginal on neighbouring datasets ------------------
# D and D' differ in one record moved from cell (0, 0) to cell (1, 1) of a 2×2 table. The
# audit's statistic is the difference of those two cells of the released xy marginal, the
# direction the shift takes (its likelihood ratio is that of the whole release).

AUDIT_DELTA = 0.01
AUDIT_BINS, AUDIT_RHO_XY = 2, 0.5
AUDIT_X = np.r_[np.full(9, 0.2), np.full(10, 0.8)]
AUDIT_DATA = [(AUDIT_X, np.r_[np.full(9, 0.2), np.full(10, 0.8)]),
              (np.r_[np.full(10, 0.2), np.full(9, 0.8)], np.r_[np.full(10, 0.2), np.full(9, 0.8)])]


def _audit_epsilon() -> float:
    """The ε whose xy measurement gets ρ = AUDIT_RHO_XY under the default shares."""
    hp = M.get(NAME).hyper({"bins": AUDIT_BINS})
    return optimize.brentq(
        lambda e: measurement_rhos(e, DELTA, hp)[XY_MARGINAL] - AUDIT_RHO_XY, 0.5, 50.0)


def xy_sample(i, reps, seed):
    batch = TractBatch.single(*AUDIT_DATA[i])
    steps = _steps(_audit_epsilon(), bins=AUDIT_BINS)
    noisy = measure_marginals(batch, np.array([0]), steps, SeededRandomness(seed), reps,
                              AUDIT_BINS, M.NO_METER)
    return noisy.xy[:, 0, 0, 0] - noisy.xy[:, 0, 1, 1]



def _claim() -> float:
    step = _steps(_audit_epsilon(), bins=AUDIT_BINS)[XY_MARGINAL]
    assert step.guarantee.rho == pytest.approx(AUDIT_RHO_XY, rel=1e-3)
    return to_approx(step.guarantee, AUDIT_DELTA).epsilon


def test_audit_neighbours_are_extreme():
    counts = [two_way_counts(TractBatch.single(*d), np.array([0]), AUDIT_BINS)[0]
              for d in AUDIT_DATA]
    diff = (counts[0] - counts[1]).ravel()
    assert sorted(diff.tolist()) == [-1, 0, 0, 1]  # one record moved: L2 shift √2


@pytest.mark.slow
def test_audit_xy_marginal():
    claim = _claim()
    lb = audit_sample(xy_sample, delta=AUDIT_DELTA)
    assert 1.0 < lb <= claim, (lb, claim)


@pytest.mark.slow
def test_audit_catches_half_the_noise():
    claim = _claim()
    with budget_scaled(ddssp, "gaussian_mechanism", 4.0):
        assert audit_sample(xy_sample, delta=AUDIT_DELTA) > claim


@pytest.mark.slow
def test_audit_catches_the_add_remove_sensitivity(monkeypatch):
    """The realistic bug: the paper's add/remove sensitivity 1 used under replace-one."""
    claim = _claim()
    # the steps read their Sensitivity when built: the draws scale the noise to its number
    add_remove = dataclasses.replace(ddssp.MARGINAL_SENSITIVITY, fixed=(("number", 1.0),))
    monkeypatch.setattr(ddssp, "MARGINAL_SENSITIVITY", add_remove)
    assert audit_sample(xy_sample, delta=AUDIT_DELTA) > claim
