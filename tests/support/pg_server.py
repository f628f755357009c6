"""A throwaway PostgreSQL server for the tests: found (or installed), started, cleaned up.

    with postgres_server() as server:
        url = server.url                        # postgresql+psycopg://postgres:...@127.0.0.1:PORT/dpatlas_test
        other = server.create_database("x")     # a fresh database, its URL

What it does:
- finds the server binaries (``initdb``, ``pg_ctl``, ``postgres``): $DPATLAS_PG_BINDIR, then
  /usr/lib/postgresql/<version>/bin (newest first), then ``pg_config --bindir``, then $PATH;
- if there are none and we are root with apt-get (a fresh CI machine), installs Debian's
  ``postgresql`` package (``apt-get update && apt-get install -y postgresql``), timed, under a
  file lock so parallel test workers install once; $DPATLAS_PG_NO_INSTALL=1 forbids it;
- PostgreSQL refuses to run as root: as root, the server runs as the ``postgres`` system user
  (created with ``useradd`` if missing); as anyone else, as that user;
- ``initdb`` into a fresh temporary directory owned by that user, a random superuser password
  (scram-sha-256 over TCP), listening on 127.0.0.1 only, on a free port, with its unix socket
  inside the temporary directory; durability off (fsync, synchronous_commit) for speed;
- stops the server (``pg_ctl stop -m fast``) and deletes the directory at exit.

Anything that prevents this raises :class:`PostgresUnavailable` with the reason.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

SERVER_USER = "postgres"
INSTALL_LOCK = Path(tempfile.gettempdir()) / "dpatlas-pg-install.lock"
NEEDED = ("initdb", "pg_ctl", "postgres")


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be found, installed or started here (the message says why)."""


# --- binaries -----------------------------------------------------------------------------------

def _version_key(path: str) -> tuple:
    m = re.search(r"/postgresql/([\d.]+)/bin", path)
    return tuple(int(p) for p in m.group(1).split(".")) if m else ()


