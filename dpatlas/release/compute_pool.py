"""The local runner's draws and publish parts computed in worker processes, not in the flow's
threads.

The local runner runs a stage's task runs on two threads of the flow process. The arithmetic of
a draw (a chunk's selection or estimates, a state's levels) is numpy called from Python: on
the national benchmark two threads made 1.55 times the progress of one (13.7 s against 21.2
CPU-s, no Prefect involved), because every short numpy call has to win the interpreter lock
back, while two processes made about 1.9 times (each ran the whole set in 19.7 and 20.3 s, side
by side, against 18.3-19.8 s alone). Writing the publish parts (pandas, Great Expectations, the
writers) is mostly Python and fared worse: the process was 1.1-1.5 cores busy while its two
parts ran. So with ``local_processes`` (the config; 0 keeps the threads) the release flow starts
that many worker processes (:func:`compute_pool`) as soon as it has listed the input. Each
draw's arithmetic, and then each publish part, level and the overview maps, runs there
(:func:`compute`), as on a Dask worker.

The workers are forked from one server process (multiprocessing's ``forkserver``:
:func:`start_server`), a fresh interpreter started from nothing of the flow's (none of its
threads or Prefect's state is copied, as with ``spawn``) that imports what the workers run
(:data:`WORKER_MODULES`: the estimators, Great Expectations, the writers) once. Those imports
cost about 2.9 CPU-s: spawned, every worker paid them (5.7 CPU-s for two) while the flow
validated the input. ``dpatlas release`` starts the server before it imports the flow
(:mod:`dpatlas.cli.release_commands`): on the national benchmark about 1.1 s before the flow's
first task, while the command's own imports and the run's creation keep one core busy; the
flow starts it itself when run otherwise (a deployment). A release of fewer than
:data:`MIN_RECORDS` records keeps the threads and starts no server (:func:`pool_processes`).
A forked worker shares no random state that noise comes from: every draw reads the operating
system's CSPRNG, or a seed it is given (:mod:`mechanisms.noise`). The server is reached through
multiprocessing's own record of it (``forkserver._forkserver``: its pid, its stop), private
names that Python 3.11, the version the project pins, has; ``tests/unit/release/
test_compute_pool.py`` would fail without them.

Only the work moves: the task run stays on the flow's thread, which waits for the result
without holding the lock. Everything that makes a draw a draw stays there too, in order: the
draw log's check that it was never drawn, persisting the frame, the crash points, recording it
(:func:`dpatlas.release.draws.draw_once`). The noise is drawn in the worker, by the same
function from the same seed (none: the operating system's CSPRNG, read by the worker), so the
draw does not depend on where it was computed. A publish part draws nothing: it writes files
into the staging folder that the flow alone commits, as from a Dask worker. A worker that dies
fails its task run, and the release, which resumes from the draws its log records, as after
any crash.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Iterator, Optional, TypeVar

T = TypeVar("T")

_active: Optional[ProcessPoolExecutor] = None  # the pool of the release running in this process
_active_size = 0  # its processes

# Below this many records the draws take a few seconds on the flow's threads, about what
# starting the workers costs; the national benchmark has 5.2 M.
MIN_RECORDS = 500_000


def pool_processes(cfg, records: int) -> int:
    """The worker processes a release of ``records`` records computes its draws in: the
    config's ``local_processes`` on the local runner with at least :data:`MIN_RECORDS`
    records, else 0 (the flow's threads; the Dask workers compute their own)."""
    if cfg.runner != "local" or records < MIN_RECORDS:
        return 0
    return cfg.local_processes


# What the workers run (draws, publish parts, levels, overview maps), by name: the server they
# are forked from imports these once. Names, not imports: `dpatlas release` imports this module
# to start the server before it imports anything heavy.
WORKER_MODULES = ("dpatlas.release.estimate", "dpatlas.release.levels", "data_contracts",
                  "dpatlas.publication.release_parts", "dpatlas.publication.png_map",
                  "matplotlib.figure", "matplotlib.backends.backend_agg")

# The workers' scheduling priority below the flow's (``nice``: 1024 against 110 CFS weight,
# about ten to one): when the flow wants the cores (validating the input while the server
# imports, tippecanoe building the tract archive while the level files and the overview maps
# are written), its work goes first and the workers take what is left; when the flow only waits
# for them (the draws, the parts) they have the cores to themselves.
WORKER_NICENESS = 10


def _worker_niceness() -> Optional[int]:
    """This process's niceness plus :data:`WORKER_NICENESS` (at most 19); None where
    priorities are not POSIX."""
    import os

    if not hasattr(os, "getpriority"):
        return None
    return min(19, os.getpriority(os.PRIO_PROCESS, 0) + WORKER_NICENESS)


def _lower_priority(pid: int, niceness: Optional[int]) -> None:
    """Process ``pid`` (0: this one) at ``niceness`` unless it is there already; a process
    that is gone, or a niceness this user may not set, is left as it is."""
    import os

    if niceness is None:
        return
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, pid) < niceness:
            os.setpriority(os.PRIO_PROCESS, pid, niceness)


