"""FreeLunchSSP: add-remove simplex sums (n for free), charged for replace-one by group privacy.

Checked here: the transformations and their inverse; the guarantee derived from the noise and
converted by the stated rule; the noise of every statistic against its theoretical covariance
(and unbiasedness); both calls; failures with reasons; the budget filter; two empirical
audits (add-remove with a broken variant caught, and replace-one showing that the unconverted
add-remove figure would be false there).
"""

import math

import numpy as np
import pytest

import mechanisms as M
from mechanisms import free_lunch as FL
from mechanisms.batch import TractBatch, ols, sufficient_stats
from mechanisms.privacy_filter import BudgetOverrun, PrivacyFilter
from mechanisms.noise import SeededRandomness
from mechanisms.privacy import PureDP, Relation, convert_relation
from mechanisms.privacy_maps import compose

from tests.support.empirical_audit import audit_sample, budget_scaled
from tests.support.inputs import line_tract

NAME = "FreeLunchSSP"


def est():
    return M.get(NAME)


# --- the transformations -----------------------------------------------------------------


def test_transformations_lie_on_the_simplex_and_give_back_the_ols_statistics():
    rng = np.random.default_rng(0)
    x = np.r_[0.0, 1.0, rng.uniform(size=200)]
    y = np.r_[1.0, 0.0, rng.uniform(size=200)]
    for u in (FL.x_simplex(x), FL.xy_simplex(x, y)):
        assert (u >= 0).all()
        assert np.allclose(u.sum(axis=0), 1.0, rtol=0, atol=1e-15)  # L1 norm exactly 1
    sx, sxy = FL.simplex_sums(TractBatch.single(x, y))
    theta = np.array([x.size, x.sum(), y.sum(), (x * x).sum(), (x * y).sum()])
    assert np.allclose(FL._M_X @ theta, sx[0]) and np.allclose(FL._M_XY @ theta, sxy[0])
    # The GLS combination is exact on noiseless sums (an unbiased linear inverse).
    steps = est().noise_steps(1.0)
    got = FL.estimate_statistics(sx[None], sxy[None], steps)
    for i, name in enumerate(FL.THETA):
        assert got[name][0, 0] == pytest.approx(theta[i], rel=1e-12)


def test_replace_one_moves_the_sum_twice_as_far_as_add_remove():
    # Why the conversion is tight for this mechanism: u(0) -> u(1) is an L1 move of 2.
    assert np.abs(FL.x_simplex(np.array([1.0])) - FL.x_simplex(np.array([0.0]))).sum() == 2.0
    assert np.abs(FL.xy_simplex(np.array([1.0]), np.array([1.0]))
                  - FL.xy_simplex(np.array([0.0]), np.array([0.0]))).sum() == 2.0


# --- the guarantee ------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1e-3, 0.1, 1.0, 8.0, 50.0])
@pytest.mark.parametrize("share", [0.2, 0.5, 0.8])
def test_guarantee_is_derived_from_the_noise_and_converted_by_the_stated_rule(eps, share):
    steps = est().noise_steps(eps, x_share=share)
    assert [s.relation for s in steps] == [Relation.ADD_REMOVE] * 2
    assert [s.noise.dims for s in steps] == [3, 4]
    eps_x, eps_xy = (s.guarantee.epsilon for s in steps)
    assert eps_x <= share * eps / 2 and eps_xy <= (1 - share) * eps / 2
    g = est().guarantee(eps, x_share=share)
    # replace-one = group privacy of size 2 over the add-remove composition
    assert g == PureDP(2 * (eps_x + eps_xy), Relation.REPLACE_ONE)
    assert g == convert_relation(compose(steps), Relation.REPLACE_ONE)
    assert eps * (1 - 1e-3) <= g.epsilon <= eps
    native = est().add_remove_guarantee(eps, x_share=share)
    assert native.relation is Relation.ADD_REMOVE and native.epsilon == pytest.approx(g.epsilon / 2)


def test_guarantee_changes_with_the_parameters_the_noise_is_drawn_with():
    a = [s.parameters["scale_num"] for s in est().noise_steps(1.0, x_share=0.3)]
    b = [s.parameters["scale_num"] for s in est().noise_steps(1.0, x_share=0.6)]
    assert a[0] > b[0] and a[1] < b[1]  # more budget on x: a smaller scale there
    assert est().guarantee(2.0).epsilon == pytest.approx(2 * est().guarantee(1.0).epsilon,
                                                         rel=1e-4)


def test_an_estimator_that_forgets_the_conversion_is_refused():
    class Unconverted(FL.FreeLunchSSP):
        def _compose(self, steps, delta, hp):
            return compose(steps)  # an add-remove figure, as if it were replace-one

    with pytest.raises(ValueError, match="stated for add-remove, the ledger charges replace-one"):
        Unconverted().guarantee(1.0)


