"""``dpatlas evaluate --scenario``: the paper's comparison on the stress scenarios of
dpatlas/evaluation/stress.py, each error measured against the scenario's estimand (issue 18, item 3)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpatlas.evaluation.evaluate import DEFAULT_MECHANISMS, evaluate_scenario
from dpatlas.evaluation.stress import SCENARIOS, scenario_state


def test_a_tiny_stress_run_has_finite_errors_for_every_mechanism():
    from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_threshold
    from dpatlas.core.config import SelectionConfig
    from dpatlas.release.selection import Rule, RuleEstimate

    threshold = resolve_threshold(SelectionConfig(rule="dp", threshold_file=DEFAULT_THRESHOLDS))
    rule = {"SelectionRule(dp)": RuleEstimate(Rule("dp", threshold, 0.1))}
    result = evaluate_scenario("skewed", tracts=12, mechanisms=DEFAULT_MECHANISMS,
                               epsilons=(8.0,), reps=2, seed=3, extra_rows=rule)
    per_tract = result.per_tract
    assert list(result.summary.mechanism) == [*DEFAULT_MECHANISMS, "SelectionRule(dp)"]
    assert (result.summary.tracts == 12).all()  # every tract of the state is usable
    ran = per_tract[per_tract.failure_rate == 0]
    assert set(ran.mechanism) >= {"NoisyStats", "DPExpTheilSen", "SelectionRule(dp)"}
    assert np.isfinite(ran.error_bound).all() and (ran.error_bound >= 0).all()
    failed = per_tract[per_tract.failure_rate > 0]
    assert np.isinf(failed.ratio).all()  # a failed run is never hidden
    assert result.params["scenario"] == "skewed"
    assert "least-squares line" in result.params["estimand"]


def test_the_truth_is_the_scenarios_least_squares_line_not_theil_sen():
    """The exact OLS fit of the records has no error against the estimand; exact Theil-Sen,
    whose line differs under skewed errors, has."""
    result = evaluate_scenario("skewed", tracts=12, mechanisms=("OLS", "TheilSen"),
                               epsilons=(1.0,), reps=1, seed=3)
    bound = result.per_tract.groupby("mechanism").error_bound.max()
    assert bound["OLS"] < 1e-9
    assert bound["TheilSen"] > 1e-3
    truth = scenario_state("skewed", 12, 3).truth["p25"]
    assert np.isfinite(truth).all()


def test_evaluate_scenario_command(tmp_path):
    from tests.support.cli import run_in_process as dpatlas

    out = tmp_path / "ev"
    bad = dpatlas("evaluate", "--out", str(out), "--scenario", "nope")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "unknown scenario" in bad.stdout and all(s in bad.stdout for s in SCENARIOS)
    assert not out.exists()
    ok = dpatlas("evaluate", "--out", str(out), "--scenario", "small", "--tracts", "15",
                 "--reps", "2", "--epsilon", "8", "--mechanism", "NoisyStats",
                 "--mechanism", "DPExpTheilSen")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "errors measured against the tract's own least-squares line" in ok.stdout
    table = pd.read_csv(out / "summary.csv")
    assert list(table.columns[:2]) == ["scenario", "mechanism"]
    assert set(table.scenario) == {"small"}
    assert set(table.mechanism) == {"NoisyStats", "DPExpTheilSen", "SelectionRule(dp)"}
    assert np.isfinite(table.median_ratio).all()
    assert "least-squares line" in (out / "summary.md").read_text()
    assert (out / "small" / "per_tract.csv").exists()
