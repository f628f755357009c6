"""Atomic file writes and the clock: the two things every stage needs and none should re-invent.

A file written here is written under a temporary name in its own folder, fsync'd, and renamed
over the target with ``os.replace`` (``rename(2)``: atomic within one file system), so a reader
— or a resumed release — sees the old file or the complete new one, never half of one. That is
what lets a resumed release trust that a persisted noise draw which exists is complete.

Times are UTC ISO 8601 strings from one function, so manifests, state files and reports agree.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator


def now_utc(timespec: str = "seconds") -> str:
    """The current UTC time as ISO 8601 (``2026-11-22T08:43:46+00:00``)."""
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable; some file systems refuse fsync on a folder."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, fsync it and rename it
    over ``path``. On an error the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)


def write_atomic(path: Path, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp)`` and rename the result over ``path`` atomically; returns ``path``."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_bytes(data))


def write_json_atomic(path: Path, obj: Any, **dumps: Any) -> Path:
    return write_bytes_atomic(path, (json.dumps(obj, **dumps) + "\n").encode())


def write_parquet_atomic(df, path: Path) -> Path:
    """A data frame as Parquet (no index), atomically."""
    return write_atomic(path, lambda tmp: df.to_parquet(tmp, index=False))
