"""The per-chunk privacy filter: every draw spends from what the plan charged, and stops
before a draw that would spend more."""

import math

import numpy as np
import pandas as pd
import pytest

import mechanisms as M
from dpatlas.release import estimate as estimate_mod
from dpatlas.release.allocate import plan, suite_step
from dpatlas.core.config import parse_config
from dpatlas.release.estimate import estimate_partition, select_partition
from dpatlas.release.selection import PRIMARY_STEP, SELECTION_STEP
from mechanisms import sufficient_stats, theil_sen
from mechanisms.privacy_filter import NO_METER, BudgetOverrun, PrivacyFilter
from mechanisms.noise import SeededRandomness
from mechanisms.privacy import ZCDP, ApproxDP, PureDP, rho_for_approx, to_approx
from mechanisms.privacy_maps import GridGaussian, GridLaplace, compose

LABELS = np.array(["17001000100", "17001000200", "17001000300"], dtype=object)


# --- the filter on its own ------------------------------------------------------------------


def test_pure_step_spends_up_to_its_charge_and_no_further():
    third = GridLaplace.calibrate(1.0 / 3).guarantee()
    f = PrivacyFilter({"s": PureDP(3 * third.epsilon)}, LABELS)
    m = f.meter("s")
    for _ in range(3):
        m.spend(LABELS, third)
    assert m.spent(LABELS[0]) == PureDP(3 * third.epsilon)
    with pytest.raises(BudgetOverrun, match="over the .* charged; nothing was drawn"):
        m.spend(LABELS[:1], third)
    assert m.spent(LABELS[0]).epsilon == pytest.approx(3 * third.epsilon)  # refusal records nothing


def test_partial_spend_and_times():
    m = PrivacyFilter({"s": PureDP(1.0)}, LABELS).meter("s")
    m.spend(LABELS[:2], PureDP(0.25), times=2)
    m.spend(LABELS[2:], PureDP(1.0))
    assert [m.spent(lab).epsilon for lab in LABELS] == [0.5, 0.5, 1.0]
    with pytest.raises(BudgetOverrun, match=LABELS[2]):
        m.spend(LABELS, PureDP(0.5))  # fits two tracts, not the third: none is recorded
    assert [m.spent(lab).epsilon for lab in LABELS] == [0.5, 0.5, 1.0]


def test_uncharged_steps_labels_and_types_are_refused():
    f = PrivacyFilter({"s": PureDP(1.0)}, LABELS)
    with pytest.raises(BudgetOverrun, match="never charged"):
        f.meter("other")
    with pytest.raises(BudgetOverrun, match="never charged"):
        f.meter("s").spend(["17999999999"], PureDP(0.1))
    with pytest.raises(BudgetOverrun, match="cannot be paid from the pure"):
        f.meter("s").spend(LABELS, ZCDP(0.01))
    with pytest.raises(BudgetOverrun, match="non-private"):
        f.meter("s").spend(LABELS, M.NotDP("heuristic"))
    with pytest.raises(BudgetOverrun, match="twice"):
        f.meter("s").spend([LABELS[0], LABELS[0]], PureDP(0.1))
    with pytest.raises(ValueError, match="twice"):
        PrivacyFilter({"s": PureDP(1.0)}, [LABELS[0], LABELS[0]])
    NO_METER.spend(["anything"], PureDP(1e9))  # evaluation: records and refuses nothing


def test_zcdp_and_approx_charges():
    step = GridGaussian.calibrate(0.5 / 80, 2)
    m = PrivacyFilter({"z": ZCDP(80 * step.guarantee().rho)}, LABELS).meter("z")
    m.spend(LABELS, step.guarantee(), times=80)
    with pytest.raises(BudgetOverrun):
        m.spend(LABELS, step.guarantee())
    # (ε, δ) charged, zCDP draws: ρ adds, converted at the charge's δ.
    rho = rho_for_approx(1.0, 1e-6)
    g = GridGaussian.calibrate(rho / 10, 2).guarantee()
    charged = to_approx(ZCDP(10 * g.rho), 1e-6)
    m = PrivacyFilter({"a": charged}, LABELS).meter("a")
    for _ in range(10):
        m.spend(LABELS, g)
    spent = m.spent(LABELS[1])
    assert isinstance(spent, ApproxDP) and spent.delta == 1e-6
    assert spent.epsilon == pytest.approx(charged.epsilon, rel=1e-9)
    with pytest.raises(BudgetOverrun):
        m.spend(LABELS, g)


