"""The one accountant (mechanisms/accounting.py) and its tolerance policy, and the audit's
independent accountant (dpatlas/audit/accounting.py) cross-checked against dp-accounting's own."""

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.rdp import rdp_privacy_accountant

from dpatlas.audit import accounting as audit_accounting
from dpatlas.audit import anchors as audit_anchors
from dpatlas.audit import noise as audit_noise
from dpatlas.ledger import caps
from dpatlas.release import allocate
from mechanisms import accounting
from mechanisms.accounting import REL_TOL, Accountant, Refused, within
from mechanisms.privacy_filter import BudgetOverrun, PrivacyFilter
from mechanisms.privacy import (GDP, ZCDP, ApproxDP, MixedRelations, PureDP, Relation,
                                to_approx)
from mechanisms.privacy_maps import ExpMedian, GridGaussian, GridLaplace

LABELS = np.array(["17001000100", "17001000200"], dtype=object)


# --- compositions, against hand-computed values ---------------------------------------------


def test_pure_epsilons_add():
    acc = Accountant().compose(PureDP(0.1), 3).compose(PureDP(0.25))
    assert acc.spent() == PureDP(0.55)


def test_zcdp_rhos_add_and_pure_parts_are_lifted_one_by_one():
    # 2 pure runs of ε = 0.2 are ρ = 2 · 0.2²/2 = 0.04 (not (2 · 0.2)²/2 = 0.08).
    acc = Accountant().compose(ZCDP(0.01), 3).compose(PureDP(0.2), 2)
    assert acc.spent().rho == pytest.approx(0.03 + 0.04, rel=1e-15)
    assert isinstance(acc.spent(), ZCDP)


def test_gdp_composes_as_root_sum_of_squares():
    assert Accountant().compose(GDP(0.5), 4).spent().mu == pytest.approx(1.0, rel=1e-15)


def test_approx_parts_add_and_concentrated_parts_convert_once_at_the_conversion_delta():
    acc = Accountant(conversion_delta=1e-6).compose(ApproxDP(0.5, 1e-6), 2).compose(ZCDP(0.01), 3)
    got = acc.spent()
    once = to_approx(ZCDP(0.03), 1e-6).epsilon  # ρ summed first, converted once
    assert got.epsilon == pytest.approx(1.0 + once, rel=1e-12)
    assert got.delta == pytest.approx(3e-6, rel=1e-12)
    # The classical bound ρ + 2√(ρ ln 1/δ) (Bun & Steinke 2016, Prop. 1.3) is above it, and
    # three separate conversions (each at a third of δ) cost more than the one.
    assert once < 0.03 + 2 * math.sqrt(0.03 * math.log(1e6))
    assert once < 3 * to_approx(ZCDP(0.01), 1e-6 / 3).epsilon


def test_fits_against_a_cap_and_says_why_not():
    acc = Accountant().compose(PureDP(0.4))
    assert acc.fits(PureDP(0.6), 1, PureDP(1.0))
    assert not acc.fits(PureDP(0.35), 2, PureDP(1.0))
    assert "1.1-DP (pure) would be over the 1-DP (pure) cap" in acc.refusal(PureDP(0.35), 2,
                                                                             PureDP(1.0))
    assert "cannot be paid from the pure" in acc.refusal(ZCDP(0.01), 1, PureDP(1.0))
    assert "non-private" in acc.refusal(audit_notdp(), 1, PureDP(1.0))
    # A concentrated draw under an (ε, δ) cap is converted at the δ the cap leaves.
    cap = ApproxDP(to_approx(ZCDP(0.02), 1e-6).epsilon, 1e-6)
    assert Accountant().compose(ZCDP(0.01)).fits(ZCDP(0.01), 1, cap)
    assert not Accountant().compose(ZCDP(0.01)).fits(ZCDP(0.0101), 1, cap)


def audit_notdp():
    from mechanisms.privacy import NotDP

    return NotDP("a baseline")


