from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from dpatlas.core.files import write_parquet_atomic
from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.crash import crashpoint
from dpatlas.release.levels import estimate_levels, read_state
from mechanisms.noise import default_randomness

from .common import TASK_OPTIONS


@task(name="estimate-levels", task_run_name="estimate-levels-{state}", **TASK_OPTIONS)
def estimate_state_levels(staged: list[Path], state: str, budget: BudgetPlan, min_n: int,
                          out: Path, seed: int | None = None) -> Path:
    """The county and state estimates of one state (its records read from every staged
    partition). Draws noise: never retried; a resumed release reuses the persisted draw."""
    log = get_run_logger()
    if out.exists():
        log.info("state %s: reusing the persisted level estimates (no new noise)", state)
        return out
    res = estimate_levels(read_state(staged, state), budget, default_randomness(seed), min_n)
    write_parquet_atomic(res, out)
    log.info("state %s: %d unit-cells, %s", state, len(res),
             res["status"].value_counts().to_dict())
    crashpoint(f"after-estimate-levels-{state}")
    return out
