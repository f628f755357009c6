"""Empirical privacy audits on neighbouring datasets (replace-one), and the release audit's
own recomputation of a PrivTree noise step (dpatlas/audit/noise.py).

Each audit draws the mechanism's output many times on D and on a neighbour D', computes a
99.9%-confidence lower bound on ε (tests/support/empirical_audit.py), and checks it against
the claim. The same audit, run on a deliberately broken variant, must exceed the claim: that
shows it can fail. BinAgg's audits (PrivTree's decisions, one bin's count) are in
tests/integration/mechanisms/test_binagg.py.
"""

import contextlib
import copy

import numpy as np
import pytest

import mechanisms as M
from mechanisms import gradient_descent, sufficient_stats, theil_sen
from mechanisms.batch import TractBatch
from mechanisms.noise import SeededRandomness
from dpatlas.audit import base as audit_base
from dpatlas.audit import noise as audit_noise

from tests.support.empirical_audit import audit_sample as audit, budget_scaled


def half_noise(module):
    """Broken variant: the module's Laplace mechanism gets twice the ε (half the noise)."""
    return budget_scaled(module, "laplace_mechanism", 2.0)


@contextlib.contextmanager
def forgotten_sensitivity():
    """Broken variant: the exponential mechanism uses utility sensitivity 1 instead of k."""
    original = theil_sen.exp_median

    def broken(seg, eps, k, *args, **kwargs):
        return original(seg, eps, np.ones_like(np.asarray(k)), *args, **kwargs)

    theil_sen.exp_median = broken
    try:
        yield
    finally:
        theil_sen.exp_median = original


# --- NoisyIntercept: D has every y = 0; D' replaces one record by y = 1 (ȳ moves by 1/n) ----

INTERCEPT_DATA = [(np.linspace(0, 1, 10), np.zeros(10)),
                  (np.linspace(0, 1, 10), np.r_[np.zeros(9), 1.0])]


def intercept_sample(i, reps, seed, eps=1.0):
    x, y = INTERCEPT_DATA[i]
    return M.estimate_batch("NoisyIntercept", TractBatch.single(x, y), eps, seed=seed,
                            reps=reps).p25[:, 0]


def test_audit_noisy_intercept():
    lb = audit(intercept_sample)
    assert 0.8 < lb <= 1.0, lb  # tight: the audit reaches most of the claim
    with half_noise(sufficient_stats):
        assert audit(intercept_sample) > 1.0


# --- NoisyStats: the released noisy ncov (claim ε/3). D: ten records at (0,0);
# D': one of them replaced by (1,1), which moves ncov by (n−1)/n, the full sensitivity. --------

STATS_DATA = [(np.zeros(10), np.zeros(10)), (np.r_[np.zeros(9), 1.0], np.r_[np.zeros(9), 1.0])]


def ncov_sample(i, reps, seed, eps=3.0):
    x, y = STATS_DATA[i]
    res = M.estimate_batch("NoisyStats", TractBatch.single(x, y), eps, seed=seed, reps=reps)
    return res.extras["noisy_ncov"][:, 0]


def test_audit_noisy_stats():
    lb = audit(ncov_sample)
    assert 0.8 < lb <= 1.0, lb  # claim for the ncov release: 3.0 / 3
    with half_noise(sufficient_stats):
        assert audit(ncov_sample) > 1.0


# --- DPExpTheilSen (p25, claim ε/2): the neighbours found by exhaustive search over small
# corner datasets to maximise the likelihood ratio. -------------------------------------------

EXP_X = np.array([0.0, 0.0, 1.0, 1.0, 0.5])
EXP_DATA = [(EXP_X, np.array([1.0, 1.0, 0.0, 0.0, 1.0])),
            (EXP_X, np.array([1.0, 1.0, 0.0, 0.0, 0.0]))]


def exp_sample(i, reps, seed, eps=4.0):
    x, y = EXP_DATA[i]
    return M.estimate_batch("DPExpTheilSen", TractBatch.single(x, y), eps, seed=seed,
                            reps=reps).p25[:, 0]


