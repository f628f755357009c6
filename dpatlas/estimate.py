"""Selecting and estimating one partition, per tract and cell (plain functions, no Prefect).

``select_partition`` draws the selection noise (dp rule) and returns the choice as a table;
the flow persists it before ``estimate_partition`` runs the chosen mechanism and the suite.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

import mechanisms as M
from mechanisms.batch import TractBatch
from mechanisms.noise import Randomness

from .allocate import BudgetPlan
from .selection import Selection, run_selected, select

RESULT_COLUMNS = ["geoid", "cell", "n", "mechanism", "status", "reason", "p25_raw", "p75_raw",
                  "epsilon_spent", "delta_spent"]


def suite_columns(plan: BudgetPlan) -> list[str]:
    return [f"{name}_{p}" for name, _, _ in plan.suite for p in ("p25", "p75")]


def _cells(df: pd.DataFrame, min_n: int):
    """Per cell: the batch of its tracts and the indices of tracts large enough to estimate."""
    for cell, grp in df.groupby("cell", sort=True):
        batch = TractBatch.from_labels(grp["geoid"].to_numpy(), grp["x"].to_numpy(),
                                       grp["y"].to_numpy())
        yield str(cell), batch, np.nonzero(batch.n >= min_n)[0]


def select_partition(df: pd.DataFrame, plan: BudgetPlan, rand: Randomness,
                     min_n: int) -> pd.DataFrame:
    """The mechanism chosen for each eligible (tract, cell), and the selection's noisy nvar."""
    frames = []
    for cell, batch, eligible in _cells(df, min_n):
        sel = select(batch.subset(eligible), plan.primary_epsilon, plan.rule, rand)
        frames.append(pd.DataFrame({"geoid": batch.labels[eligible].astype(str), "cell": cell,
                                    "mechanism": sel.mechanism[0],
                                    "noisy_nvar": sel.noisy_nvar[0],
                                    "epsilon_rest": sel.epsilon_rest}))
    cols = ["geoid", "cell", "mechanism", "noisy_nvar", "epsilon_rest"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def estimate_partition(df: pd.DataFrame, selection: pd.DataFrame, plan: BudgetPlan,
                       rand: Randomness, min_n: int) -> pd.DataFrame:
    """One row per (tract, cell) with data: the released numbers and what they cost."""
    frames = []
    for cell, batch, eligible in _cells(df, min_n):
        out = pd.DataFrame({"geoid": batch.labels.astype(str), "cell": cell, "n": batch.n,
                            "mechanism": "none", "status": "suppressed",
                            "reason": f"fewer than {min_n} records", "p25_raw": np.nan,
                            "p75_raw": np.nan, "epsilon_spent": 0.0, "delta_spent": 0.0})
        for col in suite_columns(plan):
            out[col] = np.nan
        if eligible.size:
            sub = batch.subset(eligible)
            chosen = (selection[selection["cell"] == cell].set_index("geoid")
                      .reindex(sub.labels.astype(str)))
            if chosen["mechanism"].isna().any():
                raise RuntimeError(f"cell {cell}: selection missing for some tracts")
            sel = Selection((chosen["mechanism"].to_numpy() == "NoisyStats")[None, :],
                            chosen["noisy_nvar"].to_numpy(dtype=float)[None, :],
                            float(chosen["epsilon_rest"].iloc[0]))
            res = run_selected(sub, plan.rule, sel, rand)
            out.loc[eligible, "mechanism"] = res.mechanism[0]
            out.loc[eligible, "status"] = np.where(res.failed[0], "failed", "released")
            out.loc[eligible, "reason"] = np.where(res.failed[0], res.reason[0], "")
            out.loc[eligible, "p25_raw"] = res.p25[0]
            out.loc[eligible, "p75_raw"] = res.p75[0]
            out.loc[eligible, "epsilon_spent"] = plan.epsilon_per_tract
            out.loc[eligible, "delta_spent"] = (sum(d for _, _, d in plan.suite)
                                                + plan.conversion_delta)
            for name, eps, delta in plan.suite:
                est = M.estimate_batch(name, sub, eps, delta or None, rand=rand)
                out.loc[eligible, f"{name}_p25"] = est.p25
                out.loc[eligible, f"{name}_p75"] = est.p75
        frames.append(out)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RESULT_COLUMNS)
