"""Guarantee types, composition and conversions."""

import math

import numpy as np
import pytest
from scipy.stats import norm

import mechanisms as M
import mechanisms.free_lunch  # noqa: F401  (registers FreeLunchSSP until mechanisms/__init__ does)
from mechanisms.privacy import (GDP, PROJECT_RELATION, ZCDP, ApproxDP, MixedRelations, NotDP,
                                PureDP, Relation, as_dict, convert_relation, from_dict,
                                parallel, rho_for_approx, sequential, to_approx, to_zcdp)

AR, RO = Relation.ADD_REMOVE, Relation.REPLACE_ONE


def test_sequential_same_type():
    assert sequential([PureDP(0.5), PureDP(0.25)]) == PureDP(0.75)
    assert sequential([ZCDP(0.1), ZCDP(0.2)]).rho == pytest.approx(0.3)
    assert sequential([GDP(3.0), GDP(4.0)]).mu == pytest.approx(5.0)
    assert sequential([ApproxDP(1, 1e-6), ApproxDP(2, 1e-6)]) == ApproxDP(3, 2e-6)


def test_sequential_mixed_lifts_to_zcdp():
    g = sequential([PureDP(1.0), ZCDP(0.25), GDP(1.0)])
    assert isinstance(g, ZCDP)
    assert g.rho == pytest.approx(0.5 + 0.25 + 0.5)


def test_sequential_with_approx_needs_delta():
    with pytest.raises(ValueError):
        sequential([ApproxDP(1, 1e-6), ZCDP(0.5)])
    g = sequential([ApproxDP(1, 1e-6), ZCDP(0.5), PureDP(0.5)], delta=1e-6)
    assert g.delta == pytest.approx(2e-6)
    assert g.epsilon == pytest.approx(1.5 + to_approx(ZCDP(0.5), 1e-6).epsilon)


def test_parallel_is_max_and_notdp_poisons():
    assert parallel([PureDP(1), PureDP(3), PureDP(2)]) == PureDP(3)
    assert parallel([PureDP(2), ZCDP(1.0)]) == ZCDP(2.0)  # 2-DP => 2-zCDP
    assert isinstance(sequential([PureDP(1), NotDP("x")]), NotDP)
    assert isinstance(parallel([PureDP(1), NotDP("x")]), NotDP)


def test_conversions_match_closed_forms():
    assert to_zcdp(PureDP(2.0)) == ZCDP(2.0)
    # zCDP -> (eps, delta): dp-accounting is at least as tight as rho + 2 sqrt(rho ln 1/delta)
    for rho in (0.01, 0.5, 4.0):
        e = to_approx(ZCDP(rho), 1e-6).epsilon
        assert rho < e <= rho + 2 * math.sqrt(rho * math.log(1e6)) + 1e-9


@pytest.mark.slow  # dp-accounting's PLD accountant: about 13 s for the three mu
def test_gdp_to_approx_is_exact():
    # GDP -> (eps, delta) is exact: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
    for mu in (0.5, 1.0, 2.0):
        e = to_approx(GDP(mu), 1e-5).epsilon
        d = norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)
        assert d == pytest.approx(1e-5, rel=0.02)


def test_rho_for_approx_inverts_conversion():
    rho = rho_for_approx(1.0, 1e-6)
    assert to_approx(ZCDP(rho), 1e-6).epsilon <= 1.0
    assert to_approx(ZCDP(rho * 1.01), 1e-6).epsilon > 1.0



EPSILON_GRID = np.logspace(-4, math.log10(50.0), 19)  # 1e-4 ... 50


@pytest.mark.parametrize("delta", [1e-9, 1e-6, 1e-3])
def test_rho_for_approx_is_monotone_and_tight_for_tiny_and_large_budgets(delta):
    # Regression: with dp-accounting's default orders (<= 1024) and an absolute bisection,
    # (0.001, 1e-6) and (0.003, 1e-6) both gave rho ~ 9.1e-13 and (0.01, 1e-9) ~ 1e-18.
    rhos = [rho_for_approx(float(eps), delta) for eps in EPSILON_GRID]
    assert all(a < b for a, b in zip(rhos, rhos[1:])), "rho must grow with epsilon"
    log_inv_delta = math.log(1.0 / delta)
    for eps, rho in zip(EPSILON_GRID, rhos):
        back = to_approx(ZCDP(rho), delta).epsilon
        assert eps * (1 - 1e-3) <= back <= eps, (eps, rho, back)  # fits, within 0.1%
        assert to_approx(ZCDP(rho * 1.001), delta).epsilon > eps  # and is the largest
        # At least what the closed form eps = rho + 2 sqrt(rho ln 1/delta) allows
        # (Bun & Steinke 2016, Prop. 1.3); the RDP bound used is tighter, never looser.
        closed_form = (math.sqrt(log_inv_delta + eps) - math.sqrt(log_inv_delta)) ** 2
        assert rho >= closed_form * (1 - 1e-9), (eps, rho, closed_form)


