"""A release's run state in its internal folder: the lock that keeps a second run of the same
id out, and the refusal of a resume whose input or config changed.

What a resumed release reuses is decided by its draw log alone (dpatlas.release.draws), which
also holds the fingerprints and start time that ``state.json`` held before.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from dpatlas.core.files import open_private, private_folder, write_parquet_atomic
from dpatlas.release.ingest import InputError
from dpatlas.core.errors import ReleaseRefused

__all__ = ["InputChanged", "ReleaseLock", "ReleaseLocked", "write_parquet_atomic"]


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
        private_folder(internal)  # 0700: it will hold the confidential input's staged copies
        self.path = internal / ".lock"
        self.release_id = release_id
        self._fh = None

    def __enter__(self) -> "ReleaseLock":
        self._fh = os.fdopen(open_private(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND),
                             "a+")
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
