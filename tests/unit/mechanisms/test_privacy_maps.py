"""Privacy maps: guarantees computed from the noise drawn, for every DP estimator.

Issue 7: a guarantee declared beside the mechanism can drift from the noise it draws. Here each
estimator's guarantee is checked (1) to be the composition of the maps of its noise steps,
(2) to fit its budget and be within 0.1% of it over a grid of budgets and hyperparameters,
(3) to be computed from the very parameters the samplers are called with, and (4) each map
against a case computed by hand.
"""

import inspect
import math
import sys

import numpy as np
import pytest

import mechanisms as M
from mechanisms.binagg import PrivTreeLaplace
from mechanisms import median, noise, theil_sen
from mechanisms.batch import TractBatch
from mechanisms.noise import LAPLACE_GRID_STEPS, gaussian_sigma, laplace_scale
from mechanisms.privacy import (PROJECT_RELATION, ZCDP, MixedRelations, NotDP, PureDP,
                                Relation, rho_for_approx, to_approx, to_zcdp)
from mechanisms.sensitivity import Sensitivity
from mechanisms.privacy_maps import (MAPS, ExpMedian, GridGaussian, GridLaplace, NoiseStep,
                                     StudentTSmooth, compose, from_dict, privacy_map)

from tests.support.inputs import line_tract

EPSILONS = (1e-3, 0.01, 0.1, 1.0, 2.5, 8.0, 50.0)
DELTAS = (1e-6, 1e-9)
LOOSE = 1e-3  # a guarantee more than 0.1% below its budget wastes budget

VARIANTS = [
    ("NoisyStats", {}), ("NoisyIntercept", {}),
    ("DPExpTheilSen", {}), ("DPExpTheilSen", {"lo": 0.0, "hi": 1.0}),
    ("DPExpTheilSenMatch", {}),
    ("DPExpTheilSenkMatch", {}), ("DPExpTheilSenkMatch", {"k": 1}),
    ("DPExpTheilSenkMatch", {"k": 50}),
    ("DPWideTheilSen", {}), ("DPWideTheilSen", {"theta": 0.1}),
    *[("DPSSTheilSen", {"d": d, "beta_share": p}) for d in (1, 3, 10) for p in (0.2, 0.5, 0.8)],
    *[(name, {"steps": t, "tau": tau}) for name in ("DPGDPure", "DPGDzCDP", "DPGDApprox")
      for t in (1, 10, 80) for tau in (0.1, 1.0)],
    ("BinAgg", {}), ("BinAgg", {"w_bin": 2.0, "w_count": 1.0}),
    ("FreeLunchSSP", {}), ("FreeLunchSSP", {"x_share": 0.2}), ("FreeLunchSSP", {"x_share": 0.9}),
    ("DDSSP", {}),
    ("AdaSSP", {}), ("AdaSSP", {"fail_prob": 0.01}),
]
# (epsilon, delta) estimators: zCDP noise converted to (epsilon, delta) at the delta given
APPROX = tuple(name for name, e in M.REGISTRY.items() if e.private and e.needs_delta)
# A budget every estimator can draw: where a variant's noise shares and guarantee type are read
REFERENCE_EPSILON, REFERENCE_DELTA = 8.0, 1e-6
GAUSSIAN_REFUSAL = "too little for the grid Gaussian"


def _private():
    return [name for name, e in M.REGISTRY.items() if e.private]


def test_variants_cover_every_dp_estimator():
    assert {name for name, _ in VARIANTS} == set(_private())
    for name, e in M.REGISTRY.items():
        if not e.private:
            assert e.noise_steps(1.0) == [] and isinstance(e.guarantee(1.0), NotDP)


def _gaussian_feasible(rho_step: float) -> bool:
    """The grid Gaussian needs at least 4 grid steps per unit: 4096·sqrt(2ρ) >= 4 and
    16384·sqrt(2ρ) − sqrt(2) >= 4 (mechanisms/noise.py, _gauss_grid)."""
    root = math.sqrt(2 * rho_step)
    return min(4096 * root, 16384 * root - math.sqrt(2)) >= 4


