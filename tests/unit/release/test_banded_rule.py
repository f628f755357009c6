"""The banded selection rule (issue 18, item 4): its decisions, its guarantee derived from its
noise, and the budget accounting of a release that runs it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

import mechanisms as M
from dpatlas.release import estimate as estimate_mod
from dpatlas.release.allocate import plan
from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_schedule, resolve_threshold
from dpatlas.core.config import SHIPPED_THRESHOLDS, SelectionConfig, parse_config
from dpatlas.release.estimate import estimate_partition, select_partition
from dpatlas.release.manifest import selection_section
from dpatlas.release.preflight import mechanisms_in_play
from dpatlas.release.selection import (DP_BAND, EXP_THEIL_SEN, NOISY_STATS, PRIMARY_STEP,
                                       SELECTED_EXP_THEIL_SEN, SELECTED_NOISY_STATS, Rule,
                                       check_schedule, run_selected, select)
from mechanisms.batch import TractBatch
from mechanisms.noise import SeededRandomness
from mechanisms.privacy_maps import compose
from mechanisms.sufficient_stats import intercept_step, ncov_step, nvar_step

from tests.unit.release.test_budget import Recording, microdata

INF = math.inf
# At ε = 2 (the test release's): n < 30 the dp band, 30 ≤ n < 100 DPExpTheilSen, else
# NoisyStats; at ε = 8 NoisyStats from n = 10 on.
SCHEDULE = ((1.0, ((30.0, DP_BAND), (100.0, EXP_THEIL_SEN), (INF, NOISY_STATS))),
            (8.0, ((10.0, EXP_THEIL_SEN), (INF, NOISY_STATS))))


def banded(threshold=2.79, share=0.1, schedule=SCHEDULE) -> Rule:
    return Rule("banded", threshold, share, schedule=schedule)


def tracts_of(sizes, seed=0) -> TractBatch:
    rng = np.random.default_rng(seed)
    labels, xs, ys = [], [], []
    for t, n in enumerate(sizes):
        x = rng.uniform(0, 1, n)
        labels.append(np.full(n, f"t{t:03d}"))
        xs.append(x)
        ys.append(np.clip(0.3 + 0.4 * x + rng.normal(0, 0.1, n), 0, 1))
    return TractBatch.from_labels(np.concatenate(labels), np.concatenate(xs), np.concatenate(ys))


# --- decisions ---------------------------------------------------------------------------------


def test_bands_decide_by_public_n_at_the_nearest_calibrated_epsilon():
    rule = banded()
    n = np.array([2, 29, 30, 99, 100, 5000])
    assert list(rule.band_choice(n, 1.0)) == [DP_BAND, DP_BAND, EXP_THEIL_SEN, EXP_THEIL_SEN,
                                              NOISY_STATS, NOISY_STATS]
    # ε = 2 is nearer 1 than 8 on a log scale (log 2 < log 4); ε = 3 is nearer 8.
    assert rule.bands(2.0) == SCHEDULE[0][1] and rule.bands(3.0) == SCHEDULE[1][1]
    assert rule.bands(0.1) == SCHEDULE[0][1] and rule.bands(100.0) == SCHEDULE[1][1]
    assert list(rule.band_choice(np.array([9, 10]), 8.0)) == [EXP_THEIL_SEN, NOISY_STATS]


@pytest.mark.parametrize("bad", [
    (),  # empty
    ((1.0, ((30.0, DP_BAND),)),),  # does not end at inf
    ((1.0, ((30.0, DP_BAND), (20.0, NOISY_STATS), (INF, EXP_THEIL_SEN))),),  # decreasing
    ((1.0, ((INF, "MOS"),)),),  # unknown choice
    ((8.0, ((INF, NOISY_STATS),)), (1.0, ((INF, NOISY_STATS),))),  # ε decreasing
])
def test_a_malformed_schedule_is_refused(bad):
    with pytest.raises(ValueError, match="banded rule"):
        check_schedule(bad)


def test_outside_the_dp_band_nothing_is_drawn_and_n_names_the_mechanism():
    batch = tracts_of([10, 20, 50, 80, 150, 400])
    sel = select(batch, 1.0, banded(), SeededRandomness(3), reps=200)
    drew = sel.drew
    assert list(drew) == [True, True, False, False, False, False]
    assert np.isfinite(sel.noisy_nvar[:, drew]).all()
    assert np.isnan(sel.noisy_nvar[:, ~drew]).all()  # no selection draw outside the band
    assert (sel.mechanism[:, 2:4] == EXP_THEIL_SEN).all()
    assert (sel.mechanism[:, 4:] == NOISY_STATS).all()
    assert sel.epsilon == 1.0 and sel.epsilon_rest == pytest.approx(0.9)


def test_in_the_dp_band_the_noisy_indicator_decides():
    batch = tracts_of([2000], seed=4)
    nvar = float(np.sum((batch.x - batch.x.mean()) ** 2))  # about 167; noise scale 10
    everywhere = ((1.0, ((INF, DP_BAND),)),)
    low = select(batch, 1.0, banded(0.2 * nvar, schedule=everywhere), SeededRandomness(1), 400)
    high = select(batch, 1.0, banded(5.0 * nvar, schedule=everywhere), SeededRandomness(2), 400)
    assert low.use_noisy_stats.mean() > 0.99
    assert high.use_noisy_stats.mean() < 0.01
    # the decision is exactly the comparison of ε·nvar~ with the threshold
    assert np.array_equal(low.use_noisy_stats, 1.0 * low.noisy_nvar >= 0.2 * nvar)


def test_each_branch_runs_with_its_own_budget(monkeypatch):
    """A band naming a mechanism hands it the whole ε; the dp band the rest after selection
    (NoisyStats reusing the drawn nvar)."""
    calls = []
    real = M.estimate_batch

    def spy(name, batch, epsilon, *a, **k):
        calls.append((name, tuple(batch.n), epsilon))
        return real(name, batch, epsilon, *a, **k)

    monkeypatch.setattr(M, "estimate_batch", spy)
    batch = tracts_of([20, 50, 150])
    rule = banded(threshold=1e9)  # the dp band always picks DPExpTheilSen
    out = run_selected(batch, rule, select(batch, 1.0, rule, SeededRandomness(5), 3),
                       SeededRandomness(6), 3)
    assert (EXP_THEIL_SEN, (20,), pytest.approx(0.9)) in calls
    assert (EXP_THEIL_SEN, (50,), 1.0) in calls
    assert (NOISY_STATS, (150,), 1.0) in calls
    assert list(out.mechanism[0]) == [EXP_THEIL_SEN, EXP_THEIL_SEN, NOISY_STATS]
    assert np.isnan(out.indicator[:, 1:]).all() and np.isfinite(out.indicator[:, 0]).all()


# --- guarantee derived from the noise ---------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 8.0])
@pytest.mark.parametrize("share", [0.05, 0.1, 0.3])
def test_one_step_whose_guarantee_is_the_largest_alternative(epsilon, share):
    rule = banded(share=share)
    [(name, budget, alts)] = rule.noise(epsilon)
    assert name == PRIMARY_STEP and budget == epsilon
    uses_dp = any(c == DP_BAND for _, c in rule.bands(epsilon))
    want = {NOISY_STATS, EXP_THEIL_SEN} | ({SELECTED_NOISY_STATS, SELECTED_EXP_THEIL_SEN}
                                            if uses_dp else set())
    assert set(alts) == want
    composed = {label: compose(steps).epsilon for label, steps in alts.items()}
    for label, eps in composed.items():
        assert eps <= epsilon * (1 + 1e-12), label
    assert rule.guarantee(epsilon).epsilon == pytest.approx(max(composed.values()), rel=1e-12)
    assert rule.guarantee(epsilon).epsilon == pytest.approx(epsilon, rel=1e-5)
    if uses_dp:
        eps_sel = share * epsilon
        rest = epsilon - eps_sel
        assert [s.noise for s in alts[SELECTED_NOISY_STATS]] == [
            s.noise for s in (nvar_step(eps_sel), ncov_step(rest / 2), intercept_step(rest / 2))]
        assert alts[SELECTED_EXP_THEIL_SEN][0].noise == nvar_step(eps_sel).noise
        assert [s.noise for s in alts[SELECTED_EXP_THEIL_SEN][1:]] == [
            s.noise for s in M.get(EXP_THEIL_SEN).noise_steps(rest)]


def test_the_guarantee_follows_the_noise_not_a_declaration(monkeypatch):
    """If a branch drew more noise budget, the step's guarantee would say so."""
    import dpatlas.release.selection as S

    monkeypatch.setattr(S, "ncov_step", lambda eps: ncov_step(3 * eps))
    rule = banded()
    assert rule.guarantee(1.0).epsilon > 1.5


