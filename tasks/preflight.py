"""The pre-charge checks as one Prefect task, so that a refusal shows in the Prefect UI as a
failed `preflight` task run with its message, not only as the flow's failure.

A thin wrapper: the checks are the plain functions of :mod:`dpatlas.release.preflight`. The
flow calls it twice, with what it knows at each point: before it writes anything (the id, its
paths, the noise source, the privacy unit), and again right before the charge, with the budget
plan, the public tract sizes and the parameters of every subflow called after the charge.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import pandas as pd
from prefect import task

from dpatlas.core.config import ReleaseConfig
from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.preflight import (check_before_ingest, check_before_writing,
                                       check_feasible, check_subflow_parameters)

from .common import TASK_OPTIONS


@task(name="preflight", task_run_name="preflight-{stage}", **TASK_OPTIONS)
def preflight(cfg: ReleaseConfig, release_id: str, noise_seed: Optional[int],
              stage: str = "before-writing", budget: Optional[BudgetPlan] = None,
              sizes: Optional[pd.DataFrame] = None,
              subflows: Sequence[tuple[Any, dict]] = ()) -> None:
    """Refuse (:class:`~dpatlas.release.preflight.PreflightError` and the other refusals)
    what must not be written or charged. Without ``budget`` (``stage`` "before-writing"): the
    checks that need no data. With it ("before-charge"): the plan is feasible over the public
    tract sizes ``sizes``, and each (subflow, parameters) of ``subflows`` (every subflow the
    release calls after the charge) fits the Prefect server's limit."""
    if budget is None:
        check_before_writing(cfg, release_id, noise_seed)
        check_before_ingest(cfg, release_id)  # the cap, the files, the thresholds: no data
        return
    check_feasible(cfg, budget, sizes)
    for subflow, parameters in subflows:
        check_subflow_parameters(subflow, parameters)
