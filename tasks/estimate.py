from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from prefect import get_run_logger, task

from dpatlas.allocate import BudgetPlan
from dpatlas.estimate import estimate_partition, select_partition
from mechanisms.noise import default_randomness

from .common import TASK_OPTIONS


def _chunk(staged: Path, geoids: list[str]) -> pd.DataFrame:
    df = pd.read_parquet(staged)
    return df[df["geoid"].isin(set(geoids))]


@task(name="select", task_run_name="select-{name}", **TASK_OPTIONS)
def select_chunk(staged: Path, geoids: list[str], budget: BudgetPlan, min_n: int,
                 out: Path, name: str, seed: int | None = None) -> Path:
    """Choose the mechanism per tract; the dp rule's noise is persisted before it is used."""
    sel = select_partition(_chunk(staged, geoids), budget, default_randomness(seed), min_n)
    out.parent.mkdir(parents=True, exist_ok=True)
    sel.to_parquet(out, index=False)
    counts = sel["mechanism"].value_counts().to_dict()
    get_run_logger().info("%s: selected %s", name, counts)
    return out


@task(name="estimate", task_run_name="estimate-{name}", **TASK_OPTIONS)
def estimate_chunk(staged: Path, geoids: list[str], selection: Path, budget: BudgetPlan,
                   min_n: int, out: Path, name: str, seed: int | None = None) -> Path:
    res = estimate_partition(_chunk(staged, geoids), pd.read_parquet(selection), budget,
                             default_randomness(seed), min_n)
    out.parent.mkdir(parents=True, exist_ok=True)
    res.to_parquet(out, index=False)
    status = res["status"].value_counts().to_dict()
    get_run_logger().info("%s: %d tract-cells, %s", name, len(res), status)
    return out
