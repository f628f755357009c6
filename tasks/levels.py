from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from prefect import get_run_logger, task

from dpatlas.release import staging
from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.crash import crashpoint
from dpatlas.release.draws import DrawLog
from dpatlas.release.levels import LevelTask, draw_levels
from dpatlas.release.task_groups import group_label

from .common import TASK_OPTIONS
from .draws import draw_computed


def _group_run_name() -> str:
    from prefect.runtime import task_run

    return "estimate-levels-" + group_label([u.name for u in task_run.parameters["units"]])


@task(name="estimate-levels", task_run_name=_group_run_name, **TASK_OPTIONS)
def estimate_state_levels(sources: list[list[Path]], units: list[LevelTask], budget: BudgetPlan,
                          min_n: int, internal: Path, draws: DrawLog,
                          seeds: list[int | None]) -> list[Path]:
    """The county and state estimates of each of ``units`` in turn (a state, or one group of
    its cells; unit k's records read from every staged partition in ``sources[k]``). One task
    run for a run of consecutive units (:mod:`dpatlas.release.task_groups`). Draws noise:
    never retried; each unit recorded once in the release's draw log under its own name, like
    a chunk's estimates, and reused on resume."""
    log = get_run_logger()
    paths = []
    for staged, unit, seed in zip(sources, units, seeds):
        path, res = draw_computed(draws, "levels", unit.name, internal, seed, log,
                                  draw_levels, staged, unit, budget, seed, min_n)
        if res is not None:
            _say_drawn(unit, res)
            crashpoint(f"after-estimate-levels-{unit.name.removeprefix('state-')}")
        paths.append(path)
    return paths


@task(name="estimate-levels", task_run_name="estimate-levels-{unit.name}", **TASK_OPTIONS)
def estimate_levels_staged(sources: list[str], unit: LevelTask, budget: BudgetPlan,
                           min_n: int, out: str, seed: int | None = None) -> str:
    """The county and state estimates of one level task on a Dask worker: its records read by
    URL from the staged partitions in ``sources``, its draw written at ``out`` (a URL under
    the staging location). Returns the sha256 of what it wrote; the flow records the draw
    (flows/worker_draws.py)."""
    res = draw_levels(sources, unit, budget, seed, min_n)
    _say_drawn(unit, res)
    return staging.write_parquet(res, out)


def _say_drawn(unit: LevelTask, res: pd.DataFrame) -> None:
    # the process id says where the task ran (the flow's process, or a Dask worker's)
    get_run_logger().info("%s: %d unit-cells, %s (process %d)", unit.name, len(res),
                          res["status"].value_counts().to_dict(), os.getpid())