def _reference(name: str, hp: dict):
    """(noise steps, guarantee) of a variant at the reference budget."""
    est = M.get(name)
    delta = REFERENCE_DELTA if est.needs_delta else None
    return (est.noise_steps(REFERENCE_EPSILON, delta, **hp),
            est.guarantee(REFERENCE_EPSILON, delta, **hp))


def _target(kind: str, eps: float) -> float:
    """What a budget ε means for a guarantee of this type: ε (pure, and (ε, δ) at the δ
    given), ρ = ε²/2 (zCDP)."""
    return eps**2 / 2 if kind == "zcdp" else eps


def _concentrated_budget(kind: str, eps: float, delta: float | None) -> float:
    """The ρ a variant's noise is calibrated within: ε²/2 for a zCDP estimator, the largest ρ
    whose (ε, δ) conversion fits for an (ε, δ) one (rho_for_approx)."""
    return eps**2 / 2 if kind == "zcdp" else rho_for_approx(eps, delta)


def _refusal_is_justified(name: str, hp: dict, kind: str, eps: float,
                          delta: float | None) -> bool:
    """Whether refusing budget ε is forced: some grid-Gaussian draw's share of the variant's ρ
    (the share read at the reference budget) is below what the sampler can draw, even 0.1%
    larger (the calibrations round)."""
    steps, _ = _reference(name, hp)
    total = to_zcdp(compose(steps, relation=PROJECT_RELATION)).rho
    rho = _concentrated_budget(kind, eps, delta)
    return any(not _gaussian_feasible(rho * s.guarantee.rho / total * (1 + LOOSE))
               for s in steps if s.mechanism == "grid-gaussian")


@pytest.mark.parametrize("name,hp", VARIANTS, ids=lambda v: str(v))
def test_guarantee_fits_the_budget_and_is_not_loose(name, hp):
    """Every variant alike, by the type of its guarantee (read from the registry, no names):
    pure ε-DP at ε, ρ-zCDP at ε²/2, (ε, δ)-DP at the δ given (its zCDP noise converted); a
    budget is refused only where a grid-Gaussian draw would get too little ρ."""
    est = M.get(name)
    kind = _reference(name, hp)[1].kind
    assert (kind == "approx") == est.needs_delta == (name in APPROX), (name, kind)
    deltas = DELTAS if est.needs_delta else (None,)
    checked = refused = 0
    for eps in EPSILONS:
        for delta in deltas:
            where = f"{name} {hp} eps={eps} delta={delta}"
            try:
                g = est.guarantee(eps, delta, **hp)
            except ValueError as err:  # refused up front, never silently looser
                assert GAUSSIAN_REFUSAL in str(err), (where, err)
                assert _refusal_is_justified(name, hp, kind, eps, delta), where
                refused += 1
                continue
            steps = est.noise_steps(eps, delta, **hp)
            # In the project's relation: steps stated for another are converted by name.
            assert g.relation is PROJECT_RELATION, where
            composed = compose(steps, relation=PROJECT_RELATION)
            assert g == (to_approx(composed, delta) if kind == "approx" else composed), where
            assert g.kind == kind, where
            if kind == "approx":
                assert g.delta == delta, where
            got = {"pure": lambda: g.epsilon, "zcdp": lambda: g.rho,
                   "approx": lambda: g.epsilon}[kind]()
            target = _target(kind, eps)
            assert got <= target, where
            assert got >= target * (1 - LOOSE), (where, got)
            checked += 1
    assert checked >= 2 and refused <= len(deltas) * 2, (checked, refused)


def test_infeasible_budgets_are_the_expected_ones():
    # The only refusals in the grid: zCDP gradient descent with tiny per-step ρ.
    with pytest.raises(ValueError, match="fewer steps or a larger epsilon"):
        M.get("DPGDzCDP").guarantee(1e-3, steps=80)
    assert isinstance(M.get("DPGDzCDP").guarantee(1e-3, steps=1), ZCDP)
    with pytest.raises(ValueError, match="quantum"):
        M.get("DPExpTheilSen").guarantee(2.0**-21)  # below the rate quantum per median


# --- one hand-computed case per map ----------------------------------------------------------


