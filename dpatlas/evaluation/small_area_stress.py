"""The small-area model on data it was not designed for (issue 20; the lessons of issue 18).

Each scenario keeps the generator's geography and its spatially structured tract lines
(``oi_like_state``: county effects plus a smooth field) and breaks one thing the demo
generator quietly satisfies:

- ``skewed``: right-skewed errors, sd 0.22·(Exp(1) − 1) (mean 0, sd 0.22, as the demo's);
- ``heteroskedastic``: Gaussian errors with sd 0.22·(0.4 + 1.2·x) (sd 0.22 at x = 0.5);
- ``outliers``: 3% of the children's ranks replaced by uniform draws;
- ``censored``: child ranks top- and bottom-coded at 0.15 and 0.85;
- ``narrow_x``: each tract's parent ranks within ±0.025 of the tract's mean rank;
- ``small`` / ``large``: mean tract size 15 and 600 instead of 70;
- ``generator_variant``: the generator with other spatial parameters (smooth share 0.3,
  county share 0.3, length scale 20 km instead of 0.6, 0.15, 60 km): a state with weaker
  smooth structure than the one the model's bandwidths were chosen on.

Truth: where the error law changes, the generator's line is no longer the mean of what is
drawn (clipping at 0 and 1, censoring and outliers bend it), so the estimand is each tract's
*population line*: the least-squares line of the tract's parent ranks against the children's
expected rank under the scenario's law, computed as the line through ``POPULATION_DRAWS``
independent draws of every child at the tract's own x (the tract's sampling noise averaged
out, as the generator's line is the estimand of the main evaluation; a tract's own observed
line would add sampling error the model's D counts as noise). Tracts whose x has no spread
have none and are left out of the scores. ``narrow_x``, ``small``, ``large`` and
``generator_variant`` keep the generator's line, as the main evaluation does (a narrow-x
tract's own line read at 0.25 and 0.75 is an extrapolation nothing can estimate; the
generator's line is what its children would get there). Counties: their
pooled least-squares line, as always. Research code: the release path never imports this.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from mechanisms.batch import TractBatch

from dpatlas.evaluation.small_area_eval import (DEFAULT_SPLIT, SyntheticState, _markdown,
                                                evaluate_cases, synthetic_state)
from dpatlas.evaluation.stress import least_squares_line
from dpatlas.evaluation.synthetic_input import StateParams

NOISE_SD = StateParams().noise_sd
SCENARIOS = ("skewed", "heteroskedastic", "outliers", "censored", "narrow_x", "small", "large",
             "generator_variant")
OWN_LINE_TRUTH = {"skewed", "heteroskedastic", "outliers", "censored"}
OUTLIER_SHARE, CENSOR_AT, NARROW_HALF_WIDTH = 0.03, (0.15, 0.85), 0.025
POPULATION_DRAWS = 40
PARAMS = {"small": {"mean_tract_size": 15.0}, "large": {"mean_tract_size": 600.0},
          "generator_variant": {"spatial_share": 0.3, "county_share": 0.3,
                                "length_scale_km": 20.0}}


def _errors(scenario: str, rng: np.random.Generator, x: np.ndarray) -> np.ndarray:
    if scenario == "skewed":
        return NOISE_SD * (rng.exponential(1.0, x.size) - 1.0)
    if scenario == "heteroskedastic":
        return rng.normal(0.0, NOISE_SD * (0.4 + 1.2 * x))
    return rng.normal(0.0, NOISE_SD, x.size)


def _children(scenario: str, rng: np.random.Generator, line: np.ndarray,
              x: np.ndarray) -> np.ndarray:
    """Child ranks drawn under the scenario's law around ``line`` (the true line at x)."""
    y = line + _errors(scenario, rng, x)
    if scenario == "outliers":
        hit = rng.random(x.size) < OUTLIER_SHARE
        y[hit] = rng.random(int(hit.sum()))
    return np.clip(y, *CENSOR_AT) if scenario == "censored" else np.clip(y, 0.0, 1.0)


def _redraw(state: SyntheticState, scenario: str) -> pd.DataFrame:
    """The state's records with x (narrow_x) and y redrawn from the tract's true line; the
    true line at each record's x in ``attrs["line"]``."""
    rng = np.random.default_rng([state.seed, 20, SCENARIOS.index(scenario)])
    df = state.records.copy()
    lines = df.attrs["truth"].set_index("geoid").loc[df["geoid"]]
    x = df["parent_rank"].to_numpy(dtype=float)
    if scenario == "narrow_x":
        centre = df.groupby("geoid")["parent_rank"].transform("mean").to_numpy()
        x = np.clip(centre + rng.uniform(-NARROW_HALF_WIDTH, NARROW_HALF_WIDTH, x.size), 0, 1)
        x = np.round(x, 2)
    line = lines["intercept"].to_numpy() + lines["slope"].to_numpy() * x
    df["parent_rank"], df["child_rank"] = x, np.round(_children(scenario, rng, line, x), 2)
    df.attrs["line"] = line
    return df


