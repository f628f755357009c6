"""``dpatlas estimators``, ``synth``, ``calibrate`` and the ``evaluate*`` commands: research on
synthetic input, never on release data (commands.py registers them)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from dpatlas.cli.common import (JSON_HELP, console, emit_json, fail, guard, log_to, print_rows,
                                records)


def estimators(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the registered estimators, their guarantee at epsilon = 1 and their noise sampler."""
    import mechanisms as M

    head = ("name", "guarantee at eps=1", "publishable", "noise sampler", "what it is")
    rows = [(name, est.guarantee(1.0).describe(),
             "yes" if est.publishable else "no: " + est.not_publishable_reason,
             est.sampler, est.summary) for name, est in M.REGISTRY.items()]
    if as_json:
        emit_json([{"name": name, "guarantee_at_epsilon_1": g,
                     "publishable": M.REGISTRY[name].publishable,
                     "not_publishable_reason": None if p == "yes" else p.removeprefix("no: "),
                     "noise_sampler": sampler, "summary": summary}
                    for name, g, p, sampler, summary in rows])
        return
    print_rows(head, rows)


def synth(out: Path = typer.Option(Path("data"), help="Output folder."),
          states: str = typer.Option("37", help="Comma-separated state FIPS codes (37: North "
                                     "Carolina, whose real counties hold the tracts)."),
          tracts: int = typer.Option(3108, help="Tracts per state."),
          seed: int = typer.Option(0, help="Seed (state i uses seed + i)."),
          cells: Optional[int] = typer.Option(
              None, min=1, help="Every person gets one record in each of N cells "
              "(outcome-1 ... outcome-N, column 'cell'; cells share people, so they compose "
              "sequentially). Default: no cell column."),
          ) -> None:
    """Write an Opportunity-Insights-like synthetic state (or several) and its tract boundaries."""
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    fips = _synth_states(states)
    _at_least(("--tracts", tracts, 1), ("--seed", seed, 0))
    with guard(), console.status("generating synthetic microdata and boundaries"):
        info = write_synthetic(out, fips, seed, StateParams(n_tracts=tracts), cells=cells)
    in_cells = f" ({len(info['cells'])} cells)" if info["cells"] else ""
    console.print(f"{info['records']:,} records{in_cells} in {info['tracts']:,} tracts of "
                  f"{len(info['states'])} state(s): microdata {info['microdata']}, "
                  f"boundaries {info['boundaries']}")


def _at_least(*checks: tuple[str, int, int]) -> None:
    """Each (option, value, lowest allowed): one line and exit 2 for the first value below
    its lowest (a count of 0 or a negative seed was a traceback deep in numpy)."""
    for option, value, low in checks:
        if value < low:
            fail(f"{option} {value}: give {low} or more")


def _known_scenarios(names, known: tuple[str, ...]) -> None:
    """Refuse scenario names that are not ``known`` (before anything is written)."""
    unknown = [s for s in names if s not in known]
    if unknown:
        fail(f"unknown scenario(s) {unknown}; known: {', '.join(known)}")


def _output_folder(out: Path) -> None:
    """Create ``out`` before the work whose results go there (minutes of it, for an
    evaluation), so an unwritable place is one line and exit 2 at once."""
    with guard():
        out.mkdir(parents=True, exist_ok=True)


def _synth_states(text: str) -> list[str]:
    """``--states``: distinct two-digit state FIPS codes, or one line saying what is wrong."""
    from dpatlas.core.state_fips import STATE_FIPS

    fips = [s.strip() for s in text.split(",") if s.strip()]
    if not fips:
        fail(f"--states {text!r}: give one or more state FIPS codes, e.g. 37 or 17,37")
    unknown = [s for s in fips if s not in STATE_FIPS]
    if unknown:
        fail(f"--states: not state FIPS codes: {', '.join(unknown)} (two digits, e.g. 37 for "
              f"North Carolina; known: {', '.join(sorted(STATE_FIPS))})")
    twice = sorted({s for s in fips if fips.count(s) > 1})
    if twice:
        fail(f"--states names {', '.join(twice)} more than once: give each state once")
    return fips