def test_grid_laplace_by_hand():
    cal = GridLaplace.calibrate(0.3, 1)
    # t = ceil(4097 / 0.3 * 256) / 256 = 3496107 / 256 grid units.
    assert cal.parameters() == {"grid_steps": 4096, "dims": 1, "scale_num": 3496107,
                                "scale_den": 256}
    assert cal.guarantee().epsilon == pytest.approx(4097 * 256 / 3496107, rel=1e-15)
    two = GridLaplace.calibrate(0.01, 2)  # 4098/0.01*256 = 104908800 exactly
    assert two.scale_num == 104908800 and two.guarantee().epsilon == pytest.approx(0.01)


def test_grid_gaussian_by_hand():
    cal = GridGaussian.calibrate(0.5, 1)
    # sqrt(2ρ) = 1: 4096 steps; σ² = ceil(4097² / 1) = 16785409; ρ = 4097²/(2σ²) = 0.5.
    assert cal.parameters() == {"grid_steps": 4096, "dims": 1, "sigma2": 16785409}
    assert cal.guarantee().rho == 0.5
    cal = GridGaussian.calibrate(0.02, 2)
    # sqrt(0.04) = 0.2: steps = floor(min(819.2, 3276.8 − 1.414)) = 819;
    # σ² = ceil((819 + √2)² / 0.04) = ceil(16785423.07...) .
    assert cal.grid_steps == 819
    assert cal.sigma2 == math.ceil((819 + math.sqrt(2)) ** 2 / 0.04)
    assert cal.guarantee().rho == pytest.approx((819 + math.sqrt(2)) ** 2 / (2 * cal.sigma2))
    assert cal.guarantee().rho <= 0.02


def test_exponential_median_by_hand():
    cal = ExpMedian.calibrate(0.3)
    # rate = floor(0.3 · 2^20) = floor(314572.8) = 314572.
    assert cal.parameters() == {"rate": 314572, "rate_den": 2**20}
    assert cal.guarantee().epsilon == 314572 / 2**20
    assert median.exp_median_rate(cal.argument) == 314572


def test_students_t_by_hand():
    assert privacy_map("students-t-smooth-sensitivity", {"d": 3, "beta": 0.1, "s": 0.2}) \
        == PureDP(4 * (0.1 + 0.2 / (2 * math.sqrt(3))))
    cal = StudentTSmooth.calibrate(0.5, 3, 0.5)
    # β = 0.5·0.5/4, s = 2·0.5·0.5·√3/4: (d+1)(β + s/(2√d)) = 0.25 + 0.25.
    assert cal.beta == pytest.approx(0.0625) and cal.s == pytest.approx(0.25 * math.sqrt(3) / 2)
    assert cal.guarantee().epsilon <= 0.5
    assert cal.guarantee().epsilon == pytest.approx(0.5, rel=1e-15)


def test_maps_from_published_numbers():
    steps = [s for name in ("NoisyStats", "DPGDzCDP", "DPExpTheilSen", "DPSSTheilSen", "BinAgg")
             for s in M.get(name).noise_steps(1.0)]
    assert {s.mechanism for s in steps} == set(MAPS)
    for step in steps:
        d = step.as_dict()
        assert set(d) == {"name", "mechanism", "sensitivity", "sensitivity_derivation",
                          "relation", "parameters", "repeat", "guarantee", "formula"}
        assert d["sensitivity"] == step.sensitivity.statement
        assert d["sensitivity_derivation"] == step.sensitivity.derivation != ""
        assert d["relation"] == "replace-one" == d["guarantee"]["relation"]
        assert d["mechanism"] in MAPS
        again = from_dict(d)
        assert again.guarantee == step.guarantee == privacy_map(d["mechanism"], d["parameters"])
        assert again.sensitivity.statement == d["sensitivity"]
        with pytest.raises(ValueError, match="no number"):  # published text states, no number
            again.sensitivity.value(n=10)
        assert d["guarantee"]["type"] == step.guarantee.kind
    with pytest.raises(ValueError, match="unknown mechanism"):
        privacy_map("float-laplace", {})
    with pytest.raises(ValueError, match="needs parameters"):
        privacy_map("grid-laplace", {"grid_steps": 4096, "dims": 1, "scale_num": 5})
    with pytest.raises(ValueError, match="integer >= 1"):
        privacy_map("grid-gaussian", {"grid_steps": 4096, "dims": 0, "sigma2": 5})