def _population_line(df: pd.DataFrame, scenario: str, seed: int) -> dict[str, np.ndarray]:
    """Per tract (sorted GEOID order), p25/p75 of the line through POPULATION_DRAWS draws of
    every child at the tract's own x: its sampling noise averaged out."""
    rng = np.random.default_rng([seed, 21, SCENARIOS.index(scenario)])
    x, line = df["parent_rank"].to_numpy(dtype=float), df.attrs["line"]
    y = np.concatenate([_children(scenario, rng, line, x) for _ in range(POPULATION_DRAWS)])
    labels = np.tile(df["geoid"].to_numpy(), POPULATION_DRAWS)
    return least_squares_line(TractBatch.from_labels(labels, np.tile(x, POPULATION_DRAWS), y))


def stressed_state(seed: int, scenario: str, tracts: int | None = None) -> SyntheticState:
    """The synthetic state at ``seed`` under ``scenario`` (module docstring), with its truth."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
    params = replace(StateParams(), **PARAMS.get(scenario, {}))
    state = synthetic_state(seed, tracts, params)
    if scenario not in OWN_LINE_TRUTH | {"narrow_x"}:
        return state
    df = _redraw(state, scenario)
    if scenario == "narrow_x":
        return _with_county_truth(state, df, state.truth)
    batch = TractBatch.from_labels(df["geoid"].to_numpy(), df["parent_rank"].to_numpy(),
                                   df["child_rank"].to_numpy())
    population = _population_line(df, scenario, seed)
    truth = pd.DataFrame({"geoid": batch.labels.astype(str), "n": batch.n,
                          "p25": population["p25"], "p75": population["p75"]})
    return _with_county_truth(state, df, state.truth[["geoid"]].merge(truth, on="geoid",
                                                                       how="left"))


def _with_county_truth(state: SyntheticState, df: pd.DataFrame,
                       truth: pd.DataFrame) -> SyntheticState:
    county = df["geoid"].str[:5].to_numpy()
    cb = TractBatch.from_labels(county, df["parent_rank"].to_numpy(), df["child_rank"].to_numpy())
    cl = least_squares_line(cb)
    county_truth = pd.DataFrame({"geoid": cb.labels.astype(str), "p25": cl["p25"],
                                 "p75": cl["p75"]})
    return SyntheticState(df, truth, county_truth, state.boundaries, state.seed)


def evaluate_stress(scenarios: Sequence[str] = SCENARIOS, seeds: Sequence[int] = (201, 202, 203),
                    epsilons: Sequence[float] = (1.0, 8.0), split: str = DEFAULT_SPLIT,
                    tracts: int | None = None,
                    progress: Callable[[str], None] = lambda m: None) -> pd.DataFrame:
    """One row of ``score`` per (scenario, seed, ε) at ``split``."""
    return evaluate_cases(scenarios, seeds, epsilons, split,
                          lambda seed, name: stressed_state(seed, name, tracts),
                          progress=progress)


STRESS_COLUMNS = ["p25 model RMSE", "p25 direct RMSE", "p25 state-mean RMSE", "p25 model corr",
                  "coverage", "coverage, worst size quintile", "coverage, lowest decile",
                  "coverage, highest decile", "p25 bias lowest decile",
                  "p25 bias highest decile", "p25 model corr, two releases",
                  "county p25 median abs error", "county interval coverage",
                  "county intervals [0, 1]"]


def stress_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Means over seeds per (ε, scenario), the columns a reader checks first."""
    return (rows.groupby(["epsilon", "scenario"], sort=False)[STRESS_COLUMNS].mean()
            .reset_index())


def write_stress(rows: pd.DataFrame, out: Path, split: str = DEFAULT_SPLIT) -> list[Path]:
    """stress.csv (per scenario, seed and ε) and stress.md (means over seeds, one table per ε,
    scenarios as columns)."""
    out.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out / "stress.csv", index=False)
    summary = stress_summary(rows)
    md = (f"Stress scenarios (dpatlas/evaluation/small_area_stress.py), split {split}, seeds "
          f"{', '.join(map(str, sorted(rows['seed'].unique())))}; means over seeds.\n")
    for eps, part in summary.groupby("epsilon", sort=True):
        wide = part.drop(columns="epsilon").set_index("scenario").T.reset_index(names="metric")
        md += f"\n### ε = {eps:g}\n\n{_markdown(wide)}"
    (out / "stress.md").write_text(md)
    return [out / "stress.csv", out / "stress.md"]
