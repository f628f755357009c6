"""Guarantee types, composition and conversions."""

import math

import numpy as np
import pytest
from scipy.stats import norm

import mechanisms as M
from mechanisms.privacy import (GDP, ZCDP, ApproxDP, NotDP, PureDP, as_dict, parallel,
                                rho_for_approx, sequential, to_approx, to_zcdp)


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
    # GDP -> (eps, delta) is exact: delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
    for mu in (0.5, 1.0, 2.0):
        e = to_approx(GDP(mu), 1e-5).epsilon
        d = norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2)
        assert d == pytest.approx(1e-5, rel=0.02)


def test_rho_for_approx_inverts_conversion():
    rho = rho_for_approx(1.0, 1e-6)
    assert to_approx(ZCDP(rho), 1e-6).epsilon <= 1.0
    assert to_approx(ZCDP(rho * 1.01), 1e-6).epsilon > 1.0


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
    assert steps and all(s.guarantee == s.noise.guarantee() for s in steps)
    composed = compose(steps)
    g = est.guarantee(1.0, delta)
    assert g == (to_approx(composed, delta) if est.needs_delta else composed)
