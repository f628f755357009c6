"""County and state estimates (issue 20, item 1): NoisyStats on the records pooled per unit.

A county is the GEOID's first 5 digits, a state its first 2. Each (unit, cell) with at least
``min_n`` records runs NoisyStats with its level's estimate budget and, with intervals, the
interval method the tracts use for NoisyStats with its level's interval budget; the others are
suppressed by the public n, as tracts are. Units of one level hold disjoint people (parallel
composition); each level's steps compose sequentially with the tract's (allocate.py).

Memory: the estimators take records, not running sums (NoisyStats centres its statistics in
two passes and rounds them to its grid), so one state's records are read at a time (filtered
from the staged partitions by GEOID range) and its counties and the state itself are estimated
from them: a run holds at most one state's records, as a per-state partition does; with many
cells, one group of a state's cells (:func:`level_tasks`), so memory does not grow with cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

import mechanisms as M
from mechanisms import intervals as CI
from mechanisms.batch import TractBatch
from mechanisms.noise import Randomness, default_randomness
from mechanisms.privacy_filter import PrivacyFilter
from mechanisms.sufficient_stats import noisy_stats_split

from dpatlas.core.columns import UNCERTAINTY_COLUMNS
from dpatlas.publication.level_files import GEOID_DIGITS, unit_of
from dpatlas.release import staging
from dpatlas.release.cell_groups import group_cells, group_suffix, records_by_state_and_cell
from dpatlas.release.allocate import (LEVEL_MECHANISM, BudgetPlan, LevelPlan,
                                      level_estimate_step, level_interval_step)

LEVEL_RESULT_COLUMNS = ["geoid", "level", "cell", "n", "mechanism", "status", "reason",
                        "p25_raw", "p75_raw", "epsilon_spent", "delta_spent"]


def states_of(geoids) -> list[str]:
    return sorted(set(unit_of(geoids, "state")))


def partitions_holding(staged: list[Path], chunks, state: str) -> list[Path]:
    """The staged partitions that can hold records of ``state``, in ``staged``'s order: those
    whose chunks' GEOID ranges (``dpatlas.release.estimate.Chunk``: every tract of a partition
    is in one of its chunks) reach the state. The others hold none of its records, so a state
    reads a few partitions instead of every one (51 × 51 reads on the national release)."""
    spans: dict[Path, tuple[str, str]] = {}
    for c in chunks:
        lo, hi = spans.get(Path(c.staged), (c.first_geoid, c.last_geoid))
        spans[Path(c.staged)] = (min(lo, c.first_geoid), max(hi, c.last_geoid))
    return [p for p in staged
            if Path(p) in spans and spans[Path(p)][0][:2] <= state <= spans[Path(p)][1][:2]]


def read_state(staged: list[Path | str], state: str,
               cells: Optional[tuple[str, ...]] = None) -> pd.DataFrame:
    """The staged records of one state (of ``cells`` only, if given), from every partition
    (filtered while reading): local paths, or URLs under the staging location
    (:mod:`dpatlas.release.staging`) that a Dask worker on another machine reads."""
    lo, hi = state + "0" * 9, state + "9" * 9
    rows = [("geoid", ">=", lo), ("geoid", "<=", hi)]
    if cells is not None:
        rows.append(("cell", "in", list(cells)))
    frames = [staging.read_parquet(str(p), columns=["geoid", "cell", "x", "y"], filters=rows)
              for p in staged]
    return pd.concat(frames, ignore_index=True)


@dataclass(frozen=True)
class LevelTask:
    """One run of the county and state estimates: a state, and a group of its cells (None:
    every cell) so that it reads at most ``TASK_RECORDS`` records
    (:mod:`dpatlas.release.cell_groups`). ``name``: its draw's name, ``state-06`` or, when
    the state's cells are split, ``state-06-c0``, ``state-06-c1``, ..."""

    state: str
    cells: Optional[tuple[str, ...]]
    name: str


def level_tasks(sizes: pd.DataFrame, record_bound: Optional[int] = None) -> list[LevelTask]:
    """The level tasks of a release, from n per (geoid, cell) (``sizes``), in state order."""
    records = records_by_state_and_cell(sizes)
    tasks = []
    for state in sorted(set(records.index.get_level_values(0))):
        groups = group_cells(records.loc[state], record_bound)
        tasks.extend(LevelTask(state, cells, f"state-{state}" + group_suffix(j, groups))
                     for j, cells in enumerate(groups))
    return tasks


