"""The budget automation: once a release leaves its dataset at 80% or more of its lifetime cap,
pause **every** deployment of that dataset, so that no scheduled or triggered release spends
more before an operator has looked.

    python -m deploy.automations install --config release.yaml   (after `prefect deploy --all`)
    python -m deploy.automations resume --config release.yaml    (after `dpatlas ledger show`)

``deploy.serve`` installs it itself once its deployments are registered. A deployment belongs
to a dataset by its tag ``dpatlas-dataset:<dataset>`` (``deploy.serve`` and ``prefect.yaml``
set it): the automation pauses each deployment so tagged when it is installed, by id (Prefect's
pause action names one deployment; ``source: inferred`` would pause only the one whose run
published). Install it again after adding a deployment. Prefect 3.8's command line has no
``prefect deployment resume``: ``resume`` here (or the toggle in the Prefect UI) undoes a pause.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from pathlib import Path
from typing import Sequence
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterTags
from prefect.events.actions import PauseDeployment
from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

from dpatlas.core.config import ConfigError, load_config
from dpatlas.release.events import BUDGET_LABEL, DATASET_LABEL, PUBLISHED

BUDGET_AUTOMATION = "dpatlas-budget-over-80-percent"


def dataset_tag(dataset: str) -> str:
    """The tag that makes a deployment one of ``dataset``'s (paused with the others)."""
    return f"dpatlas-dataset:{dataset}"


def budget_automation_name(dataset: str) -> str:
    return f"{BUDGET_AUTOMATION}-{dataset}"


def budget_automation(dataset: str, deployment_ids: Sequence[UUID]) -> AutomationCore:
    """The automation for ``dataset``: on ``dpatlas.release.published`` with the label saying
    the dataset is at 80% or more of its cap, pause each of ``deployment_ids``."""
    if not deployment_ids:
        raise ValueError(f"no deployment of dataset {dataset} to pause")
    return AutomationCore(
        name=budget_automation_name(dataset),
        description=(f"A release left dataset {dataset} with 80% or more of its lifetime "
                     "epsilon cap spent: pause every deployment of the dataset until an "
                     "operator has looked (`dpatlas ledger show`) and resumed them "
                     "(`python -m deploy.automations resume --config FILE`)."),
        enabled=True,
        trigger=EventTrigger(expect={PUBLISHED}, posture=Posture.Reactive, threshold=1,
                             within=timedelta(0),
                             match={BUDGET_LABEL: "true", DATASET_LABEL: dataset}),
        actions=[PauseDeployment(source="selected", deployment_id=d) for d in deployment_ids],
    )


def dataset_deployments(client, dataset: str) -> list:
    """Every deployment on the server tagged as ``dataset``'s."""
    return client.read_deployments(deployment_filter=DeploymentFilter(
        tags=DeploymentFilterTags(all_=[dataset_tag(dataset)])))


def install_budget_automation(dataset: str) -> tuple[UUID, list]:
    """Create (or replace) ``dataset``'s budget automation on the configured server, pausing
    every deployment tagged as the dataset's. Returns its id and those deployments."""
    with get_client(sync_client=True) as client:
        deployments = dataset_deployments(client, dataset)
        automation = budget_automation(dataset, [d.id for d in deployments])
        for old in client.read_automations_by_name(automation.name):
            client.delete_automation(old.id)
        return client.create_automation(automation), deployments


def resume_dataset_deployments(dataset: str) -> list:
    """Resume (unpause) every deployment of ``dataset``; returns the ones that were paused."""
    with get_client(sync_client=True) as client:
        paused = [d for d in dataset_deployments(client, dataset) if d.paused]
        for d in paused:
            client.resume_deployment(d.id)
    return paused


def deployment_names(deployments: list) -> str:
    return ", ".join(sorted(f"{d.name} ({d.id})" for d in deployments)) or "none"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.automations",
        description="Install the budget automation of a config's dataset, or resume the "
                    "dataset's deployments after it paused them (needs PREFECT_API_URL).")
    parser.add_argument("action", choices=("install", "resume"))
    parser.add_argument("--config", "-c", required=True, help="release configuration (YAML)")
    args = parser.parse_args(argv)

    from deploy.api import PrefectAPIUnavailable, require_api, use_api

    try:
        dataset = load_config(Path(args.config)).ledger.dataset
        url = require_api()
    except (ConfigError, PrefectAPIUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with use_api(url):
        if args.action == "resume":
            print(f"resumed: {deployment_names(resume_dataset_deployments(dataset))}")
            return 0
        try:
            automation_id, deployments = install_budget_automation(dataset)
        except ValueError as err:
            print(f"error: {err} on {url} (tag {dataset_tag(dataset)}): register the "
                  "deployments first (deploy/README.md)", file=sys.stderr)
            return 2
    print(f"automation {budget_automation_name(dataset)} ({automation_id}) pauses: "
          f"{deployment_names(deployments)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