def test_relations_are_not_mixed():
    half = PureDP(0.5, Relation.ADD_REMOVE)
    with pytest.raises(MixedRelations):
        Accountant().compose(PureDP(0.5)).compose(half).spent()
    assert "convert it first" in Accountant().compose(half).refusal(PureDP(0.1), 1, PureDP(1.0))


def test_count_must_be_a_whole_number():
    with pytest.raises(ValueError, match="whole number"):
        Accountant().compose(PureDP(0.1), 1.5)


# --- one tolerance policy ---------------------------------------------------------------------


def _three_shares_over_their_cap() -> float:
    """A cap whose three equal float shares sum (in float) to more than the cap itself."""
    for cap in np.linspace(0.1, 3.0, 2901):
        third = float(cap) / 3
        if third + third + third > float(cap):
            return float(cap)
    raise AssertionError("no such cap")


def test_three_equal_float_shares_fit_their_cap_everywhere():
    cap = _three_shares_over_their_cap()
    third = cap / 3
    assert third + third + third > cap  # the float sum is over: the tolerance is what lets it in
    acc = Accountant().compose(PureDP(third)).compose(PureDP(third))
    assert acc.fits(PureDP(third), 1, PureDP(cap))
    # the in-run filter, three draws of a third
    m = PrivacyFilter({"s": PureDP(cap)}, LABELS).meter("s")
    for _ in range(3):
        m.spend(LABELS, PureDP(third))
    # the ledger's cap check
    assert caps.within_cap(third + third + third, cap)


def test_a_real_overspend_of_one_part_in_a_million_is_refused_everywhere():
    over = 1.0 + 1e-6
    assert not within(over, 1.0)
    assert not Accountant().fits(PureDP(over), 1, PureDP(1.0))
    m = PrivacyFilter({"s": PureDP(1.0)}, LABELS).meter("s")
    with pytest.raises(BudgetOverrun, match="over the 1-DP"):
        m.spend(LABELS, PureDP(over))
    assert not caps.within_cap(over, 1.0)
    assert not Accountant().fits(ZCDP(0.01 * over), 1, ZCDP(0.01))


def test_the_plan_filter_ledger_and_manifest_share_the_one_tolerance():
    import mechanisms.privacy_filter as privacy_filter
    from dpatlas.release import manifest

    assert REL_TOL == 1e-9
    assert not hasattr(privacy_filter, "REL_TOL") and not hasattr(allocate, "REL_TOL")
    assert not hasattr(caps, "REL_TOL") and not hasattr(manifest, "REL_TOL")
    assert allocate.within is accounting.within and manifest.within is accounting.within
    # 1e-10 relative over passes, 1e-8 is refused: the same line for every caller
    assert caps.within_cap(1.0 + 1e-10, 1.0) and not caps.within_cap(1.0 + 1e-8, 1.0)
    assert accounting.agrees(1.0, 1.0 + 1e-10) and not accounting.agrees(1.0, 1.0 + 1e-8)


# --- the audit's independent accountant against dp-accounting's ---------------------------


K = (1, 3, 10)


@pytest.mark.parametrize("k", K)
def test_audit_discrete_laplace_composition_matches_dp_accounting(k):
    """Pure ε adds: the audit's total of k discrete Laplace steps is k·ε, which is what
    dp-accounting's PLD of the same discrete Laplace (parameter a = 1/t per grid unit,
    integer sensitivity N + d grid units) gives at δ = 0, up to its pessimistic discretisation.
    At δ > 0 the audit's pure total is no tighter than the PLD's (it states δ = 0)."""
    noise = GridLaplace.calibrate(0.3)
    p = noise.parameters()
    one = audit_noise.noise_guarantee({"mechanism": "grid-laplace", "parameters": p})
    total = audit_accounting.sequential([one] * k)
    assert total.kind == "pure"
    a = p["scale_den"] / p["scale_num"]
    sens = p["grid_steps"] + p["dims"]
    assert total.epsilon == pytest.approx(k * a * sens, rel=1e-12)
    # dp-accounting's PLDAccountant truncates tails to an infinite loss (ε = ∞ at δ = 0), so
    # the PLD is composed here without truncation.
    exact = pld.from_discrete_laplace_mechanism(
        a, sensitivity=sens, value_discretization_interval=1e-5).self_compose(
        k, tail_mass_truncation=0.0)
    assert exact.get_epsilon_for_delta(0.0) == pytest.approx(total.epsilon, rel=1e-3)
    assert total.epsilon >= exact.get_epsilon_for_delta(1e-6)


