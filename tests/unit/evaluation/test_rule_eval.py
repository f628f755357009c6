"""Three-way selection rules (dpatlas/evaluation/rule_eval.py).

Checked here: the rule's guarantee is derived from the noise of its selection and of its
alternatives (it moves when a mechanism's noise moves) and fits the budget, pure ε for the
FreeLunchSSP family and (ε, δ) for the DDSSP one; every draw of a run is paid from the step the
rule charges (a filter charged less stops the run); the rule runs each mechanism exactly on the
tracts its thresholds give it; the region frequencies of a tract near the thresholds follow the
Laplace law of the selection's noise; the calibration scores the same metric as the
evaluation and never loses to the two-way rules its grid contains; bad rules are refused.
"""

import math

import numpy as np
import pytest

import mechanisms as M
from dpatlas.evaluation import rule_eval as R
from dpatlas.evaluation.evaluate import error_ratios
from mechanisms.batch import TractBatch, sufficient_stats
from mechanisms.privacy_filter import BudgetOverrun, PrivacyFilter
from mechanisms.free_lunch import free_lunch_steps
from mechanisms.noise import SeededRandomness, laplace_scale
from mechanisms.privacy import ApproxDP, PureDP, parallel, sequential, to_approx
from mechanisms.privacy_maps import compose
from mechanisms.sufficient_stats import intercept_step, ncov_step, nvar_step

NS, ETS, FL, DD = R.NOISY_STATS, R.EXP_THEIL_SEN, R.FREE_LUNCH, R.DDSSP


def pure_rule(**kw):
    return R.ThreeWayRule(**{"low": ETS, "middle": NS, "high": FL, "lower": 4.0,
                             "upper": 80.0, **kw})


def approx_rule(**kw):
    return R.ThreeWayRule(**{"low": ETS, "middle": NS, "high": DD, "lower": 4.0,
                             "upper": 80.0, "delta": 1e-6, **kw})


# --- the guarantee ---------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 8.0])
@pytest.mark.parametrize("share", [0.05, 0.1, 0.3])
def test_pure_rule_guarantee_is_selection_plus_worst_alternative_and_fits(epsilon, share):
    rule = pure_rule(share=share)
    eps_sel, rest = share * epsilon, (1 - share) * epsilon
    by_hand = sequential([
        compose([nvar_step(eps_sel)]),
        parallel([compose([ncov_step(rest / 2), intercept_step(rest / 2)]),
                  M.get(ETS).guarantee(rest), M.get(FL).guarantee(rest)])])
    g = R.fits_budget(rule, epsilon)
    assert isinstance(g, PureDP) and g == by_hand
    assert g.epsilon <= epsilon * (1 + 1e-12)
    # The budget is nearly all used (the maps round towards more noise only slightly).
    assert g.epsilon > 0.99 * epsilon


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
def test_approx_rule_is_only_epsilon_delta_and_fits(epsilon):
    rule = approx_rule()
    g = R.fits_budget(rule, epsilon)
    assert isinstance(g, ApproxDP)
    assert g.epsilon <= epsilon * (1 + 1e-9) and 0 < g.delta <= 1e-6
    # Its primary step is DDSSP's own (ε, δ) guarantee, the largest alternative.
    primary = dict(rule.steps(epsilon))[R.PRIMARY_STEP]
    assert primary == to_approx(M.get(DD).guarantee(0.9 * epsilon, 1e-6), 1e-6)


def test_guarantee_follows_a_mechanisms_noise_not_a_declaration(monkeypatch):
    rule = pure_rule()
    before = rule.guarantee(1.0)
    # FreeLunchSSP made to draw half the noise: twice the ε, and the rule must see it.
    fl = M.get(FL)
    monkeypatch.setattr(fl, "_noise_steps", lambda eps, delta, hp: free_lunch_steps(2 * eps, hp))
    after = rule.guarantee(1.0)
    assert after.epsilon == pytest.approx(before.epsilon + 0.9, rel=1e-3)
    with pytest.raises(ValueError, match="more than the budget 1-DP"):
        R.fits_budget(rule, 1.0)