@pytest.mark.parametrize("hp,match", [({"x_share": 0.0}, "x_share"), ({"x_share": 1.0}, "x_share"),
                                      ({"x_share": True}, "x_share"),
                                      ({"min_noisy_n": -1.0}, "min_noisy_n"),
                                      ({"min_noisy_n": float("nan")}, "min_noisy_n"),
                                      ({"bins": 3}, "unknown hyperparameter")])
def test_bad_hyperparameters_are_refused(hp, match):
    x, y = line_tract(20)
    with pytest.raises(ValueError, match=match):
        M.estimate(NAME, x, y, 1.0, seed=1, **hp)


# --- the distribution of the noisy statistics ---------------------------------------------


@pytest.mark.parametrize("share", [0.5, 0.25])
def test_statistics_noise_matches_the_theoretical_covariance_and_is_unbiased(share):
    x, y = line_tract(60, seed=5)
    eps, reps = 2.0, 40_000
    res = M.estimate_batch(NAME, TractBatch.single(x, y), eps, seed=3, reps=reps, x_share=share)
    cov = FL.statistics_covariance(est().noise_steps(eps, x_share=share))
    truth = {"n": x.size, "sum_x": x.sum(), "sum_y": y.sum(), "sum_xx": (x * x).sum(),
             "sum_xy": (x * y).sum()}
    draws = np.stack([res.extras[f"noisy_{k}"][:, 0] for k in FL.THETA])
    for i, k in enumerate(FL.THETA):
        sd = math.sqrt(cov[i, i])
        # unbiased up to the grid rounding (1/8192 per coordinate)
        assert abs(draws[i].mean() - truth[k]) < 5 * sd / math.sqrt(reps) + 1e-3, k
        assert np.var(draws[i]) == pytest.approx(cov[i, i], rel=0.04), k
    # and the correlations the GLS combination implies (n and Σx share noise)
    emp = np.corrcoef(draws)
    theo = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert np.abs(emp - theo).max() < 0.03


def test_each_coordinate_is_discrete_laplace_of_the_calibrated_scale():
    x, y = line_tract(30, seed=2)
    batch = TractBatch.single(x, y)
    step = est().noise_steps(1.0)[0]
    sums = FL.simplex_sums(batch)[0]
    out = FL.release_simplex_sums(batch, step, sums, SeededRandomness(4), 50_000, M.NO_METER)
    noise = (out[:, 0, :] - np.rint(sums[0] * 4096) / 4096) * 4096  # integers
    assert np.allclose(noise, np.rint(noise))
    assert np.var(noise, axis=0) == pytest.approx(
        np.full(3, FL.discrete_laplace_variance(step.noise.scale_num / step.noise.scale_den)),
        rel=0.04)
    assert abs(np.corrcoef(noise.T)[0, 2]) < 0.02  # independent coordinates


def test_gls_beats_either_release_alone_for_n():
    steps = est().noise_steps(1.0)
    v_x, v_xy = (FL.coordinate_variance(s) for s in steps)
    cov = FL.statistics_covariance(steps)
    assert cov[0, 0] < min(3 * v_x, 4 * v_xy)  # n from one simplex alone: the sum of its d


# --- both calls, failures --------------------------------------------------------------------


def test_both_calls_agree_and_large_budgets_approach_ols():
    x, y = line_tract(80, seed=1)
    one = M.estimate(NAME, x, y, 2.0, seed=7)
    batch = M.estimate_batch(NAME, TractBatch.single(x, y), 2.0, seed=7)
    assert one.failed == bool(batch.failed[0]) and one.guarantee == batch.guarantee
    assert one.p25 == pytest.approx(batch.p25[0]) and one.p75 == pytest.approx(batch.p75[0])
    fit = ols(sufficient_stats(TractBatch.single(x, y)))
    big = M.estimate(NAME, x, y, 1e4, seed=1)
    assert big.p25 == pytest.approx(fit.p25[0], abs=2e-3)
    assert big.p75 == pytest.approx(fit.p75[0], abs=2e-3)
    assert big.extras["noisy_n"] == pytest.approx(80, abs=0.05)


def test_batches_draw_for_every_tract_and_fail_small_ones():
    rng = np.random.default_rng(3)
    sizes = [1, 30, 55, 2, 80, 0]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    x = np.round(rng.uniform(size=labels.size), 2)
    y = np.clip(0.2 + 0.5 * x + rng.normal(0, 0.1, labels.size), 0, 1)
    batch = TractBatch(x, y, np.r_[0, np.cumsum(sizes)].astype(np.int64),
                       np.array([f"t{i}" for i in range(len(sizes))]))
    g = est().guarantee(1.0)
    meter = PrivacyFilter({"s": PureDP(3 * g.epsilon)}, batch.labels).meter("s")  # 3 reps
    res = M.estimate_batch(NAME, batch, 1.0, seed=1, reps=3, meter=meter)
    assert res.p25.shape == (3, 6)
    assert res.failed[:, [0, 5]].all() and "fewer than 2" in res.reason[0, 0]
    assert np.isnan(res.p25[res.failed]).all() and np.isfinite(res.p25[~res.failed]).all()
    # Noise was drawn (and paid) for every tract, the empty one too: skipping would reveal n.
    assert np.isfinite(res.extras["noisy_n"]).all()
    for lab in batch.labels:
        assert meter.spent(lab).epsilon == pytest.approx(3 * g.epsilon)  # reps = 3