def test_add_remove_draws_are_converted_to_the_replace_one_charge():
    from mechanisms.privacy import Relation
    ar = Relation.ADD_REMOVE
    # pure: each add-remove draw of eps costs 2 eps against a replace-one charge
    m = PrivacyFilter({"s": PureDP(1.0)}, LABELS).meter("s")
    m.spend(LABELS, PureDP(0.25, ar))
    assert m.spent(LABELS[0]) == PureDP(0.5)  # stated in the charge's relation
    m.spend(LABELS, PureDP(0.25, ar))
    with pytest.raises(BudgetOverrun, match="over the 1-DP"):
        m.spend(LABELS, PureDP(0.01, ar))
    # zCDP: rho quadruples
    z = PrivacyFilter({"z": ZCDP(1.0)}, LABELS).meter("z")
    z.spend(LABELS, ZCDP(0.125, ar), times=2)
    assert z.spent(LABELS[1]).rho == pytest.approx(1.0)
    with pytest.raises(BudgetOverrun):
        z.spend(LABELS[:1], ZCDP(0.001, ar))
    # (eps, delta): (2 eps, (1 + e^eps) delta) per draw
    a = PrivacyFilter({"a": ApproxDP(1.0, 1e-5)}, LABELS).meter("a")
    a.spend(LABELS, ApproxDP(0.5, 1e-6, ar))
    spent = a.spent(LABELS[2])
    assert spent.epsilon == pytest.approx(1.0) and spent.delta == pytest.approx(
        (1 + math.exp(0.5)) * 1e-6)


def test_a_replace_one_draw_cannot_be_paid_from_an_add_remove_charge():
    from mechanisms.privacy import Relation
    m = PrivacyFilter({"s": PureDP(10.0, Relation.ADD_REMOVE)}, LABELS).meter("s")
    with pytest.raises(BudgetOverrun, match="cannot be paid .* same n.*nothing was drawn"):
        m.spend(LABELS, PureDP(0.1))
    assert m.spent(LABELS[0]) == PureDP(0.0, Relation.ADD_REMOVE)  # nothing recorded
    m.spend(LABELS, PureDP(0.1, Relation.ADD_REMOVE))  # its own relation: counted as is
    assert m.spent(LABELS[0]).epsilon == pytest.approx(0.1)


# --- the release path -----------------------------------------------------------------------


def config(rule="dp", profile="primary", suite=None, mechanism="DPExpTheilSen"):
    sel = {"rule": rule, "mechanism": mechanism, "budget_share": 0.1}
    if rule != "fixed":
        sel["threshold"] = 12.0 if rule == "dp" else 60
    prof = {"name": profile}
    if suite is not None:
        prof["suite"] = suite
    return parse_config({"input": {"path": "x.parquet"}, "boundaries": {"path": "b.parquet"},
                         "privacy": {"epsilon_per_tract": 2.0, "delta": 1e-6},
                         "selection": sel, "profile": prof})


def microdata(seed=0, sizes=(3, 25, 300, 140, 60, 1)):
    """Tracts of mixed size and spread, so the dp rule picks both mechanisms."""
    rng = np.random.default_rng(seed)
    rows = []
    for t, n in enumerate(sizes):
        spread = 0.05 if t % 2 else 0.5  # n·var(x) about n/12 or n/1200
        x = np.clip(0.5 + rng.uniform(-spread, spread, n), 0, 1)
        y = np.clip(0.2 + 0.5 * x + rng.normal(0, 0.1, n), 0, 1)
        rows.append(pd.DataFrame({"geoid": f"17001{t:06d}", "cell": "all", "x": x, "y": y}))
    return pd.concat(rows, ignore_index=True)


class Recording(PrivacyFilter):
    made: list = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        Recording.made.append(self)


def run_release(cfg, monkeypatch, seed=5):
    Recording.made = []
    monkeypatch.setattr(estimate_mod, "PrivacyFilter", Recording)
    budget = plan(cfg, cfg.selection.threshold)
    df = microdata()
    sel = select_partition(df, budget, SeededRandomness(seed), min_n=2)
    res = estimate_partition(df, sel, budget, SeededRandomness(seed + 1), min_n=2)
    return budget, sel, res