@pytest.mark.parametrize("k", K)
def test_audit_discrete_gaussian_composition_matches_dp_accounting(k):
    """zCDP: the audit's ρ of k discrete Gaussian steps, converted once, equals
    dp-accounting's RDP accountant composing k Gaussians of noise multiplier σ/Δ at the same
    orders (a Gaussian's Rényi divergence at order α is αΔ²/(2σ²) = αρ, exactly a ρ-zCDP
    bound; the discrete Gaussian satisfies the same ρ, Canonne, Kamath & Steinke 2020). It is
    no tighter than dp-accounting's exact PLD of the discrete Gaussian: the zCDP conversion is
    an upper bound on the privacy profile."""
    noise = GridGaussian.calibrate(0.02)
    p = noise.parameters()
    one = audit_noise.noise_guarantee({"mechanism": "grid-gaussian", "parameters": p})
    sens = p["grid_steps"] + 1  # dims = 1: L2 sensitivity N + √1 grid units
    sigma = math.sqrt(p["sigma2"])
    assert one.rho == pytest.approx(sens ** 2 / (2 * sigma ** 2), rel=1e-12)
    delta = 1e-6
    eps_audit, _ = audit_accounting.as_approx(audit_accounting.sequential([one] * k), delta)
    rdp = rdp_privacy_accountant.RdpAccountant(audit_accounting.zcdp_conversion_orders())
    rdp.compose(dp_accounting.GaussianDpEvent(sigma / sens), k)
    assert eps_audit == pytest.approx(rdp.get_epsilon(delta), rel=1e-9)
    exact = pld.from_discrete_gaussian_mechanism(
        sigma, sensitivity=sens, value_discretization_interval=1e-4).self_compose(k)
    assert eps_audit >= exact.get_epsilon_for_delta(delta)


@pytest.mark.parametrize("k", K)
def test_audit_exponential_mechanism_composition_matches_dp_accounting(k):
    """The exponential-mechanism median is pure ε = rate/rate_den; dp-accounting has no event
    for it, so its pure-ε composition is checked against dp-accounting's PLD of an ε-DP
    mechanism (the worst case of every ε-DP mechanism: ``from_privacy_parameters``) composed
    k times: k·ε at δ = 0; at δ > 0 the audit's pure total is no tighter."""
    noise = ExpMedian.calibrate(0.15)
    one = audit_noise.noise_guarantee({"mechanism": "exponential-median",
                                 "parameters": noise.parameters()})
    assert one.epsilon == pytest.approx(noise.rate / noise.rate_den, rel=1e-15)
    total = audit_accounting.sequential([one] * k)
    worst = pld.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(one.epsilon),
                                        value_discretization_interval=1e-5).self_compose(
        k, tail_mass_truncation=0.0)
    assert worst.get_epsilon_for_delta(0.0) == pytest.approx(total.epsilon, rel=1e-3)
    assert total.epsilon >= worst.get_epsilon_for_delta(1e-6)


# --- the ledger's lifetime total composes zCDP charges as ρ -----------------------------------


def _zcdp_charges(rho: float, delta: float, cells: list[str]):
    from dpatlas.ledger import Charge

    eps = to_approx(ZCDP(rho), delta).epsilon  # what charges() stores for a zCDP step
    return [Charge(cell, "suite: BinAgg", "zcdp", eps, delta, rho) for cell in cells]