def test_noise_steps_carry_their_relation_to_the_manifest_and_back():
    steps = M.get("FreeLunchSSP").noise_steps(1.0)
    for step in steps:
        d = step.as_dict()
        assert d["relation"] == "add-remove" == d["guarantee"]["relation"]
        assert "add-remove" in d["guarantee"]["text"]
        again = from_dict(d)
        assert again.relation is Relation.ADD_REMOVE and again.guarantee == step.guarantee
        assert privacy_map(d["mechanism"], d["parameters"], d["relation"]) == step.guarantee
    legacy = {k: v for k, v in M.get("NoisyStats").noise_steps(1.0)[0].as_dict().items()
              if k != "relation"}
    assert from_dict(legacy).relation is Relation.REPLACE_ONE  # manifests before issue 9
    with pytest.raises(ValueError, match="relation must be a Relation"):
        Sensitivity("L1", "1", "1", "a count", relation="add-remove")
    with pytest.raises(ValueError, match="must be a Sensitivity"):
        NoiseStep("x", GridLaplace.calibrate(1.0), "1")


def test_compose_refuses_mixed_steps_unless_told_the_relation():
    ar = M.get("FreeLunchSSP").noise_steps(1.0)
    ro = M.get("NoisyStats").noise_steps(1.0)
    assert compose(ar) == PureDP(sum(s.guarantee.epsilon for s in ar), Relation.ADD_REMOVE)
    with pytest.raises(MixedRelations):
        compose(ar + ro)
    both = compose(ar + ro, relation=Relation.REPLACE_ONE)
    assert both == PureDP(2 * compose(ar).epsilon + compose(ro).epsilon, Relation.REPLACE_ONE)
    with pytest.raises(MixedRelations, match="same n"):
        compose(ro, relation=Relation.ADD_REMOVE)


def test_laplace_budgets_the_sampler_cannot_draw_are_refused_at_calibration():
    from mechanisms.privacy_maps import MAX_SCALE_NUM
    assert MAX_SCALE_NUM == getattr(noise, "_MAX_GEOMETRIC_SCALE_NUM", MAX_SCALE_NUM)
    smallest = (LAPLACE_GRID_STEPS + 1) * 256 / MAX_SCALE_NUM
    GridLaplace.calibrate(smallest * 1.001)
    with pytest.raises(ValueError, match="too small for the grid Laplace"):
        GridLaplace.calibrate(smallest / 2)


def _drawn_parameters(monkeypatch, sampler, noise_object, dims):
    """What ``sampler`` hands the exact discrete sampler when it draws with ``noise_object``."""
    seen = {}
    real_laplace, real_gaussian = noise.discrete_laplace, noise.discrete_gaussian

    def laplace(rand, scale_num, scale_den):
        seen.update(scale_num=set(np.asarray(scale_num).tolist()), scale_den=scale_den)
        return real_laplace(rand, scale_num, scale_den)

    def gaussian(rand, sigma2):
        seen.update(sigma2=set(np.asarray(sigma2).tolist()))
        return real_gaussian(rand, sigma2)

    monkeypatch.setattr(noise, "discrete_laplace", laplace)
    monkeypatch.setattr(noise, "discrete_gaussian", gaussian)
    values = np.full((3, dims), 0.25)
    out = sampler(noise.SeededRandomness(1), values, 0.5, noise_object)
    unit = 0.5 / noise_object.grid_steps  # the grid is the object's: sensitivity/grid_steps
    assert np.allclose(out / unit, np.rint(out / unit), rtol=0, atol=1e-6)
    return seen


