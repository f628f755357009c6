"""A release's durable state in its internal folder: lock, input fingerprint, persisted stages.

Every stage output is written to a temporary name and renamed into place, so a file that
exists is complete: a resumed release reuses it instead of redrawing its noise.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from dpatlas.core.files import now_utc, write_json_atomic, write_parquet_atomic
from dpatlas.release.ingest import InputError
from dpatlas.core.errors import ReleaseRefused

__all__ = ["InputChanged", "ReleaseLock", "ReleaseLocked", "check_same_input", "record_start",
           "write_parquet_atomic"]


class ReleaseLocked(RuntimeError, ReleaseRefused):
    """Another process is running this release id right now."""


class InputChanged(InputError):
    """A resumed release sees another input or config than the one it began with (an operator
    error: the operator changed it, and can restore it)."""

    def __init__(self, message: str, changed: list[str]):
        super().__init__(message)
        self.changed = changed  # "input", "config"

    @property
    def what(self) -> str:
        return " and ".join(self.changed)


class ReleaseLock:
    """An exclusive, non-blocking lock on one release id (one machine; the ledger guards more)."""

    def __init__(self, internal: Path, release_id: str):
        internal.mkdir(parents=True, exist_ok=True)
        self.path = internal / ".lock"
        self.release_id = release_id
        self._fh = None

    def __enter__(self) -> "ReleaseLock":
        self._fh = open(self.path, "a+")
        try:
            fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.seek(0)
            holder = self._fh.read().strip() or "another process"
            self._fh.close()
            raise ReleaseLocked(f"release {self.release_id} is being run by {holder}; "
                                "wait for it to finish (nothing was charged twice)") from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(f"pid {os.getpid()}")
        self._fh.flush()
        return self

    def __exit__(self, *exc) -> None:
        if self._fh:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()


def check_same_input(internal: Path, input_sha256: str, config_sha256: str) -> None:
    """A resumed release must see the same input and config as when it began
    (:class:`InputChanged` otherwise)."""
    state = internal / "state.json"
    now = {"input_sha256": input_sha256, "config_sha256": config_sha256}
    if state.exists():
        before = json.loads(state.read_text())
        changed = [k.split("_")[0] for k in now if before.get(k) != now[k]]
        if changed:
            what = " and ".join(changed)
            raise InputChanged(f"the {what} changed since release {internal.name} began; "
                               f"resume needs the same {what}: restore the original {what} to "
                               "resume it, or start a new release id", changed)
        return
    write_json_atomic(state, now)


def record_start(internal: Path) -> str:
    """When this release first began (UTC), recorded in its ``state.json`` by the first run
    and kept by every resumed one, so the manifest states the original start."""
    state = internal / "state.json"
    data = json.loads(state.read_text()) if state.exists() else {}
    if "started" not in data:
        data["started"] = now_utc()
        write_json_atomic(state, data)
    return data["started"]
