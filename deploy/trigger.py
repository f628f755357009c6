"""Trigger an operator rerun of a release through the Prefect API.

``dpatlas rerun RELEASE_ID --config FILE`` calls :func:`trigger_release`. The run is executed
by the process serving the deployments (``python -m deploy.serve --config FILE``, or a worker
of a work pool), not by the caller; the caller waits for it and reports its final state.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from prefect.client.orchestration import get_client
from pydantic import ValidationError
from prefect.client.schemas.objects import DeploymentStatus
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from deploy.api import PrefectAPIUnavailable, require_api, use_api
from dpatlas.core.config import load_config
from dpatlas.release.outcome import ReleaseOutcome

FLOW_NAME = "dpatlas-release"
OPERATOR_DEPLOYMENT = f"{FLOW_NAME}/operator-rerun"

__all__ = ["trigger_release", "TriggeredRun", "TriggerError", "PrefectAPIUnavailable",
           "DeploymentNotRegistered",
           "DeploymentNotServed", "OPERATOR_DEPLOYMENT"]


class TriggerError(RuntimeError):
    """A rerun could not be started; the message says what to do."""


class DeploymentNotRegistered(TriggerError):
    """The Prefect server knows no ``dpatlas-release/operator-rerun`` deployment."""


class DeploymentNotServed(TriggerError):
    """The deployment is registered but no serve process or worker is polling for its runs."""


@dataclass(frozen=True)
class TriggeredRun:
    """A triggered run as the caller saw it: its final state type (``COMPLETED``, ``FAILED``,
    ... or a non-final one such as ``RUNNING`` if the timeout passed first: the run goes on in
    the serving process), Prefect's state message, and the flow's outcome when it completed
    and its persisted result could be read (else None)."""

    flow_run_id: str
    flow_run_name: str
    state: Optional[str]
    message: Optional[str]
    outcome: Optional[ReleaseOutcome]


def _serve_help(config: Path) -> str:
    return ("start serving it from the repository root, with PREFECT_API_URL set: "
            f"`python -m deploy.serve --config {config}` (deploy/README.md)")


def _resume_help(config: Path) -> str:
    return (f"check the budget (`dpatlas ledger show -c {config}`), then resume the dataset's "
            f"deployments: `python -m deploy.automations resume --config {config}` (or each "
            "one's pause toggle in the Prefect UI; Prefect 3.8 has no `prefect deployment "
            "resume`)")


def not_served_advice(deployment, config: Path) -> str:
    """Why the operator deployment would not run a run created now, and what starts it, for
    the setup it is registered by: ``deploy.serve`` (no work pool) or a worker of its pool."""
    status = deployment.status.value if deployment.status else None
    pool = deployment.work_pool_name
    if pool:
        if deployment.paused:
            return ("it is paused, by the budget automation or by hand (a work pool's "
                    f"deployments are never paused by their workers); {_resume_help(config)}")
        return (f"status {status}: no worker of work pool {pool} has polled for its runs "
                "lately; start one from the repository root: "
                f"`prefect worker start --pool {pool}` (deploy/README.md)")
    if deployment.paused:
        return ("it is paused: the serve process stopped (stopping pauses its deployments), "
                "or the budget automation or someone paused it. If `python -m deploy.serve "
                f"--config {config}` is not running, {_serve_help(config)}; serving resumes "
                f"its deployments, so check the budget first. If it is running, "
                + _resume_help(config))
    return (f"status {status}: nothing has polled for its runs lately (the serve process "
            f"died?); {_serve_help(config)}")


def trigger_release(config_path: str, release_id: Optional[str], timeout: float = 600,
                    ) -> TriggeredRun:
    """Run ``dpatlas-release/operator-rerun`` for ``config_path`` and ``release_id`` and wait up
    to ``timeout`` seconds for it to finish.

    Returns a :class:`TriggeredRun`.

    ``release_id=None`` lets the flow choose (the config's ``release_id`` or a new id).

    Raises :class:`PrefectAPIUnavailable` if ``PREFECT_API_URL`` is unset or the server does
    not answer, :class:`DeploymentNotRegistered` / :class:`DeploymentNotServed` if nothing would
    run the flow (before any run is created), and ``dpatlas.core.config.ConfigError`` for an invalid
    config.
    """
    config = Path(config_path).expanduser().resolve()
    load_config(config)  # fail here, not in the serving process, on a bad config
    url = require_api()
    with use_api(url):
        with get_client(sync_client=True) as client:
            try:
                deployment = client.read_deployment_by_name(OPERATOR_DEPLOYMENT)
            except ObjectNotFound:
                raise DeploymentNotRegistered(
                    f"the deployment {OPERATOR_DEPLOYMENT} is not registered on the Prefect "
                    f"server at {url}; " + _serve_help(config) + "; or, with a work pool "
                    "and workers, `prefect deploy --all`") from None
        # A run created now would wait, and start whenever something polls again: refuse, a
        # release must not fire at an unexpected time. `serve` pauses its deployments when it
        # stops; the server marks them NOT_READY about a minute after the last poll (a killed
        # serve process).
        if deployment.paused or deployment.status != DeploymentStatus.READY:
            raise DeploymentNotServed(
                f"the deployment {OPERATOR_DEPLOYMENT} is registered on {url} but will not "
                f"run now: {not_served_advice(deployment, config)}")

        flow_run = run_deployment(
            OPERATOR_DEPLOYMENT,
            parameters={"config_path": str(config), "release_id": release_id},
            timeout=timeout,
            poll_interval=2,
            tags=["operator-rerun"],
            as_subflow=False,
        )
    state = flow_run.state
    return TriggeredRun(flow_run_id=str(flow_run.id), flow_run_name=flow_run.name,
                        state=state.type.value if state is not None else None,
                        message=state.message if state is not None else None,
                        outcome=_outcome(state))


def _outcome(state) -> Optional[ReleaseOutcome]:
    """The completed run's persisted result (JSON in the serving machine's result storage):
    Prefect stores the model as its JSON fields, so it is validated back into the model."""
    if state is None or not state.is_completed():
        return None
    try:
        value = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - not persisted, or stored on another machine
        return None
    if isinstance(value, ReleaseOutcome):
        return value
    try:
        return ReleaseOutcome.model_validate(value)
    except ValidationError:  # an older flow's result (the folder as a string)
        return None
