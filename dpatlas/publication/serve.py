"""`dpatlas serve`: the publish root over HTTP on this machine, with range requests.

Starlette's ``StaticFiles`` serves the files (HEAD, ``ETag``/``304``, byte ranges) and uvicorn
runs it; what is ours is what may be served and which ranges are honoured. The web map reads
PMTiles archives by range: ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n`` get ``206 Partial
Content`` (RFC 9110 §14, §15.3.7); a range that starts past the end of the file gets ``416
Range Not Satisfiable`` with ``Content-Range: bytes */size``. A syntactically invalid Range, or
several ranges at once, is ignored and the whole file is sent with 200, which RFC 9110 §14.2
allows. It is for local viewing and tests, not production hosting: it binds 127.0.0.1 unless
told otherwise, serves only a publish root (dpatlas.publication.publish_root) and in it only
published files whose real path is inside the root, and never a database file.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import stat
import sys
import threading
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import FileResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from dpatlas.publication.opened_file import (OpenedFileResponse, OpenedPath, open_checked,
                                             opened_file_response)
from dpatlas.publication.publish_root import check_publish_root, unpublished_reason

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_BEYOND_ANY_FILE = 10**18
# Types the standard table lacks or gets wrong for a publish root.
_TYPES = {".pmtiles": "application/vnd.pmtiles", ".geojson": "application/geo+json",
          ".json": "application/json", ".js": "text/javascript", ".mjs": "text/javascript",
          ".atom": "application/atom+xml", ".parquet": "application/vnd.apache.parquet",
          ".csv": "text/csv"}


class ServeError(RuntimeError):
    """The server cannot start; the message says what to do."""


class Unsatisfiable(ValueError):
    """A byte range that starts beyond the end of the representation (answer 416)."""


def _position(digits: str) -> int:
    """A byte position from its digits, without converting thousands of them (Python refuses
    over 4,300 digits): any position of more than 18 digits lies past every file's end."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else _BEYOND_ANY_FILE


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive byte range ``(first, last)`` a Range header asks of a ``size``-byte file.

    None means "send the whole file": no header, a header we do not honour (another unit,
    several ranges, bad syntax, ``bytes=5-2``). Raises :class:`Unsatisfiable` when the range
    is valid but selects nothing (``first >= size``, ``bytes=-0``, or any range of an empty
    file), per RFC 9110 §14.1.1-14.1.2. ``last`` is clamped to ``size - 1``.
    """
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if first == "" and last == "":
        return None
    if first == "":                      # suffix range: the last n bytes
        length = _position(last)
        if length == 0 or size == 0:
            raise Unsatisfiable(header)
        return max(0, size - length), size - 1
    start = _position(first)
    if last != "" and _position(last) < start:
        return None                      # invalid: ignore (RFC 9110 §14.1.1)
    if start >= size:
        raise Unsatisfiable(header)
    return start, size - 1 if last == "" else min(_position(last), size - 1)


class PublishedFiles(StaticFiles):
    """The published files of one root, each with its type, a single range or none.

    ``StaticFiles`` (``follow_symlink=False``) already refuses a path whose real path is outside
    the root, through a linked file or folder or ``..``, and answers 404 to a NUL in the path;
    it never lists a folder. Ours: only published files, never a database by content."""

    def __init__(self, root: Path):
        super().__init__(directory=os.path.realpath(root), html=True)
        self._root = os.path.realpath(root)

    async def get_response(self, path: str, scope) -> Response:
        response = await super().get_response(path, scope)
        if isinstance(response, FileResponse) and not isinstance(response, OpenedFileResponse):
            # Starlette sends a root's 404.html itself, by its path: send the file looked up.
            if not isinstance(response.path, OpenedPath):
                raise HTTPException(status_code=404)
            return OpenedFileResponse(response.path, status_code=response.status_code,
                                      stat_result=response.stat_result)
        return response

    def lookup_path(self, path: str) -> tuple[str, os.stat_result | None]:
        # Every file served passes here: the one asked for, a folder's index.html, 404.html.
        full_path, stat_result = super().lookup_path(path)
        if stat_result is None or not stat.S_ISREG(stat_result.st_mode):
            return full_path, stat_result
        relative = os.path.relpath(full_path, self._root).replace(os.sep, "/")
        # A second line behind the start's check: only published files (never a database by
        # name, nor staged rows, a key or the input copied into the root since).
        if unpublished_reason(self._root, relative) is not None:
            return "", None
        # Opened once: the database check and the send read the same open file, so a file
        # swapped in at this path after the check is not what is sent (time of check = use).
        opened = open_checked(full_path)
        if opened is None:
            return "", None
        return opened, os.fstat(opened.handle.fileno())

    def file_response(self, full_path, stat_result, scope, status_code=200) -> Response:
        # Starlette would answer several ranges (multipart) and refuse with 400 what we ignore
        # (another unit, bytes=5-2, thousands of digits): hand it the one range we honour.
        headers = [(k, v) for k, v in scope["headers"] if k != b"range"]
        asked = dict(scope["headers"]).get(b"range")
        try:
            wanted = parse_range(asked.decode("latin-1") if asked else None,
                                 stat_result.st_size)
        except Unsatisfiable:
            full_path.handle.close()
            return Response(status_code=416,
                            headers={"Content-Range": f"bytes */{stat_result.st_size}"})
        if wanted is not None:
            headers.append((b"range", f"bytes={wanted[0]}-{wanted[1]}".encode()))
        scope["headers"] = headers
        response = opened_file_response(full_path, stat_result, scope, status_code,
                                        self.is_not_modified)
        media_type = _TYPES.get(Path(full_path).suffix.lower())
        if media_type is not None and response.status_code != 304:
            response.headers["Content-Type"] = media_type
        # Feed and pages change between releases; a viewer should not keep stale copies.
        response.headers["Cache-Control"] = "no-cache"
        return response


class ThreadingServer:
    """uvicorn serving the published files of ``root`` on a socket bound at construction (a
    busy port is refused before anything is printed; port 0 is known at once). The names are
    those of ``socketserver``: ``server_address``, ``serve_forever``, ``shutdown``,
    ``server_close``."""

    def __init__(self, root: Path, sock: socket.socket, *, quiet: bool):
        self.socket = sock
        self.server_address = sock.getsockname()
        app = Starlette(routes=[Mount("/", app=PublishedFiles(root))])
        # log_config=None: uvicorn leaves the process's logging alone (a release's, Prefect's).
        self._uvicorn = uvicorn.Server(uvicorn.Config(
            app, log_config=None, access_log=not quiet, lifespan="off",
            timeout_graceful_shutdown=5))
        self._stopped = threading.Event()
        if not quiet:
            _log_requests_to_stderr()

    def serve_forever(self) -> None:
        """Serve until :meth:`shutdown` or Ctrl-C (uvicorn then raises KeyboardInterrupt
        again, in the main thread, once its connections are closed)."""
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` (running in another thread) and wait until it has."""
        self._uvicorn.should_exit = True
        self._stopped.wait()

    def server_close(self) -> None:
        self.socket.close()


