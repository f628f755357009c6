"""The release's report in Prefect: its typed outcome, a markdown summary and a table artifact."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import quote

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from dpatlas.core.config import LedgerConfig
from dpatlas.ledger import Ledger
from dpatlas.release.events import emit_published
from dpatlas.release.outcome import BudgetState, ReleaseOutcome

from .common import TASK_OPTIONS

SUMMARY_KEY = "dpatlas-release-summary"  # artifact keys: lowercase letters, digits, dashes
MECHANISMS_KEY = "dpatlas-release-mechanisms"


def outcome_from_manifest(folder: Path, status: str, budget: BudgetState) -> ReleaseOutcome:
    manifest = json.loads((folder / "manifest.json").read_text())
    total = manifest["total_per_person"]
    return ReleaseOutcome(
        release_id=manifest["release_id"], status=status, folder=str(folder),
        published_at=manifest["published"], by_status=manifest["counts"]["by_status"],
        by_mechanism=manifest["counts"]["by_mechanism"], epsilon_per_person=total["epsilon"],
        delta_per_person=total["delta"], rho_per_person=total.get("rho"),
        files=sorted(manifest["files"]) + ["manifest.json"], budget=budget)


def budget_state(cfg: LedgerConfig) -> BudgetState:
    spent = Ledger(cfg.url, create=False).spent(cfg.dataset)
    return BudgetState(dataset=cfg.dataset, spent_epsilon=spent["epsilon"],
                       spent_delta=spent["delta"], cap_epsilon=spent["cap_epsilon"],
                       cap_delta=spent["cap_delta"])


def release_links(o: ReleaseOutcome, base_url: str | None) -> list[tuple[str, str]]:
    """Each file's absolute link under the publish root's ``base_url`` (publish.base_url); none
    without one: a link relative to the root 404s in the Prefect UI, and a path of the
    machine that ran the release must not be shown."""
    if not base_url:
        return []
    return [(name, f"{base_url}{quote(o.release_id)}/{quote(name)}") for name in o.files]


def summary_markdown(o: ReleaseOutcome, base_url: str | None = None) -> str:
    b = o.budget
    cap = "no cap" if b.cap_epsilon is None else f"{b.cap_epsilon:g}"
    left = "-" if b.left_epsilon is None else f"{b.left_epsilon:.4g}"
    share = "-" if b.share_spent is None else f"{b.share_spent:.0%}"
    rows = "\n".join(f"| {status} | {n:,} |" for status, n in sorted(o.by_status.items()))
    links = release_links(o, base_url)
    if links:
        files = "\n".join(f"- [{name}]({link})" for name, link in links)
        where = f"at {base_url}{quote(o.release_id)}/"
    else:
        files = "\n".join(f"- `{name}`" for name in o.files)
        where = (f"in folder `{o.release_id}/` of the publish root (open it there, or "
                 "`dpatlas serve` the root; `publish.base_url` makes these links)")
    what = ("Published by this run" if o.charged
            else "Already published earlier: nothing new published, nothing charged")
    return f"""# Release {o.release_id}

{what}, {where} ({o.published_at}).

| tracts | count |
| --- | --- |
{rows}

**Per person:** ε = {o.epsilon_per_person:.4g}, δ = {o.delta_per_person:.3g}\
{f", ρ = {o.rho_per_person:.4g}" if o.rho_per_person else ""}

**Ledger, dataset `{b.dataset}`:** ε spent {b.spent_epsilon:.4g} of {cap} ({share}), left {left}

## Files

{files}
"""


@task(name="report", **TASK_OPTIONS)
def report_release(ledger: LedgerConfig, folder: Path, status: str,
                   base_url: str | None = None) -> ReleaseOutcome:
    """The run's outcome, shown in Prefect as a summary and a per-mechanism table; a newly
    published release also emits ``dpatlas.release.published``. ``base_url``: where the
    publish root is served (its files are linked under it)."""
    outcome = outcome_from_manifest(folder, status, budget_state(ledger))
    create_markdown_artifact(summary_markdown(outcome, base_url), key=SUMMARY_KEY,
                             description=f"release {outcome.release_id}")
    create_table_artifact([{"mechanism": m, "tract-cells": n}
                           for m, n in sorted(outcome.by_mechanism.items())],
                          key=MECHANISMS_KEY,
                          description=f"release {outcome.release_id}: tract-cells per mechanism")
    if outcome.charged:
        emit_published(outcome)
    return outcome