@pytest.mark.parametrize("rule", ["dp", "public", "fixed"])
def test_normal_path_spends_exactly_what_was_charged(rule, monkeypatch):
    cfg = config(rule, profile="full-suite",
                 suite=["NoisyIntercept", "DPExpTheilSenkMatch", "DPGDzCDP", "DPGDApprox"])
    budget, sel, res = run_release(cfg, monkeypatch)
    released = res[res.status != "suppressed"]
    assert {"NoisyStats", "DPExpTheilSen"} <= set(released.mechanism) or rule == "fixed"
    mech = dict(zip(released.geoid, released.mechanism))
    spent = {}
    for f in Recording.made:
        for step, per_label in f.spent().items():
            for label, g in per_label.items():
                assert (step, label) not in spent  # each step spent in one stage only
                spent[(step, label)] = g
    for step in budget.steps:
        for geoid, chosen in mech.items():
            g = spent[(step.name, geoid)]
            # the primary step: what the tract's alternative composes to (the step's charge is
            # the largest alternative); every other step: exactly its charge
            want = step.composed(chosen) if step.name == PRIMARY_STEP else step.guarantee
            assert type(g) is type(want), (step.name, g, want)
            for f in ("epsilon", "delta", "rho"):
                if hasattr(want, f):
                    assert getattr(g, f) == pytest.approx(getattr(want, f), rel=1e-9), \
                        (step.name, geoid, g, want)
    # and the largest alternative of the primary step is its charge
    primary = budget.step(PRIMARY_STEP)
    assert max(primary.composed(lab).epsilon for lab, _ in primary.noise) == \
        primary.guarantee.epsilon
    eps_charged, _ = budget.charged()
    assert np.allclose(released.epsilon_spent, eps_charged)
    assert eps_charged <= 2.0 and eps_charged == pytest.approx(2.0, rel=1e-3)


def _count_calls(monkeypatch, module, attr):
    calls = []
    original = getattr(module, attr)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, attr, counted)
    return calls


def test_an_estimator_that_draws_twice_is_stopped_before_its_second_draw(monkeypatch):
    cfg = config("fixed", mechanism="DPExpTheilSen")
    budget = plan(cfg, None)
    df = microdata()
    sel = select_partition(df, budget, SeededRandomness(1), min_n=2)
    est = M.get("DPExpTheilSen")
    original_run = type(est)._run

    def twice(self, *args, **kwargs):
        original_run(self, *args, **kwargs)
        return original_run(self, *args, **kwargs)

    monkeypatch.setattr(type(est), "_run", twice)
    draws = _count_calls(monkeypatch, theil_sen, "exp_median")
    with pytest.raises(BudgetOverrun, match="primary: p25 and p75"):
        estimate_partition(df, sel, budget, SeededRandomness(2), min_n=2)
    assert len(draws) == 2  # the first run's p25 and p75 medians; nothing of the second


def test_an_estimator_with_twice_the_epsilon_is_stopped_before_drawing(monkeypatch):
    cfg = config("dp")
    budget = plan(cfg, cfg.selection.threshold)
    df = microdata()
    sel = select_partition(df, budget, SeededRandomness(1), min_n=2)
    assert (sel.mechanism == "NoisyStats").any()
    # Broken NoisyStats: its draws are calibrated to twice the ε the plan gave them.
    for attr in ("ncov_step", "intercept_step"):
        monkeypatch.setattr(sufficient_stats, attr,
                            lambda eps, _f=getattr(sufficient_stats, attr): _f(2 * eps))
    draws = _count_calls(monkeypatch, sufficient_stats, "laplace_mechanism")
    with pytest.raises(BudgetOverrun, match="primary"):
        estimate_partition(df, sel, budget, SeededRandomness(2), min_n=2)
    # NoisyStats runs first: its ncov at 2·(ε_rest/2) just fits the step's charge; the
    # intercept draw would take it over and was refused before it happened.
    assert len(draws) == 1


def test_selection_noise_is_metered_and_cannot_be_drawn_twice(monkeypatch):
    cfg = config("dp")
    budget = plan(cfg, cfg.selection.threshold)
    original = sufficient_stats._draw_nvar

    def twice(*args):
        original(*args)
        return original(*args)

    monkeypatch.setattr(sufficient_stats, "_draw_nvar", twice)
    draws = _count_calls(monkeypatch, sufficient_stats, "laplace_mechanism")
    with pytest.raises(BudgetOverrun, match="selection"):
        select_partition(microdata(), budget, SeededRandomness(1), min_n=2)
    assert len(draws) == 1


