"""One Dask cluster per release (issue 35): flows/cluster.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prefect.task_runners import ThreadPoolTaskRunner


def _cfg(**over):
    return SimpleNamespace(**{"runner": "dask", "dask_address": None, "dask_workers": 1,
                              **over})


def test_runner_dask_without_an_address_starts_one_local_cluster_closed_on_failure():
    from distributed import Client

    from flows.cluster import release_cluster, release_task_runner

    cfg = _cfg()
    with pytest.raises(RuntimeError, match="a stage failed"):
        with release_cluster(cfg) as address:
            with Client(address, timeout=30) as client:
                assert len(client.scheduler_info()["workers"]) == cfg.dask_workers
            # every subflow connects to this cluster; none starts one of its own
            for _ in range(2):
                runner = release_task_runner(cfg, address)
                assert runner.address == address and not runner.cluster_kwargs
            raise RuntimeError("a stage failed")
    with pytest.raises(OSError):  # closed on the way out, also on failure
        Client(address, timeout=2)


def test_a_given_scheduler_is_used_and_the_local_runner_starts_no_cluster():
    from flows.cluster import release_cluster, release_task_runner

    given = _cfg(dask_address="tcp://10.0.0.5:8786")
    with release_cluster(given) as address:
        assert address == "tcp://10.0.0.5:8786"
        assert release_task_runner(given, address).address == address
    local = _cfg(runner="local")
    with release_cluster(local) as address:
        assert address is None
        runner = release_task_runner(local, address)
        assert isinstance(runner, ThreadPoolTaskRunner) and runner._max_workers == 2