def test_audit_dp_exp_theil_sen():
    claim = 2.0  # ε/2 for the p25 median
    lb = audit(exp_sample)
    # The exact law reaches 1.0 (half the claim) on these neighbours: the exponential
    # mechanism's factor 2 is loose here.
    assert 0.8 < lb <= claim, lb
    with forgotten_sensitivity():
        assert audit(exp_sample) > claim


# --- DPGDPure: one noisy gradient step (claim ε/T per step; the run composes T of them).
# D: a record whose clipped gradient is (+τ, +τ); D': it becomes (−τ, −τ) (L1 shift 4τ). ------

GD_TAU, GD_STEPS, GD_EPS = 0.1, 4, 4.0
GD_DATA = [(np.array([0.5, 0.3, 0.7]), np.array([0.0, 0.4, 0.6])),
           (np.array([0.5, 0.3, 0.7]), np.array([1.0, 0.4, 0.6]))]


def gd_step_sample(i, reps, seed):
    x, y = GD_DATA[i]
    b = TractBatch.single(x, y)
    gsum = gradient_descent.clipped_gradient_sum(b, np.full((1, 1, 2), 0.5), GD_TAU)
    est = M.get("DPGDPure")
    hp = est.hyper({"steps": GD_STEPS, "tau": GD_TAU})
    noisy = est._noisy_sum(SeededRandomness(seed), np.repeat(gsum, reps, axis=0), GD_EPS, None, hp)
    return noisy[:, 0, :].sum(axis=1)  # the shift is along (1, 1): its sum carries it all


def test_audit_dpgd_pure_step():
    claim = GD_EPS / GD_STEPS
    lb = audit(gd_step_sample)
    assert 0.6 < lb <= claim, lb
    with half_noise(gradient_descent):
        assert audit(gd_step_sample) > claim


def test_gd_audit_neighbours_are_extreme():
    # The audit's neighbours really move the clipped sum by 2τ in each coordinate.
    sums = [gradient_descent.clipped_gradient_sum(TractBatch.single(*d), np.full((1, 1, 2), 0.5),
                                                  GD_TAU)[0, 0] for d in GD_DATA]
    assert np.allclose(sums[0] - sums[1], [2 * GD_TAU, 2 * GD_TAU])


# --- the release audit recomputes BinAgg's PrivTree step from its parameters alone ---------


def _binagg_budget_step(eps):
    """A manifest budget step for BinAgg in the form allocate.Step.as_dict() writes."""
    steps = M.get("BinAgg").noise_steps(eps)
    g = M.get("BinAgg").guarantee(eps)
    return {"step": "suite: BinAgg", "estimator": "BinAgg", "guarantee": M.privacy.as_dict(g),
            "noise": {"alternatives": {"BinAgg": [s.as_dict() for s in steps]}}}


def _check(step):
    manifest = {"budget": {"steps": [step]}}
    return audit_noise.check_noise(None, manifest)


@pytest.mark.parametrize("eps", [0.05, 1.0, 8.0])
def test_release_audit_recomputes_privtree_and_accepts_a_correct_step(eps):
    step = _binagg_budget_step(eps)
    privtree = step["noise"]["alternatives"]["BinAgg"][0]
    assert privtree["mechanism"] == "privtree-grid-laplace"
    recomputed = audit_noise.noise_guarantee(privtree)
    assert recomputed.epsilon == pytest.approx(privtree["guarantee"]["epsilon"], rel=1e-12)
    bound = audit_noise.noise_guarantee_bound(privtree)
    assert recomputed.epsilon < bound.epsilon < recomputed.epsilon * 1.001
    assert "4 noise steps recomputed" in _check(step)


