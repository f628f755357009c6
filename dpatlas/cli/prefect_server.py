"""The Prefect API a command uses: a configured one, the persistent local server, or one that
lives exactly as long as the command.

`dpatlas server start` runs ``prefect server start`` in the background with its database in a
home folder (``$PREFECT_HOME``, default ``~/.dpatlas-prefect``), recording its pid and URL
there; a release uses it while it runs, so run history, artifacts and events are kept and the
printed run links stay valid (docs/operations.md).

Without ``PREFECT_API_URL`` Prefect starts a temporary ("ephemeral") server in a subprocess and
stops it from an ``atexit`` hook. A release killed with SIGKILL runs no hook, so that server
outlived every killed release (found in review: 3 of 3). Here the command starts the same
server itself, asking the kernel to kill it when its parent dies (Linux ``PR_SET_PDEATHSIG``),
so nothing outlives the command however it ends. With ``PREFECT_API_URL`` set, or the
persistent server running, that server is used (checked to answer first) and nothing is
started.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
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

    def __init__(self, url: str, wait: Callable[[], None] = lambda: None, used: str = ""):
        self.url, self._wait, self.used = url, wait, used or f"the Prefect API at {url}"

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


class PrefectAPIUnreachable(RuntimeError, OperatorError):
    """A configured Prefect API (PREFECT_API_URL, or the `dpatlas server` recorded) does not
    answer: the operator's to fix (start it, or point elsewhere), not a bug."""


_CONFIGURED_ADVICE = ("start that server, or unset PREFECT_API_URL to use the dpatlas server "
                      "(`dpatlas server start`) or a temporary one for this command")


def check_api_answers(url: str, named_by: str, timeout: float = 5.0,
                      advice: str = _CONFIGURED_ADVICE) -> None:
    """Raise :class:`PrefectAPIUnreachable`, naming ``url``, unless its health check answers."""
    try:
        with httpx.Client(timeout=timeout) as client:
            answer = client.get(f"{url.rstrip('/')}/health")
        # 401/403: it answers, and wants the credentials Prefect's own client sends (Cloud)
        if answer.status_code < 400 or answer.status_code in (401, 403):
            return
        problem = f"HTTP {answer.status_code}"
    except httpx.HTTPError as err:
        problem = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    raise PrefectAPIUnreachable(
        f"the Prefect API at {url} ({named_by}) does not answer ({problem}); {advice}")


# --- a persistent local server: `dpatlas server start|stop|status` -----------------------------

DEFAULT_HOME = Path("~/.dpatlas-prefect")
_STATE_FILE, _SERVER_LOG = "dpatlas-server.json", "dpatlas-server.log"
DEFAULT_PORT = 4200


def server_home(home: Optional[Path] = None) -> Path:
    """The persistent server's home (its SQLite database, pid and log files): ``home``, else
    ``$PREFECT_HOME``, else ``~/.dpatlas-prefect`` (deploy/README.md uses the same)."""
    chosen = home or os.environ.get("PREFECT_HOME") or DEFAULT_HOME
    return Path(chosen).expanduser().resolve()


@dataclasses.dataclass(frozen=True)
class ServerRecord:
    """What `dpatlas server start` recorded in the home: the server's process group and URL."""

    pid: int
    url: str
    home: Path

    @property
    def log(self) -> Path:
        return self.home / _SERVER_LOG

    @property
    def database(self) -> Path:
        return self.home / "prefect.db"

    def running(self) -> bool:
        return _alive(self.pid) and not _zombie(self.pid) and _runs_prefect(self.pid)


def _runs_prefect(pid: int) -> bool:
    """Whether ``pid`` still runs ``prefect server`` (after a reboot the recorded pid may be
    another program's); True where /proc cannot tell."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True
    return b"server" in args and any(Path(os.fsdecode(a)).name == "prefect" for a in args)


def _zombie(pid: int) -> bool:
    """A process that exited but was not reaped yet (its parent still runs) still has a pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _restart_advice(record: ServerRecord) -> str:
    return (f"see its log {record.log}, then `dpatlas server stop` and `dpatlas server start` "
            f"(with --home {record.home} if that is not the default)")


class ServerRecordCorrupt(RuntimeError, OperatorError):
    """The server's record in its home cannot be read, or names no process it could be."""


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 2**22  # Linux's largest