def start_server(modules: tuple[str, ...] = WORKER_MODULES) -> None:
    """Start the process the workers are forked from (multiprocessing's forkserver), at the
    workers' lower priority, importing ``modules`` once; returns at once (the server imports
    them meanwhile, and a worker asked of it waits for that). A server running already is
    kept (:func:`compute_pool` stops it with its workers)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # (multiprocessing's own record of it, here and below)
    if server._forkserver_pid is not None:
        return
    # __main__ as multiprocessing's own default: a worker then need not import it again
    forkserver.set_forkserver_preload(["__main__", *modules])
    forkserver.ensure_running()
    if server._forkserver_pid is not None:
        _lower_priority(server._forkserver_pid, _worker_niceness())


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop the pool's workers, then their server.

    Waiting for the workers first is what accounts for their time: the server reaps each
    worker (its CPU joins the server's children's) and reports its exit, and this process
    reaps the server. Stopped as the workers were told to stop, the server could exit before
    reaping them (it checks for its end before its children), and the national benchmark's
    ``wait4`` of the release then missed the workers' CPU: 42 of about 61 CPU-s counted. And
    the server is stopped rather than left to this process's exit: it holds the process's
    standard output open, and its own exit (0.7 s: a heap of Great Expectations, pandas and
    matplotlib) kept a reader of that output waiting after the release had ended."""
    from multiprocessing import forkserver

    pool.shutdown(wait=True, cancel_futures=True)
    with contextlib.suppress(OSError):
        forkserver._forkserver._stop()


def _warm(niceness: Optional[int]) -> None:
    """Each worker runs at ``niceness`` (its server's already, unless a server started without
    :func:`start_server` forked it) and exits without collecting its heap again
    (:func:`~dpatlas.core.memory.freeze_heap_at_exit`)."""
    from dpatlas.core.memory import freeze_heap_at_exit

    _lower_priority(0, niceness)
    freeze_heap_at_exit()


def _started() -> int:
    import os

    return os.getpid()


def _start_workers(pool: ProcessPoolExecutor, processes: int) -> None:
    """Ask the server for every worker now, so each is there at the first draw; in a thread of
    its own: a worker asked for waits until the server has imported its modules, and the
    flow does not."""
    with contextlib.suppress(RuntimeError):  # the pool was shut down meanwhile
        for _ in range(processes):
            pool.submit(_started)


@contextlib.contextmanager
def compute_pool(processes: int) -> Iterator[Optional[ProcessPoolExecutor]]:
    """``processes`` worker processes for :func:`compute` while the block runs (none when 0,
    or when a pool is active already), forked from the server (:func:`start_server`, started
    here unless it runs); the workers and the server stopped on leaving, on every path."""
    global _active, _active_size
    if processes < 1 or _active is not None:
        yield None
        return
    start_server()
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("forkserver"),
                               initializer=_warm, initargs=(_worker_niceness(),))
    threading.Thread(target=_start_workers, args=(pool, processes), daemon=True,
                     name="compute-pool-start").start()
    try:
        _active, _active_size = pool, processes
        yield pool
    finally:
        _active = None
        # not waited for: the flow goes on to publish meanwhile (the interpreter joins the
        # workers before it exits)
        threading.Thread(target=_stop, args=(pool,), daemon=True,
                         name="compute-pool-stop").start()


def pool_size() -> int:
    """The processes of the pool :func:`compute` sends work to (0: none), which run it first
    come, first served: the local runner's release, while its pool is open."""
    return _active_size if _active is not None else 0


def compute(fn: Callable[..., T], *args) -> T:
    """``fn(*args)`` in a worker of the active pool (``fn`` and its arguments picklable), or
    here when there is none (the Dask workers, tests calling tasks directly)."""
    pool = _active
    if pool is None:
        return fn(*args)
    return pool.submit(fn, *args).result()