# --- the release path ------------------------------------------------------------------------


def write_schedule(tmp_path, schedule=SCHEDULE, threshold=2.79):
    entry = {"threshold": threshold, "selection_budget_share": 0.1, "schedule": [
        {"epsilon": e, "bands": [{"n_below": None if math.isinf(u) else u, "choice": c}
                                 for u, c in bands]} for e, bands in schedule]}
    path = tmp_path / "thresholds.yaml"
    path.write_text(yaml.safe_dump({"rules": {"banded": entry, "dp": {"threshold": 2.79}}}))
    return path


def banded_config(path, epsilon=2.0):
    return parse_config({"input": {"path": "x.parquet"}, "boundaries": {"path": "b.parquet"},
                         "privacy": {"epsilon_per_tract": epsilon, "delta": 1e-6},
                         "selection": {"rule": "banded", "threshold_file": str(path),
                                       "budget_share": 0.1},
                         "profile": {"name": "primary"}})


def test_config_needs_the_calibration_file_and_reads_bands_from_it(tmp_path):
    with pytest.raises(ValueError, match="banded"):
        SelectionConfig(rule="banded", threshold=2.0)
    # no file named: the calibration shipped with the package, which holds the bands (issue 21)
    shipped = SelectionConfig(rule="banded")
    assert shipped.threshold_file == SHIPPED_THRESHOLDS
    assert resolve_schedule(shipped)
    path = write_schedule(tmp_path)
    sel = SelectionConfig(rule="banded", threshold_file=path)
    assert resolve_schedule(sel) == check_schedule(SCHEDULE)
    assert resolve_threshold(sel) == 2.79
    (tmp_path / "old.yaml").write_text(yaml.safe_dump({"rules": {"dp": {"threshold": 1.0}}}))
    with pytest.raises(ValueError, match="no bands for rule 'banded'"):
        resolve_schedule(SelectionConfig(rule="banded", threshold_file=tmp_path / "old.yaml"))
    assert SelectionConfig(rule="dp", threshold=2.0).rule == "dp"  # still valid


