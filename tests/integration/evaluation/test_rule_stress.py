"""The banded rule against both fixed mechanisms on the stress scenarios (issue 18, item 4)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dpatlas.evaluation import rule_stress as RS
from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_schedule, resolve_threshold
from dpatlas.core.config import SelectionConfig
from dpatlas.release.selection import DP_BAND, EXP_THEIL_SEN, NOISY_STATS, Rule, apply_rule
from dpatlas.evaluation.stress import RULE_CALIBRATION_SCENARIOS, scenario_state
from mechanisms.batch import ols, sufficient_stats
from mechanisms.noise import SeededRandomness

SCHEDULE = ((1.0, ((40.0, DP_BAND), (120.0, EXP_THEIL_SEN), (math.inf, NOISY_STATS))),)


def shipped() -> tuple[Rule, float]:
    sel = SelectionConfig(rule="banded", threshold_file=DEFAULT_THRESHOLDS)
    rule = Rule("banded", resolve_threshold(sel), 0.1, schedule=resolve_schedule(sel))
    dp = resolve_threshold(SelectionConfig(rule="dp", threshold_file=DEFAULT_THRESHOLDS))
    return rule, dp


def test_the_evaluation_simulates_the_rule_as_a_release_runs_it():
    """The evaluation's rule (fixed draws in the bands that name a mechanism, the dp band's
    own draws elsewhere) has the law of ``apply_rule``: per tract the same mechanism outside
    the dp band, and in it the same chance of NoisyStats and the same error scale."""
    reps = 300
    d = RS.draw("demo", 7, 60, reps, 1.0)
    rule = Rule("banded", 2.79, 0.1, schedule=SCHEDULE)
    simulated = RS.banded_p25(d, rule.bands(1.0), rule.threshold)
    state = scenario_state("demo", 60, 7)
    fit = ols(sufficient_stats(state.batch))
    keep = fit.ok & (state.batch.n >= 3) & np.isfinite(fit.se25) & (fit.se25 > 0)
    out = apply_rule(state.batch, 1.0, rule, SeededRandomness(8), reps)
    released = np.where(out.failed, np.nan, out.p25)[:, keep]
    choice = rule.band_choice(d.n, 1.0)
    assert {DP_BAND, EXP_THEIL_SEN, NOISY_STATS} <= set(choice)
    mech = out.mechanism[:, keep]
    for name in (EXP_THEIL_SEN, NOISY_STATS):
        assert (mech[:, choice == name] == name).all()
    band = choice == DP_BAND
    p_sim = (d.epsilon * d.nvar_sel[:, band] >= rule.threshold).mean(axis=0)
    p_run = (mech[:, band] == NOISY_STATS).mean(axis=0)
    assert np.abs(p_sim - p_run).max() < 0.15  # 300 reps: sd of a difference <= 0.041
    r_sim = RS.error_ratio(d, simulated)
    r_run = RS.error_ratio(d, released)
    assert np.median(r_sim) == pytest.approx(np.median(r_run), rel=0.15)


def test_violation_reads_the_requirement():
    best = np.array([1.0, 2.0, 2.0, 2.0, 2.0, 2.0])
    assert RS.violation(best, best) == pytest.approx(1.0)  # equal overall: meets
    assert RS.violation(np.r_[1.0, [2.1] * 5], best) == pytest.approx(1.0)
    assert RS.violation(np.r_[1.01, [2.0] * 5], best) == pytest.approx(1.01)
    assert RS.violation(np.r_[1.0, 2.0, 2.0, 2.0, 2.0, 2.3], best) == pytest.approx(2.3 / 2.1)


def test_shipped_calibration_was_made_on_other_seeds_than_the_evaluation():
    import yaml

    entry = yaml.safe_load(DEFAULT_THRESHOLDS.read_text())["rules"]["banded"]
    assert set(entry["calibration"]["seeds"]).isdisjoint({RS.EVALUATION_SEED})
    assert entry["calibration"]["scenarios"] == list(RULE_CALIBRATION_SCENARIOS)


@pytest.mark.slow
def test_the_banded_rule_meets_the_requirement_on_small_stress_states():
    """On small states of every scenario (seed 5, never a calibration seed): at ε = 1 the
    banded rule is no worse than the better fixed mechanism over all tracts and within 1.05
    of it in every size quintile. At ε = 8 no rule that sees only n, ε and the noisy n·var(x)
    can (docs/selection.md: the heteroskedastic and tied-x scenarios need DPExpTheilSen where
    the skewed and outlier ones need NoisyStats, at the same n); there the test holds the
    rule to the worst violation the calibration found, so a regression still fails."""
    rule, dp = shipped()
    table = RS.evaluate(rule, dp, seed=5, tracts=300, large_tracts=40, reps=30)
    banded = table[table.row == "banded rule"]
    at_1 = banded[banded.epsilon == 1.0]
    assert (at_1.requirement == "meets").all(), at_1.to_string()
    import yaml

    cal = yaml.safe_load(DEFAULT_THRESHOLDS.read_text())["rules"]["banded"]["calibration"]
    worst_8 = max(c["worst_violation"] for c in cal["per_epsilon"] if c["epsilon"] == 8.0)
    for r in banded[banded.epsilon == 8.0].itertuples():
        fixed = table[(table.scenario == r.scenario) & (table.epsilon == 8.0)
                      & table.row.isin([NOISY_STATS, EXP_THEIL_SEN])]
        best = fixed[["all", *RS.QUINTILES]].min().to_numpy()
        got = np.array([r.all, *(getattr(r, q) for q in RS.QUINTILES)])
        assert RS.violation(got, best) <= 1.25 * worst_8, (r.scenario, got, best)


def test_evaluate_rule_command(tmp_path):
    """Operator errors: one line, exit 2, nothing written; a tiny run writes its tables."""
    from tests.support.cli import run_in_process as dpatlas

    out = tmp_path / "ev"
    bad = dpatlas("evaluate-rule", "--out", str(out), "--scenario", "nope")
    assert bad.returncode == 2 and "unknown scenario" in bad.stdout, bad.stdout + bad.stderr
    seed = dpatlas("evaluate-rule", "--out", str(out), "--seed", "101")
    assert seed.returncode == 2 and "calibration seed" in seed.stdout
    missing = dpatlas("evaluate-rule", "--out", str(out), "--thresholds",
                      str(tmp_path / "none.yaml"))
    assert missing.returncode == 2 and "not found" in missing.stdout
    assert not out.exists()
    ok = dpatlas("evaluate-rule", "--out", str(out), "--scenario", "small", "--epsilon", "8",
                 "--tracts", "30", "--reps", "5")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "banded rule" in (out / "rule.md").read_text()
    table = pd.read_csv(out / "rule.csv")
    assert set(table.row) == {NOISY_STATS, EXP_THEIL_SEN, "dp rule (today)", "banded rule"}