def test_rho_for_approx_rejects_bad_budgets():
    for eps, delta in ((1.0, 0.0), (1.0, 1.0), (-0.1, 1e-6), (math.nan, 1e-6)):
        with pytest.raises(ValueError):
            rho_for_approx(eps, delta)

def test_bad_values_rejected():
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            PureDP(bad)
    with pytest.raises(ValueError):
        ApproxDP(1.0, 1.5)
    with pytest.raises(TypeError):
        to_zcdp(ApproxDP(1.0, 1e-6))


@pytest.mark.parametrize("name,expected", [
    ("NoisyStats", PureDP(1.0)), ("NoisyIntercept", PureDP(1.0)),
    ("DPExpTheilSen", PureDP(1.0)), ("DPExpTheilSenMatch", PureDP(1.0)),
    ("DPExpTheilSenkMatch", PureDP(1.0)), ("DPWideTheilSen", PureDP(1.0)),
    ("DPSSTheilSen", PureDP(1.0)), ("DPGDPure", PureDP(1.0)), ("DPGDzCDP", ZCDP(0.5)),
])
def test_estimator_guarantees(name, expected):
    g = M.get(name).guarantee(1.0, **M.get(name).defaults)
    assert type(g) is type(expected)
    for f in ("epsilon", "rho"):
        if hasattr(expected, f):
            assert getattr(g, f) == pytest.approx(getattr(expected, f))


def test_approx_and_nondp_guarantees():
    g = M.get("DPGDApprox").guarantee(1.0, 1e-6)
    assert isinstance(g, ApproxDP) and g.delta == 1e-6 and 0.99 < g.epsilon <= 1.0 + 1e-9
    for name in ("OLS", "TheilSen", "MOS"):
        assert isinstance(M.get(name).guarantee(1.0), NotDP)
        assert not M.get(name).private
    assert as_dict(PureDP(1.0))["type"] == "pure"


def test_ss_noise_parameters_spend_at_most_epsilon():
    from mechanisms.theil_sen import DPSSTheilSen
    for d in (1, 3, 10):
        for share in (0.2, 0.5, 0.8):
            beta, s = DPSSTheilSen.noise_parameters(0.5, d, share)
            eps = (d + 1) * (beta + s / (2 * np.sqrt(d)))
            assert eps <= 0.5 and eps == pytest.approx(0.5, rel=1e-15)
    with pytest.raises(ValueError, match="beta_share"):
        DPSSTheilSen.noise_parameters(0.5, 3, 1.0)


@pytest.mark.parametrize("name", [n for n, e in M.REGISTRY.items() if e.private])
def test_guarantee_is_the_composition_of_the_noise_steps(name):
    from mechanisms.privacy_maps import compose
    est = M.get(name)
    delta = 1e-6 if est.needs_delta else None
    steps = est.noise_steps(1.0, delta)
    # Each step's guarantee is its map's numbers, stated for the relation of its sensitivity.
    assert steps and all(s.guarantee == M.privacy.with_relation(s.noise.guarantee(), s.relation)
                         for s in steps)
    composed = compose(steps, relation=PROJECT_RELATION)  # the stated conversion, if any
    g = est.guarantee(1.0, delta)
    assert g.relation is PROJECT_RELATION
    assert g == (to_approx(composed, delta) if est.needs_delta else composed)


# --- neighbouring relations (issue 9) ---------------------------------------------------------


def test_guarantees_carry_their_relation_and_default_to_the_projects():
    assert PROJECT_RELATION is RO
    assert PureDP(1.0) == PureDP(1.0, RO) != PureDP(1.0, AR)
    assert ApproxDP(1.0, 1e-6).relation is ZCDP(0.1).relation is GDP(1.0).relation is RO
    # The text names the relation where it is not the project's, and the dict always.
    assert PureDP(1.0).describe() == "1-DP (pure)"
    assert PureDP(1.0, AR).describe() == "1-DP (pure, add-remove)"
    assert "add-remove" in ZCDP(0.1, AR).describe() and "add-remove" in GDP(1, AR).describe()
    assert as_dict(PureDP(1.0))["relation"] == "replace-one"
    assert as_dict(ApproxDP(1.0, 1e-6, AR))["relation"] == "add-remove"
    assert "relation" not in as_dict(NotDP("x"))
    for g in (PureDP(0.5, AR), ApproxDP(1.0, 1e-6, AR), ZCDP(0.2), GDP(1.5, AR), NotDP("x")):
        assert from_dict(as_dict(g)) == g
    legacy = {"type": "pure", "text": "1-DP (pure)", "epsilon": 1.0}  # before relations
    assert from_dict(legacy) == PureDP(1.0, RO)
    with pytest.raises(ValueError, match="unknown neighbouring relation"):
        from_dict({**legacy, "relation": "swap-two"})
    with pytest.raises(ValueError, match="relation must be a Relation"):
        PureDP(1.0, "add-remove")


