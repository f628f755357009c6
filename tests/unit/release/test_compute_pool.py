"""The local runner's draws computed in worker processes (dpatlas.release.compute_pool)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pandas as pd

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
    import pytest

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


def test_the_workers_import_what_they_are_told_to_as_they_start():
    # a module nothing of the pool's own code imports: only the warm-up puts it there
    with CP.compute_pool(1, warm=("tabnanny",)):
        assert CP.compute(_imported, "tabnanny")
    with CP.compute_pool(1):
        assert not CP.compute(_imported, "tabnanny")


def test_the_release_flow_names_only_modules_that_exist():
    # a misspelt name would break every pooled release at its first draw (the pool's
    # initializer fails in each worker)
    import importlib.util

    from flows.release import COMPUTE_MODULES

    assert COMPUTE_MODULES
    for name in COMPUTE_MODULES:
        assert importlib.util.find_spec(name) is not None, name
