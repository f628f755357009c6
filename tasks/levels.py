from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

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
        log.info("%s: %d unit-cells, %s", unit.name, len(res),
                 res["status"].value_counts().to_dict())
        crashpoint(f"after-estimate-levels-{unit.name.removeprefix('state-')}")
    return path
