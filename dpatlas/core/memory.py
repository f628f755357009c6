"""Fewer malloc arenas in a release's process, so that its peak memory follows its data.

glibc gives each thread that contends for the heap an arena of its own, up to eight per core,
and an arena keeps the memory its frees leave behind. A release run by the local runner holds
its tasks in a thread pool beside Prefect's own threads, so the frames of one stage are freed
into arenas that the next stage's threads do not reuse. Measured on the full-scale national
release, one cell, local runner (`benchmarks/bench_national.py --runners local --scale 1.0`,
two runs each, 2 cores): the flow process peaked at 1,637 and 1,646 MiB, and at 1,256 and
1,282 MiB with the limit of two arenas set through ``MALLOC_ARENA_MAX=2`` (wall 111-116 s
against 117-120 s: the threads wait a little more for the heap).

glibc fixes its arena limit once the process has made eight arenas, so the limit is set with
``mallopt`` as early as possible: when ``dpatlas``'s command line is imported, before Prefect
starts its threads (two runs: 1,313 and 1,302 MiB). Set only when the release flow begins, it
came too late to do as much (1,583 and 1,552 MiB): the flow sets it too, for callers that run
it from Python, and ``deploy/serve.py`` gives its runs' processes the environment variable.
Elsewhere (musl, macOS) there is nothing to set; an explicit ``MALLOC_ARENA_MAX`` is left as
it is.

The same processes end faster when the cyclic garbage collector is told to leave their heap to
the operating system (:func:`freeze_heap_at_exit`): the interpreter's shutdown collected the
release flow's half a million objects several times over, 1.1 s of the national release's
wall time after its last task (``perf``: 57% of its samples in ``gc_collect_main``, about 20%
more in the collector's ``visit_*`` functions), against
0.1 s with the heap frozen; each compute process (``dpatlas.release.compute_pool``) did the
same as it exited.

Arrow's own allocator (mimalloc in the pyarrow wheels) keeps what a thread frees for that
thread's next allocations, and its pages go back to the operating system only when asked
(:func:`return_arrow_memory`). Reading a partition of 4 M records (California's first group
of cells in a 24-cell national input, 305 MiB as a frame) passes 460 MiB through the pool; it
kept the process 325 MiB above what the frame needs until the next read, and the input
check, which comes on top, peaked 220 MiB higher for it. Returned after the read and after
the partition is staged, one validation task of that partition peaked at 1,111 MiB instead of
1,334 and left the process at 383 MiB instead of 742 (one run each; each return took under
4 ms).
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import functools
import gc
import logging
import os
from pathlib import Path

__all__ = ["RELEASE_ARENAS", "freeze_heap_at_exit", "high_water_mib", "limit_malloc_arenas",
           "return_arrow_memory"]

RELEASE_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's malloc.h
_log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def limit_malloc_arenas(arenas: int = RELEASE_ARENAS) -> bool:
    """Limit this process's malloc arenas to ``arenas`` (glibc only; once per process).
    Returns whether the limit was set here (False: not glibc, or set in the environment)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False  # the operator's own choice, read by glibc at start
    name = ctypes.util.find_library("c")
    if name is None or "libc.so" not in name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(_M_ARENA_MAX, arenas) == 1
    if not done:
        _log.debug("mallopt(M_ARENA_MAX, %d) was refused", arenas)
    return done


@functools.lru_cache(maxsize=None)
def freeze_heap_at_exit() -> None:
    """As this process exits (an ``atexit`` handler, once per process), move every object
    alive then out of the cyclic collector's reach (``gc.freeze``), so that the interpreter's
    shutdown does not scan them again and again before the operating system takes the memory
    back. Other ``atexit`` handlers run as before, and objects freed by reference counting are
    freed (files closed, connections ended); only reference cycles still alive at exit are not
    collected, which spares nothing a release writes: its files are closed as they are
    written."""
    atexit.register(gc.freeze)


def return_arrow_memory() -> None:
    """Give the pages Arrow's memory pool keeps after frees back to the operating system.
    Call it in the thread that did the work: mimalloc keeps a heap per thread, and a thread
    returns only its own."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


def high_water_mib(pid: int, program: str | None = None) -> float | None:
    """The peak RSS (VmHWM) of process ``pid``, in MiB; None after its exit or where there is
    no /proc. With ``program``: None too until ``pid`` runs it (before its exec the status is
    the forking process's, whose memory the child shares or copies)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmHWM" not in fields or (program is not None
                                 and fields.get("Name", "").strip() != program[:15]):
        return None
    return int(fields["VmHWM"].split()[0]) / 1024
