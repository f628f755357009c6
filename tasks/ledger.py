from __future__ import annotations

import os
from pathlib import Path

from prefect import get_run_logger, task

from dpatlas.release.allocate import BudgetPlan
from dpatlas.core.config import LedgerConfig
from dpatlas.core.hashing import sha256_file
from dpatlas.ledger import Ledger, LedgerError, charges, display_text

from .common import TASK_OPTIONS

# How long a release's lease in the ledger lasts without renewal. The run renews it every
# third of this; another host may take an in-progress release over only after it expires.
LEASE_SECONDS = 60.0


@task(name="ledger-charge", **TASK_OPTIONS)
def charge_release(cfg: LedgerConfig, release_id: str, budget: BudgetPlan, cells: list[str],
                   config_sha256: str, owner: str, plan: dict | None = None) -> str:
    """Record the release's charges and take its lease before any noise is drawn.

    Refused over the ledger's lifetime cap, when the ledger has no cap, when the config states
    a cap other than the ledger's, or while another owner holds the release's lease; on resume,
    when ``plan`` (``plan_record.plan_entry``) is not the plan it was charged under.
    """
    ledger = Ledger(cfg.url)
    expected = None
    if cfg.cap_epsilon is not None or cfg.cap_delta is not None:
        expected = (cfg.cap_epsilon, cfg.cap_delta)
    status = ledger.begin_release(release_id, cfg.dataset, charges(budget, cells),
                                  config_sha256, owner, lease_seconds=LEASE_SECONDS,
                                  expected_cap=expected, plan=plan)
    spent = ledger.spent(cfg.dataset)
    get_run_logger().info("ledger: release %s is %s; dataset %s has spent eps=%.4g of %.4g",
                          release_id, status, cfg.dataset, spent["epsilon"], spent["cap_epsilon"])
    return status


@task(name="ledger-status", **TASK_OPTIONS)
def release_status(cfg: LedgerConfig, release_id: str, published_folder: Path) -> str | None:
    """The release's status in the ledger (None: not there). A folder at the release's path
    that the ledger does not know means the wrong ledger, and a withdrawn id can never run
    again: both refused before anything is done (no input read)."""
    ledger = Ledger(cfg.url)
    entry = ledger.release(release_id)
    if os.path.lexists(published_folder) and not entry:
        raise FileExistsError(f"{published_folder} exists but the ledger at {ledger.url} has "
                              f"no release {release_id}: is this the right ledger?")
    if entry and entry["status"] == "withdrawn":
        raise LedgerError(f"release {release_id} was withdrawn ({display_text(entry['reason'])})"
                          f" in the ledger at {ledger.url}: its budget stays spent and it can "
                          "never be run or published again; use a new release id (nothing "
                          "was read or charged)")
    return entry["status"] if entry else None


@task(name="ledger-complete", **TASK_OPTIONS)
def complete_release(cfg: LedgerConfig, release_id: str, folder: Path, owner: str) -> None:
    """Mark the release published in the ledger with its manifest's sha256 (idempotent; the
    lease owner only)."""
    Ledger(cfg.url).complete_release(release_id, sha256_file(folder / "manifest.json"), owner)