def test_every_draw_is_paid_from_the_step_the_rule_charges():
    batch = three_tracts()
    rule = pure_rule(lower=1_000.0, upper=15_000.0)
    eps = 1_000.0
    charged = dict(rule.steps(eps))
    filt = PrivacyFilter(charged, batch.labels)
    out = R.apply_three_way(batch, eps, rule, SeededRandomness(5), 1,
                            selection_meter=filt.meter(R.SELECTION_STEP),
                            primary_meter=filt.meter(R.PRIMARY_STEP))
    assert list(out.mechanism[0]) == [ETS, NS, FL]
    spent = filt.spent()
    for label in batch.labels:
        assert spent[R.SELECTION_STEP][label].epsilon <= charged[R.SELECTION_STEP].epsilon
        assert spent[R.PRIMARY_STEP][label].epsilon <= charged[R.PRIMARY_STEP].epsilon
    # NoisyStats (tract 1) pays only ncov and intercept here: its nvar was the selection's.
    ns_paid = compose([ncov_step(0.45 * eps), intercept_step(0.45 * eps)]).epsilon
    assert spent[R.PRIMARY_STEP][batch.labels[1]].epsilon == pytest.approx(ns_paid)
    # A primary step charged for a smaller budget stops the run before its draw.
    short = {**charged, R.PRIMARY_STEP: dict(rule.steps(eps / 2))[R.PRIMARY_STEP]}
    filt = PrivacyFilter(short, batch.labels)
    with pytest.raises(BudgetOverrun):
        R.apply_three_way(batch, eps, rule, SeededRandomness(5), 1,
                          selection_meter=filt.meter(R.SELECTION_STEP),
                          primary_meter=filt.meter(R.PRIMARY_STEP))


# --- the choice ------------------------------------------------------------------------------


def three_tracts(seed: int = 0) -> TractBatch:
    """n·var(x) about 0.002 (x on [0.50, 0.52]), 4 (n = 50, x uniform), 25 (n = 300)."""
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(0.50, 0.52, 50), rng.uniform(0, 1, 50), rng.uniform(0, 1, 300)]
    x = np.concatenate(xs)
    y = np.clip(0.3 + 0.4 * x + rng.normal(0, 0.1, x.size), 0, 1)
    labels = np.repeat(["a", "b", "c"], [len(v) for v in xs])
    return TractBatch.from_labels(labels, x, y)


@pytest.mark.parametrize("order", [(ETS, NS, FL), (FL, ETS, NS), (NS, FL, ETS)])
def test_each_mechanism_runs_exactly_on_the_tracts_of_its_region(order, monkeypatch):
    batch = three_tracts()
    nvar = sufficient_stats(batch).nvar
    eps = 1_000.0  # indicator ε·nvar ≈ 2, 4,000, 25,000; its noise is Lap(1/share) = Lap(10)
    assert 1.0 < eps * nvar[0] < 1e1 and 2e3 < eps * nvar[1] < 1e4 and eps * nvar[2] > 2e4
    rule = R.ThreeWayRule(*order, lower=1_000.0, upper=15_000.0)
    calls = []
    real = R._run_alternative

    def spy(name, sub, *args, **kw):
        calls.append((name, tuple(sub.labels)))
        return real(name, sub, *args, **kw)

    monkeypatch.setattr(R, "_run_alternative", spy)
    out = R.apply_three_way(batch, eps, rule, SeededRandomness(1), reps=10)
    assert (out.mechanism == np.array(order, dtype=object)[None, :]).all()
    assert sorted(calls) == sorted(zip(order, [("a",), ("b",), ("c",)]))
    ok = ~out.failed
    assert ok[:, 1:].all() and np.isfinite(out.p25[ok]).all()


def test_region_boundaries_belong_to_the_region_above():
    rule = pure_rule(lower=4.0, upper=80.0)
    got = rule.region(np.array([np.nan, 0.0, 3.999, 4.0, 79.9, 80.0, 1e9]))
    assert got.tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert pure_rule(lower=4.0, upper=math.inf).region(np.array([1e300])).tolist() == [1]
    assert pure_rule(lower=4.0, upper=4.0).region(np.array([3.0, 4.0])).tolist() == [0, 2]


