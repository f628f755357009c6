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
that many worker processes (:func:`compute_pool`, ``spawn``: a fresh interpreter, nothing of
the flow's threads or Prefect's state copied) as soon as it has listed the input. Each imports
what it will run (the modules the flow names: the estimators, Great Expectations, the writers)
while the flow validates the input, when the flow's two threads keep only 1.2-1.5 cores busy,
not at its first task on the release's busiest stretch. Each draw's arithmetic, and then each
publish part, level and the overview maps, runs there (:func:`compute`), as on a Dask worker.
Those imports cost a worker about 3.5 CPU-s (1.7 of them Great Expectations'): a release of
fewer than :data:`MIN_RECORDS` records keeps the threads (:func:`pool_processes`).

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


# The workers' scheduling priority below the flow's (``nice``: 1024 against 110 CFS weight,
# about ten to one): when the flow wants the cores (validating the input while the workers
# import, tippecanoe building the tract archive while the level files and the overview maps
# are written), its work goes first and the workers take what is left; when the flow only waits
# for them (the draws, the parts) they have the cores to themselves.
WORKER_NICENESS = 10


def _warm(modules: tuple[str, ...]) -> None:
    """Each worker lowers its priority, then imports ``modules`` once, as it starts; it
    exits without collecting its heap again (:func:`~dpatlas.core.memory.freeze_heap_at_exit`)."""
    import importlib
    import os

    from dpatlas.core.memory import freeze_heap_at_exit

    if hasattr(os, "nice"):  # POSIX
        os.nice(WORKER_NICENESS)
    freeze_heap_at_exit()
    for name in modules:
        importlib.import_module(name)


def _started() -> int:
    import os

    return os.getpid()


@contextlib.contextmanager
def compute_pool(processes: int, warm: tuple[str, ...] = ()
                 ) -> Iterator[Optional[ProcessPoolExecutor]]:
    """``processes`` worker processes for :func:`compute` while the block runs (none when 0,
    or when a pool is active already), each importing the modules ``warm`` names as it starts
    (names, not imports here: what the workers run is above this module); stopped on leaving,
    on every path."""
    global _active, _active_size
    if processes < 1 or _active is not None:
        yield None
        return
    pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_warm, initargs=(tuple(warm),))
    try:
        for _ in range(processes):  # start them now: they import while the flow goes on
            pool.submit(_started)
        _active, _active_size = pool, processes
        yield pool
    finally:
        _active = None
        # not waited for: the workers exit on their own once told to (the flow goes on to
        # publish meanwhile); the interpreter joins them before it exits
        pool.shutdown(wait=False, cancel_futures=True)


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