def find_bindir() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, or None."""
    candidates: list[Path] = []
    if os.environ.get("DPATLAS_PG_BINDIR"):
        candidates.append(Path(os.environ["DPATLAS_PG_BINDIR"]))
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=_version_key, reverse=True)]
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
            if out:
                candidates.append(Path(out))
    for name in ("initdb", "pg_ctl"):
        found = shutil.which(name)
        if found:
            candidates.append(Path(found).resolve().parent)
    for d in candidates:
        if all(os.access(d / n, os.X_OK) for n in NEEDED):
            return d
    return None


def _tail(text: str | bytes | None, n: int = 20) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").strip().splitlines()[-n:])


def install_postgresql(timeout: float = 1200) -> float:
    """apt-get install Debian's postgresql (as root); returns the seconds it took (0: no need)."""
    if os.environ.get("DPATLAS_PG_NO_INSTALL"):
        raise PostgresUnavailable("no PostgreSQL server binaries, and DPATLAS_PG_NO_INSTALL "
                                  "forbids installing them")
    if os.geteuid() != 0:
        raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl), and not "
                                  "root to apt-get install postgresql")
    apt = shutil.which("apt-get")
    if apt is None:
        raise PostgresUnavailable("no PostgreSQL server binaries, and no apt-get to install them")
    with open(INSTALL_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers: one installs, the others wait
        if find_bindir() is not None:
            return 0.0
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        t0 = time.monotonic()
        for cmd in ([apt, "-o", "DPkg::Lock::Timeout=300", "update"],
                    [apt, "-o", "DPkg::Lock::Timeout=300", "install", "-y",
                     "--no-install-recommends", "postgresql"]):
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                   timeout=timeout, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired as e:
                raise PostgresUnavailable(f"{' '.join(cmd)} took over {timeout:.0f} s") from e
            if p.returncode != 0:
                raise PostgresUnavailable(f"{' '.join(cmd)} failed ({p.returncode}):\n"
                                          f"{_tail(p.stdout + p.stderr)}")
        seconds = time.monotonic() - t0
    if find_bindir() is None:
        raise PostgresUnavailable("apt-get installed postgresql but its binaries are not found")
    return seconds


# --- the server user ----------------------------------------------------------------------------

def _server_account() -> pwd.struct_passwd | None:
    """None: run as ourselves (not root). As root: the postgres system user, created if need be."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd")
    if useradd is None:
        raise PostgresUnavailable("running as root, no 'postgres' user and no useradd to make one")
    p = subprocess.run([useradd, "--system", "--user-group", "--no-create-home",
                        "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
                        SERVER_USER], capture_output=True, text=True)
    if p.returncode != 0:
        raise PostgresUnavailable(f"useradd {SERVER_USER} failed: {_tail(p.stderr)}")
    return pwd.getpwnam(SERVER_USER)


def _traversable_by_others(path: Path) -> bool:
    for p in [path, *path.parents]:
        if not os.stat(p).st_mode & 0o001:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the server ---------------------------------------------------------------------------------

@dataclass
class PostgresServer:
    bindir: Path
    root: Path  # the temporary directory: data/, sock/, server.log
    port: int
    password: str
    run_as: str  # the OS user the server runs as
    install_seconds: float = 0.0  # time spent in apt-get install (0: binaries were there)
    dbname: str = "dpatlas_test"
    _account: pwd.struct_passwd | None = field(default=None, repr=False)
    _running: bool = field(default=False, repr=False)

    user = "postgres"  # the database superuser

    @property
    def url(self) -> str:
        return self.url_for(self.dbname)

    def url_for(self, dbname: str) -> str:
        return (f"postgresql+psycopg://{self.user}:{self.password}@127.0.0.1:{self.port}/"
                f"{dbname}")

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def _run(self, args: list, timeout: float = 120) -> subprocess.CompletedProcess:
        kw = {}
        if self._account is not None:
            kw = {"user": self._account.pw_uid, "group": self._account.pw_gid,
                  "extra_groups": []}
        env = {"PATH": f"{self.bindir}:/usr/bin:/bin", "HOME": str(self.root),
               "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC"}
        return subprocess.run([str(a) for a in args], cwd=self.root, env=env,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)

    def _connect(self, dbname: str = "postgres"):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=self.user,
                               password=self.password, dbname=dbname, autocommit=True,
                               connect_timeout=10)

    def create_database(self, name: str) -> str:
        """Create a database; returns its SQLAlchemy URL."""
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", name):
            raise ValueError(f"database name {name!r}: use lower-case letters, digits, _")
        with self._connect() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url_for(name)

    def stop(self) -> None:
        if self._running:
            data = self.root / "data"
            p = self._run([self.bindir / "pg_ctl", "-D", data, "-m", "fast", "-w", "-t", "30",
                           "stop"], timeout=60)
            if p.returncode != 0:
                self._run([self.bindir / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"],
                          timeout=60)
            self._running = False
        shutil.rmtree(self.root, ignore_errors=True)

    @classmethod
    def start(cls, install: bool = True, dbname: str = "dpatlas_test") -> "PostgresServer":
        bindir = find_bindir()
        seconds = 0.0
        if bindir is None:
            if not install:
                raise PostgresUnavailable("no PostgreSQL server binaries (initdb, pg_ctl) found")
            seconds = install_postgresql()
            bindir = find_bindir()
        account = _server_account()
        base = Path(tempfile.gettempdir())
        if account is not None and not _traversable_by_others(base):
            base = Path("/tmp")  # the server user must reach its directory
        root = Path(tempfile.mkdtemp(prefix="dpatlas-pg-", dir=base))
        server = cls(bindir=bindir, root=root, port=0, password=secrets.token_hex(16),
                     run_as=account.pw_name if account else pwd.getpwuid(os.geteuid()).pw_name,
                     install_seconds=seconds, dbname=dbname, _account=account)
        try:
            server._init_and_start()
            server.create_database(dbname)
        except BaseException:
            server.stop()
            raise
        atexit.register(server.stop)  # in case the caller never reaches its own stop
        return server

    def _init_and_start(self) -> None:
        data, sock = self.root / "data", self.root / "sock"
        sock.mkdir()
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self._account is not None:
            for p in (self.root, sock, pwfile):
                os.chown(p, self._account.pw_uid, self._account.pw_gid)
        os.chmod(self.root, 0o700)
        os.chmod(pwfile, 0o600)
        p = self._run([self.bindir / "initdb", "-D", data, "-U", self.user, "--pwfile", pwfile,
                       "--auth-host=scram-sha-256", "--auth-local=trust", "--encoding=UTF8",
                       "--locale=C", "--no-sync"], timeout=180)
        pwfile.unlink()
        if p.returncode != 0:
            raise PostgresUnavailable(f"initdb failed ({p.returncode}) as {self.run_as}:\n"
                                      f"{_tail(p.stdout + p.stderr)}")
        with open(data / "postgresql.conf", "a") as conf:
            conf.write(f"\n# dpatlas tests\nlisten_addresses = '127.0.0.1'\n"
                       f"unix_socket_directories = '{sock}'\n"
                       "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                       "max_connections = 50\nshared_buffers = 32MB\n"
                       "max_wal_size = 256MB\nlog_min_messages = warning\n")
        last = ""
        for _ in range(5):  # a port taken between _free_port() and the server's bind: retry
            self.port = _free_port()
            p = self._run([self.bindir / "pg_ctl", "-D", data, "-l", self.log_file, "-w",
                           "-t", "60", "-o", f"-p {self.port}", "start"], timeout=120)
            if p.returncode == 0:
                self._running = True
                return
            log = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
            last = _tail(p.stdout + p.stderr + "\n" + log)
            if "already in use" not in log and "could not bind" not in log:
                break
        raise PostgresUnavailable(f"pg_ctl start failed as {self.run_as}:\n{last}")


@contextlib.contextmanager
def postgres_server(install: bool = True, dbname: str = "dpatlas_test") -> Iterator[PostgresServer]:
    """Start a private PostgreSQL server (see the module doc); yields it, stops it at exit."""
    server = PostgresServer.start(install=install, dbname=dbname)
    try:
        yield server
    finally:
        server.stop()


# --- one server per test process, for every test module that needs one --------------------------

_shared: PostgresServer | None = None
_shared_error: PostgresUnavailable | None = None


def shared_server() -> PostgresServer:
    """The test process's PostgreSQL server, started on first use and stopped at exit (atexit).

    Test modules share it, so a run starts (and, on a fresh machine, installs) one server;
    a failure to get one is remembered, so it is not retried by every module."""
    global _shared, _shared_error
    if _shared_error is not None:
        raise _shared_error
    if _shared is None:
        try:
            _shared = PostgresServer.start()
        except PostgresUnavailable as e:
            _shared_error = e
            raise
    return _shared


LEDGER_DATASET = "tracts-2020"  # the dataset of the ``ledger`` fixture's cap


try:  # the pytest fixtures, imported by the test modules that use PostgreSQL
    import pytest
except ImportError:  # pragma: no cover - this module is also usable without pytest
    pytest = None

if pytest is not None:
    import uuid
    import warnings

    @pytest.fixture(scope="session")
    def pg():
        """The shared server; skipped with the reason if none can be had, unless
        DPATLAS_REQUIRE_PG=1 (then the test fails)."""
        try:
            server = shared_server()
        except PostgresUnavailable as e:
            if os.environ.get("DPATLAS_REQUIRE_PG"):
                pytest.fail(f"PostgreSQL required (DPATLAS_REQUIRE_PG) but unavailable: {e}")
            pytest.skip(f"PostgreSQL unavailable, PostgreSQL ledger tests skipped: {e}")
        if server.install_seconds:
            warnings.warn(f"installed Debian's postgresql for the ledger tests in "
                          f"{server.install_seconds:.0f} s")
        return server

    @pytest.fixture(params=["sqlite", "postgresql"])
    def ledger_url(request, tmp_path):
        """A fresh, empty ledger database: a SQLite file, or a new PostgreSQL database."""
        if request.param == "sqlite":
            return f"sqlite:///{tmp_path / 'ledger.db'}"
        server = request.getfixturevalue("pg")
        return server.create_database(f"ledger_{uuid.uuid4().hex[:16]}")

    @pytest.fixture
    def url(ledger_url):
        """A fresh SQLite file, or a fresh database on the test run's PostgreSQL server."""
        return ledger_url

    @pytest.fixture
    def ledger(url):
        """A ledger at ``url`` whose dataset LEDGER_DATASET has a cap (eps 10, delta 1e-5)."""
        from dpatlas.ledger import Ledger

        led = Ledger(url)
        led.set_cap(LEDGER_DATASET, 10.0, 1e-5, reason="initial cap")
        yield led
        led.close()