def draw_levels(sources: list[Path | str], unit: "LevelTask", budget: BudgetPlan,
                seed: Optional[int], min_n: int) -> pd.DataFrame:
    """A level task's county and state estimates, its records read from ``sources`` (paths,
    or URLs under the staging location), drawn from ``seed`` (None: the operating system's
    CSPRNG); the caller persists and records them. Picklable, for a compute-pool worker
    (:mod:`dpatlas.release.compute_pool`) or a Dask worker."""
    return estimate_levels(read_state(sources, unit.state, unit.cells), budget,
                           default_randomness(seed), min_n)


def estimate_levels(df: pd.DataFrame, plan: BudgetPlan, rand: Randomness,
                    min_n: int) -> pd.DataFrame:
    """One row per (unit, cell) with records, for every level of ``plan`` (in plan order)."""
    frames = [estimate_level(df, plan, lp, rand, min_n) for lp in plan.levels]
    cols = LEVEL_RESULT_COLUMNS + (UNCERTAINTY_COLUMNS if any(lp.interval_epsilon
                                                           for lp in plan.levels) else [])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def unit_labels(geoids: pd.Series, level: str) -> np.ndarray:
    """``unit_of`` the GEOIDs as fixed-width text: the same units, sorted as fast as numbers
    (a national release's records grouped by object strings cost seconds)."""
    return np.asarray(geoids.astype(str).str[:GEOID_DIGITS[level]].to_numpy(), dtype=str)


def estimate_level(df: pd.DataFrame, plan: BudgetPlan, lp: LevelPlan, rand: Randomness,
                   min_n: int) -> pd.DataFrame:
    # a unit's rows say what the level's own steps charged its records in the cell (the
    # tract's and other levels' steps are charged to the same people, but not for this row)
    eps_charged, delta_charged = plan.charged(lp.steps)
    frames = []
    for cell, grp in df.groupby("cell", sort=True):
        batch = TractBatch.from_labels(unit_labels(grp["geoid"], lp.level),
                                       grp["x"].to_numpy(), grp["y"].to_numpy())
        out = pd.DataFrame({"geoid": batch.labels.astype(str), "level": lp.level,
                            "cell": str(cell), "n": batch.n, "mechanism": "none",
                            "status": "suppressed", "reason": f"fewer than {min_n} records",
                            "p25_raw": np.nan, "p75_raw": np.nan, "epsilon_spent": 0.0,
                            "delta_spent": 0.0})
        for col in UNCERTAINTY_COLUMNS if lp.interval_epsilon else []:
            out[col] = np.nan
        eligible = np.nonzero(batch.n >= min_n)[0]
        if eligible.size:
            sub = batch.subset(eligible)
            est, ci = _estimate_units(sub, plan, lp, rand)
            out.loc[eligible, "mechanism"] = LEVEL_MECHANISM
            out.loc[eligible, "status"] = np.where(est.failed, "failed", "released")
            out.loc[eligible, "reason"] = np.where(est.failed, est.reason, "")
            out.loc[eligible, "p25_raw"] = est.p25
            out.loc[eligible, "p75_raw"] = est.p75
            out.loc[eligible, "epsilon_spent"] = eps_charged
            out.loc[eligible, "delta_spent"] = delta_charged
            if ci is not None:
                for col in UNCERTAINTY_COLUMNS:
                    out.loc[eligible, col] = getattr(ci, col)[0]
        frames.append(out)
    return pd.concat(frames, ignore_index=True)


def _estimate_units(sub: TractBatch, plan: BudgetPlan, lp: LevelPlan, rand: Randomness):
    """NoisyStats on each unit's pooled records, metered against the level's own steps, and
    the interval of what it released (post-processing plus the interval step's noise)."""
    steps = {name: plan.step(name).guarantee for name in lp.steps}
    budget = PrivacyFilter(steps, sub.labels)
    est = M.estimate_batch(LEVEL_MECHANISM, sub, lp.estimate_epsilon, rand=rand,
                           meter=budget.meter(level_estimate_step(lp.level)),
                           publishable_only=True)
    if not lp.interval_epsilon:
        return est, None
    eps_nvar, eps_ncov, eps_intercept = noisy_stats_split(lp.estimate_epsilon)
    released = CI.Released(est.p25[None, :], est.p75[None, :],
                           noisy_nvar=np.asarray(est.extras["noisy_nvar"])[None, :],
                           eps_nvar=eps_nvar, eps_ncov=eps_ncov, eps_intercept=eps_intercept)
    # counties and states hold thousands of records and are published with no selection
    # floor: their nvar bound averages both noisy nvar draws (mechanisms/intervals.py)
    ci = CI.intervals(LEVEL_MECHANISM, sub, released, lp.interval_epsilon, rand,
                      plan.interval_level, meter=budget.meter(level_interval_step(lp.level)),
                      nvar_from_both_draws=True)
    return est, ci