def test_ledger_lifetime_total_converts_the_summed_rho_once(tmp_path):
    from dpatlas.ledger import Charge, Ledger

    rho, delta = 0.01, 1e-7
    per_step = to_approx(ZCDP(rho), delta).epsilon
    once = to_approx(ZCDP(4 * rho), 4 * delta).epsilon
    basic = 4 * per_step + 0.5
    tight = once + 0.5
    assert tight < basic - 0.5  # converting once is much tighter than adding 4 conversions
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as led:
        # a cap between the two totals: only the composed total fits
        led.set_cap("tracts", (tight + basic) / 2, 1e-5, reason="test")
        led.begin_release("r1", "tracts", _zcdp_charges(rho, delta, ["all", "female"]), "c" * 64,
                          "a")
        led.begin_release("r2", "tracts", _zcdp_charges(rho, delta, ["all", "female"])
                          + [Charge("all", "primary: p25 and p75", "pure", 0.5, 0.0, 0.125)],
                          "c" * 64, "a")
        s = led.spent("tracts")
        assert s["epsilon"] == pytest.approx(tight, rel=1e-12)
        assert s["delta"] == pytest.approx(4 * delta, rel=1e-12)
        assert f"eps={tight:.10g}"[:12] in led.summary_text()
        # the audit's own recomputation, from the same rows, agrees
        rows = [{"kind": k, "e": e, "d": d, "rho": r} for k, e, d, r in
                led.entries("tracts")[["guarantee_type", "epsilon", "delta", "rho"]]
                .itertuples(index=False)]
        rows = [{**x, "rho": None if x["rho"] != x["rho"] else x["rho"]} for x in rows]
        assert audit_anchors.lifetime_spend(rows) == pytest.approx((tight, 4 * delta), rel=1e-9)
        # a further release over the composed total is still refused
        from dpatlas.ledger import BudgetExceeded

        with pytest.raises(BudgetExceeded):
            led.begin_release("r3", "tracts", [Charge("all", "x", "pure", basic, 0.0, None)],
                              "c" * 64, "a")


def test_ledger_lifetime_total_of_pure_charges_is_their_sum(tmp_path):
    from dpatlas.ledger import Charge, Ledger

    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as led:
        led.set_cap("tracts", 2.0, 1e-5, reason="test")
        led.begin_release("r1", "tracts", [Charge("all", "s", "pure", 0.75, 0.0, 0.28125)] * 2,
                          "c" * 64, "a")
        assert led.spent("tracts")["epsilon"] == 1.5
    assert audit_anchors.lifetime_spend(
        [{"kind": "pure", "e": 0.75, "d": 0.0, "rho": 0.28125}] * 2) \
        == (1.5, 0.0)


def test_privacy_maps_are_declared_in_one_module():
    from mechanisms import privacy_maps
    from mechanisms.binagg import PrivTreeLaplace

    assert privacy_maps.MAPS["privtree-grid-laplace"] is PrivTreeLaplace
    assert PrivTreeLaplace.__module__ == "mechanisms.privacy_maps"
    src = open(privacy_maps.__file__.replace("privacy_maps", "binagg")).read()
    assert "MAPS" not in src


def test_one_copy_of_the_laplace_scale_formula():
    from mechanisms.noise import LAPLACE_GRID_STEPS, laplace_scale, laplace_scale_num

    for eps in (0.001, 0.3, 1.0 / 3, 7.0):
        for d in (1, 3):
            want = math.ceil((LAPLACE_GRID_STEPS + d) / eps * 256)  # the formula, by hand
            assert int(laplace_scale_num(eps, d)) == want
            assert GridLaplace.calibrate(eps, d).scale_num == want
            assert laplace_scale(2.0, eps, d) == 2.0 / LAPLACE_GRID_STEPS * (want / 256)
