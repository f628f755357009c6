"""County and state estimates (the level tasks of :func:`dpatlas.release.levels.level_tasks`).

The local runner runs them on the release flow's own two threads, reading the local staged
partitions. With ``runner: dask`` they run on the release's Dask workers, in a subflow of
their own (``dpatlas-levels``, run ``levels-<release id>``) on the release's cluster: its own
subflow, not a stage of select/estimate, so they start once the estimates are drawn without
changing that subflow's parameters (checked against the server's limit before the charge),
and each subflow of the release connects to the one cluster the same way. With
``staging_url`` each task reads its state's rows by URL and writes its draw there, and the flow
records it (:mod:`flows.worker_draws`); without, the workers share the internal folder and
record their draws themselves, as the chunks do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from prefect import flow, unmapped

from dpatlas.core.config import ReleaseConfig
from dpatlas.release.draws import DrawLog
from dpatlas.release.estimate import Chunk
from dpatlas.release.levels import LevelTask, partitions_holding
from flows.cluster import local_task_groups, release_task_runner, subflow_without_heartbeat
from flows.worker_draws import copy_recorded, draw_on_workers, task_seed
from tasks.levels import estimate_levels_staged, estimate_state_levels

# the seeds' stage index (1 selection, 2 estimates)
LEVELS_STAGE = 3


def levels_run_name(release_id: str) -> str:
    return f"levels-{release_id}"


def estimate_release_levels(cfg: ReleaseConfig, release_id: str, address: Optional[str],
                            staged: list[Path], chunks: list[Chunk], worker_chunks: list[Chunk],
                            units: list[LevelTask], budget, internal: Path,
                            noise_seed: Optional[int],
                            staging_location: Optional[str] = None,
                            unit_records: Optional[list[int]] = None) -> list[Path]:
    """County and state estimates, one task per state, or per group of its cells when it holds
    many records (``units``: :func:`~dpatlas.release.levels.level_tasks`, the ones the draw
    log's layout records; none unless the plan has levels), each reading only the staged
    partitions that hold its records (``worker_chunks``' copies of them with a staging
    location). Task k's seed depends on k alone, as a chunk's does, so every runner draws the
    same noise; the local runner runs consecutive units in one task run (``unit_records``,
    each unit's records, balance the runs: :mod:`dpatlas.release.task_groups`)."""
    if not budget.levels:
        return []
    if cfg.runner != "dask":
        sources = [partitions_holding(staged, chunks, u.state) for u in units]
        return _map_levels(units, sources, budget, cfg.publish.min_n, internal, noise_seed,
                           local_task_groups(cfg, lambda: unit_records or [1] * len(units)))
    subflow = levels_on_workers.with_options(task_runner=release_task_runner(cfg, address),
                                             flow_run_name=levels_run_name(release_id))
    with subflow_without_heartbeat():
        return subflow(**levels_subflow_parameters(cfg, staged, chunks, worker_chunks, units,
                                                   budget, internal, noise_seed,
                                                   staging_location))


def levels_subflow_parameters(cfg: ReleaseConfig, staged: list[Path], chunks: list[Chunk],
                              worker_chunks: list[Chunk], units: list[LevelTask], budget,
                              internal: Path, noise_seed: Optional[int],
                              staging_location: Optional[str] = None) -> Optional[dict]:
    """The parameters of the ``dpatlas-levels`` subflow (public values and paths) for the
    level tasks ``units``, or None when the release calls none (no levels, or the local
    runner): the flow measures them against the server's limit before the charge, then calls
    the subflow with them."""
    if not budget.levels or cfg.runner != "dask":
        return None
    sources = [partitions_holding(staged, chunks, u.state) for u in units]
    if staging_location:
        url_of = {Path(c.staged): w.staged for c, w in zip(chunks, worker_chunks)}
        sources = [[url_of[Path(p)] for p in files] for files in sources]
    return {"units": units, "sources": [[str(p) for p in files] for files in sources],
            "budget": budget, "min_n": cfg.publish.min_n, "internal": str(internal),
            "noise_seed": noise_seed, "staging_location": staging_location}


@flow(name="dpatlas-levels", persist_result=False)
def levels_on_workers(units: list[LevelTask], sources: list[list[str]], budget, min_n: int,
                      internal: str, noise_seed: Optional[int] = None,
                      staging_location: Optional[str] = None) -> list[Path]:
    """The level tasks on the release's workers: unit k reads ``sources[k]`` (paths, or URLs
    under ``staging_location``, where its draw is then written and recorded by this flow
    before it is copied into the internal folder)."""
    internal = Path(internal)
    if not staging_location:
        return _map_levels(units, [[Path(p) for p in files] for files in sources], budget,
                           min_n, internal, noise_seed)
    log = DrawLog(internal)
    draw_on_workers(
        log, "levels", units, staging_location, noise_seed, LEVELS_STAGE,
        lambda todo, outs, seeds: estimate_levels_staged.map(
            [sources[k] for k in todo], [units[k] for k in todo], unmapped(budget),
            unmapped(min_n), outs, seeds))
    return copy_recorded(log, "levels", units, internal)


def _map_levels(units: list[LevelTask], sources: list[list[Path]], budget, min_n: int,
                internal: Path, noise_seed: Optional[int],
                groups: Optional[list[list[int]]] = None) -> list[Path]:
    """The level tasks on the current flow's task runner, each drawing once into the internal
    folder and recording its draw itself: a task run per unit, or per run of consecutive
    units in ``groups`` (the local runner). Unit k's seed depends on k alone."""
    groups = groups or [[k] for k in range(len(units))]
    futures = estimate_state_levels.map(
        [[sources[k] for k in group] for group in groups],
        [[units[k] for k in group] for group in groups], unmapped(budget), unmapped(min_n),
        unmapped(internal), unmapped(DrawLog(internal)),
        [[task_seed(noise_seed, LEVELS_STAGE, k) for k in group] for group in groups])
    return [Path(p) for paths in futures.result() for p in paths]
