"""Serve the release flow as two Prefect deployments.

    python -m deploy.serve --config release.yaml      (from the repository root)

- ``dpatlas-release/scheduled-release``: runs on ``schedule.cron`` (in ``schedule.timezone``)
  of the config, with parameters ``{"config_path": <absolute config path>}``; every run gets a
  new release id (keep ``release_id: null`` in a scheduled config: a fixed id is published
  once, and later runs with it are no-ops). When ``schedule.cron`` is null the deployment is
  still registered, but *without* a schedule: registering it with no schedule clears a cron
  that an earlier ``serve`` with another config left on the server, and the deployment can
  still be run by hand from the UI.
- ``dpatlas-release/operator-rerun``: no schedule; default parameters
  ``{"config_path": ..., "release_id": None}``. An operator starts it with a release id
  (``dpatlas rerun RELEASE_ID --config FILE``, i.e. :func:`deploy.trigger.trigger_release`).

Both are tagged ``dpatlas`` and ``dpatlas-dataset:<ledger.dataset>``; once they are registered,
the dataset's budget automation is installed, which pauses every deployment so tagged when a
release leaves the dataset at 80% of its cap (deploy/automations.py).

``serve`` is a long-running process: it registers both deployments with the Prefect API
(``PREFECT_API_URL``, required) and polls it for runs, executing each in a subprocess of this
machine. Stop it with Ctrl-C or SIGTERM (the schedule is then paused until it serves again).

The flow's return value (a ``dpatlas.release.outcome.ReleaseOutcome``: small and public) is persisted
as JSON in Prefect's
result storage (``$PREFECT_HOME/storage`` of this machine) so that the process that triggered
a run can read it. Task results stay in memory: every task sets ``persist_result=False``, and
the runs started here also get ``PREFECT_TASKS_DEFAULT_PERSIST_RESULT=false`` (a task would
otherwise inherit persistence from the flow). Subflows do inherit it; the one subflow returns
only paths of internal files.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from prefect import serve

from deploy.automations import budget_automation_name, dataset_tag, install_budget_automation
from deploy.schedule import cron_schedule
from dpatlas.core.config import ConfigError, load_config
from dpatlas.core.memory import RELEASE_ARENAS
from flows.release import release

FLOW_NAME = release.name  # "dpatlas-release"
SCHEDULED = "scheduled-release"
OPERATOR = "operator-rerun"
SCHEDULED_DEPLOYMENT = f"{FLOW_NAME}/{SCHEDULED}"
OPERATOR_DEPLOYMENT = f"{FLOW_NAME}/{OPERATOR}"
TAGS = ["dpatlas"]


# The release flow as deployed: its return value (the ReleaseOutcome: small and public) is
# persisted as JSON, so that a trigger in another process can read it. Module-level, because
# a served run does not use this process's flow object: the runner starts
# `python -m prefect.engine`, which re-imports the flow from the deployment's entrypoint, so
# the entrypoint must name this object (the default one would name the undecorated
# `flows/release.py:release` and lose the option).
release_with_result = release.with_options(persist_result=True, result_serializer="json")


def _entrypoint() -> str:
    """``<this file relative to the working directory>:release_with_result``; served runs
    start in the working directory of the serving process."""
    here = os.path.relpath(Path(__file__).resolve(), Path.cwd().resolve())
    return f"{here}:release_with_result"


def build_deployments(config_path: str) -> list:
    """The two runner deployments for ``config_path`` (validated now, not at the first run)."""
    path = Path(config_path).expanduser().resolve()
    cfg = load_config(path)  # ConfigError with the operator's message if invalid
    flow = release_with_result

    schedule = cron_schedule(cfg.schedule)  # ConfigError as `dpatlas config check` says
    if schedule is not None:
        if cfg.release_id:
            print(f"warning: {path} fixes release_id {cfg.release_id!r}: only the first "
                  "scheduled run publishes it, later ones do nothing", file=sys.stderr)

    tags = [*TAGS, dataset_tag(cfg.ledger.dataset)]  # the budget automation pauses by it
    scheduled = flow.to_deployment(
        SCHEDULED,
        # No cron: an empty list (not None), so that re-serving removes an old schedule.
        **({"schedule": schedule} if schedule is not None else {"schedules": []}),
        parameters={"config_path": str(path)},
        description=(f"Scheduled release of {path} "
                     + (f"({cfg.schedule.cron}, {cfg.schedule.timezone})" if schedule
                        else "(no schedule: schedule.cron is null)")),
        tags=tags,
    )
    operator = flow.to_deployment(
        OPERATOR,
        schedules=[],
        parameters={"config_path": str(path), "release_id": None},
        description=(f"Operator-triggered release or rerun of {path}: run with a release id "
                     "(`dpatlas rerun RELEASE_ID --config FILE`)."),
        tags=tags,
    )
    for deployment in (scheduled, operator):
        deployment.entrypoint = _entrypoint()
        # Served runs belong to the serving process: set (not just leave unset) the work pool
        # fields, so that re-registering clears a pool that `prefect deploy` left on these
        # names (as Prefect's Runner.add_flow does).
        deployment.work_pool_name = None
        deployment.work_queue_name = None
    return [scheduled, operator]


def _install_automation(deployments: list, dataset: str) -> None:
    """Register the deployments now (``serve`` registers them again, the same ones), then
    the budget automation that pauses every deployment of the dataset (deploy/automations.py)."""
    for deployment in deployments:
        deployment.apply()
    _, paused = install_budget_automation(dataset)
    print(f"automation {budget_automation_name(dataset)} pauses "
          f"{', '.join(sorted(d.name for d in paused))} at 80% of the cap", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.serve",
        description="Register the dpatlas release deployments and serve their runs "
                    "(needs PREFECT_API_URL pointing at a running Prefect server).")
    parser.add_argument("--config", "-c", required=True, help="release configuration (YAML)")
    parser.add_argument("--limit", type=int, default=1,
                        help="at most this many release runs at once (default 1: releases "
                             "of one config must not race for the same publish folder)")
    args = parser.parse_args(argv)

    from deploy.api import PrefectAPIUnavailable, require_api, use_api

    try:
        deployments = build_deployments(args.config)
        url = require_api()
    except (ConfigError, PrefectAPIUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    # The flow persists its return value (see release_with_result), and Prefect lets tasks
    # inherit that from their flow; tasks must keep their results in memory (confidential
    # data), so make "not persisted" their default in the runs started from here.
    os.environ.setdefault("PREFECT_TASKS_DEFAULT_PERSIST_RESULT", "false")
    # each run's process starts with two malloc arenas, as `dpatlas release` limits its own
    # (dpatlas.core.memory: glibc reads the variable at the process's start)
    os.environ.setdefault("MALLOC_ARENA_MAX", str(RELEASE_ARENAS))
    print(f"serving {', '.join(f'{FLOW_NAME}/{d.name}' for d in deployments)} "
          f"against {url}", flush=True)
    with use_api(url):
        _install_automation(deployments, load_config(Path(args.config)).ledger.dataset)
    serve(*deployments, limit=args.limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
