"""Stress scenarios for the small-area model (issue 32, item 4): states whose tract outcomes
have structure the model must not assume away.

Each scenario draws a state of its own (no reuse of ``oi_like_state``'s fixed structure): the
demo's tracts and boundaries (``synth_boundaries``, North Carolina's counties), the demo's
sizes (exponential, mean 70) and noise (sd 0.22, clipped to [0, 1], rounded to 0.01), and
tract lines y = α_t + β_t·x built from unit-variance parts as the demo generator builds them
(a Matérn field at a length scale, a county effect, the tract's own), then breaks one thing:

- ``field-3km``, ``field-15km``, ``field-60km``: a smooth field at that length scale (share
  0.75, the rest the tract's own), no county effect; ``field-*km-county``: share 0.6 and a
  county effect of share 0.15;
- ``boundary``: the 60 km field with county effects, plus a step of ``BOUNDARY_STEP`` in α
  between the tracts west and east of the state's median longitude (a sharp line);
- ``size-dependent``: α shifts by ``SIZE_SLOPE``·(log n − its state mean): outcomes depend
  on the public tract size;
- ``outlying-tracts``: ``OUTLIER_SHARE`` of the tracts have α ± ``OUTLIER_SHIFT`` (random
  sign) from what their neighbours have (``truth["planted_outlier"]`` marks them);
- ``neighbourhood``: α rises and β falls with the tract's mean parent income (correlation
  ``NEIGHBOURHOOD_CORR``), and tract mean parent ranks vary more: the pooled state line
  differs from the mean of the tract lines;
- ``bimodal``: each tract's parents' log incomes are a two-component mixture (half at the
  tract mean − 0.9, half at + 0.9, sd 0.3 each): parent ranks bunch near both ends.

Truth, for every scenario: the estimand of ``mechanisms/estimand.py``, the population
least-squares prediction at x* = 0.25 / 0.75 under the law that generated the tract's records.
The law is y = clip(α + β·x + e, 0, 1), e ~ N(0, 0.22²), so E[y | x] is the censored normal
mean m(x) (closed form, ``expected_outcome``), and the truth is the least-squares line of m(x)
over the tract's own parent ranks: exact, no simulation. Tracts whose x has no spread have no
line and are not scored. Counties: their pooled least-squares line, as in every evaluation.

Seeds: ``CALIBRATION_SEEDS`` were used for every choice tuned on these scenarios (the model's
covariates and variances, docs/small-area.md); ``REPORT_SEEDS`` never were. Research code: the
release path never imports this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from mechanisms.batch import TractBatch

from dpatlas.evaluation.small_area_eval import (DEFAULT_SPLIT, SyntheticState, evaluate_cases,
                                                score)
from dpatlas.evaluation.stress import least_squares_line
from dpatlas.evaluation.synthetic_input import (NORTH_CAROLINA_FIPS, StateParams, matern_field,
                                                tract_geoids)

CALIBRATION_SEEDS = (301, 302)
REPORT_SEEDS = (401, 402, 403)
BOUNDARY_STEP = 0.12
SIZE_SLOPE = 0.04
OUTLIER_SHARE, OUTLIER_SHIFT = 0.04, 0.2
NEIGHBOURHOOD_CORR = 0.8
FLAG_Z = 2.5758293035489  # |z| beyond it: the model may not apply (two-sided 1%)


@dataclass(frozen=True)
class Scenario:
    length_scale_km: float = 60.0
    spatial_share: float = 0.6
    county_share: float = 0.15
    boundary_step: float = 0.0
    size_slope: float = 0.0
    outlier_share: float = 0.0
    neighbourhood_corr: float = 0.0
    bimodal: bool = False


SCENARIOS: dict[str, Scenario] = {
    **{f"field-{int(ls)}km": Scenario(ls, 0.75, 0.0) for ls in (3.0, 15.0, 60.0)},
    **{f"field-{int(ls)}km-county": Scenario(ls, 0.6, 0.15) for ls in (3.0, 15.0, 60.0)},
    "boundary": Scenario(boundary_step=BOUNDARY_STEP),
    "size-dependent": Scenario(size_slope=SIZE_SLOPE),
    "outlying-tracts": Scenario(outlier_share=OUTLIER_SHARE),
    "neighbourhood": Scenario(neighbourhood_corr=NEIGHBOURHOOD_CORR),
    "bimodal": Scenario(bimodal=True),
}


def expected_outcome(mu: np.ndarray, sd: float) -> np.ndarray:
    """E[clip(Z, 0, 1)] for Z ~ N(mu, sd²): E[max(Z, 0)] − E[max(Z − 1, 0)], with
    E[max(Z − c, 0)] = (mu − c)·Φ((mu − c)/sd) + sd·φ((mu − c)/sd)."""
    mu = np.asarray(mu, dtype=float)

    def above(c):
        z = (mu - c) / sd
        return (mu - c) * stats.norm.cdf(z) + sd * stats.norm.pdf(z)

    return above(0.0) - above(1.0)


def _unit_parts(points_km, county_of, sc: Scenario, seed: int, stream: int) -> np.ndarray:
    """√s·F + √c·C + √(1 − s − c)·E: field, county, own parts, each standardised."""
    rng = np.random.default_rng([seed, 32, stream])
    field = matern_field(points_km, sc.length_scale_km, 1.5, rng)
    field = (field - field.mean()) / field.std()
    _, county_index = np.unique(county_of, return_inverse=True)
    county = rng.standard_normal(county_index.max() + 1)[county_index]
    own = rng.standard_normal(len(points_km))
    s, c = sc.spatial_share, sc.county_share
    return np.sqrt(s) * field + np.sqrt(c) * county + np.sqrt(1 - s - c) * own


def scenario_state(seed: int, name: str, tracts: int = 3108) -> SyntheticState:
    """The state of scenario ``name`` at ``seed`` with its truth (module docstring)."""
    from dpatlas.core.places import local_km, tract_centroids
    from dpatlas.evaluation.synthetic_boundaries import synth_boundaries

    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    sc, p = SCENARIOS[name], StateParams()
    geoids, county_code = tract_geoids(NORTH_CAROLINA_FIPS, tracts, max(1, min(100, tracts // 30)))
    boundaries = synth_boundaries(list(geoids), seed=seed)
    lonlat = tract_centroids(boundaries).loc[geoids][["lon", "lat"]].to_numpy()
    km = local_km(lonlat[:, 0], lonlat[:, 1])
    rng = np.random.default_rng([seed, 32, 0])
    sizes = np.maximum(1, np.rint(rng.exponential(p.mean_tract_size, tracts))).astype(int)

    parent = _unit_parts(km, county_code, sc, seed, 1)
    a_part, b_part = (_unit_parts(km, county_code, sc, seed, k) for k in (2, 3))
    if sc.neighbourhood_corr:
        r = sc.neighbourhood_corr
        a_part = r * parent + np.sqrt(1 - r ** 2) * a_part
        b_part = -r * parent + np.sqrt(1 - r ** 2) * b_part
    intercept = p.intercept_mean + p.intercept_sd * a_part
    slope = p.slope_mean + p.slope_sd * b_part
    if sc.boundary_step:
        intercept = intercept + np.where(km[:, 0] > np.median(km[:, 0]), sc.boundary_step, 0.0)
    if sc.size_slope:
        log_n = np.log(sizes)
        intercept = intercept + sc.size_slope * (log_n - log_n.mean())
    planted = np.zeros(tracts, dtype=bool)
    if sc.outlier_share:
        planted[rng.choice(tracts, int(round(sc.outlier_share * tracts)), replace=False)] = True
        intercept = intercept + planted * rng.choice([-1.0, 1.0], tracts) * OUTLIER_SHIFT

    tract = np.repeat(np.arange(tracts), sizes)
    between = p.between_sd * (1.5 if sc.neighbourhood_corr else 1.0)
    centre = between * parent[tract]
    if sc.bimodal:
        side = rng.choice([-0.9, 0.9], tract.size)
        log_income = rng.normal(centre + side, 0.3)
    else:
        log_income = rng.normal(centre, p.within_sd)
    order = np.argsort(log_income, kind="stable")
    rank = np.empty(tract.size)
    rank[order] = (np.arange(tract.size) + 0.5) / tract.size
    x = np.round(rank, 2)
    mu = intercept[tract] + slope[tract] * x
    y = np.round(np.clip(mu + rng.normal(0.0, p.noise_sd, tract.size), 0.0, 1.0), 2)
    records = pd.DataFrame({"geoid": geoids[tract], "parent_rank": x, "child_rank": y})

    line = least_squares_line(TractBatch.from_labels(geoids[tract], x,
                                                     expected_outcome(mu, p.noise_sd)))
    truth = pd.DataFrame({"geoid": geoids, "n": sizes, "p25": line["p25"], "p75": line["p75"],
                          "planted_outlier": planted})
    cb = TractBatch.from_labels(records["geoid"].str[:5].to_numpy(), x, y)
    cl = least_squares_line(cb)
    county_truth = pd.DataFrame({"geoid": cb.labels.astype(str), "p25": cl["p25"],
                                 "p75": cl["p75"]})
    return SyntheticState(records, truth, county_truth, boundaries, seed)


def score_scenario(state: SyntheticState, first: pd.DataFrame, second: pd.DataFrame,
                   counties: pd.DataFrame) -> dict:
    """``score`` (with the two releases' median p25 widths) and the flag's record: the share
    of planted outliers with |p25_model_z| > ``FLAG_Z``, the share of the other tracts, and
    the z's mean and sd over the tracts that have one."""
    out = score(state, first, second, counties)
    truth = state.truth.set_index("geoid").reindex(first["geoid"])
    z = first["p25_model_z"].to_numpy(dtype=float) if "p25_model_z" in first else \
        np.full(len(first), np.nan)
    flagged = np.abs(z) > FLAG_Z
    planted = truth["planted_outlier"].fillna(False).to_numpy(dtype=bool) \
        if "planted_outlier" in truth else np.zeros(len(z), dtype=bool)
    has = np.isfinite(z)
    out["flagged, planted outliers"] = (float(flagged[planted & has].mean())
                                        if (planted & has).any() else float("nan"))
    out["flagged, other tracts"] = float(flagged[~planted & has].mean()) if has.any() else \
        float("nan")
    out["p25 z mean"] = float(np.mean(z[has & ~planted])) if has.any() else float("nan")
    out["p25 z sd"] = float(np.std(z[has & ~planted])) if has.any() else float("nan")
    return out


def evaluate_scenarios(names: Sequence[str], seeds: Sequence[int] = REPORT_SEEDS,
                       epsilons: Sequence[float] = (1.0,), split: str = DEFAULT_SPLIT,
                       tracts: int = 3108,
                       progress: Callable[[str], None] = lambda m: None) -> pd.DataFrame:
    """One row of ``score_scenario`` per (scenario, seed, ε), each seed labelled with its role
    (``calibration`` or ``report``)."""
    return evaluate_cases(
        names, seeds, epsilons, split, lambda seed, name: scenario_state(seed, name, tracts),
        score_scenario,
        lambda seed: {"seeds": "calibration" if seed in CALIBRATION_SEEDS else "report"},
        progress)


SCENARIO_COLUMNS = ["coverage", "coverage, worst size quintile", "coverage, lowest decile",
                    "coverage, highest decile", "median p25 width",
                    "median p25 width, second release", "p25 width ratio, two releases",
                    "p25 model corr", "p25 model RMSE",
                    "flagged, planted outliers", "flagged, other tracts", "p25 z mean",
                    "p25 z sd"]


def scenario_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Means over seeds per (seed role, ε, scenario)."""
    return (rows.groupby(["seeds", "epsilon", "scenario"], sort=False)[SCENARIO_COLUMNS].mean()
            .reset_index())


def write_scenarios(rows: pd.DataFrame, out, split: str = DEFAULT_SPLIT) -> list:
    """scenarios.csv (per scenario, seed and ε) and scenarios.md (means over seeds)."""
    from pathlib import Path

    from dpatlas.evaluation.small_area_eval import _markdown

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out / "scenarios.csv", index=False)
    summary = scenario_summary(rows)
    md = (f"Small-area stress scenarios (dpatlas/evaluation/small_area_scenarios.py), split "
          f"{split}; means over seeds. Calibration seeds {list(CALIBRATION_SEEDS)}, report "
          f"seeds {list(REPORT_SEEDS)}.\n")
    for (role, eps), part in summary.groupby(["seeds", "epsilon"], sort=True):
        seeds = sorted(rows.loc[(rows["seeds"] == role) & (rows["epsilon"] == eps), "seed"]
                       .unique())
        md += (f"\n### ε = {eps:g}, {role} seeds {', '.join(map(str, seeds))}\n\n"
               f"{_markdown(part.drop(columns=['seeds', 'epsilon']))}")
    (out / "scenarios.md").write_text(md)
    return [out / "scenarios.csv", out / "scenarios.md"]
