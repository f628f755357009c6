"""A Dask cluster of separate processes on loopback: ``dask scheduler`` and ``dask worker``
started as subprocesses (as deploy/README.md starts them on machines), for the cluster test and
``benchmarks/bench_national.py --dask-cluster processes``. Stopped (and waited for) on exit."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

DASK = str(Path(sys.executable).with_name("dask"))


@dataclass
class DaskProcesses:
    address: str
    scheduler: subprocess.Popen
    workers: list[subprocess.Popen] = field(default_factory=list)
    worker_logs: list[Path] = field(default_factory=list)

    @property
    def worker_pids(self) -> list[int]:
        return [w.pid for w in self.workers]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(command: list[str], log: Path, env: dict) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def _wait_for_workers(address: str, count: int, timeout: float) -> None:
    from distributed import Client

    with Client(address, timeout=timeout) as client:
        client.wait_for_workers(count, timeout=timeout)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def dask_processes(folder: Path, workers: int = 2, env: dict | None = None,
                   timeout: float = 120.0) -> Iterator[DaskProcesses]:
    """``dask scheduler --port P`` and ``workers`` × ``dask worker tcp://127.0.0.1:P
    --nthreads 1 --no-nanny`` (no nanny: the worker's pid is the process that runs the tasks),
    each logging to a file in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **(env or {})}
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    scheduler = _start([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                        "--no-dashboard"], folder / "scheduler.log", env)
    cluster = DaskProcesses(address, scheduler)
    try:
        for k in range(workers):
            log = folder / f"worker-{k}.log"
            cluster.workers.append(_start(
                [DASK, "worker", address, "--nthreads", "1", "--no-nanny", "--name",
                 f"worker-{k}", "--no-dashboard", "--local-directory", str(folder / f"w{k}")],
                log, env))
            cluster.worker_logs.append(log)
        _wait_for_workers(address, workers, timeout)
        yield cluster
    finally:
        for proc in [*cluster.workers, scheduler]:
            _stop(proc)