def test_mixed_relations_cannot_compose_silently():
    for compose_ in (sequential, parallel):
        with pytest.raises(MixedRelations, match="add-remove and replace-one.*convert_relation"):
            compose_([PureDP(0.5, AR), PureDP(0.5, RO)])
        with pytest.raises(MixedRelations):
            compose_([ZCDP(0.1, AR), PureDP(0.5)])  # across accounting types too
    with pytest.raises(MixedRelations):
        sequential([ApproxDP(1, 1e-6, AR), ZCDP(0.5)], delta=1e-6)
    # One relation composes and keeps it.
    assert sequential([PureDP(0.5, AR), PureDP(0.25, AR)]) == PureDP(0.75, AR)
    assert parallel([PureDP(0.5, AR), PureDP(2.0, AR)]) == PureDP(2.0, AR)
    assert sequential([PureDP(1.0, AR), ZCDP(0.25, AR)]) == ZCDP(0.75, AR)
    g = sequential([ApproxDP(1, 1e-6, AR), ZCDP(0.5, AR)], delta=1e-6)
    assert isinstance(g, ApproxDP) and g.relation is AR
    assert isinstance(sequential([PureDP(1, AR), NotDP("x")]), NotDP)


def test_converted_guarantees_compose():
    g = sequential([convert_relation(PureDP(0.5, AR), RO), PureDP(1.0)])
    assert g == PureDP(2.0, RO)
    z = sequential([convert_relation(ZCDP(0.1, AR), RO), ZCDP(0.1)])
    assert z.relation is RO and z.rho == pytest.approx(0.5)


@pytest.mark.parametrize("g,expected", [
    (PureDP(0.7, AR), PureDP(1.4, RO)),
    (ZCDP(0.3, AR), ZCDP(1.2, RO)),
    (GDP(0.8, AR), GDP(1.6, RO)),
    (ApproxDP(1.0, 1e-6, AR), ApproxDP(2.0, (1 + math.e) * 1e-6, RO)),
    (ApproxDP(0.0, 1e-3, AR), ApproxDP(0.0, 2e-3, RO)),
])
def test_add_remove_to_replace_one_is_group_privacy_of_size_two(g, expected):
    got = convert_relation(g, RO)
    assert type(got) is type(expected) and got.relation is RO
    for f in ("epsilon", "delta", "rho", "mu"):
        if hasattr(expected, f):
            assert getattr(got, f) == pytest.approx(getattr(expected, f), rel=1e-15)
    assert convert_relation(got, RO) is got  # same relation: unchanged
    assert convert_relation(NotDP("x"), RO) == NotDP("x")


def test_approx_conversion_is_the_inequality_applied_twice():
    # For randomized response on one bit (the worst case of (eps, 0)), chaining the
    # (eps, delta) inequality along D -> D - x -> D - x + x' is exactly what group privacy
    # gives: check (1 + e^eps) delta against the two-step bound numerically.
    eps, delta = 0.4, 1e-4
    p_d2 = np.linspace(0, 1, 101)  # any probability of an event under D''
    two_steps = np.minimum(1.0, math.exp(eps) * np.minimum(1.0, math.exp(eps) * p_d2 + delta)
                           + delta)
    conv = convert_relation(ApproxDP(eps, delta, AR), RO)
    assert np.all(two_steps <= np.minimum(1.0, math.exp(conv.epsilon) * p_d2 + conv.delta) + 1e-15)
    with pytest.raises(ValueError, match="delta .* >= 1"):
        convert_relation(ApproxDP(5.0, 0.01, AR), RO)


def test_replace_one_cannot_become_add_remove():
    with pytest.raises(MixedRelations, match="same n.*changes n"):
        convert_relation(PureDP(1.0, RO), AR)
    with pytest.raises(MixedRelations):
        convert_relation(ZCDP(0.5), AR)


def test_type_conversions_keep_the_relation():
    assert to_zcdp(PureDP(2.0, AR)) == ZCDP(2.0, AR)
    assert to_zcdp(GDP(1.0, AR)).relation is AR
    assert to_approx(ZCDP(0.5, AR), 1e-6).relation is AR
    assert to_approx(GDP(0.1, AR), 1e-6).relation is AR  # small mu: a fast PLD
    assert to_approx(PureDP(1.0, AR), 1e-6) == ApproxDP(1.0, 0.0, AR)
