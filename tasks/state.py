from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import task

from dpatlas.core.config import ReleaseConfig, fingerprint
from dpatlas.release.ingest import input_fingerprint
from dpatlas.release.run_state import check_same_input, record_start

from .common import TASK_OPTIONS


@dataclass(frozen=True)
class ReleaseStart:
    """What a (resumed) run of a release starts from: when it first began, and the
    fingerprints of its config and input (a resumed run must see the same)."""

    started: str
    config_sha256: str
    input_sha256: str


@task(name="open-release", **TASK_OPTIONS)
def open_release(cfg: ReleaseConfig, internal: Path) -> ReleaseStart:
    """Record (or, on resume, check) the release's input and config fingerprints and start."""
    config_sha, input_sha = fingerprint(cfg), input_fingerprint(cfg.input)
    check_same_input(internal, input_sha, config_sha)
    return ReleaseStart(record_start(internal), config_sha, input_sha)
