"""Wall time, CPU time and the load average of one measured span: the benchmarks' shared line.

On a shared machine a wall time moves 2-7x with the load; the CPU time a piece of work takes
moves much less, so every benchmark prints both, with the 1/5/15-minute load average at the
start and end of the span (os.getloadavg) so a reader can judge the wall time.

CPU time is user + system time from ``os.times()``: of this process, and of its children
that have been waited for (a subprocess counts once it has exited and been reaped). For one
subprocess the ``rusage`` of ``os.wait4`` gives its own tree's CPU time
(:func:`rusage_cpu_seconds`); for processes that are not our children (Dask workers, a
server) :func:`process_cpu_seconds` reads their counters with psutil before and after.

    with measure("release") as m:
        ...
    print(m.line())   # release: wall 12.3 s | CPU 10.1 s (process 9.0 + children 1.1) | ...
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15-minute load averages (zeros where the system has none)."""
    try:
        return tuple(round(v, 2) for v in os.getloadavg())
    except OSError:
        return (0.0, 0.0, 0.0)


def _load_text(load: tuple[float, float, float]) -> str:
    return "/".join(f"{v:.2f}" for v in load)


@dataclass
class Span:
    """One measured span: filled in by :func:`measure` (or by hand, e.g. for a subprocess)."""

    label: str
    wall: float = 0.0
    cpu_process: float = 0.0
    cpu_children: float = 0.0
    load_start: tuple[float, float, float] = (0.0, 0.0, 0.0)
    load_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    extra: dict = field(default_factory=dict)  # more CPU figures, e.g. {"dask workers": 3.2}

    @property
    def cpu(self) -> float:
        return self.cpu_process + self.cpu_children

    def line(self) -> str:
        """The one line format every benchmark prints."""
        more = "".join(f" + {k} {v:.1f}" for k, v in self.extra.items())
        return (f"{self.label}: wall {self.wall:.1f} s | CPU {self.cpu:.1f} s (process "
                f"{self.cpu_process:.1f} + children {self.cpu_children:.1f}{more}) | load "
                f"average {_load_text(self.load_start)} -> {_load_text(self.load_end)}")

    def as_dict(self) -> dict:
        return {**asdict(self), "cpu": self.cpu}


def _cpu_now() -> tuple[float, float]:
    t = os.times()
    return t.user + t.system, t.children_user + t.children_system


@contextmanager
def measure(label: str):
    """Measure the body: wall, this process's and its reaped children's CPU, load average."""
    span = Span(label, load_start=load_average())
    own, children = _cpu_now()
    t0 = time.perf_counter()
    try:
        yield span
    finally:
        span.wall = time.perf_counter() - t0
        own_end, children_end = _cpu_now()
        span.cpu_process = own_end - own
        span.cpu_children = children_end - children
        span.load_end = load_average()


def rusage_cpu_seconds(usage) -> float:
    """User + system CPU of a reaped process and the children it reaped (``os.wait4``'s
    rusage: a release's own CPU plus e.g. tippecanoe's)."""
    return usage.ru_utime + usage.ru_stime


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU so far of a live process (not our child) and its reaped children;
    None once it is gone."""
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return t.user + t.system + t.children_user + t.children_system


def cpu_of(pids) -> dict[int, float]:
    """:func:`process_cpu_seconds` of each live pid (the gone ones left out)."""
    out = {}
    for pid in pids:
        seconds = process_cpu_seconds(pid)
        if seconds is not None:
            out[pid] = seconds
    return out


def cpu_used(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes used between two :func:`cpu_of` readings (processes that
    ended in between count as nothing: read them before they end)."""
    return sum(after[pid] - before.get(pid, 0.0) for pid in after)


# The draw functions of selection and estimation (dpatlas.release.estimate), as the drawing
# tasks hand them to ``compute`` (tasks/draws.py)
ESTIMATOR_DRAWS = ("draw_selection", "draw_estimates")


def time_estimator_draws(compute, timed_compute):
    """``compute`` (tasks/draws.py's), calling ``timed_compute`` instead when it computes a
    selection or estimates: that call spans the draw made in a compute-pool worker
    (dpatlas.release.compute_pool), whose own functions the benchmark cannot wrap."""
    def wrapper(fn, *args):
        return (timed_compute if fn.__name__ in ESTIMATOR_DRAWS else compute)(fn, *args)
    wrapper.__wrapped__ = compute
    return wrapper