def test_the_sampler_draws_with_the_calibrated_objects_own_numbers(monkeypatch):
    # Numbers no budget calibrates to: the sampler can only have read them off the object.
    odd = GridLaplace(1000, 2, 12345, 7)
    assert _drawn_parameters(monkeypatch, noise.laplace_mechanism, odd, 2) == {
        "scale_num": {12345}, "scale_den": 7}
    tree = PrivTreeLaplace(LAPLACE_GRID_STEPS, 99991, 256, 5, 2)
    assert _drawn_parameters(monkeypatch, noise.laplace_mechanism, tree, 1) == {
        "scale_num": {99991}, "scale_den": 256}
    g = GridGaussian(777, 3, 654321)
    # (the discrete Gaussian's own rejection sampler draws discrete Laplace noise too)
    assert _drawn_parameters(monkeypatch, noise.gaussian_mechanism, g, 3)["sigma2"] == {654321}


@pytest.mark.parametrize("sampler, calibrated", [
    (noise.laplace_mechanism, GridLaplace.calibrate(0.3, 1)),
    (noise.laplace_mechanism, PrivTreeLaplace.calibrate(0.3)),
    (noise.gaussian_mechanism, GridGaussian.calibrate(0.1, 2))])
def test_a_sampler_refuses_noise_calibrated_for_another_coordinate_count(sampler, calibrated):
    rand = noise.SeededRandomness(1)
    sampler(rand, np.zeros((3, calibrated.dims)), 1.0, calibrated)  # the right count draws
    for dims in (calibrated.dims + 1, calibrated.dims + 2):
        with pytest.raises(ValueError, match=f"calibrated for {calibrated.dims} coordinate"):
            sampler(rand, np.zeros((3, dims)), 1.0, calibrated)
    with pytest.raises(ValueError, match="calibrated noise"):  # nor does a bare budget draw
        sampler(rand, np.zeros((3, calibrated.dims)), 1.0, 0.3)


# --- the samplers draw exactly the calibrated noise -----------------------------------------


@pytest.mark.parametrize("eps", [0.01, 0.7, 8.0])
def test_sampler_scales_agree_with_noise_steps(eps):
    # The public scales (noise.laplace_scale, gaussian_sigma: the intervals' bootstrap reads
    # them) are those of the calibrated noise the sampler draws with.
    for dims in (1, 2, 4):
        lap = GridLaplace.calibrate(eps, dims)
        assert laplace_scale(LAPLACE_GRID_STEPS, eps, dims) == lap.scale_num / lap.scale_den
        gau = GridGaussian.calibrate(eps / 10, dims)
        assert gaussian_sigma(gau.grid_steps, eps / 10, dims) == math.sqrt(gau.sigma2)
    for name in _private():
        delta = 1e-6 if M.get(name).needs_delta else None
        try:
            steps = M.get(name).noise_steps(eps, delta)
        except ValueError:
            continue  # infeasible (covered above)
        for step in steps:
            n = step.noise
            if isinstance(n, (GridLaplace, PrivTreeLaplace)):
                # the sampler's own grid and denominator (laplace_scale's, the public scales')
                assert (n.grid_steps, n.scale_den) == (LAPLACE_GRID_STEPS, 256)
            elif isinstance(n, GridGaussian):
                assert n.grid_steps >= 4 and 1 <= n.sigma2 <= 2**28
            elif isinstance(n, ExpMedian):
                assert median.exp_median_rate(n.argument) == n.rate
                assert n.rate_den == median.EXP_RATE_DENOMINATOR
            else:
                assert isinstance(n, StudentTSmooth)


def _laplace_call(a):
    assert a["noise"].dims == np.shape(a["values"])[-1]
    return (a["noise"].kind, a["noise"].parameters())


def _gaussian_call(a):
    assert a["noise"].dims == np.shape(a["values"])[-1]
    return (a["noise"].kind, a["noise"].parameters())


def _exp_median_call(a):
    return ("exponential-median", {"rate": median.exp_median_rate(a["epsilon"]),
                                   "rate_den": median.EXP_RATE_DENOMINATOR})


def _smooth_sensitivity_call(a):
    return ("smooth beta", {"beta": a["beta"]})


# Every noise primitive an estimator draws through, with what a call asks it for.
SAMPLERS = {noise.laplace_mechanism: _laplace_call, noise.gaussian_mechanism: _gaussian_call,
            median.exp_median: _exp_median_call,
            median.smooth_sensitivity: _smooth_sensitivity_call}