def test_region_frequencies_follow_the_laplace_noise_of_the_selection():
    """A tract whose true ε·nvar sits one noise scale b above ``lower`` and b·ln 2 below
    ``upper``: P(low) = e^{-1}/2, P(high) = e^{-ln 2}/2 = 1/4, the Laplace tails."""
    rng = np.random.default_rng(3)
    n = 600  # n·var(x) ≈ 50, well above the noise scale b ≈ 10
    x = rng.uniform(0, 1, n)
    y = rng.uniform(0, 1, n)
    batch = TractBatch.single(x, y)
    eps, share = 1.0, 0.1
    truth = eps * float(sufficient_stats(batch).nvar[0])
    b = eps * laplace_scale(1 - 1 / n, share * eps)  # the indicator's noise scale
    rule = pure_rule(lower=truth - b, upper=truth + b * math.log(2), share=share)
    reps = 4000
    out = R.apply_three_way(batch, eps, rule, SeededRandomness(11), reps)
    freq = np.bincount(out.region[:, 0], minlength=3) / reps
    expect = np.array([math.exp(-1) / 2, 0.0, 0.25])
    expect[1] = 1 - expect[0] - expect[2]
    sd = np.sqrt(expect * (1 - expect) / reps)
    assert np.all(np.abs(freq - expect) < 5 * sd), (freq, expect)
    # The indicator's noise itself: mean 0, variance 2b².
    noise = out.indicator[:, 0] - truth
    assert abs(noise.mean()) < 5 * math.sqrt(2) * b / math.sqrt(reps)
    assert noise.var() == pytest.approx(2 * b * b, rel=0.15)


# --- calibration -----------------------------------------------------------------------------


def test_bound_ratio_is_the_evaluations_metric():
    rng = np.random.default_rng(0)
    p25 = rng.normal(0.4, 0.1, (30, 7))
    failed = rng.uniform(size=p25.shape) < 0.2
    p25 = np.where(failed, np.nan, p25)
    ols_p25, se = rng.uniform(0.3, 0.5, 7), rng.uniform(0.01, 0.1, 7)

    class Est:
        pass

    est = Est()
    est.p25, est.failed = p25, failed
    np.testing.assert_array_equal(R.bound_ratio(p25, failed, ols_p25, se),
                                  error_ratios(est, ols_p25, se)[1])


def test_calibration_never_loses_to_the_two_way_rules_in_its_grid():
    today = (ETS, NS, FL, 2.79, math.inf)
    cal = R.calibrate_three_way("pure", seeds=(101,), tracts=60, reps=6,
                                grid=np.array([1.0, 5.0, 50.0, np.inf]),
                                reference={"today": today})
    best = cal["best"]["score"]
    assert best <= cal["best_two_way_in_grid"]["score"]
    assert best <= cal["reference"]["today"]["score"]
    assert cal["reference"]["today"]["upper"] is None
    assert cal["reference"]["today"]["unused_regions"] == ["high"]
    ets_low = cal["best_exp_theil_sen_low"]
    assert ets_low["low"] == ETS and ets_low["unused_regions"] == [] and best <= ets_low["score"]
    rule = R.rule_from_calibration(cal)
    assert rule.mechanisms == (cal["best"]["low"], cal["best"]["middle"], cal["best"]["high"])
    assert R.fits_budget(rule, 1.0).epsilon <= 1.0
    assert len(cal["best_by_order"]) == 6  # every order of the three mechanisms


# --- bad rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, message", [
    ({"high": ETS}, "three different mechanisms"),
    ({"high": "OLS"}, "not differentially private"),
    ({"high": DD}, "give delta"),
    ({"lower": 90.0}, "must be <= upper"),
    ({"lower": 0.0}, "lower must be a number > 0"),
    ({"lower": math.nan}, "lower must be a number > 0"),
    ({"lower": math.inf, "upper": math.inf}, "lower must be a number > 0"),
    ({"upper": -1.0}, "upper must be a number > 0"),
    ({"share": 1.0}, "share must lie in"),
    ({"share": 0.0}, "share must lie in"),
    ({"delta": 1.5}, "delta must lie in"),
])
def test_bad_rules_are_refused_with_the_reason(kw, message):
    with pytest.raises(ValueError, match=message):
        pure_rule(**kw)


def test_unknown_mechanism_and_family_are_named():
    with pytest.raises(KeyError, match="unknown estimator 'Nope'"):
        pure_rule(high="Nope")
    with pytest.raises(ValueError, match="unknown rule family 'mixed'; known: pure, approx"):
        R.calibrate_three_way("mixed")


def test_label_leaves_out_unused_regions():
    assert pure_rule(lower=4.4, upper=47.2).label() == (
        "DPExpTheilSen < 4.4 <= NoisyStats < 47.2 <= FreeLunchSSP")
    assert pure_rule(lower=2.79, upper=math.inf).label() == "DPExpTheilSen < 2.79 <= NoisyStats"
    assert approx_rule(low=DD, middle=ETS, high=NS, lower=10.7, upper=10.7).label() == (
        "DDSSP < 10.7 <= NoisyStats")
