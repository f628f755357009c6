from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task

from dpatlas.allocate import BudgetPlan
from dpatlas.crash import crashpoint
from dpatlas.estimate import estimate_partition, select_partition
from dpatlas.state import write_parquet_atomic
from mechanisms.noise import default_randomness

from .common import TASK_OPTIONS


def _chunk(staged: Path, geoids: list[str]) -> pd.DataFrame:
    # Filter while reading: only this chunk's rows are loaded, not the whole state.
    return pd.read_parquet(staged, filters=[("geoid", "in", list(geoids))])


@task(name="select", task_run_name="select-{name}", **TASK_OPTIONS)
def select_chunk(staged: Path, geoids: list[str], budget: BudgetPlan, min_n: int,
                 out: Path, name: str, seed: int | None = None) -> Path:
    """Choose the mechanism per tract. The dp rule's noise is persisted before anything uses
    it; a resumed release reuses the persisted draw instead of drawing again."""
    log = get_run_logger()
    if out.exists():
        log.info("%s: reusing the persisted selection (no new noise)", name)
        return out
    sel = select_partition(_chunk(staged, geoids), budget, default_randomness(seed), min_n)
    write_parquet_atomic(sel, out)
    log.info("%s: selected %s", name, sel["mechanism"].value_counts().to_dict())
    crashpoint(f"after-select-{name}")
    return out


@task(name="estimate", task_run_name="estimate-{name}", **TASK_OPTIONS)
def estimate_chunk(staged: Path, geoids: list[str], selection: Path, budget: BudgetPlan,
                   min_n: int, out: Path, name: str, seed: int | None = None) -> Path:
    log = get_run_logger()
    if out.exists():
        log.info("%s: reusing the persisted estimates (no new noise)", name)
        return out
    res = estimate_partition(_chunk(staged, geoids), pd.read_parquet(selection), budget,
                             default_randomness(seed), min_n)
    write_parquet_atomic(res, out)
    log.info("%s: %d tract-cells, %s", name, len(res), res["status"].value_counts().to_dict())
    crashpoint(f"after-estimate-{name}")
    return out