def calibrate(out: Path = typer.Option(Path("thresholds.yaml"), help="Where to write."),
              tracts: int = typer.Option(1000, help="Tracts per synthetic calibration state."),
              reps: int = typer.Option(50, help="Runs per tract."),
              banded: bool = typer.Option(True, help="Also calibrate the banded rule on the "
                                                     "stress scenarios (about 10 minutes)."),
              ) -> None:
    """Calibrate the selection thresholds on synthetic states (never on release data)."""
    from dpatlas.evaluation.calibrate import calibrate as run, write_thresholds

    result = run(tracts=tracts, reps=reps, progress=lambda m: console.log(m))
    if banded:
        from dpatlas.evaluation.rule_stress import calibrate as calibrate_banded

        result["rules"]["banded"] = calibrate_banded(progress=lambda m: console.log(m))
    write_thresholds(result, out)
    for rule, r in result["rules"].items():
        console.print(f"{rule} rule: threshold {r['threshold']:.4g} on {r['indicator']}")
    if banded:
        for entry in result["rules"]["banded"]["schedule"]:
            console.print(f"banded rule at epsilon {entry['epsilon']:g}: " + ", ".join(
                f"{b['choice']} below n = {b['n_below']}" for b in entry["bands"]))
    console.print(f"wrote {out}")