def test_the_shipped_thresholds_hold_a_banded_rule():
    sel = SelectionConfig(rule="banded", threshold_file=DEFAULT_THRESHOLDS)
    schedule = resolve_schedule(sel)
    assert [e for e, _ in schedule] == [1.0, 8.0]
    assert resolve_threshold(sel) > 0


def test_release_spends_per_tract_exactly_its_branch_and_never_more(tmp_path, monkeypatch):
    """Sizes 3, 25, 300, 140, 60, 1 at ε = 2 (min_n 2): 3 and 25 in the dp band, 60 in the
    DPExpTheilSen band, 140 and 300 in the NoisyStats band. The selection stage spends only
    in the dp band; the estimate stage records that draw again on the same step, then the
    mechanism; each tract's total is its branch's composition, at most the charge."""
    cfg = banded_config(write_schedule(tmp_path))
    budget = plan(cfg, resolve_threshold(cfg.selection))
    assert [s.name for s in budget.steps] == [PRIMARY_STEP, "interval: p25 and p75"]
    Recording.made = []
    monkeypatch.setattr(estimate_mod, "PrivacyFilter", Recording)
    df = microdata()
    sel = select_partition(df, budget, SeededRandomness(5), min_n=2)
    selection_filter = Recording.made[-1]
    res = estimate_partition(df, sel, budget, SeededRandomness(6), min_n=2)
    n = dict(zip(res.geoid, res.n))
    band = {g: budget.rule.band_choice(np.array([k]), budget.primary_epsilon)[0]
            for g, k in n.items()}
    spent_at_selection = selection_filter.spent()[PRIMARY_STEP]
    eps_sel, _ = budget.rule.budgets(budget.primary_epsilon)
    released = res[res.status != "suppressed"]
    for geoid in released.geoid:
        got = spent_at_selection.get(geoid)
        if band[geoid] == DP_BAND:
            assert got.epsilon == pytest.approx(compose([nvar_step(eps_sel)]).epsilon)
        else:
            assert got is None or got.epsilon == 0
    primary = budget.step(PRIMARY_STEP)
    spent = Recording.made[-1].spent()[PRIMARY_STEP]
    for r in released.itertuples():
        label = r.mechanism
        if band[r.geoid] == DP_BAND:
            label = {NOISY_STATS: SELECTED_NOISY_STATS,
                     EXP_THEIL_SEN: SELECTED_EXP_THEIL_SEN}[r.mechanism]
        else:
            assert r.mechanism == band[r.geoid]
        assert spent[r.geoid].epsilon == pytest.approx(primary.composed(label).epsilon,
                                                       rel=1e-9), (r.geoid, label)
        assert spent[r.geoid].epsilon <= primary.guarantee.epsilon * (1 + 1e-12)
    assert {band[g] for g in released.geoid} == {DP_BAND, EXP_THEIL_SEN, NOISY_STATS}
    assert released[["p25_lo", "p25_hi"]].notna().all().all()
    eps_charged, _ = budget.charged()
    assert eps_charged == pytest.approx(2.0, rel=1e-3) and eps_charged <= 2.0
    assert np.allclose(released.epsilon_spent, eps_charged)


