from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.crash import crashpoint
from dpatlas.release.draws import DrawLog, draw_once, noise_source
from dpatlas.release.levels import estimate_levels, read_state
from mechanisms.noise import default_randomness

from .common import TASK_OPTIONS


@task(name="estimate-levels", task_run_name="estimate-levels-{state}", **TASK_OPTIONS)
def estimate_state_levels(staged: list[Path], state: str, budget: BudgetPlan, min_n: int,
                          out: Path, draws: DrawLog, seed: int | None = None) -> Path:
    """The county and state estimates of one state (its records read from every staged
    partition). Draws noise: never retried; recorded once in the release's draw log, like a
    chunk's estimates, and reused on resume."""
    log = get_run_logger()
    path, res = draw_once(
        draws, "levels", f"state-{state}", out,
        lambda: estimate_levels(read_state(staged, state), budget, default_randomness(seed),
                                min_n),
        noise_source(seed), log.info)
    if res is not None:
        log.info("state %s: %d unit-cells, %s", state, len(res),
                 res["status"].value_counts().to_dict())
        crashpoint(f"after-estimate-levels-{state}")
    return path
