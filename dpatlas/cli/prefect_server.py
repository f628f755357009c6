"""A Prefect API server that lives exactly as long as the command that needs it.

Without ``PREFECT_API_URL`` Prefect starts a temporary ("ephemeral") server in a subprocess and
stops it from an ``atexit`` hook. A release killed with SIGKILL runs no hook, so that server
outlived every killed release (found in review: 3 of 3). Here the command starts the same
server itself, asking the kernel to kill it when its parent dies (Linux ``PR_SET_PDEATHSIG``),
so nothing outlives the command however it ends. With ``PREFECT_API_URL`` set, that server is
used and nothing is started.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx

from dpatlas.core.errors import OperatorError

_PR_SET_PDEATHSIG = 1


class ServerStartError(RuntimeError, OperatorError):
    """The local Prefect server did not come up."""


def _die_with(parent_pid: int):
    """preexec_fn: SIGKILL this child when the parent dies (also if it already has)."""

    def set_death_signal() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # the parent died between fork and prctl
            os._exit(1)

    return set_death_signal


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ServerStartError(f"the local Prefect server exited with code "
                                       f"{proc.returncode}; see {log}")
            try:
                if client.get(f"{url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    raise ServerStartError(f"the local Prefect server did not answer within {timeout:.0f} s; "
                           f"see {log}")


def _drain_to_server() -> None:
    """Send queued logs and events while the server still listens (else they fail at exit)."""
    from prefect._internal.concurrency.services import QueueService

    with contextlib.suppress(Exception):
        QueueService.drain_all(timeout=10)


class PrefectAPI:
    """A Prefect API being made available: ``url`` at once, :meth:`ready` before the first call."""

    def __init__(self, url: str, wait: Callable[[], None] = lambda: None):
        self.url, self._wait = url, wait

    def ready(self) -> str:
        """Block until the API answers (the local server has started); returns its URL."""
        self._wait()
        return self.url


_LOG_PREFIX, _LOG_SUFFIX = "dpatlas-prefect-server-", ".log"


def default_server_log() -> Path:
    """Where the command's own server logs (kept only if it wrote something)."""
    return Path(tempfile.gettempdir()) / f"{_LOG_PREFIX}{os.getpid()}{_LOG_SUFFIX}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. EPERM: another user's process, alive
        return True
    return True


def remove_stale_server_logs(folder: Optional[Path] = None) -> None:
    """Remove the empty server logs of commands that died without cleaning up (SIGKILL runs
    no exit code). A log with something in it is kept for the operator; so is the log of a
    command still running."""
    folder = Path(folder or tempfile.gettempdir())
    for log in folder.glob(f"{_LOG_PREFIX}*{_LOG_SUFFIX}"):
        pid = log.name[len(_LOG_PREFIX):-len(_LOG_SUFFIX)]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            if log.stat().st_size == 0:
                log.unlink()


@contextlib.contextmanager
def prefect_api(log: Optional[Path] = None, timeout: float = 180.0) -> Iterator[PrefectAPI]:
    """A Prefect API for this command: ``PREFECT_API_URL`` if set, else a local server that is
    started now, dies with this process, and is stopped on exit.

    The server process is started and the block entered at once; call :meth:`PrefectAPI.ready`
    before the first Prefect call. The server's start-up is mostly its own imports, in another
    process, so whatever the block does first (load and check the config, import the flow and
    its data stack) overlaps with it instead of adding to it (docs/operations.md).
    """
    remove_stale_server_logs()
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        yield PrefectAPI(configured)
        return
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = log or default_server_log()
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
             "--log-level", "error", "--lifespan", "on"],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with(os.getpid()))
    try:
        # Imported after the server process started: importing Prefect takes about a second.
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: url}):
            os.environ["PREFECT_API_URL"] = url  # for subprocesses (Dask workers)
            try:
                yield PrefectAPI(url, lambda: _wait_healthy(url, proc, timeout, log))
            finally:
                if proc.poll() is None:
                    _drain_to_server()
                os.environ.pop("PREFECT_API_URL", None)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            if log.stat().st_size == 0:
                log.unlink()