def evaluate(out: Path = typer.Option(Path("evaluation"), help="Output folder."),
             reps: int = typer.Option(100, help="Runs per tract and mechanism."),
             seed: int = typer.Option(0, help="Seed of the synthetic state and of the noise."),
             epsilon: list[float] = typer.Option([1.0, 8.0], help="Per-tract budgets."),
             mechanism: list[str] = typer.Option([], help="Mechanisms (default: all DP + MOS)."),
             tracts: int = typer.Option(3108, help="Tracts in the synthetic state."),
             rule: bool = typer.Option(True, help="Add the calibrated dp selection rule as a row."),
             scenario: list[str] = typer.Option([], help="Stress scenario(s) of dpatlas/evaluation/stress.py,"
                                                " or 'all' (default: the demo generator)."),
             as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
             ) -> None:
    """Rebuild the paper's comparison on an Illinois-sized synthetic state: table and plots."""
    from dpatlas.evaluation.evaluate import DEFAULT_MECHANISMS, evaluate as run, write_report
    from dpatlas.evaluation.synthetic_input import StateParams

    from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_threshold
    from dpatlas.core.config import SelectionConfig
    from dpatlas.release.selection import Rule, RuleEstimate

    _at_least(("--reps", reps, 1), ("--seed", seed, 0), ("--tracts", tracts, 1))
    if scenario:
        from dpatlas.evaluation.stress import SCENARIOS

        _known_scenarios(scenario, (*SCENARIOS, "all"))
    _output_folder(out)
    mechs = tuple(mechanism) or DEFAULT_MECHANISMS
    extra = {}
    if rule:
        threshold = resolve_threshold(SelectionConfig(rule="dp", threshold_file=DEFAULT_THRESHOLDS))
        extra["SelectionRule(dp)"] = RuleEstimate(Rule("dp", threshold, 0.1))
    if scenario:
        _evaluate_scenarios(scenario, out, reps, seed, tuple(epsilon), mechs, tracts, extra,
                            as_json)
        return
    t0 = time.perf_counter()
    result = run(mechs, tuple(epsilon), reps, seed, StateParams(n_tracts=tracts),
                 progress=log_to(as_json), extra_rows=extra)
    paths = write_report(result, out)
    thr = result.crossover.get("threshold")
    if as_json:
        emit_json({"summary": records(result.summary), "crossover_threshold": thr,
                    "files": paths})
        return
    print_rows(("mechanism", "epsilon", "tracts", "share below SE", "median ratio",
                 "failure rate"),
                [(r.mechanism, f"{r.epsilon:g}", r.tracts, f"{r.share_below_se:.3f}",
                  f"{r.median_ratio:.3f}", f"{r.mean_failure_rate:.3f}")
                 for r in result.summary.itertuples()])
    console.print(f"NoisyStats/DPExpTheilSen crossover in n*eps*var(x): "
                  f"{'not found' if thr is None else f'{thr:.3g}'}")
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def _evaluate_scenarios(names: list[str], out: Path, reps: int, seed: int, epsilons: tuple,
                       mechs: tuple, tracts: int, extra: dict, as_json: bool = False) -> None:
    """``dpatlas evaluate --scenario``: one report per stress scenario, one summary of all."""
    from dpatlas.evaluation.evaluate import (SCENARIO_ESTIMAND, evaluate_scenario, scenario_summary,
                                             write_scenario_reports)
    from dpatlas.evaluation.stress import SCENARIOS

    t0 = time.perf_counter()
    log = log_to(as_json)
    if not as_json:
        console.print(f"errors measured against {SCENARIO_ESTIMAND}", soft_wrap=True)
    results = {name: evaluate_scenario(name, tracts, mechs, epsilons, reps, seed,
                                       progress=lambda m, _s=name: log(f"{_s}: {m}"),
                                       extra_rows=extra)
               for name in (SCENARIOS if "all" in names else dict.fromkeys(names))}
    paths = write_scenario_reports(results, out)
    summary = scenario_summary(results)
    if as_json:
        emit_json({"estimand": SCENARIO_ESTIMAND, "summary": records(summary),
                    "files": paths})
        return
    print_rows(("scenario", "mechanism", "epsilon", "tracts", "share below SE",
                 "median ratio", "failure rate"),
                [(r.scenario, r.mechanism, f"{r.epsilon:g}", r.tracts,
                  f"{r.share_below_se:.3f}", f"{r.median_ratio:.3f}",
                  f"{r.mean_failure_rate:.3f}") for r in summary.itertuples()])
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def evaluate_rule(
        out: Path = typer.Option(Path("evaluation-rule"), help="Output folder."),
        scenario: list[str] = typer.Option([], help="Stress scenario(s) (default: all)."),
        epsilon: list[float] = typer.Option([1.0, 8.0], help="Per-tract budgets."),
        tracts: int = typer.Option(3108, help="Tracts per scenario state."),
        large_tracts: int = typer.Option(300, help="Tracts of the 'large' scenario."),
        reps: int = typer.Option(50, help="Runs per tract."),
        seed: int = typer.Option(0, help="Scenario seed (the calibration's are 101, 102)."),
        thresholds: Path = typer.Option(None, help="Calibration file (default: the shipped)."),
        census: bool = typer.Option(False, "--census", help="Score against the tract's own "
                                    "least-squares line (the census reading) instead of its "
                                    "expected outcome."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The banded selection rule against both fixed mechanisms (and today's dp rule), per
    stress scenario, epsilon and tract-size quintile, against the tract's expected outcome
    (docs/selection.md)."""
    from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_schedule, resolve_threshold
    from dpatlas.core.config import SelectionConfig
    from dpatlas.evaluation.rule_stress import CALIBRATION_SEEDS, evaluate as run, to_markdown
    from dpatlas.release.selection import Rule
    from dpatlas.evaluation.stress import SCENARIOS

    t0 = time.perf_counter()
    _at_least(("--reps", reps, 1), ("--seed", seed, 0), ("--tracts", tracts, 1),
              ("--large-tracts", large_tracts, 1))
    _known_scenarios(scenario, SCENARIOS)
    if seed in CALIBRATION_SEEDS:
        fail(f"seed {seed} is a calibration seed: evaluate on another")
    with guard():
        path = thresholds or DEFAULT_THRESHOLDS
        try:
            banded = SelectionConfig(rule="banded", threshold_file=path)
            rule = Rule("banded", resolve_threshold(banded), 0.1,
                        schedule=resolve_schedule(banded))
            dp = resolve_threshold(SelectionConfig(rule="dp", threshold_file=path))
        except (FileNotFoundError, ValueError) as err:
            fail(str(err))
        out.mkdir(parents=True, exist_ok=True)  # before the work, not after it
        table = run(rule, dp, seed, tuple(epsilon), tuple(scenario) or SCENARIOS, tracts,
                    large_tracts, reps, progress=log_to(as_json), census=census)
        table.to_csv(out / "rule.csv", index=False)
        (out / "rule.md").write_text(to_markdown(table))
    if as_json:
        emit_json({"rows": records(table), "files": [out / "rule.csv", out / "rule.md"]})
        return
    console.print(to_markdown(table))
    console.print(f"wrote {out / 'rule.csv'}, {out / 'rule.md'} in "
                  f"{time.perf_counter() - t0:.0f}s")


def evaluate_intervals(
        out: Path = typer.Option(Path("evaluation-intervals"), help="Output folder."),
        reps: int = typer.Option(100, help="Runs per tract."),
        tracts: int = typer.Option(3108, help="Tracts in the synthetic state."),
        seed: int = typer.Option(21, help="Synthetic state seed (never the demo's 0)."),
        epsilon: list[float] = typer.Option([1.0, 8.0], help="Per-tract budgets."),
        share: float = typer.Option(0.25, help="Share of each tract's budget for the interval."),
        level: float = typer.Option(0.95, help="Confidence level."),
        scenario: list[str] = typer.Option(["demo"], help="Scenario(s) of dpatlas/evaluation/stress.py, "
                                           "or 'all'."),
        reliable_width: float = typer.Option(0.5, help="Widest interval the map shows as "
                                             "reliable (the config's low_reliability_width)."),
        census: bool = typer.Option(False, "--census", help="Score against the census reading "
                                    "(each row's line of the tract's own records) instead of "
                                    "the tract's expected outcome."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Coverage and width of the DP confidence intervals per scenario, mechanism and epsilon,
    against the tract's expected outcome: overall, by tract-size and interval-width quintile,
    in the extreme deciles and among the reliable ones; calibration of the standard errors."""
    from dpatlas.evaluation.interval_eval import evaluate_intervals as run, write_interval_report
    from dpatlas.evaluation.stress import SCENARIOS

    t0 = time.perf_counter()
    _at_least(("--reps", reps, 1), ("--seed", seed, 0), ("--tracts", tracts, 1))
    scenarios = SCENARIOS if "all" in scenario else tuple(scenario)
    with guard():
        try:
            summary, per_tract, edges = run(tracts, reps, seed, tuple(epsilon), share, level,
                                            progress=log_to(as_json),
                                            scenarios=scenarios, reliable_width=reliable_width,
                                            estimand="census" if census else "expected")
        except ValueError as err:
            fail(str(err))
        paths = write_interval_report(summary, per_tract, edges, out)
    if as_json:
        emit_json({"summary": records(summary), "size_quintile_edges": edges,
                    "files": paths})
        return
    cols = ("coverage", "worst Q", "worst W", "extreme deciles", "SE cover", "worst SE Q",
            "median width", "width<=0.2", "width<=0.5", "reliable", "[0,1] share")
    for name, e in edges.items():
        console.print(f"{name}: tract-size quintiles up to n = {e}")
    print_rows(("scenario", "mechanism", "epsilon", *cols, "reliable intervals"),
                [(r["scenario"], r["mechanism"], f"{r['epsilon']:g}",
                  *(f"{r[c]:.3f}" for c in cols), r["reliable intervals"])
                 for _, r in summary.iterrows()])
    console.print("worst Q, worst W: the lowest coverage over the tract-size and the "
                  "interval-width quintiles (each quintile in summary.md); SE cover: share of "
                  "value ± 1.96·se covering (worst SE Q: by size quintile)")
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def evaluate_small_area(
        out: Path = typer.Option(Path("evaluation-small-area"), help="Output folder."),
        seed: list[int] = typer.Option([201, 202, 203, 204, 205],
                                       help="Synthetic state seeds (never the demo's 0; "
                                       "101-103 were used for tuning)."),
        epsilon: list[float] = typer.Option([1.0, 8.0], help="ε per person, all levels."),
        split: list[str] = typer.Option(["0.66/0.31/0.03", "0.7/0.27/0.03", "0.7/0.2/0.1",
                                         "0.8/0.15/0.05", "0.9/0.08/0.02"],
                                        help="tract/county/state shares of ε; the first is "
                                        "the one the targets are checked under (0.66/0.31/0.03, "
                                        "the release's default)."),
        tracts: Optional[int] = typer.Option(None, help="Tracts per state (default 3,108)."),
        quick: bool = typer.Option(False, help="One seed, ε = 1, one split, 400 tracts."),
        stress: bool = typer.Option(False, help="Instead: the model on data it was not "
                                    "designed for (skewed, heteroskedastic, outliers, censored, "
                                    "narrow x, small and large tracts, other spatial "
                                    "parameters), seeds 201-203 unless --seed, first split; "
                                    "writes stress.csv and stress.md."),
        scenario: list[str] = typer.Option([], "--scenario",
                                           help="Instead: the model's stress scenarios "
                                           "(issue 32) by name, or 'all': coverage overall, "
                                           "worst size quintile, extreme deciles, median p25 "
                                           "width of two releases, corr/RMSE, flagged share of "
                                           "planted outliers; report seeds 401-403 unless "
                                           "--seed (calibration seeds: 301, 302), first split; "
                                           "writes scenarios.csv and scenarios.md."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The small-area model (Fay–Herriot on published values) against the generator's truth:
    RMSE, correlation, interval coverage, two releases' agreement, county error; a figure."""
    from dpatlas.evaluation.small_area_eval import (evaluate_small_area as run, summarise,
                                                    target_check, write_report)

    t0 = time.perf_counter()
    _at_least(*(("--seed", s, 0) for s in seed), ("--tracts", 1 if tracts is None else tracts, 1))
    if stress:
        _evaluate_small_area_stress(out, seed, epsilon, split[0], tracts, quick, t0, as_json)
        return
    if scenario:
        _evaluate_small_area_scenarios(out, scenario, seed, epsilon, split[0], tracts, quick,
                                       t0, as_json)
        return
    if quick:
        seed, epsilon, split, tracts = seed[:1], [1.0], split[:1], tracts or 400
    try:
        splits = {s: tuple(float(v) for v in s.split("/")) for s in split}
    except ValueError:
        fail(f"--split takes tract/county/state shares such as 0.8/0.15/0.05, got {split}")
    bad = [s for s, v in splits.items() if len(v) != 3 or abs(sum(v) - 1) > 1e-9
           or min(v) <= 0]
    if bad:
        fail(f"--split: three positive shares summing to 1, got {bad}")
    _output_folder(out)
    with guard():
        rows, shown = run(tuple(seed), tuple(epsilon), splits, tracts,
                          progress=log_to(as_json))
        paths = write_report(rows, shown, out, split[0])
    targets = target_check(summarise(rows), split[0])
    if as_json:
        emit_json({"split": split[0], "seeds": list(seed), "targets": records(targets),
                    "files": paths})
        return
    console.print(f"targets at epsilon 1, split {split[0]}, seeds {list(seed)}:")
    print_rows(("metric", "value", "target", "met"),
                [(r["metric"], f"{r['value']:.4f}", r["target"], r["met"])
                 for _, r in targets.iterrows()])
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def _evaluate_small_area_scenarios(out: Path, names: list[str], seed: list[int],
                                   epsilon: list[float], split: str, tracts: Optional[int],
                                   quick: bool, t0: float, as_json: bool) -> None:
    from dpatlas.evaluation import small_area_scenarios as sc

    names = list(sc.SCENARIOS) if "all" in names else names
    unknown = [n for n in names if n not in sc.SCENARIOS]
    if unknown:
        fail(f"--scenario: unknown {unknown}; choose from all, {', '.join(sc.SCENARIOS)}")
    seeds = sc.REPORT_SEEDS if seed == [201, 202, 203, 204, 205] else tuple(seed)
    if quick:
        seeds, epsilon, tracts = seeds[:1], [1.0], tracts or 400
    _output_folder(out)
    with guard():
        rows = sc.evaluate_scenarios(names, seeds, tuple(epsilon), split, tracts or 3108,
                                     progress=log_to(as_json))
        paths = sc.write_scenarios(rows, Path(out), split)
    summary = sc.scenario_summary(rows)
    if as_json:
        emit_json({"split": split, "seeds": list(seeds), "summary": records(summary),
                    "files": paths})
        return
    cols = ("coverage", "coverage, worst size quintile", "coverage, lowest decile",
            "coverage, highest decile", "median p25 width", "median p25 width, second release",
            "p25 model corr", "p25 model RMSE", "flagged, planted outliers")
    console.print(f"seeds {list(seeds)} (calibration seeds: {list(sc.CALIBRATION_SEEDS)}), "
                  f"split {split}; means over seeds:")
    print_rows(("seeds", "epsilon", "scenario", "cov", "worst Q", "low D", "high D", "width",
                 "width 2", "corr", "RMSE", "flagged"),
                [(r["seeds"], f"{r['epsilon']:g}", r["scenario"],
                  *(f"{r[c]:.3f}" for c in cols)) for _, r in summary.iterrows()])
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def _evaluate_small_area_stress(out: Path, seed: list[int], epsilon: list[float], split: str,
                                tracts: Optional[int], quick: bool, t0: float,
                                as_json: bool) -> None:
    from dpatlas.evaluation.small_area_stress import SCENARIOS, evaluate_stress, write_stress

    seeds = (201, 202, 203) if seed == [201, 202, 203, 204, 205] else tuple(seed)
    scenarios = SCENARIOS
    if quick:
        seeds, epsilon, tracts, scenarios = seeds[:1], [1.0], tracts or 400, SCENARIOS[:2]
    _output_folder(out)
    with guard():
        rows = evaluate_stress(scenarios, seeds, tuple(epsilon), split, tracts,
                               progress=log_to(as_json))
        paths = write_stress(rows, Path(out), split)
    if as_json:
        from dpatlas.evaluation.small_area_stress import stress_summary
        emit_json({"split": split, "seeds": list(seeds),
                    "summary": records(stress_summary(rows)), "files": paths})
        return
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")
