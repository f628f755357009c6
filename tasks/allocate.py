from __future__ import annotations

from prefect import get_run_logger, task

from dpatlas.release.allocate import BudgetPlan, plan
from dpatlas.release.thresholds import resolve_threshold
from dpatlas.core.config import ReleaseConfig

from .common import TASK_OPTIONS


@task(name="allocate", **TASK_OPTIONS)
def allocate_budget(cfg: ReleaseConfig) -> BudgetPlan:
    budget = plan(cfg, resolve_threshold(cfg.selection))
    log = get_run_logger()
    for step in budget.steps:
        log.info("budget step %-32s %s", step.name, step.guarantee.describe())
        for label, noise in step.noise:
            log.info("    %s: %s", label, "; ".join(
                f"{ns.name} {ns.mechanism} {ns.parameters}"
                + (f" x{ns.repeat}" if ns.repeat > 1 else "") for ns in noise))
    log.info("per tract and cell: %s", budget.per_tract().describe())
    return budget
