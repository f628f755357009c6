"""The local runner's draws computed in worker processes (dpatlas.release.compute_pool)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from dpatlas.release import compute_pool as CP
from dpatlas.release.estimate import Chunk, draw_selection


def test_compute_runs_here_without_a_pool_and_in_a_worker_with_one():
    assert CP.compute(os.getpid) == os.getpid()
    with CP.compute_pool(1) as pool:
        assert pool is not None
        worker = CP.compute(os.getpid)
        assert worker != os.getpid()
        with CP.compute_pool(2) as nested:  # one pool at a time: the outer one serves
            assert nested is None and CP.compute(os.getpid) == worker
    assert CP._active is None and CP.compute(os.getpid) == os.getpid()


def test_the_pool_size_is_its_processes_while_it_is_open():
    assert CP.pool_size() == 0
    with CP.compute_pool(1):
        assert CP.pool_size() == 1
        with CP.compute_pool(2):  # the outer pool serves
            assert CP.pool_size() == 1
    assert CP.pool_size() == 0
    with CP.compute_pool(0):
        assert CP.pool_size() == 0


def test_a_pool_of_no_processes_is_none():
    with CP.compute_pool(0) as pool:
        assert pool is None and CP.compute(os.getpid) == os.getpid()


def test_an_error_in_a_worker_is_raised_in_the_caller_and_the_pool_stops():
    with pytest.raises(ZeroDivisionError):
        with CP.compute_pool(1):
            CP.compute(divmod, 1, 0)
    assert CP._active is None


def test_only_large_local_releases_start_workers():
    local = SimpleNamespace(runner="local", local_processes=2)
    assert CP.pool_processes(local, CP.MIN_RECORDS) == 2
    assert CP.pool_processes(local, CP.MIN_RECORDS - 1) == 0
    assert CP.pool_processes(SimpleNamespace(runner="local", local_processes=0), 10**9) == 0
    assert CP.pool_processes(SimpleNamespace(runner="dask", local_processes=2), 10**9) == 0


def test_a_draw_is_the_same_in_a_worker_as_here(tmp_path):
    """The selection of a chunk from a seed: the same frame computed here or in a worker."""
    import numpy as np

    from dpatlas.core.config import load_config
    from dpatlas.release.allocate import plan
    from dpatlas.release.thresholds import resolve_threshold

    rng = np.random.default_rng(3)
    geoids = np.repeat([f"170310{k:05d}" for k in range(12)], 40)
    x = rng.uniform(0, 1, len(geoids))
    frame = pd.DataFrame({"row": np.arange(len(geoids)), "geoid": geoids, "x": x,
                          "y": np.clip(0.3 + 0.4 * x + rng.normal(0, 0.1, len(x)), 0, 1),
                          "cell": "all", "person_id": [f"p{k}" for k in range(len(x))]})
    staged = tmp_path / "input-17.parquet"
    frame.to_parquet(staged)
    config = tmp_path / "config.yaml"
    config.write_text("input: {path: in.parquet}\nboundaries: {path: b.parquet}\n"
                      "privacy: {epsilon_per_tract: 1.0}\n"
                      "selection: {rule: dp, threshold: 3.0}\n")
    cfg = load_config(config)
    budget = plan(cfg, resolve_threshold(cfg.selection))
    chunk = Chunk(staged, geoids[0], geoids[-1], "input-17-0")
    here = draw_selection(chunk, budget, 7, 2)
    with CP.compute_pool(1):
        there = CP.compute(draw_selection, chunk, budget, 7, 2)
    pd.testing.assert_frame_equal(here, there)
    assert len(here) == 12


def _imported(name: str) -> bool:
    import sys

    return name in sys.modules


def _priority() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def _server_pid():
    from multiprocessing import forkserver

    return forkserver._forkserver._forkserver_pid


def _server_gone() -> bool:
    """Whether the last pool's server has stopped (it is stopped in a thread), waiting for
    it up to 30 s."""
    deadline = time.monotonic() + 30
    while _server_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return _server_pid() is None


def test_the_workers_come_from_a_server_that_imported_what_they_run_and_stops_with_them():
    # matplotlib's Agg backend: in WORKER_MODULES, and nothing this test module or the pool's
    # own code imports, so a worker has it only from the server it was forked from
    assert "matplotlib.backends.backend_agg" in CP.WORKER_MODULES
    assert _server_gone()  # an earlier pool's
    with CP.compute_pool(1):
        server = _server_pid()
        assert server is not None
        assert CP.compute(_imported, "matplotlib.backends.backend_agg")
        # the worker and its server below this process's priority (WORKER_NICENESS)
        assert CP.compute(_priority) == min(19, _priority() + CP.WORKER_NICENESS)
        assert os.getpriority(os.PRIO_PROCESS, server) == CP.compute(_priority)
    assert _server_gone()
    with pytest.raises(ProcessLookupError):
        os.kill(server, 0)


def test_the_flow_waits_for_the_server_only_when_it_needs_a_worker():
    """Opening the pool returns at once although the server is still importing (about 3 s):
    the workers are asked for in a thread, which waits for the server."""
    assert _server_gone()  # an earlier pool's: this one starts its own
    started = time.perf_counter()
    with CP.compute_pool(2):
        opened = time.perf_counter() - started
        assert CP.compute(_imported, "data_contracts")
        first = time.perf_counter() - started
    assert opened < 0.5 < first, (opened, first)


def test_the_server_imports_only_modules_that_exist():
    # a misspelt name would not fail (the server skips what it cannot import) but every
    # worker would import the module at its first call, on the release's busiest stretch
    import importlib.util

    assert CP.WORKER_MODULES
    for name in CP.WORKER_MODULES:
        assert importlib.util.find_spec(name) is not None, name


def _busy(seconds: float) -> float:
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass
    return time.process_time() - started


def test_the_workers_cpu_counts_in_this_process_once_the_pool_is_closed():
    """The server reaps its workers before it is stopped, and this process reaps the server:
    what the workers computed shows in this process's children's CPU (as wait4 and `time`
    read it), not lost with a worker reaped by no one."""
    import resource

    assert _server_gone()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with CP.compute_pool(2):
        spent = sum(CP._active.map(_busy, [0.6, 0.6]))
    assert _server_gone()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    counted = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert counted >= spent >= 1.2, (counted, spent)
