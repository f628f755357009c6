"""Atomic file writes and the clock: the two things every stage needs and none should re-invent.

A file written here is written under a temporary name in its own folder, fsync'd, and renamed
over the target with ``os.replace`` (``rename(2)``: atomic within one file system), so a reader
— or a resumed release — sees the old file or the complete new one, never half of one. That is
what lets a resumed release trust that a persisted noise draw which exists is complete.

A file written ``private=True`` (everything in a release's internal folder: staged
confidential copies, draws, reports, keys) is mode 0600 from the moment it exists, in folders
made 0700, whatever the process umask: the internal folder holds person-level records. Published
files are written without it and keep the umask's modes (they are public).

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


PRIVATE_FILE_MODE = 0o600
PRIVATE_FOLDER_MODE = 0o700


def private_folder(folder: Path) -> Path:
    """``mkdir -p folder``, every folder it makes and ``folder`` itself mode 0700 (chmod, not
    the mkdir mode, which the umask would narrow or, under umask 000, leave 0777)."""
    folder = Path(folder)
    missing = []
    for parent in (folder, *folder.parents):
        if parent.is_dir():
            break
        missing.append(parent)
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made by a concurrent writer just now
            made.mkdir(mode=PRIVATE_FOLDER_MODE)
        os.chmod(made, PRIVATE_FOLDER_MODE)
    os.chmod(folder, PRIVATE_FOLDER_MODE)
    return folder


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """``os.open`` of a file that is mode 0600 from its creation on (an existing file is
    narrowed to 0600 too); returns the descriptor."""
    fd = os.open(path, flags, PRIVATE_FILE_MODE)
    os.fchmod(fd, PRIVATE_FILE_MODE)  # the creation mode is narrowed by the umask, never widened
    return fd


def seal_private(folder: Path) -> None:
    """Narrow a tree another library wrote (Great Expectations' Data Docs) to 0700 / 0600."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    os.chmod(folder, PRIVATE_FOLDER_MODE)
    for here, folders, files in os.walk(folder):
        for name in folders:
            os.chmod(os.path.join(here, name), PRIVATE_FOLDER_MODE)
        for name in files:
            os.chmod(os.path.join(here, name), PRIVATE_FILE_MODE)


@contextlib.contextmanager
def atomic_path(path: Path, private: bool = False) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds, fsync it and rename it
    over ``path``. On an error the temporary file is removed and ``path`` is untouched.

    ``private``: the folder is made 0700 and the temporary file exists as 0600 before the block
    writes into it (writers that open by name keep an existing file's mode), and is set 0600
    again before the rename, in case the writer replaced the file."""
    path = Path(path)
    if private:
        private_folder(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        if private:
            os.close(open_private(tmp))
        yield tmp
        if private:
            os.chmod(tmp, PRIVATE_FILE_MODE)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)


def write_atomic(path: Path, write: Callable[[Path], Any], private: bool = False) -> Path:
    """Call ``write(tmp)`` and rename the result over ``path`` atomically; returns ``path``.
    ``private``: mode 0600 in a 0700 folder (see :func:`atomic_path`)."""
    with atomic_path(path, private) as tmp:
        write(tmp)
    return Path(path)


def write_bytes_atomic(path: Path, data: bytes, private: bool = False) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_bytes(data), private)


def write_json_atomic(path: Path, obj: Any, private: bool = False, **dumps: Any) -> Path:
    return write_bytes_atomic(path, (json.dumps(obj, **dumps) + "\n").encode(), private)


def write_parquet_atomic(df, path: Path, private: bool = False) -> Path:
    """A data frame as Parquet (no index), atomically."""
    return write_atomic(path, lambda tmp: df.to_parquet(tmp, index=False), private)
