"""Model-based tract estimates in a release (issue 20, item 2): a post-processing stage of
publishing. The Fay–Herriot model of ``dpatlas.small_area`` is fitted to the assembled,
rounded tract, county and state tables exactly as they are published, per cell and state, and
its columns (``p25_model``, ``p25_model_lo``, ``p25_model_hi``, ``p25_model_se``,
``p25_model_z`` and the same for p75) are added to the tract table, rounded like the other published values. It reads DP
outputs and public values only, so it has no budget step and no ledger entry; ``dpatlas
audit`` re-fits it from the published files (docs/small-area.md)."""

from __future__ import annotations

import geopandas as gpd

from dpatlas.small_area.published import (LEVEL_INPUTS, MODEL_COLUMNS, TRACT_INPUTS,
                                          fit_published, noise_from_steps, round_model)
from dpatlas.publication.tract_files import PUBLISHED_DECIMALS

METHOD = ("Fay–Herriot area-level model (EBLUP) of each tract's direct p25 and p75 "
          "(dpatlas.small_area.fit_model), estimating the tract expected outcome: each direct is "
          "read through its law given the tract's expected outcome (slope, offset and noise "
          "variance by mechanism, public n and the mechanism's epsilon in budget.steps, "
          "calibrated on synthetic calibration seeds; docs/small-area.md, 'The directs' law'), "
          "σ² by the adjusted residual likelihood (Li & Lahiri 2010), β and each tract's "
          "own-direct term bounded by Huber's psi (b = 1.345; Sinha & Rao 2009) against the DP "
          "noise's heavy tails; no benchmark to the state's pooled line (it differs from the "
          "mean of tract lines); 95% intervals estimate ± 1.96·√MSE (Prasad–Rao with "
          "Datta–Lahiri's term) clipped to [0, 1]; tracts without a direct get the synthetic "
          "estimate. p25_model_z, p75_model_z: the direct minus the model's prediction without "
          "it, over the square root of its variance (direct noise + σ² + the prediction's "
          "variance); |z| > 2.58 means the model may not apply to that tract")
COVARIATES = ("Gaussian-kernel means (8 and 25 km, the tract itself left out, weighted by "
              "1/(D + σ²)) of the neighbours' directs of the quantity and of the midpoint "
              "(p25 + p75)/2, read through the directs' law; log of the tract's public n; the "
              "county's published p25/p75 and midpoint; positions from the published tract "
              "geometry (representative points)")
LIMITS = [
    "Shrinkage: unusual tracts look ordinary. Where the covariates explain little of a "
    "tract's outcome, the extreme deciles of the truth are covered 0.60-0.80 (synthetic "
    "fine-scale fields, docs/small-area.md, 'Issue 32'); p25_model_z, p75_model_z flag a "
    "direct beyond the model's reach (|z| > 2.58) where the direct is precise enough to tell. "
    "The direct estimates (p25, p75 with their intervals) stay beside the model columns.",
    "Coverage of the 95% model intervals on synthetic states (docs/small-area.md, 'Issue "
    "32'): demo-like state, report seeds 201-203, at epsilon 1 0.951 overall, 0.926 in the "
    "worst size quintile, 0.905 and 0.810 in the lowest and highest deciles of the truth, "
    "median p25 width 0.195; at epsilon 8 0.949, 0.945, 0.882 and 0.840. On 11 stress "
    "scenarios (report seeds 401-403) 0.89-0.97 overall at epsilon 1 and 0.89-0.99 at "
    "epsilon 8.",
    "The directs' law (slope, offset and noise variance given the tract's expected outcome, "
    "by mechanism, public n and the plan's epsilon) is calibrated on synthetic states; on "
    "data unlike them (far steeper or flatter rank-rank slopes) it can be off.",
    "Two releases of the same data can differ in interval width by 10-50% at epsilon 1 (the "
    "model's own variance is weakly identified when most directs are noise).",
]


def add_model_estimates(table: gpd.GeoDataFrame, level_tables: dict, log=None,
                        steps: list[dict] | None = None) -> tuple[gpd.GeoDataFrame, list[dict]]:
    """``table`` with the model columns (before its geometry), and the fits per cell and state
    (``dpatlas.small_area.published.fit_published``). ``log``: a logger, one line per fit.
    ``steps``: the plan's budget steps as the manifest prints them (``Step.as_dict``): the
    tract mechanisms' ε makes their directs' noise variance known (``noise_from_steps``)."""
    values, fits = fit_published(table, level_tables.get("county"), level_tables.get("state"),
                                 noise_from_steps(steps))
    values = round_model(values, PUBLISHED_DECIMALS)
    plain = table.drop(columns="geometry")
    for column in MODEL_COLUMNS:
        plain[column] = values[column].to_numpy()
    out = gpd.GeoDataFrame(plain, geometry=table.geometry.to_numpy(), crs=table.crs)
    for fit in fits:
        if log is not None:
            log.info("small-area model, cell %s, state %s: %s", fit["cell"], fit["state"],
                     fit_summary(fit))
    return out, fits


def fit_summary(fit: dict) -> str:
    if not fit["fitted"]:
        return f"not fitted ({fit['reason']})"
    return (f"fitted on {fit['directs']} directs of {fit['tracts']} tracts, sigma2 "
            f"p25 {fit['p25']['sigma2']:.3g}, p75 {fit['p75']['sigma2']:.3g}")


def small_area_section(fits: list[dict]) -> dict:
    """The manifest's ``small_area``: the method, what it reads, every fit, and its limits."""
    return {
        "method": METHOD,
        "covariates": COVARIATES,
        "columns": list(MODEL_COLUMNS),
        "inputs": {"tracts.parquet": list(TRACT_INPUTS),
                   "counties.parquet": list(LEVEL_INPUTS),
                   "states.parquet": list(LEVEL_INPUTS)},
        "budget": "none: post-processing of the published columns listed in inputs (DP "
                  "outputs and public values); no budget step, no ledger charge",
        "fitted_by": "cell and state: each state's tracts of a cell are one fit, with the "
                     "cell's county and state tables",
        "direct_and_model": "p25, p75 (and their intervals) are the direct DP estimates; "
                            "p25_model, p75_model are the model-based estimates",
        "rounding": f"{PUBLISHED_DECIMALS} decimals: estimates to nearest, _lo down, _hi and "
                    "_se up",
        "fits": fits,
        "limits": LIMITS,
        "docs": "docs/small-area.md",
        "audit": "dpatlas audit re-fits the model from tracts.parquet, counties.parquet and "
                 "states.parquet and requires every value within one rounding step",
    }


def model_published_columns() -> dict:
    """The manifest's ``published_columns`` entry of the model columns."""
    return {", ".join(MODEL_COLUMNS):
            "post-processing of the published columns tracts.parquet "
            f"{', '.join(c for c in TRACT_INPUTS)} and counties/states.parquet "
            f"{', '.join(c for c in LEVEL_INPUTS)} by the small-area model (section "
            "small_area); no budget of its own"}
