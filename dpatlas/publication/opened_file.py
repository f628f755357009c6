"""A file `dpatlas serve` sends from the handle it checked: opened once at lookup, checked (a
regular file, not a database by content) and sent from that same open file, never by opening
its path again. A file swapped in at the path between the check and the send (time of check,
time of use) is therefore not what is sent; the size and ETag are those of the open file.
"""

from __future__ import annotations

import os
import stat
from contextlib import asynccontextmanager
from typing import BinaryIO, Callable

import anyio
from starlette.datastructures import Headers
from starlette.responses import FileResponse, Response
from starlette.staticfiles import NotModifiedResponse

# Never served, whatever their name: a database is not a release artefact (and by name:
# publish_root.DATABASE_SUFFIXES).
SQLITE_MAGIC = b"SQLite format 3\x00"


class OpenedPath(str):
    """A looked-up path (as Starlette passes it on) with its file open: ``handle``."""

    handle: BinaryIO


def open_checked(path: str) -> OpenedPath | None:
    """``path`` opened for sending when it is a regular file that is not a SQLite database
    (checked on the open file; a last component that is a link is refused), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    handle = os.fdopen(fd, "rb")
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or \
                handle.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC:
            handle.close()
            return None
    except OSError:
        handle.close()
        return None
    opened = OpenedPath(path)
    opened.handle = handle
    return opened


class OpenedFileResponse(FileResponse):
    """Starlette's file response (ranges, HEAD, ETag) reading the handle it is given, which it
    closes once the response is sent."""

    def __init__(self, opened: OpenedPath, **kwargs):
        super().__init__(opened, **kwargs)
        self.handle = opened.handle

    async def __call__(self, scope, receive, send) -> None:
        # "pathsend" would have the server open the path itself.
        extensions = {k: v for k, v in scope.get("extensions", {}).items()
                      if k != "http.response.pathsend"}
        try:
            await super().__call__({**scope, "extensions": extensions}, receive, send)
        finally:
            self.handle.close()

    @asynccontextmanager
    async def _open_file(self):
        self.handle.seek(0)
        yield anyio.wrap_file(self.handle)


def opened_file_response(opened: OpenedPath, stat_result: os.stat_result, scope,
                         status_code: int, is_not_modified: Callable) -> Response:
    """What ``StaticFiles.file_response`` answers, sent from ``opened``'s handle."""
    response = OpenedFileResponse(opened, status_code=status_code, stat_result=stat_result)
    if is_not_modified(response.headers, Headers(scope=scope)):
        opened.handle.close()
        return NotModifiedResponse(response.headers)
    return response
