"""Trigger an operator rerun of a release through the Prefect API.

``dpatlas rerun RELEASE_ID --config FILE`` calls :func:`trigger_release`. The run is executed
by the process serving the deployments (``python -m deploy.serve --config FILE``, or a worker
of a work pool), not by the caller; the caller waits for it and reports its final state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import DeploymentStatus
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from deploy.api import PrefectAPIUnavailable, require_api, use_api
from dpatlas.config import load_config

FLOW_NAME = "dpatlas-release"
OPERATOR_DEPLOYMENT = f"{FLOW_NAME}/operator-rerun"

__all__ = ["trigger_release", "TriggerError", "PrefectAPIUnavailable", "DeploymentNotRegistered",
           "DeploymentNotServed", "OPERATOR_DEPLOYMENT"]


class TriggerError(RuntimeError):
    """A rerun could not be started; the message says what to do."""


class DeploymentNotRegistered(TriggerError):
    """The Prefect server knows no ``dpatlas-release/operator-rerun`` deployment."""


class DeploymentNotServed(TriggerError):
    """The deployment is registered but no serve process or worker is polling for its runs."""


def _serve_help(config: Path) -> str:
    return (f"start serving it from the repository root, with PREFECT_API_URL set:\n"
            f"    python -m deploy.serve --config {config}\n(see deploy/README.md)")


def trigger_release(config_path: str, release_id: Optional[str], timeout: float = 600,
                    ) -> dict[str, Any]:
    """Run ``dpatlas-release/operator-rerun`` for ``config_path`` and ``release_id`` and wait up
    to ``timeout`` seconds for it to finish.

    Returns ``{"flow_run_id", "state", "result", "message"}``: ``state`` is the state type
    (``"COMPLETED"``, ``"FAILED"``, ... or a non-final one such as ``"RUNNING"`` if the timeout
    passed first: the run goes on in the serving process); ``result`` is the published folder
    (a string) when the run completed and its result could be read, else None; ``message`` is
    Prefect's state message (e.g. the error of a failed run).

    ``release_id=None`` lets the flow choose (the config's ``release_id`` or a new id).

    Raises :class:`PrefectAPIUnavailable` if ``PREFECT_API_URL`` is unset or the server does
    not answer, :class:`DeploymentNotRegistered` / :class:`DeploymentNotServed` if nothing would
    run the flow (before any run is created), and ``dpatlas.config.ConfigError`` for an invalid
    config.
    """
    config = Path(config_path).expanduser().resolve()
    cfg = load_config(config)  # fail here, not in the serving process, on a bad config
    url = require_api()
    with use_api(url):
        with get_client(sync_client=True) as client:
            try:
                deployment = client.read_deployment_by_name(OPERATOR_DEPLOYMENT)
            except ObjectNotFound:
                raise DeploymentNotRegistered(
                    f"the deployment {OPERATOR_DEPLOYMENT} is not registered on the Prefect "
                    f"server at {url}; " + _serve_help(config)) from None
        # A run created now would wait, and start whenever something polls again: refuse, a
        # release must not fire at an unexpected time. `serve` pauses its deployments when it
        # stops; the server marks them NOT_READY about a minute after the last poll (a killed
        # serve process).
        if deployment.paused or deployment.status != DeploymentStatus.READY:
            status = deployment.status.value if deployment.status else None
            why = ("paused: the serve process stopped, or it was paused" if deployment.paused
                   else f"status {status}: nothing has polled for its runs lately")
            raise DeploymentNotServed(
                f"the deployment {OPERATOR_DEPLOYMENT} is registered on {url} but is not being "
                f"served ({why}); " + _serve_help(config))

        flow_run = run_deployment(
            OPERATOR_DEPLOYMENT,
            parameters={"config_path": str(config), "release_id": release_id},
            timeout=timeout,
            poll_interval=2,
            flow_run_name=f"rerun-{release_id}" if release_id else None,
            tags=["operator-rerun"],
            as_subflow=False,
        )
        state = flow_run.state
        result = None
        if state is not None and state.is_completed():
            try:
                value = state.result(raise_on_failure=False)
                result = value if isinstance(value, str) else None
            except Exception:  # not persisted (e.g. a worker on another machine)
                result = None
            if result is None and release_id:
                # The flow publishes to <publish root>/<release id>: the same folder.
                folder = cfg.publish.root / release_id
                result = str(folder) if folder.is_dir() else None
    return {
        "flow_run_id": str(flow_run.id),
        "state": state.type.value if state is not None else None,
        "result": result,
        "message": state.message if state is not None else None,
    }