def test_the_filter_stops_a_run_charged_less_than_its_noise():
    x, y = line_tract(40)
    batch = TractBatch.single(x, y)
    # Charged the add-remove figure as if it were replace-one: the first draw alone converts
    # to more than that.
    charged = PureDP(est().add_remove_guarantee(1.0).epsilon * 1.5)
    meter = PrivacyFilter({"s": charged}, batch.labels).meter("s")
    with pytest.raises(BudgetOverrun, match="over the .* charged"):
        M.estimate_batch(NAME, batch, 1.0, seed=1, meter=meter)


def test_failures_carry_reasons_and_no_values():
    # No spread in x: the true nvar is 0, so the noisy nvar is <= 0 about half the time.
    x = np.full(50, 0.5)
    y = np.linspace(0, 1, 50)
    res = M.estimate_batch(NAME, TractBatch.single(x, y), 50.0, seed=2, reps=2000)
    rate = res.failed[:, 0].mean()
    assert 0.3 < rate < 0.7
    assert set(res.reason[:, 0][res.failed[:, 0]]) == {"noisy nvar <= 0"}
    assert np.isnan(res.p25[:, 0][res.failed[:, 0]]).all()
    # A noisy n below the floor: refused whatever the other statistics say.
    x, y = line_tract(30)
    res = M.estimate_batch(NAME, TractBatch.single(x, y), 8.0, seed=2, reps=5, min_noisy_n=1e6)
    assert res.failed.all() and set(res.reason.ravel()) == {"noisy n < 1e+06"}
    # At a tiny budget a small tract's noisy n is often below 2.
    res = M.estimate_batch(NAME, TractBatch.single(x[:5], y[:5]), 0.05, seed=2, reps=400)
    assert (res.reason == "noisy n < 2").mean() > 0.2


# --- empirical audits --------------------------------------------------------------------------



AUDIT_EPS = 4.0  # replace-one budget: the x simplex runs at 4 · 0.5 / 2 = 1 add-remove
X_CLAIM = est().noise_steps(AUDIT_EPS)[0].guarantee.epsilon  # ≈ 1.0, add-remove


def _x_release(x, reps, seed):
    batch = TractBatch.single(x, np.zeros_like(x))
    step = est().noise_steps(AUDIT_EPS)[0]
    sums = FL.simplex_sums(batch)[0]
    return FL.release_simplex_sums(batch, step, sums, SeededRandomness(seed), reps,
                                   M.NO_METER)[:, 0, :]


# Add-remove neighbours: D has ten records at x = 0, D' one more. Only Σ(1 − x) moves, by 1.
ADD_REMOVE_DATA = [np.zeros(10), np.zeros(11)]


def add_remove_sample(i, reps, seed):
    return _x_release(ADD_REMOVE_DATA[i], reps, seed)[:, 2]


def test_audit_add_remove_release_and_a_broken_variant():
    lb = audit_sample(add_remove_sample)
    assert 0.8 < lb <= X_CLAIM, lb
    with budget_scaled(FL, "laplace_mechanism", 2.0):  # half the noise
        assert audit_sample(add_remove_sample) > X_CLAIM


# Replace-one neighbours: one record moves from x = 0 to x = 1, u from (0, 0, 1) to (1, 0, 0):
# Σx² rises by 1 and Σ(1 − x) falls by 1, each in its own independent noise. The statistic
# min(Σx², 10 − Σ(1 − x)) sees both: above 1 its likelihood ratio is e^{2/b}, twice the
# add-remove loss. The audit then exceeds the add-remove figure (so using it for replace-one
# would be false) and stays within the converted one.
REPLACE_ONE_DATA = [np.zeros(10), np.r_[np.zeros(9), 1.0]]


def replace_one_sample(i, reps, seed):
    out = _x_release(REPLACE_ONE_DATA[i], reps, seed)
    return np.minimum(out[:, 0], 10.0 - out[:, 2])


def test_audit_replace_one_needs_the_conversion():
    lb = audit_sample(replace_one_sample, seed=100)
    assert X_CLAIM < lb <= convert_relation(PureDP(X_CLAIM, Relation.ADD_REMOVE),
                                            Relation.REPLACE_ONE).epsilon, lb