def test_release_audit_rejects_a_tampered_privtree_scale_or_bias():
    step = _binagg_budget_step(1.0)
    # Half the scale, guarantee left as stated: the recomputation disagrees.
    tampered = copy.deepcopy(step)
    p = tampered["noise"]["alternatives"]["BinAgg"][0]["parameters"]
    p["scale_num"] //= 2
    with pytest.raises(audit_base.Mismatch, match="privtree-grid-laplace .* gives"):
        _check(tampered)
    # Half the scale and the noise step's guarantee restated to match: the composition then
    # exceeds the budget step's guarantee.
    noise = tampered["noise"]["alternatives"]["BinAgg"][0]
    noise["guarantee"]["epsilon"] = audit_noise.noise_guarantee(noise).epsilon
    with pytest.raises(audit_base.Mismatch, match="noise gives rho .* > stated"):
        _check(tampered)
    # A bias of zero (no decay per level) is not a PrivTree the map covers.
    zero = copy.deepcopy(step)
    zero["noise"]["alternatives"]["BinAgg"][0]["parameters"]["bias"] = 0
    with pytest.raises(audit_base.Mismatch, match="bias must be an integer >= 1"):
        _check(zero)
    # Twice the scale with the guarantee restated: more private than the step says, which
    # the rounding cannot explain (the step does not describe its noise).
    loose = copy.deepcopy(step)
    noise = loose["noise"]["alternatives"]["BinAgg"][0]
    noise["parameters"]["scale_num"] *= 2
    noise["guarantee"]["epsilon"] = audit_noise.noise_guarantee(noise).epsilon
    with pytest.raises(audit_base.Mismatch, match="does not describe its noise"):
        _check(loose)


def test_release_audit_privtree_formula_is_independent_of_the_mechanisms_code():
    from mechanisms.binagg import privtree_replace_one_epsilon

    for n, t, bias in ((4096, 7915.8, 5487), (4096, 500.0, 347), (1, 2.0, 2), (4, 40.0, 1)):
        assert audit_noise.privtree_replace_one_epsilon(n, t, bias) == pytest.approx(
            privtree_replace_one_epsilon(n, t, bias), rel=1e-12)
    src = open(audit_noise.__file__).read()
    assert "import mechanisms" not in src and "from mechanisms" not in src


# --- the release audit converts add-remove noise (FreeLunchSSP) to the step's replace-one ---


def _free_lunch_budget_step(eps):
    """FreeLunchSSP's budget step as the manifest prints it (dpatlas/manifest.step_entry)."""
    est = M.get("FreeLunchSSP")
    steps = est.noise_steps(eps)
    return {"step": "suite: FreeLunchSSP", "estimator": "FreeLunchSSP",
            "relation": "replace-one", "guarantee": M.privacy.as_dict(est.guarantee(eps)),
            "noise": {"alternatives": {"FreeLunchSSP": [s.as_dict() for s in steps]}},
            "relation_conversions": {"FreeLunchSSP": {"noise_relations": ["add-remove"],
                                                      "to": "replace-one"}}}


@pytest.mark.parametrize("eps", [0.001, 1.0, 50.0])
def test_release_audit_converts_add_remove_noise_draw_by_draw(eps):
    step = _free_lunch_budget_step(eps)
    assert "converted to replace-one draw by draw" in _check(step)
    assert "1 alternative(s) with add-remove noise" in audit_noise.check_relations(
        None, {"budget": {"steps": [step], "per_tract_and_cell": step["guarantee"]}})
    # Without the conversion the same noise is half the step's epsilon: not its noise.
    unconverted = copy.deepcopy(step)
    for ns in unconverted["noise"]["alternatives"]["FreeLunchSSP"]:
        ns["relation"] = ns["guarantee"]["relation"] = "replace-one"
    with pytest.raises(audit_base.Mismatch, match="does not describe its noise"):
        _check(unconverted)
    # Replace-one noise cannot pay a step stated for add-remove: no conversion that way.
    add_remove = copy.deepcopy(step)
    add_remove["relation"] = "add-remove"
    for ns in add_remove["noise"]["alternatives"]["FreeLunchSSP"]:
        ns["relation"] = ns["guarantee"]["relation"] = "replace-one"
    with pytest.raises(audit_base.Mismatch, match="cannot pay a step charged for add-remove"):
        _check(add_remove)