class Recorder:
    """Records what each sampler is asked for, wherever it is called from.

    Each sampler is replaced in every loaded ``mechanisms`` module that holds it (its own
    module and each that imported it by name), found by identity: a new estimator module is
    covered without being listed, and one that draws through a primitive not in ``SAMPLERS``
    records nothing, so its run no longer matches its noise steps."""

    def __init__(self, monkeypatch):
        self.calls = []
        for original, describe in SAMPLERS.items():
            wrapped = self._wrapper(original, describe)
            holders = [(module, attr) for module in _mechanisms_modules()
                       for attr, value in vars(module).items() if value is original]
            assert holders, original
            for module, attr in holders:
                monkeypatch.setattr(module, attr, wrapped)

    def _wrapper(self, original, describe):
        signature = inspect.signature(original)

        def wrapped(*args, **kwargs):
            self.calls.append(describe(signature.bind(*args, **kwargs).arguments))
            return original(*args, **kwargs)

        return wrapped


def _mechanisms_modules():
    return [m for name, m in list(sys.modules.items())
            if m is not None and (name == "mechanisms" or name.startswith("mechanisms."))]


@pytest.mark.parametrize("name", [n for n in _private() if n != "BinAgg"])  # BinAgg: PrivTree
def test_runs_draw_exactly_their_noise_steps(name, monkeypatch):  # draws per depth; own test
    eps, delta = 2.0, (1e-6 if M.get(name).needs_delta else None)
    hp = {"steps": 6} if name.startswith("DPGD") else {}
    steps = M.get(name).noise_steps(eps, delta, **hp)
    rec = Recorder(monkeypatch)
    x, y = line_tract(30, seed=2)
    M.estimate_batch(name, TractBatch.single(x, y), eps, delta, seed=1, **hp)
    expected = []
    for s in steps:
        for _ in range(s.repeat):
            if s.mechanism == "students-t-smooth-sensitivity":
                expected.append(("smooth beta", {"beta": s.parameters["beta"]}))
            else:
                expected.append((s.mechanism, s.parameters))
    assert rec.calls == expected


def test_noisy_intercept_spread_is_the_maps_scale():
    # The released noise has the scale the map was computed from: sd = √2·t·unit.
    x, y = line_tract(50, seed=4)
    eps, reps = 0.5, 20000
    (step,) = M.get("NoisyIntercept").noise_steps(eps)
    t_units = step.parameters["scale_num"] / step.parameters["scale_den"]
    b = t_units * (1 / 50) / step.parameters["grid_steps"]
    out = M.estimate_batch("NoisyIntercept", TractBatch.single(x, y), eps, seed=3,
                           reps=reps).p25[:, 0]
    assert np.std(out) == pytest.approx(math.sqrt(2) * b, rel=0.04)


# --- DPSSTheilSen: derived from (d, beta, s), evaluation only -------------------------------


@pytest.mark.parametrize("d", [1, 3, 10])
@pytest.mark.parametrize("share", [0.2, 0.5, 0.8])
def test_dpss_guarantee_is_the_t_map_of_its_parameters(d, share):
    steps = M.get("DPSSTheilSen").noise_steps(1.0, d=d, beta_share=share)
    assert [s.name for s in steps] == ["p25 median", "p75 median"]
    total = 0.0
    for s in steps:
        p = s.parameters
        assert p["d"] == d and p["beta"] == pytest.approx(share * 0.5 / (d + 1))
        total += (p["d"] + 1) * (p["beta"] + p["s"] / (2 * math.sqrt(p["d"])))
    assert M.get("DPSSTheilSen").guarantee(1.0, d=d, beta_share=share).epsilon == \
        pytest.approx(total, rel=1e-15)