def read_server_record(home: Optional[Path] = None,
                       strict: bool = False) -> Optional[ServerRecord]:
    """The server recorded in the home, or None (never started, or stopped).

    A record that cannot be read, or whose pid could not be a server this command started (0,
    1 or negative: kill() would signal this process's group, init, or every process; above
    the kernel's largest pid), is None, or with ``strict`` a :class:`ServerRecordCorrupt`
    naming the file."""
    home = server_home(home)
    path = home / _STATE_FILE
    if strict:
        _check_home(home)
    try:
        data = json.loads(path.read_text())
        pid = data["pid"]
        if isinstance(pid, bool) or not isinstance(pid, int) or not 1 < pid <= _pid_max():
            raise ValueError(f"pid {pid!r} is no process a server could run as")
        return ServerRecord(pid, str(data["url"]), home)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as err:
        if not strict:
            return None
        raise ServerRecordCorrupt(
            f"the server record {path} is damaged ({type(err).__name__}: {err}): nothing was "
            f"signalled; stop any `prefect server` you started there by hand, then remove "
            f"{path}") from None


def _check_home(home: Path) -> None:
    """A home that exists must be a folder (a file there was a bare `[Errno 17]`)."""
    if home.exists() and not home.is_dir():
        raise ServerStartError(f"--home {home} is not a folder: give a folder for the server's "
                               "database, pid and log files")


_START_LOCK = "dpatlas-server.lock"


