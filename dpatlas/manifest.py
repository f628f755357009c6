"""The accounting manifest of a release: everything an auditor needs to recompute the totals."""

from __future__ import annotations

import pandas as pd

import mechanisms as M
from mechanisms.privacy import as_dict

from .allocate import BudgetPlan
from .config import ReleaseConfig, fingerprint
from .publish import code_version, now_utc

COMPOSITION = {
    "within_tract_and_cell": "sequential: the steps below run on the same people",
    "across_tracts": "parallel: each person is in exactly one tract per cell",
    "across_cells": "sequential: cells may share people",
    "across_releases": "sequential: tracked by the budget ledger",
}


def sampler_description(plan: BudgetPlan, source: str) -> dict:
    used = {"NoisyStats", "DPExpTheilSen"} | {name for name, _, _ in plan.suite}
    return {"random_bits": source,
            "per_estimator": {name: M.get(name).sampler for name in sorted(used)},
            "note": "see README, 'Noise: why it is safe against floating-point attacks'"}


def build_manifest(cfg: ReleaseConfig, release_id: str, plan: BudgetPlan, table: pd.DataFrame,
                   input_sha256: str, random_source: str, started: str) -> dict:
    # Validation reports (rows quarantined, clipped) are NOT differentially private: they stay
    # in the internal folder and never enter this public manifest.
    cells = sorted(table["cell"].unique())
    totals = plan.totals(len(cells))
    per_tract = plan.per_tract()
    return {
        "release_id": release_id,
        "started": started,
        "published": now_utc(),
        "code_version": code_version(),
        "config_sha256": fingerprint(cfg),
        "input_sha256": input_sha256,
        "boundaries": {"path": str(cfg.boundaries.path)},
        "privacy_unit": cfg.privacy.unit,
        "neighbouring_relation": cfg.privacy.neighbouring,
        "public_values": ["n (records per tract and cell)", "tract boundaries"],
        "profile": cfg.profile.name,
        "selection": {"rule": plan.rule.kind, "threshold": plan.rule.threshold,
                      "budget_share": plan.rule.share if plan.rule.kind == "dp" else 0.0},
        "budget": {
            "epsilon_per_tract_and_cell": plan.epsilon_per_tract,
            "delta_per_tract_and_cell": plan.delta_per_tract,
            "steps": [s.as_dict() for s in plan.steps],
            "conversion_delta": plan.conversion_delta,
            "per_tract_and_cell": as_dict(per_tract),
        },
        "composition": COMPOSITION,
        "cells": cells,
        "total_per_person": totals,
        "counts": {
            "tracts": int(table["geoid"].nunique()),
            "rows": int(len(table)),
            "by_status": {k: int(v) for k, v in table["status"].value_counts().items()},
            "by_mechanism": {k: int(v) for k, v in table["mechanism"].value_counts().items()},
        },
        "published_columns": {
            "p25, p75": "display values: the raw values clipped to [0, 1] (post-processing)",
            "p25_raw, p75_raw": "the primary step's release for the tract's mechanism",
            **{f"{name}_p25, {name}_p75": f"the step 'suite: {name}'" for name, _, _ in plan.suite},
            "n, geoid, state, county, cell, geometry": "public",
            "mechanism, status, reason": "which mechanism ran and whether it failed: a "
                                         "function of the DP selection, the public n and the "
                                         "DP outputs (failure of NoisyStats = its noisy nvar <= 0)",
            "epsilon_spent, delta_spent": "the budget charged to the tract and cell",
        },
        "noise_sampler": sampler_description(plan, random_source),
        "ledger_entry": None,
    }