def test_dpss_guarantee_follows_its_noise_not_a_declaration(monkeypatch):
    est = M.get("DPSSTheilSen")

    def stale(eps_med, d, beta_share):
        # The old bug class: noise calibrated as if d = 3 and beta_share = 1/2, whatever the
        # hyperparameters say. A declared guarantee would still read ε; the map does not.
        return StudentTSmooth(float(d), 0.5 * eps_med / 4, 2 * 0.5 * eps_med * math.sqrt(3) / 4)

    monkeypatch.setattr(theil_sen.StudentTSmooth, "calibrate", staticmethod(stale))
    g = {(d, p): est.guarantee(1.0, d=d, beta_share=p).epsilon
         for d in (1, 3, 10) for p in (0.2, 0.8)}
    assert g[(3, 0.2)] == pytest.approx(1.0) and g[(3, 0.8)] == pytest.approx(1.0)
    assert g[(1, 0.2)] != pytest.approx(g[(10, 0.2)])  # changes with d
    assert g[(10, 0.2)] > 1.0  # and is reported, not hidden


def test_dpss_guarantee_changes_with_its_parameters():
    est = M.get("DPSSTheilSen")
    params = {(d, p): [s.parameters for s in est.noise_steps(1.0, d=d, beta_share=p)]
              for d in (1, 3, 10) for p in (0.2, 0.5, 0.8)}
    assert len({(ps[0]["beta"], ps[0]["s"]) for ps in params.values()}) == 9


def test_dpss_is_evaluation_only():
    est = M.get("DPSSTheilSen")
    assert not est.publishable and "floating point" in est.not_publishable_reason
    assert "DPSSTheilSen" not in M.PUBLISHABLE
    assert M.get("FreeLunchSSP").publishable  # its relation conversion is wired in the plan
    x, y = line_tract(20)
    with pytest.raises(M.NotPublishable, match="DPSSTheilSen cannot be published.*Mironov"):
        M.estimate_batch("DPSSTheilSen", TractBatch.single(x, y), 1.0, publishable_only=True)
    assert M.estimate_batch("DPSSTheilSen", TractBatch.single(x, y), 1.0, seed=1).p25.size


def _draws_exactly(name: str) -> bool:
    """Every noise step of the estimator is drawn by an exact sampler (no floating-point
    Student's t: DPSSTheilSen's reason)."""
    est = M.get(name)
    delta = REFERENCE_DELTA if est.needs_delta else None
    return all(s.mechanism != "students-t-smooth-sensitivity"
               for s in est.noise_steps(REFERENCE_EPSILON, delta))


def test_publishable_set_is_derived_from_the_registry():
    assert M.PUBLISHABLE == tuple(name for name, e in M.REGISTRY.items() if e.publishable)
    for name, e in M.REGISTRY.items():
        if e.publishable:
            # DP, with a guarantee derived from noise the exact samplers draw
            assert e.private and name in _private(), name
            assert _draws_exactly(name), name
            delta = REFERENCE_DELTA if e.needs_delta else None
            assert not isinstance(e.guarantee(REFERENCE_EPSILON, delta), NotDP), name
        else:
            assert e.not_publishable_reason, name  # an operator is told why
    for name in _private():
        if not _draws_exactly(name):
            assert name not in M.PUBLISHABLE, name
    for name, e in M.REGISTRY.items():
        if not e.private:
            assert name not in M.PUBLISHABLE, name


def test_default_suite_has_no_opted_out_estimator_and_at_most_one_zcdp():
    opted_out = {name for name, e in M.REGISTRY.items()
                 if not getattr(e, "in_default_suite", True)}
    assert opted_out and not opted_out & set(M.DEFAULT_SUITE)
    assert set(M.DEFAULT_SUITE) <= set(M.PUBLISHABLE)
    assert M.DEFAULT_SUITE == tuple(name for name in M.PUBLISHABLE if name not in opted_out)
    zcdp = [name for name in M.DEFAULT_SUITE if _reference(name, {})[1].kind == "zcdp"]
    assert len(zcdp) <= 1, zcdp  # each would need its own conversion delta (allocate.plan)


# --- memory ------------------------------------------------------------------------------


def test_peak_bytes_is_quadratic_for_all_pairs_and_linear_for_matchings():
    n = np.array([1000, 100_075])
    allp = M.get("DPExpTheilSen").peak_bytes(n)
    assert allp[1] > 37 * 2**30  # the tract that died after its charge needs far more
    assert allp[1] / allp[0] > 5000
    km = M.get("DPExpTheilSenkMatch").peak_bytes(n)
    assert km[1] / km[0] < 110
