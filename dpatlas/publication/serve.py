"""`dpatlas serve`: the publish root over HTTP on this machine, with range requests.

The web map reads PMTiles archives with HTTP range requests; Python's ``http.server`` answers
every request with the whole file. This server answers a single byte range with
``206 Partial Content`` (RFC 9110 §14, §15.3.7): ``bytes=a-b``, ``bytes=a-`` (from a to the
end) and ``bytes=-n`` (the last n bytes); a range that starts past the end of the file gets
``416 Range Not Satisfiable`` with ``Content-Range: bytes */size``. A syntactically invalid
Range, or several ranges at once, is ignored and the whole file is sent with 200, which
RFC 9110 §14.2 allows. It is for local viewing and tests, not production hosting: it binds
127.0.0.1 unless told otherwise, serves only a publish root (dpatlas.publication.publish_root)
and in it only published files whose real path is inside the root, and never a database file.
"""

from __future__ import annotations

import errno
import http.server
import os
import re
import shutil
import socketserver
import sys
import threading
from functools import partial
from http import HTTPStatus
from pathlib import Path

from dpatlas.publication.publish_root import check_publish_root, unpublished_reason

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_BEYOND_ANY_FILE = 10**18
# Never served, whatever their name: a database is not a release artefact (and by name:
# publish_root.DATABASE_SUFFIXES).
_SQLITE_MAGIC = b"SQLite format 3\x00"
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


class RangeRequestHandler(http.server.SimpleHTTPRequestHandler):
    """Static files of one folder, with single byte ranges, HEAD, and nothing outside it."""

    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, **_TYPES}
    protocol_version = "HTTP/1.1"        # keep-alive: the map makes many small requests

    def __init__(self, *args, directory: str, quiet: bool = False, **kwargs):
        self._quiet = quiet
        self._root = os.path.realpath(directory)
        super().__init__(*args, directory=directory, **kwargs)

    def end_headers(self):
        self.send_header("Accept-Ranges", "bytes")
        # Feed and pages change between releases; a viewer should not keep stale copies.
        self.send_header("Cache-Control", "no-cache")
        super().end_headers()

    def _inside_root(self, url_path: str) -> str | None:
        """The real path a request names, or None if it lies outside the root (through a
        symbolic link to a file or a folder, or ``..``) or cannot name a file at all (a NUL).
        One check for files and folders: a linked folder must not expose what it points to."""
        path = self.translate_path(url_path)
        if "\x00" in path:
            return None
        real = os.path.realpath(path)
        if os.path.commonpath([real, self._root]) != self._root:
            return None
        return real

    def _index(self, folder: str) -> str | None:
        """The index page of a folder asked for as ``folder/``, as a request path (None: no
        index, or asked for without the slash, which the base class redirects)."""
        request = self.path.split("?", 1)[0].split("#", 1)[0]
        if not request.endswith("/"):
            return None
        for name in ("index.html", "index.htm"):
            if os.path.isfile(os.path.join(folder, name)):
                return request + name
        return None

    def send_head(self):
        self._remaining = None           # per request: a connection is reused (keep-alive)
        real = self._inside_root(self.path)
        if real is None:
            # A symbolic link in the root (e.g. a hand-made one) must not expose other files;
            # the feed's own `latest` link points inside the root and passes.
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        if os.path.isdir(real):
            index = self._index(real)
            if index is None:
                return super().send_head()  # redirect to "dir/", or no listing (404)
            real = self._inside_root(index)  # the index file itself may be a link out
            if real is None:
                self.send_error(HTTPStatus.NOT_FOUND, "File not found")
                return None
        if unpublished_reason(self._root, os.path.relpath(real, self._root)
                              .replace(os.sep, "/")) is not None:
            # a second line behind the start's check: only published files (never a database
            # by name, nor staged rows, a key or the input copied into the root since)
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        try:
            handle = open(real, "rb")
        except OSError:
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        if handle.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC:
            handle.close()
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        try:
            size = os.fstat(handle.fileno()).st_size
            try:
                wanted = parse_range(self.headers.get("Range"), size)
            except Unsatisfiable:
                handle.close()
                self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            first, last = wanted if wanted is not None else (0, size - 1)
            if wanted is None:
                self.send_response(HTTPStatus.OK)
            else:
                self.send_response(HTTPStatus.PARTIAL_CONTENT)
                self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Type", self.guess_type(real))
            self.send_header("Content-Length", str(max(0, last - first + 1)))
            self.send_header("Last-Modified",
                             self.date_time_string(int(os.fstat(handle.fileno()).st_mtime)))
            self.end_headers()
            handle.seek(first)
            self._remaining = max(0, last - first + 1)
            return handle
        except BaseException:
            handle.close()
            raise

    def copyfile(self, source, outputfile):
        """Send only the selected bytes (``send_head`` left the file at the range's start)."""
        remaining = self._remaining
        if remaining is None:            # a listing or index produced by the base class
            shutil.copyfileobj(source, outputfile)
            return
        while remaining > 0:
            chunk = source.read(min(64 * 1024, remaining))
            if not chunk:
                break
            outputfile.write(chunk)
            remaining -= len(chunk)
        self._remaining = None

    def list_directory(self, path):
        # No listings: a publish root is read through its pages, feed and manifests.
        self.send_error(HTTPStatus.NOT_FOUND, "No index here")
        return None

    def log_message(self, format, *args):
        if not self._quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")


class ThreadingServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True                # a hung client never keeps the process alive
    allow_reuse_address = True


def make_server(root: Path, port: int = DEFAULT_PORT, host: str = DEFAULT_HOST, *,
                quiet: bool = False) -> ThreadingServer:
    """A bound, not yet running, server of ``root`` (port 0: any free port; read it from
    ``server.server_address``). Raises :class:`ServeError` with what to do."""
    root = Path(root)
    if not root.is_dir():
        raise ServeError(f"{root} is not a folder: pass a publish root (e.g. demo/releases)")
    if not 0 <= port <= 65535:
        raise ServeError(f"port {port} is not in 0..65535: pick another with --port")
    handler = partial(RangeRequestHandler, directory=str(root), quiet=quiet)
    try:
        return ThreadingServer((host, port), handler)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is in use: pick another with --port") \
                from None
        if err.errno == errno.EACCES:
            raise ServeError(f"port {port} needs privileges: pick one above 1023 with --port") \
                from None
        raise ServeError(f"cannot listen on {host}:{port}: {err.strerror}: check --host and "
                         "--port") from None


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
