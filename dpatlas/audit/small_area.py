"""The small_area check (m): model-based tract columns re-fitted from the published files by
``dpatlas.small_area`` (the one package of ours the audit imports) and compared."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from .base import LEVEL_STEMS, MODEL_COLUMNS, Mismatch, _is_number
from .files import _config, readable


# Post-processing of published values: the auditor re-fits the model from the published files
# with dpatlas.small_area (numpy, pandas and scipy; it imports nothing of ours) and compares.

MODEL_ROUNDING_STEP = 1e-4  # the release rounds the model columns to 4 decimals
# The re-fit's sigma2 and beta against the manifest's: loose, because σ² is found by a bounded
# optimiser (log σ² to 1e-6) whose path may differ on another machine's floating point; the
# values themselves are held to one rounding step.
MODEL_FIT_RTOL = 1e-3


def _model_differences(published, refit) -> list[str]:
    problems = []
    for c in MODEL_COLUMNS:
        a, b = published[c].to_numpy(dtype=float), refit[c].to_numpy(dtype=float)
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        off = (nan_a != nan_b) | (~nan_a & ~nan_b & (np.abs(np.where(nan_a, 0, a) - np.where(
            nan_b, 0, b)) > MODEL_ROUNDING_STEP * (1 + 1e-6)))
        if off.any():
            k = int(np.argmax(off))
            problems.append(f"{c} differs from the re-fit by more than one rounding step in "
                            f"{int(off.sum())} row(s), e.g. geoid {published['geoid'].iloc[k]}"
                            f" cell {published['cell'].iloc[k]}: {a[k]!r} published, "
                            f"{b[k]!r} re-fitted")
    return problems


def _fit_problems(stated, refit: list[dict]) -> list[str]:
    if not isinstance(stated, list) or len(stated) != len(refit):
        return [f"small_area.fits lists {len(stated) if isinstance(stated, list) else stated!r}"
                f" fit(s), the re-fit has {len(refit)} (one per cell and state)"]
    problems = []
    for s, r in zip(stated, refit):
        where = f"cell {r['cell']} state {r['state']}"
        if not isinstance(s, dict) or any(s.get(k) != r[k] for k in
                                          ("cell", "state", "tracts", "directs", "fitted")):
            problems.append(f"small_area.fits: the fit of {where} is not stated as re-fitted")
            continue
        for q in ("p25", "p75") if r["fitted"] else ():
            got, want = s.get(q) or {}, r[q]
            beta = got.get("beta")
            # sigma2_interval: stated since the intervals use their own σ² (absent before)
            variances = [k for k in ("sigma2", "sigma2_interval") if k in want]
            if not (all(_is_number(got.get(k)) for k in variances) and isinstance(beta, list)
                    and len(beta) == len(want["beta"]) and all(_is_number(b) for b in beta)
                    and np.allclose([*(got[k] for k in variances), *beta],
                                    [*(want[k] for k in variances), *want["beta"]],
                                    rtol=MODEL_FIT_RTOL, atol=1e-12)):
                problems.append(f"small_area.fits: {where} {q}: sigma2/beta {got.get('sigma2')!r}"
                                f"/{beta!r} are not the re-fit's {want['sigma2']!r}/"
                                f"{want['beta']!r}")
    return problems


def _model_z_problems(tracts, fits: list[dict]) -> list[str]:
    """``p25_model_z``/``p75_model_z`` (issue 32): in every fitted cell and state, finite
    exactly where the tract has a direct (released, value present), empty elsewhere."""
    cell, state = tracts["cell"].astype(str), tracts["geoid"].astype(str).str[:2]
    fitted = np.zeros(len(tracts), dtype=bool)
    for f in fits:
        if f["fitted"]:
            fitted |= ((cell == f["cell"]) & (state == f["state"])).to_numpy()
    problems = []
    for q in ("p25", "p75"):
        direct = ((tracts["status"].astype(str) == "released")
                  & tracts[q].notna()).to_numpy()
        finite = np.isfinite(tracts[f"{q}_model_z"].to_numpy(dtype=float))
        off = fitted & (finite != direct)
        if off.any():
            problems.append(f"{q}_model_z is not finite exactly where a direct {q} is, in "
                            f"{int(off.sum())} row(s) of fitted states, e.g. geoid "
                            f"{tracts['geoid'].iloc[int(np.argmax(off))]}")
    return problems


def check_small_area(folder: Path, m: dict) -> str:
    """Model-based columns re-fitted from the published files: tracts.parquet (with its
    geometry), counties.parquet and states.parquet; each value within one rounding step."""
    try:
        columns = pq.read_schema(readable(folder / "tracts.parquet")).names
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    section = m.get("small_area")
    has = [c for c in MODEL_COLUMNS if c in columns]
    if not has and not section:
        return "no model-based columns"
    if not has or not isinstance(section, dict) or len(has) != len(MODEL_COLUMNS):
        raise Mismatch(f"model columns {has} and the manifest's small_area section "
                       f"{'present' if section else 'absent'} do not go together")
    if not (_config(folder).get("small_area") or {}).get("model"):
        raise Mismatch("model columns, but config.json does not ask for the model "
                       "(small_area.model)")
    import geopandas
    import pandas as pd

    from dpatlas.small_area.published import fit_published, noise_from_steps

    levels = m.get("levels") or {}
    try:
        tracts = geopandas.read_parquet(readable(folder / "tracts.parquet"))
        tables = [pd.read_parquet(readable(folder / f"{LEVEL_STEMS[lv]}.parquet")) if lv in levels
                  else None for lv in ("county", "state")]
        refit, fits = fit_published(tracts, *tables,
                                    noise_from_steps((m.get("budget") or {}).get("steps")))
    except Exception as err:  # noqa: BLE001 - a model that cannot be re-fitted is a finding
        raise Mismatch(f"the model cannot be re-fitted from the published files: "
                       f"{type(err).__name__} {err}") from None
    problems = (_model_differences(tracts, refit) + _fit_problems(section.get("fits"), fits)
                + _model_z_problems(tracts, fits))
    if problems:
        raise Mismatch("; ".join(problems))
    fitted = sum(f["fitted"] for f in fits)
    return (f"re-fitted from tracts.parquet, counties.parquet and states.parquet: {fitted} of "
            f"{len(fits)} cell-state fit(s); every model value within one rounding step of "
            "the published one; the z columns finite exactly where a direct is")
