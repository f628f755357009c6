from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task

from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.crash import crashpoint
from dpatlas.release.estimate import Chunk, estimate_partition, read_chunk, select_partition
from dpatlas.core.files import write_parquet_atomic
from mechanisms.noise import default_randomness

from .common import TASK_OPTIONS

# These tasks draw noise: never retried (TASK_OPTIONS). A rerun of the release resumes from
# the persisted draws instead.


@task(name="select", task_run_name="select-{chunk.name}", **TASK_OPTIONS)
def select_chunk(chunk: Chunk, budget: BudgetPlan, min_n: int, out: Path,
                 seed: int | None = None) -> Path:
    """Choose the mechanism per tract. The dp rule's noise is persisted before anything uses
    it; a resumed release reuses the persisted draw instead of drawing again."""
    log = get_run_logger()
    if out.exists():
        log.info("%s: reusing the persisted selection (no new noise)", chunk.name)
        return out
    sel = select_partition(read_chunk(chunk), budget, default_randomness(seed), min_n)
    write_parquet_atomic(sel, out)
    log.info("%s: selected %s", chunk.name, sel["mechanism"].value_counts().to_dict())
    crashpoint(f"after-select-{chunk.name}")
    return out


@task(name="estimate", task_run_name="estimate-{chunk.name}", **TASK_OPTIONS)
def estimate_chunk(chunk: Chunk, selection: Path, budget: BudgetPlan, min_n: int, out: Path,
                   seed: int | None = None) -> Path:
    log = get_run_logger()
    if out.exists():
        log.info("%s: reusing the persisted estimates (no new noise)", chunk.name)
        return out
    res = estimate_partition(read_chunk(chunk), pd.read_parquet(selection), budget,
                             default_randomness(seed), min_n)
    write_parquet_atomic(res, out)
    log.info("%s: %d tract-cells, %s", chunk.name, len(res),
             res["status"].value_counts().to_dict())
    crashpoint(f"after-estimate-{chunk.name}")
    return out