def _log_requests_to_stderr() -> None:
    """One line a request on stderr, as ``http.server`` printed them."""
    access = logging.getLogger("uvicorn.access")
    if not access.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        access.addHandler(handler)
        access.setLevel(logging.INFO)
        access.propagate = False


def make_server(root: Path, port: int = DEFAULT_PORT, host: str = DEFAULT_HOST, *,
                quiet: bool = False) -> ThreadingServer:
    """A bound, not yet running, server of ``root`` (port 0: any free port; read it from
    ``server.server_address``). Raises :class:`ServeError` with what to do."""
    root = Path(root)
    if not root.is_dir():
        raise ServeError(f"{root} is not a folder: pass a publish root (e.g. demo/releases)")
    if not 0 <= port <= 65535:
        raise ServeError(f"port {port} is not in 0..65535: pick another with --port")
    try:
        sock = socket.create_server((host, port))  # SO_REUSEADDR, as before
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is in use: pick another with --port") \
                from None
        if err.errno == errno.EACCES:
            raise ServeError(f"port {port} needs privileges: pick one above 1023 with --port") \
                from None
        raise ServeError(f"cannot listen on {host}:{port}: {err.strerror}: check --host and "
                         "--port") from None
    return ThreadingServer(root, sock, quiet=quiet)


def serve(root: Path, port: int = DEFAULT_PORT, host: str = DEFAULT_HOST) -> None:
    """Serve ``root`` until interrupted (Ctrl-C), printing the URL of its page. Refuses
    (:class:`~dpatlas.publication.publish_root.NotAPublishRoot`) a folder that is not a
    publish root, or one holding files that are never published."""
    if Path(root).is_dir():
        check_publish_root(root)
    server = make_server(root, port, host)
    bound_host, bound_port = server.server_address[:2]
    print(f"serving {Path(root).resolve()} at http://{bound_host}:{bound_port}/ "
          "(Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def serve_in_thread(root: Path, port: int = 0, host: str = DEFAULT_HOST,
                    ) -> tuple[ThreadingServer, str]:
    """Start a quiet server in a daemon thread (tests); returns it and its base URL. Stop it
    with ``server.shutdown(); server.server_close()``."""
    server = make_server(root, port, host, quiet=True)
    threading.Thread(target=server.serve_forever, name="dpatlas-serve", daemon=True).start()
    bound_host, bound_port = server.server_address[:2]
    return server, f"http://{bound_host}:{bound_port}/"
