"""One Dask cluster per release (issue 35): every subflow on workers shares it.

With ``runner: dask`` and no ``dask_address``, a ``DaskTaskRunner`` given ``cluster_kwargs``
starts its own LocalCluster: each subflow on workers (select/estimate, levels, and publish)
would start and stop a cluster of its own. :func:`release_cluster` starts one for the release
instead, and :func:`release_task_runner` connects each subflow to its address.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional, Sequence

from prefect.logging import get_logger, get_run_logger
from prefect.exceptions import MissingContextError
from prefect.task_runners import ThreadPoolTaskRunner

from dpatlas.core.config import ReleaseConfig
from dpatlas.release.task_groups import LOCAL_TASK_GROUPS, consecutive_groups

# The local runner's threads: two, as this machine has two cores.
LOCAL_WORKERS = 2


def local_cluster_kwargs(cfg: ReleaseConfig) -> dict:
    """The release's LocalCluster: ``dask_workers`` processes of one thread each."""
    return {"n_workers": cfg.dask_workers, "threads_per_worker": 1, "processes": True}


@contextlib.contextmanager
def release_cluster(cfg: ReleaseConfig) -> Iterator[Optional[str]]:
    """The scheduler address every subflow of this release uses: ``dask_address``, or that of
    a LocalCluster started here and closed on leaving (also on failure); None for the local
    runner."""
    if cfg.runner != "dask":
        yield None
    elif cfg.dask_address:
        yield cfg.dask_address
    else:
        from distributed import LocalCluster

        with LocalCluster(**local_cluster_kwargs(cfg)) as cluster:
            _logger().info("started the release's Dask cluster at %s (%d workers)",
                           cluster.scheduler_address, cfg.dask_workers)
            yield cluster.scheduler_address


def release_task_runner(cfg: ReleaseConfig, address: Optional[str] = None,
                        threads: int = LOCAL_WORKERS):
    """A subflow's task runner: the Dask scheduler at ``address`` (from
    :func:`release_cluster`), or, with none given, ``dask_address`` or a LocalCluster of the
    runner's own; ``threads`` local threads (two by default) for the local runner."""
    if cfg.runner == "dask":  # each task run under a key of its own: flows/keyed_dask.py
        from flows.keyed_dask import KeyedDaskTaskRunner

        address = address or cfg.dask_address
        if address:
            return KeyedDaskTaskRunner(address=address)
        return KeyedDaskTaskRunner(cluster_kwargs=local_cluster_kwargs(cfg))
    return ThreadPoolTaskRunner(max_workers=threads)


@contextlib.contextmanager
def subflow_without_heartbeat() -> Iterator[None]:
    """A subflow called inside runs without a heartbeat thread of its own.

    Prefect gives every flow run a thread that emits a heartbeat (every
    ``flows.heartbeat_frequency`` s, 180 by default) and joins it as the run ends; the thread
    sleeps in steps of a second, so each run's end waits for up to a second, with nothing to
    do: a trivial subflow took 1.11-1.19 s with the thread and 0.15-0.17 s without (Prefect
    3.8.8, this machine). A release's subflows run in its flow's process, on the thread that
    called them, so the release flow's own heartbeat, which goes on meanwhile, already says
    that process is alive; theirs said nothing more."""
    from prefect.settings import temporary_settings

    with temporary_settings(updates={"flows.heartbeat_frequency": None}):
        yield


def local_task_groups(cfg: ReleaseConfig, weights: Callable[[], Sequence[float]]
                      ) -> Optional[list[list[int]]]:
    """The runs of consecutive units (chunks, level tasks) a drawing stage gives each task run
    on the local runner (:mod:`dpatlas.release.task_groups`); None with workers, which take a
    task run per unit. ``weights``: each unit's records, asked for on the local runner only
    (the chunks' cost the flow a pass over every tract-cell: 4.7 CPU-s at 42 national
    cells)."""
    if cfg.runner == "dask":
        return None
    return consecutive_groups(weights(), LOCAL_TASK_GROUPS)


def _logger():
    try:  # the release's run log, when started from the flow
        return get_run_logger()
    except MissingContextError:
        return get_logger(__name__)