def test_a_dp_band_draw_not_recorded_again_would_be_caught(tmp_path, monkeypatch):
    """Without recording the selection's draw in the estimate stage, a tract of the dp band
    would show less spent than its branch composes to: the test above would fail. Here: the
    record is what makes a second selection-sized draw overrun."""
    from mechanisms.privacy_filter import BudgetOverrun, PrivacyFilter

    cfg = banded_config(write_schedule(tmp_path))
    budget = plan(cfg, resolve_threshold(cfg.selection))
    labels = np.array(["a"])
    meter = PrivacyFilter({PRIMARY_STEP: budget.step(PRIMARY_STEP).guarantee},
                          labels).meter(PRIMARY_STEP)
    eps_sel, rest = budget.rule.budgets(budget.primary_epsilon)
    meter.spend(labels, nvar_step(eps_sel).guarantee)  # the recorded selection draw
    for step in M.get(EXP_THEIL_SEN).noise_steps(rest):
        meter.spend(labels, step.guarantee)  # the dp band's DPExpTheilSen: fits
    with pytest.raises(BudgetOverrun):
        meter.spend(labels, nvar_step(eps_sel).guarantee)


def test_manifest_and_preflight_state_the_bands(tmp_path):
    cfg = banded_config(write_schedule(tmp_path))
    budget = plan(cfg, resolve_threshold(cfg.selection))
    section = selection_section(budget.rule, budget.primary_epsilon)
    assert section["rule"] == "banded" and section["budget_share"] == 0.1
    assert section["bands"] == [{"n_below": 30.0, "choice": DP_BAND},
                                {"n_below": 100.0, "choice": EXP_THEIL_SEN},
                                {"n_below": None, "choice": NOISY_STATS}]
    play = mechanisms_in_play(budget, np.array([5, 50, 500]))
    assert list(play[NOISY_STATS]) == [True, False, True]
    assert list(play[EXP_THEIL_SEN]) == [True, True, False]


def test_a_banded_release_passes_the_audit(tmp_path):
    """A whole (seeded, test-mode) release under the banded rule, written and audited from
    its folder alone: the one primary step's four alternatives recompose to its charge, the
    config agrees with the manifest's selection, every column is accounted for."""
    from dpatlas.audit import run as audit
    from dpatlas.release.allocate import plan as make_plan
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
    from tests.integration.test_release_audit import build_release, make_cfg

    data = tmp_path / "state"
    write_synthetic(data, ["17"], seed=5, params=StateParams(n_tracts=40, counties=3))
    path = write_schedule(tmp_path)
    cfg = make_cfg(tmp_path, data, selection={"rule": "banded", "threshold": None,
                                              "threshold_file": str(path)})
    budget = make_plan(cfg, resolve_threshold(cfg.selection))
    _, table, manifest, folder = build_release(tmp_path, data, cfg=cfg, plan=budget)
    assert manifest["selection"]["rule"] == "banded"
    assert [b["choice"] for b in manifest["selection"]["bands"]] == [
        DP_BAND, EXP_THEIL_SEN, NOISY_STATS]
    released = table[table.status == "released"]
    assert set(released.mechanism) == {NOISY_STATS, EXP_THEIL_SEN}
    report = audit.audit_release(folder)
    assert report.ok, [c for c in report.checks if not c[1]]
