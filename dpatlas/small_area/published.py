"""The model fitted to a release's published tables, as the release does and the audit redoes.

``fit_published(tracts, counties, states)`` takes the published tract table (with its
geometry) and the county and state tables, keeps only the columns the model reads
(``TRACT_INPUTS``, ``LEVEL_INPUTS``: nothing else can reach it, not even model columns already
in the table), and fits ``fit_model`` once per cell and state: fit_model takes one cell, and a
state's tracts are fitted on their own (docs/small-area.md, "Limits": memory, and a state's
estimates are benchmarked to its own published value). A state whose cell has fewer than
``MIN_RELEASED`` directs is not fitted: its tracts' model columns stay empty and its entry in
the returned fits says why.

Imports nothing of ours beyond this package, so ``dpatlas audit`` can call it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpatlas.small_area.model import (DIRECT_LAW, MIN_RELEASED, QUANTITIES, Neighbours,
                                      fit_model, model_columns, tract_neighbours)

TRACT_INPUTS = ("geoid", "cell", "n", "status", "mechanism", "p25", "p75", "geometry")
LEVEL_INPUTS = ("geoid", "cell", "p25", "p75", "p25_se", "p75_se")
MODEL_COLUMNS = tuple(c for q in QUANTITIES for c in model_columns(q))
WGS84 = "EPSG:4326"
# The tract budget step whose ε the mechanisms' noise is calibrated with (the manifest's
# budget.steps; dpatlas.release.selection.PRIMARY_STEP, spelled out so this package imports
# nothing of ours; tests/unit/small_area/test_known_noise.py checks the two agree).
PRIMARY_STEP = "primary: p25 and p75"


def noise_from_steps(steps) -> dict | None:
    """{mechanism: ε} the tract mechanisms ran with, from a release plan's budget steps as the
    manifest prints them (``budget.steps``: ``step``, ``epsilon_param``): public, so the model
    can take its directs' DP noise variance as known (``model.direct_law``). None when the
    plan has no primary step."""
    for step in steps or []:
        if step.get("step") == PRIMARY_STEP and step.get("epsilon_param"):
            return {m: float(step["epsilon_param"]) for m in DIRECT_LAW}
    return None


def _inputs(table, columns) -> pd.DataFrame | None:
    if table is None:
        return None
    return table[[c for c in columns if c in table.columns]].copy()


def _of_cell(table: pd.DataFrame | None, cell: str) -> pd.DataFrame | None:
    if table is None:
        return None
    return table[table["cell"].astype(str) == cell].drop(columns="cell").reset_index(drop=True)


def fit_published(tracts, counties=None, states=None,
                  noise: dict | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """(the model columns, one row per row of ``tracts`` in its order; the fits).

    ``tracts``: the published tract table with its geometry (a GeoDataFrame); ``counties``,
    ``states``: the published level tables (or None); ``noise``: {mechanism: ε} from the
    release's plan (``noise_from_steps``), or None. Each fit is ``{"cell", "state",
    "tracts", "directs", "fitted"}`` plus, when fitted, per quantity ``{"covariates",
    "beta", "sigma2"}``, else ``reason``. The values are unrounded.
    """
    t = _inputs(tracts, TRACT_INPUTS)
    if t.crs is not None and str(t.crs) != WGS84:  # positions are taken in degrees
        t = t.to_crs(WGS84)
    t["geoid"] = t["geoid"].astype(str)
    levels = [_inputs(counties, LEVEL_INPUTS), _inputs(states, LEVEL_INPUTS)]
    out = pd.DataFrame(np.nan, index=t.index, columns=list(MODEL_COLUMNS))
    fits = []
    cell = t["cell"].astype(str)
    state = t["geoid"].str[:2]
    # A state's tracts are where they are in every cell: their neighbours are found once (the
    # kernel pairs and positions were a fifth of a part's model fits, rebuilt for each cell).
    found: dict[tuple[str, ...], Neighbours] = {}
    for c in sorted(cell.unique()):
        for s in sorted(state[cell == c].unique()):
            rows = (cell == c) & (state == s)
            part = t[rows].reset_index(drop=True)
            directs = int((part["status"].astype(str) == "released").sum())
            fit = {"cell": c, "state": s, "tracts": int(rows.sum()), "directs": directs}
            if directs < MIN_RELEASED:
                fits.append({**fit, "fitted": False,
                             "reason": f"{directs} tract(s) with a direct estimate, fewer than "
                                       f"the {MIN_RELEASED} the model needs to fit its "
                                       "variances: model columns left empty"})
                continue
            geoids = tuple(part["geoid"])
            if geoids not in found:
                found[geoids] = tract_neighbours(part[["geoid", "geometry"]], part["geoid"])
            fitted = fit_model(part.drop(columns=["cell", "geometry"]),
                               *(_of_cell(lv, c) for lv in levels), noise=noise,
                               neighbours=found[geoids])
            out.loc[rows, list(MODEL_COLUMNS)] = fitted[list(MODEL_COLUMNS)].to_numpy()
            fits.append({**fit, "fitted": True,
                         **{q: _plain(fitted.attrs["fits"][q]) for q in QUANTITIES}})
    return out, fits


def _plain(details: dict) -> dict:
    """A fit's covariates, β and σ² as plain JSON values: ``sigma2``, the model's own variance
    the point estimate shrinks with; ``sigma2_interval``, the (never smaller) one its
    intervals are computed with (docs/small-area.md, "Which variance")."""
    return {"covariates": [str(n) for n in details["covariates"]],
            "beta": [float(b) for b in details["beta"]],
            "sigma2": float(details["sigma2"])}


def round_model(values: pd.DataFrame, decimals: int) -> pd.DataFrame:
    """The model columns rounded as the release rounds its values: estimates to nearest,
    lower bounds down, upper bounds and standard errors up (a published interval contains
    the computed one)."""
    scale = 10.0 ** decimals
    out = values.copy()
    for q in QUANTITIES:
        est, lo, hi, se, z = model_columns(q)
        for c in (est, z):
            out[c] = out[c].astype(float).round(decimals) + 0.0
        out[lo] = (np.floor(out[lo].astype(float) * scale) / scale).round(decimals) + 0.0
        for c in (hi, se):
            out[c] = (np.ceil(out[c].astype(float) * scale) / scale).round(decimals) + 0.0
    return out
