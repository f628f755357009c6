"""Prefect events of a release: published, refused, failed.

Automations react to these (deploy/automations.py: pause every deployment of a dataset once
it has spent 80% of its cap). The resource is the release, ``dpatlas.release.<id>``, labelled
with its dataset and whether the dataset's budget is over 80% of its cap; Prefect adds the flow
run (and its deployment) as related resources.
"""

from __future__ import annotations

from typing import Any, Optional

from prefect.events import emit_event

from dpatlas.core.errors import ReleaseRefused
from dpatlas.release.outcome import ReleaseOutcome

PUBLISHED = "dpatlas.release.published"
REFUSED = "dpatlas.release.refused"
FAILED = "dpatlas.release.failed"
BUDGET_ALERT_SHARE = 0.8  # the label below says whether spent ε ≥ this share of the cap
BUDGET_LABEL = "dpatlas.budget.over-80-percent"
DATASET_LABEL = "dpatlas.dataset"  # deploy/automations.py pauses the dataset's deployments


def _resource(release_id: str, **labels: str) -> dict[str, str]:
    return {"prefect.resource.id": f"dpatlas.release.{release_id}",
            "prefect.resource.name": release_id, **labels}


def emit_published(outcome: ReleaseOutcome) -> None:
    b = outcome.budget
    over = b.share_spent is not None and b.share_spent >= BUDGET_ALERT_SHARE
    emit_event(PUBLISHED,
               resource=_resource(outcome.release_id, **{DATASET_LABEL: b.dataset,
                                                         BUDGET_LABEL: str(over).lower()}),
               payload={"folder": outcome.folder, "by_status": outcome.by_status,
                        "epsilon_per_person": outcome.epsilon_per_person,
                        "delta_per_person": outcome.delta_per_person,
                        "spent_epsilon": b.spent_epsilon, "cap_epsilon": b.cap_epsilon,
                        "share_spent": b.share_spent})


def _refusals() -> tuple[type[BaseException], ...]:
    """Errors by which the pipeline refuses a release by its rules (a bad config or input, the
    cap, a pre-charge check, a busy id): anything else is a failure."""
    return (ReleaseRefused,)


def emit_refused_or_failed(release_id: str, error: Optional[BaseException],
                           flow_run_name: str) -> None:
    refused = isinstance(error, _refusals())
    payload: dict[str, Any] = {"flow_run": flow_run_name,
                               "error_type": type(error).__name__ if error else None,
                               "message": (str(error).splitlines() or [""])[0] if error else None}
    emit_event(REFUSED if refused else FAILED, resource=_resource(release_id), payload=payload)


def on_release_failure(flow, flow_run, state) -> None:
    """Flow hook: a failed release run emits ``refused`` or ``failed``."""
    error = state.result(raise_on_failure=False)
    rid = (flow_run.parameters or {}).get("release_id") or flow_run.name
    emit_refused_or_failed(str(rid), error if isinstance(error, BaseException) else None,
                           flow_run.name)
