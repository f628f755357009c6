from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import get_run_logger, task

from dpatlas.core.config import ReleaseConfig, fingerprint
from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.draws import DrawLog
from dpatlas.release.ingest import input_fingerprint
from dpatlas.release.plan_record import plan_entry

from .common import TASK_OPTIONS


@dataclass(frozen=True)
class ReleaseStart:
    """What a (resumed) run of a release starts from: when it first began, and the
    fingerprints of its config and input (a resumed run must see the same)."""

    started: str
    config_sha256: str
    input_sha256: str


@task(name="open-release", **TASK_OPTIONS)
def open_release(cfg: ReleaseConfig, internal: Path, charged: bool = False) -> ReleaseStart:
    """Begin the release's draw log (the internal folder is named after the release id) or,
    on resume, check its config and input against the log's header. ``charged``: the ledger
    holds the release's charge, so its log must be there (never begun afresh)."""
    # a release begun before paths inside the config's folder were stated relative to it
    # (issue 31, O9) holds the absolute form: the same config still resumes it
    header = DrawLog.open(internal, internal.name, fingerprint(cfg),
                          input_fingerprint(cfg.input), say=get_run_logger().warning,
                          charged=charged,
                          earlier_config_sha256=fingerprint(cfg, relative_paths=False))
    return ReleaseStart(header["started"], header["config_sha256"], header["input_sha256"])


@task(name="record-plan", **TASK_OPTIONS)
def record_plan(internal: Path, budget: BudgetPlan, layout: dict) -> dict:
    """The plan this run charges and draws under, and how its draws are grouped into tasks
    (``plan_record.draw_layout``), in the draw log's header; a resume whose plan or layout
    differs from the one its recorded draws were made under is refused here, before the
    charge and before any noise (dpatlas.release.draws). Returns the plan entry for the
    ledger."""
    entry = plan_entry(budget)
    DrawLog(internal).settle_plan(entry, layout, say=get_run_logger().warning)
    return entry
