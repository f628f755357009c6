from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task

from dpatlas.release import staging
from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.crash import crashpoint
from dpatlas.release.draws import DrawLog, draw_once, noise_source
from dpatlas.release.levels import LevelTask, estimate_levels, read_state
from mechanisms.noise import default_randomness

from .common import TASK_OPTIONS


@task(name="estimate-levels", task_run_name="estimate-levels-{unit.name}", **TASK_OPTIONS)
def estimate_state_levels(staged: list[Path], unit: LevelTask, budget: BudgetPlan, min_n: int,
                          out: Path, draws: DrawLog, seed: int | None = None) -> Path:
    """The county and state estimates of one state, or of one group of its cells (its
    records read from every staged partition that holds them). Draws noise: never retried;
    recorded once in the release's draw log, like a chunk's estimates, and reused on resume."""
    log = get_run_logger()
    path, res = draw_once(
        draws, "levels", unit.name, out,
        lambda: estimate_levels(read_state(staged, unit.state, unit.cells), budget,
                                default_randomness(seed), min_n),
        noise_source(seed), log.info)
    if res is not None:
        _say_drawn(unit, res)
        crashpoint(f"after-estimate-levels-{unit.name.removeprefix('state-')}")
    return path


@task(name="estimate-levels", task_run_name="estimate-levels-{unit.name}", **TASK_OPTIONS)
def estimate_levels_staged(sources: list[str], unit: LevelTask, budget: BudgetPlan,
                           min_n: int, out: str, seed: int | None = None) -> str:
    """The county and state estimates of one level task on a Dask worker: its records read by
    URL from the staged partitions in ``sources``, its draw written at ``out`` (a URL under
    the staging location). Returns the sha256 of what it wrote; the flow records the draw
    (flows/worker_draws.py)."""
    res = estimate_levels(read_state(sources, unit.state, unit.cells), budget,
                          default_randomness(seed), min_n)
    _say_drawn(unit, res)
    return staging.write_parquet(res, out)


def _say_drawn(unit: LevelTask, res: pd.DataFrame) -> None:
    # the process id says where the task ran (the flow's process, or a Dask worker's)
    get_run_logger().info("%s: %d unit-cells, %s (process %d)", unit.name, len(res),
                          res["status"].value_counts().to_dict(), os.getpid())