def test_suite_estimator_over_its_share_is_stopped(monkeypatch):
    cfg = config("fixed", profile="full-suite", suite=["DPGDPure", "NoisyIntercept"])
    budget = plan(cfg, None)
    df = microdata()
    sel = select_partition(df, budget, SeededRandomness(1), min_n=2)
    est = type(M.get("DPGDPure"))
    calibrated = M.get("DPGDPure").defaults["steps"]
    original_run = est._run

    def extra_iteration(self, batch, run_budget, rand, reps, hp, meter):
        # Broken DPGDPure: one more iteration than its noise was calibrated (and charged) for.
        return original_run(self, batch, run_budget, rand, reps,
                            {**hp, "steps": calibrated + 1}, meter)

    monkeypatch.setattr(est, "_run", extra_iteration)
    draws = _count_calls(monkeypatch, M.gradient_descent, "laplace_mechanism")
    with pytest.raises(BudgetOverrun, match="suite: DPGDPure"):
        estimate_partition(df, sel, budget, SeededRandomness(2), min_n=2)
    assert len(draws) == calibrated  # every charged iteration ran; the extra one did not


def test_persisted_selection_from_another_plan_is_refused():
    cfg = config("dp")
    budget = plan(cfg, cfg.selection.threshold)
    df = microdata()
    sel = select_partition(df, budget, SeededRandomness(1), min_n=2)
    sel["epsilon_rest"] = sel["epsilon_rest"] * 1.5
    with pytest.raises(RuntimeError, match="another budget plan"):
        estimate_partition(df, sel, budget, SeededRandomness(2), min_n=2)


def test_release_path_refuses_evaluation_only_estimators():
    x = np.linspace(0, 1, 10)
    with pytest.raises(M.NotPublishable, match="remove it from profile.suite"):
        M.estimate_batch("DPSSTheilSen", M.TractBatch.single(x, x), 1.0, publishable_only=True)
    with pytest.raises(M.NotPublishable):
        M.estimate_batch("MOS", M.TractBatch.single(x, x), 1.0, publishable_only=True)


# --- the plan lists its noise ------------------------------------------------------------------


@pytest.mark.parametrize("rule,mechanism", [("dp", None), ("public", None),
                                            ("fixed", "NoisyStats"), ("fixed", "DPExpTheilSen")])
def test_plan_steps_list_their_noise(rule, mechanism):
    cfg = config(rule, profile="full-suite", mechanism=mechanism or "DPExpTheilSen",
                 suite=["NoisyStats", "DPGDzCDP", "DPGDApprox"])
    budget = plan(cfg, cfg.selection.threshold)
    for step in budget.steps:
        d = step.as_dict()
        assert {"step", "estimator", "epsilon_param", "delta_param", "guarantee",
                "noise"} <= set(d)
        alts = d["noise"]["alternatives"]
        assert alts, step.name
        stated = d["guarantee"]
        found = []
        for label, noise_steps in alts.items():
            parts = []
            for ns in noise_steps:
                g = M.privacy_map(ns["mechanism"], ns["parameters"])  # recomputed, not read
                assert M.privacy.as_dict(g) == ns["guarantee"]
                parts += [g] * ns["repeat"]
            composed = M.sequential(parts)
            if stated["type"] == "approx":
                composed = to_approx(composed, step.delta)
            value = composed.epsilon if hasattr(composed, "epsilon") else composed.rho
            claim = stated.get("epsilon", stated.get("rho"))
            assert value <= claim * (1 + 1e-12), (step.name, label)
            found.append(value)
        assert max(found) == pytest.approx(claim, rel=1e-12)
    names = [s.name for s in budget.steps]
    primary = budget.step(PRIMARY_STEP)
    labels = [lab for lab, _ in primary.noise]
    if rule == "dp":
        assert names[:2] == [SELECTION_STEP, PRIMARY_STEP]
        assert [ns.name for ns in budget.step(SELECTION_STEP).noise[0][1]] == ["nvar"]
        assert [ns.name for ns in primary.alternatives()["NoisyStats"]] == ["ncov", "intercept"]
        assert [ns.name for ns in primary.alternatives()["DPExpTheilSen"]] == \
            ["p25 median", "p75 median"]
        eps_rest = primary.epsilon
        assert primary.alternatives()["NoisyStats"][0].noise == \
            GridLaplace.calibrate(eps_rest / 2)
    elif rule == "public":
        assert labels == ["NoisyStats", "DPExpTheilSen"]
        assert [ns.name for ns in primary.alternatives()["NoisyStats"]] == \
            ["nvar", "ncov", "intercept"]
    else:
        assert labels == [mechanism]
        assert primary.guarantee == compose(primary.alternatives()[mechanism])
    gd = budget.step(suite_step("DPGDzCDP"))
    assert isinstance(gd.guarantee, ZCDP) and gd.noise[0][1][0].repeat == 80
    assert "dp-accounting" in budget.step(suite_step("DPGDApprox")).as_dict()["noise"][
        "composition"]
    total_eps, total_delta = budget.charged()
    assert total_eps <= 2.0 * (1 + 1e-12) and total_delta <= 1e-6 * (1 + 1e-12)
    assert math.isclose(total_eps, 2.0, rel_tol=1e-3)