@contextlib.contextmanager
def _starting(home: Path) -> Iterator[None]:
    """Hold the home's start lock: of two `dpatlas server start` at once, one starts the
    server, the other is told it is starting (both reported success, and raced for the port
    and the record)."""
    import fcntl

    fd = os.open(home / _START_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ServerStartError(f"another `dpatlas server start` is starting the server in "
                                   f"{home} now: wait for it, then `dpatlas server status` "
                                   f"(with --home {home} if that is not the default)") from None
        yield
    finally:
        os.close(fd)  # releases the lock


def _port_free(port: int) -> bool:
    """Whether a server could listen on ``port``: bound as the server binds it, with
    SO_REUSEADDR (uvicorn sets it), so connections of a just-stopped server still in TIME-WAIT
    do not make the port look taken for a minute; a live listener still does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def start_server(home: Optional[Path] = None, port: int = DEFAULT_PORT,
                 timeout: float = 180.0) -> tuple[ServerRecord, bool]:
    """Start ``prefect server start`` in the background (its own session: it outlives this
    command) with its database in the home, and wait for its health check. Returns the record
    and whether it was started now (False: it was already running)."""
    home = server_home(home)
    _check_home(home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _starting(home):
        return _start_locked(home, port, timeout)


def _start_locked(home: Path, port: int, timeout: float) -> tuple[ServerRecord, bool]:
    record = read_server_record(home)
    if record is not None and record.running():
        check_api_answers(record.url, f"the dpatlas server recorded in {home}",
                          advice=_restart_advice(record))
        _point_at(home)
        return record, False
    if not _port_free(port):
        raise ServerStartError(f"port {port} on 127.0.0.1 is in use; choose another with "
                               "--port")
    url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    # The UI asks /ui-settings where the API is: without these it answers port 4200 whatever
    # --port says, and the UI of a server on another port "can't connect to Server API".
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_API_HOST="127.0.0.1", PREFECT_SERVER_API_PORT=str(port),
               PREFECT_UI_API_URL=url)
    prefect = Path(sys.executable).with_name("prefect")
    command = [str(prefect)] if prefect.exists() else [sys.executable, "-m", "prefect"]
    with open(home / _SERVER_LOG, "ab") as out:
        proc = subprocess.Popen(
            [*command, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
    record = ServerRecord(proc.pid, url, home)
    (home / _STATE_FILE).write_text(json.dumps({"pid": proc.pid, "url": url, "port": port}))
    try:
        _wait_healthy(url, proc, timeout, record.log)
    except BaseException:
        stop_server(home)
        raise
    _point_at(home)
    return record, True


# A server started with --home elsewhere: releases find it through this pointer in the default
# home (they look in $PREFECT_HOME or the default home first), without an exported PREFECT_HOME.
_POINTER_FILE = "dpatlas-server-elsewhere.json"


def _pointer_path() -> Path:
    return DEFAULT_HOME.expanduser() / _POINTER_FILE


def _point_at(home: Path) -> None:
    """Record ``home`` as the last server's home, unless it is the default one (found there)."""
    pointer = _pointer_path()
    if home == pointer.parent.resolve():
        return
    with contextlib.suppress(OSError):  # a release then uses a temporary server, as before
        pointer.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = pointer.with_name(f".{_POINTER_FILE}.{os.getpid()}")
        tmp.write_text(json.dumps({"home": str(home)}))
        os.replace(tmp, pointer)


def _forget_pointer(home: Path) -> None:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        pointer = _pointer_path()
        if Path(json.loads(pointer.read_text())["home"]) == home:
            pointer.unlink()


def running_server() -> Optional[ServerRecord]:
    """The `dpatlas server` a release uses: the one recorded in $PREFECT_HOME (or the default
    home), else the last one started with --home elsewhere; None if neither runs."""
    record = read_server_record()
    if record is not None and record.running():
        return record
    try:
        home = Path(json.loads(_pointer_path().read_text())["home"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    record = read_server_record(home)
    return record if record is not None and record.running() else None


def stop_server(home: Optional[Path] = None, grace: float = 20.0) -> Optional[ServerRecord]:
    """Stop the recorded server's process group (SIGTERM, then SIGKILL after ``grace``
    seconds) and forget it. Returns the record, or None if none was recorded."""
    home = server_home(home)
    record = read_server_record(home)
    if record is None:
        return None
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if not record.running():
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(record.pid, sig)
        deadline = time.monotonic() + wait
        while record.running() and time.monotonic() < deadline:
            time.sleep(0.2)
    (home / _STATE_FILE).unlink(missing_ok=True)
    _forget_pointer(home)
    return record


_UNFINISHED_RUN_STATES = ["PENDING", "RUNNING", "CANCELLING", "PAUSED"]


def runs_in_progress(record: ServerRecord, timeout: float = 5.0) -> Optional[list[str]]:
    """The names of the flow runs the recorded server holds as in progress (pending, running,
    cancelling, paused): stopping it stops them (a release then stops, and a rerun finishes
    it). None when the server does not answer (then there is nothing to ask)."""
    query = {"flow_runs": {"state": {"type": {"any_": _UNFINISHED_RUN_STATES}}}, "limit": 50}
    try:
        with httpx.Client(timeout=timeout) as client:
            answer = client.post(f"{record.url.rstrip('/')}/flow_runs/filter", json=query)
        answer.raise_for_status()
        return [str(run.get("name") or run.get("id")) for run in answer.json()]
    except (httpx.HTTPError, ValueError, TypeError, AttributeError):
        return None


def server_health(record: ServerRecord) -> Optional[str]:
    """None if the recorded server answers, else why not."""
    if not record.running():
        return (f"the dpatlas server recorded in {record.home} (pid {record.pid}) is no longer "
                f"running; see its log {record.log}, then `dpatlas server start`")
    try:
        check_api_answers(record.url, "dpatlas server", timeout=3.0,
                          advice=_restart_advice(record))
    except PrefectAPIUnreachable as err:
        return str(err)
    return None


@contextlib.contextmanager
def _pointing_at(url: str) -> Iterator[None]:
    """Make ``url`` the API of this process (Prefect's settings) and of its subprocesses (the
    environment: Dask workers)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        os.environ["PREFECT_API_URL"] = url
        try:
            yield
        finally:
            os.environ.pop("PREFECT_API_URL", None)


@contextlib.contextmanager
def prefect_api(log: Optional[Path] = None, timeout: float = 180.0) -> Iterator[PrefectAPI]:
    """A Prefect API for this command, in this order: ``PREFECT_API_URL`` if set; the
    persistent server of `dpatlas server start` if it runs (:func:`running_server`: its run
    history is kept);
    else a temporary local server that is started now, dies with this process, and is
    stopped on exit. :attr:`PrefectAPI.used` says which, for the operator.

    The block is entered at once; call :meth:`PrefectAPI.ready` before the first Prefect call:
    it checks that a configured API answers (an operator error naming its URL if not: before
    any data is read) or waits for the temporary server. That server's start-up is mostly its
    own imports, in another process, so whatever the block does first (load and check the
    config, import the flow and its data stack) overlaps with it instead of adding to it
    (docs/operations.md).
    """
    remove_stale_server_logs()
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        yield PrefectAPI(configured, lambda: check_api_answers(configured, "PREFECT_API_URL"),
                         used=f"the Prefect API at {configured} (PREFECT_API_URL)")
        return
    record = running_server()
    if record is not None:
        with _pointing_at(record.url):
            try:
                yield PrefectAPI(record.url, lambda: check_api_answers(
                    record.url, f"the dpatlas server recorded in {record.home}",
                    advice=_restart_advice(record)),
                    used=f"the dpatlas server at {record.url} (run history kept in "
                         f"{record.home})")
            finally:
                _drain_to_server()
        return
    with _temporary_server(log, timeout) as api:
        yield api


@contextlib.contextmanager
def _temporary_server(log: Optional[Path], timeout: float) -> Iterator[PrefectAPI]:
    """A local server started now that dies with this process (see the module's doc)."""
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
        # Prefect is imported after the server process started: that takes about a second.
        with _pointing_at(url):
            try:
                yield PrefectAPI(url, lambda: _wait_healthy(url, proc, timeout, log),
                                 used=f"a temporary Prefect server at {url}: its run history "
                                      "ends with this command (`dpatlas server start` keeps "
                                      "it)")
            finally:
                if proc.poll() is None:
                    _drain_to_server()
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
