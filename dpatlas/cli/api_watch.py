"""Watch the Prefect API a release runs against, and stop the release at once when the server
goes away (killed, or `dpatlas server stop` during the run).

Without it a release whose server died hung for 2.5 to 5 minutes in the Prefect client's
retries, then failed as an internal error (``ConnectError``), exit 1. The release is made to
survive being stopped anywhere (a draw is recorded before anything reads it, the charge is
taken once, a rerun of the id finishes it), so the watch stops this process, as a crash would,
once the server has refused connections for ``gone_after`` seconds, after saying so.

Only a refused connection counts: a server that is slow to answer (a release keeping both
cores busy) is not gone.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
import threading
import time
from typing import Callable, Iterator

import httpx

GONE_AFTER = 10.0  # seconds of refused connections before the server counts as gone
POLL_EVERY = 2.0


@functools.lru_cache(maxsize=1)
def _tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once: building it loads the CA bundle (~20 ms of
    CPU), which a client made per poll did every 2 s for the whole release
    (docs/measurements/national-cost.md)."""
    return httpx.create_ssl_context()


def server_refuses(url: str, timeout: float = 3.0) -> bool:
    """Whether the API's health check is refused now (True), rather than answered or slow."""
    try:
        with httpx.Client(timeout=timeout, verify=_tls_context()) as client:
            client.get(f"{url.rstrip('/')}/health")
    except httpx.ConnectError:
        return True
    except httpx.HTTPError:  # slow or odd, but there
        return False
    return False


class ApiWatch:
    """A daemon thread polling ``url``; ``on_gone(seconds)`` is called once when it has refused
    connections for ``gone_after`` seconds in a row (by then the release cannot go on)."""

    def __init__(self, url: str, on_gone: Callable[[float], None],
                 gone_after: float = GONE_AFTER, every: float = POLL_EVERY,
                 refuses: Callable[[str], bool] = server_refuses):
        self.url, self.on_gone, self.gone_after, self.every = url, on_gone, gone_after, every
        self._refuses = refuses
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dpatlas-api-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        since = None
        while not self._stop.wait(self.every):
            if not self._refuses(self.url):
                since = None
                continue
            now = time.monotonic()
            since = now if since is None else since
            if now - since >= self.gone_after and not self._stop.is_set():
                self.on_gone(now - since)
                return


@contextlib.contextmanager
def watching_api(url: str, on_gone: Callable[[float], None], **options) -> Iterator[ApiWatch]:
    """Watch ``url`` for the ``with`` body (see :class:`ApiWatch`)."""
    watch = ApiWatch(url, on_gone, **options)
    watch.start()
    try:
        yield watch
    finally:
        watch.stop()