# --- relations in the plan and the manifest (issue 9) ----------------------------------------


def test_manifest_prints_the_relation_per_step_and_refuses_a_wrong_one():
    from types import SimpleNamespace

    import mechanisms.free_lunch  # noqa: F401  (registers FreeLunchSSP)
    from dpatlas.release.allocate import Step
    from dpatlas.release.manifest import check_relations, relations_section, step_entry
    from dpatlas.publication.tract_files import PublishError
    from mechanisms.privacy import PROJECT_RELATION, Relation

    budget = plan(config(profile="full-suite"), 12.0)
    for s in budget.steps:
        d = step_entry(s)
        assert d["relation"] == "replace-one" == d["guarantee"]["relation"]
        assert "relation_conversions" not in d
        for alt in d["noise"]["alternatives"].values():
            assert {ns["relation"] for ns in alt} == {"replace-one"}
    check_relations(budget, "replace-one")
    assert relations_section("replace-one")["charged_in"] == "replace-one"

    est = M.get("FreeLunchSSP")
    steps = tuple(est.noise_steps(1.0))
    converted = Step("suite: FreeLunchSSP", "FreeLunchSSP", 1.0, 0.0, est.guarantee(1.0),
                     (("FreeLunchSSP", steps),))
    d = step_entry(converted)
    assert d["relation"] == "replace-one"
    conv = d["relation_conversions"]["FreeLunchSSP"]
    assert conv["noise_relations"] == ["add-remove"] and "group privacy of size 2" in conv["by"]
    assert [ns["relation"] for ns in d["noise"]["alternatives"]["FreeLunchSSP"]] == \
        ["add-remove", "add-remove"]
    check_relations(SimpleNamespace(steps=(converted,)), "replace-one")

    # A step charged with the add-remove figure itself: refused before anything is published.
    unconverted = Step("suite: x", "FreeLunchSSP", 1.0, 0.0, est.add_remove_guarantee(1.0),
                       (("FreeLunchSSP", steps),))
    with pytest.raises(PublishError, match="stated for add-remove, the ledger charges replace-one"):
        check_relations(SimpleNamespace(steps=(unconverted,)), "replace-one")
    with pytest.raises(PublishError, match="unknown neighbouring relation"):
        check_relations(budget, "swap")
    assert PROJECT_RELATION is Relation.REPLACE_ONE


def test_ledger_charges_refuse_a_step_not_stated_for_replace_one():
    """The caps are in replace-one units: an add-remove step (half the ε for the same noise)
    would be under-charged, so building its charges fails instead."""
    from types import SimpleNamespace

    from dpatlas.release.allocate import Step
    from dpatlas.ledger import charges

    est = M.get("FreeLunchSSP")
    steps = tuple(est.noise_steps(1.0))
    converted = Step("suite: FreeLunchSSP", "FreeLunchSSP", 1.0, 0.0, est.guarantee(1.0),
                     (("FreeLunchSSP", steps),))
    (ch,) = charges(SimpleNamespace(steps=(converted,), conversion_delta=0.0), ["all"])
    assert ch.epsilon == pytest.approx(1.0) and ch.guarantee_type == "pure"
    unconverted = Step("suite: x", "FreeLunchSSP", 1.0, 0.0, est.add_remove_guarantee(1.0),
                       (("FreeLunchSSP", steps),))
    with pytest.raises(ValueError, match="stated for add-remove neighbours"):
        charges(SimpleNamespace(steps=(unconverted,), conversion_delta=0.0), ["all"])


def test_a_plan_with_add_remove_noise_converts_each_draw():
    """FreeLunchSSP in a suite: its step's guarantee is its noise converted draw by draw (group
    privacy of size 2), and equals what the estimator derives; under add-remove it is half."""
    budget = plan(config(profile="full-suite", suite=["FreeLunchSSP"]), 6.0)
    (step,) = [s for s in budget.steps if s.estimator == "FreeLunchSSP"]
    assert step.composed("FreeLunchSSP") == step.guarantee
    assert step.guarantee.epsilon == pytest.approx(
        2 * M.get("FreeLunchSSP").add_remove_guarantee(step.epsilon).epsilon)
