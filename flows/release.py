"""The release flow: the stages of release.md, one Prefect task per stage and partition.

ingest → validate (every partition, before any noise) → allocate → charge the ledger →
select → estimate (chunks of tracts, on the configured task runner) → publish → feed

Selection needs the budget plan (the dp rule spends part of each tract's budget), so
allocation runs before selection. The ledger is charged before any noise is drawn, and every
chunk's selection draw and estimates are persisted and recorded in the release's draw log
(dpatlas.release.draws) before the next stage reads them, so a release that crashed resumes
without drawing fresh noise for work already drawn; a completed release id reruns as a no-op.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections import Counter
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Optional

from prefect import flow, unmapped
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from dpatlas.core.config import ReleaseConfig, load_config
from dpatlas.core.memory import freeze_heap_at_exit, limit_malloc_arenas
from dpatlas.release.compute_pool import compute_pool, pool_processes, pool_size
from dpatlas.release.crash import crashpoint
from dpatlas.release import staging
from dpatlas.release.draws import DrawLog, DrawLogMissing, draw_path, noise_source
from dpatlas.release.estimate import Chunk, stage_chunks
from dpatlas.release.task_groups import chunk_records, level_records
from dpatlas.release.levels import LevelTask, level_tasks
from dpatlas.core.ids import validate_release_id
from dpatlas.ledger import LeaseLost, Ledger, ReleaseBusy, charges
from dpatlas.release.preflight import mark_root
from dpatlas.release.plan_record import draw_layout
from dpatlas.release.run_state import InputChanged, ReleaseLock
from tasks.allocate import allocate_budget
from tasks.estimate import estimate_staged, select_and_estimate_chunks, select_staged
from tasks.ingest import list_partitions
from tasks.ledger import LEASE_SECONDS, charge_release, complete_release, release_status
from tasks.preflight import preflight
from dpatlas.publication.tract_files import release_folder
from dpatlas.publication.release_parts import (LevelJob, LevelResult, MadeOverview, PartJob,
                                               PartResult, PublishPart, TileJob,
                                               level_tile_jobs, tile_jobs)
from tasks.publish import (plan_publish, publish_parameters, publish_level, publish_overview,
                           publish_part, publish_release, publish_tiles, show_in_feed)
from tasks.report import report_release
from tasks.state import open_release, record_plan
from tasks.validate import (bound_contributions, check_boundaries, check_change_limit,
                            plan_chunks, read_boundaries, record_validation)

from dpatlas.release.events import on_release_failure
from dpatlas.release.outcome import ReleaseOutcome
from flows.cluster import (LOCAL_WORKERS, local_task_groups, release_cluster,
                           release_task_runner, subflow_without_heartbeat)
from flows.levels import estimate_release_levels, levels_on_workers, levels_subflow_parameters
from flows.validation import validate_release_input
from flows.worker_draws import copy_recorded, draw_on_workers, draw_urls, task_seed


def new_release_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def release_run_name() -> str:
    """``release-<id>``; a run that will choose its id itself (a scheduled run) is named after
    its config file until then."""
    params = flow_run.parameters
    if params.get("release_id"):
        return f"release-{params['release_id']}"
    return f"release-new-{Path(str(params.get('config_path', 'config'))).stem}"


def _name_run_after(release_id: str) -> None:
    """A run that chose its release id itself (a scheduled run, ``release-new-<config>``) is
    renamed ``release-<id>`` once it has one, so every run in Prefect names its release."""
    name = f"release-{release_id}"
    if flow_run.id is None or flow_run.name == name:
        return
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name)


def select_run_name(release_id: str) -> str:
    """The selection-and-estimation subflow's run: ``select-estimate-<id>`` (its task runs are
    ``select-<chunk>`` and ``estimate-<chunk>``), not a random name."""
    return f"select-estimate-{release_id}"


@flow(name="dpatlas-select-estimate", persist_result=False)
def select_and_estimate(chunks: list[Chunk], budget, min_n: int, internal: str,
                        noise_seed: Optional[int] = None,
                        staging_location: Optional[str] = None,
                        groups: Optional[list[list[int]]] = None) -> list[Path]:
    """Selection then estimation for every chunk, fanned out with ``.map`` on the flow's task
    runner: a task run per chunk, or per run of consecutive chunks in ``groups`` (the local
    runner: :mod:`dpatlas.release.task_groups`), each chunk selected then estimated. Chunk
    k's seeds depend on k alone, so the noise each chunk draws depends neither on the order
    in which the chunks run nor on how they are grouped.

    With a ``staging_location`` (the chunks' partitions staged there), the workers read and
    write there and this flow records their draws (:func:`_select_and_estimate_staged`)."""
    internal = Path(internal)
    if staging_location:
        return _select_and_estimate_staged(chunks, budget, min_n, internal, noise_seed,
                                           staging_location)
    groups = groups or [[k] for k in range(len(chunks))]
    runs = select_and_estimate_chunks.map(
        [[chunks[k] for k in group] for group in groups], unmapped(budget), unmapped(min_n),
        unmapped(internal),
        unmapped(DrawLog(internal)),  # each draw made once: reused on resume, never redrawn
        [[(task_seed(noise_seed, 1, k), task_seed(noise_seed, 2, k)) for k in group]
         for group in groups])
    return [Path(p) for paths in runs.result() for p in paths]


def _select_and_estimate_staged(chunks: list[Chunk], budget, min_n: int, internal: Path,
                                noise_seed: Optional[int], location: str) -> list[Path]:
    """The chunks drawn on workers that share only the staging location with this flow: each
    task gets its chunk (a GEOID range and a URL) and returns a sha256; this flow records each
    draw before the next stage is given it. Selection finishes for every chunk before any
    estimate starts (the log is this flow's, not the workers'). The estimates are copied into
    the internal folder for publishing, checked against the sha256 recorded."""
    log = DrawLog(internal)
    selections = draw_on_workers(
        log, "select", chunks, location, noise_seed, 1,
        lambda todo, outs, seeds: select_staged.map(
            [chunks[k] for k in todo], unmapped(budget), unmapped(min_n), outs, seeds))
    draw_on_workers(
        log, "estimate", chunks, location, noise_seed, 2,
        lambda todo, outs, seeds: estimate_staged.map(
            [chunks[k] for k in todo], [selections[k] for k in todo], unmapped(budget),
            unmapped(min_n), outs, seeds))
    return copy_recorded(log, "estimate", chunks, internal)


# The release flow's own task runner runs the partition validations and, with the local
# runner, the per-state level tasks (the chunks have their subflow's, and with runner dask the
# levels too: flows/levels.py): two at a time, as the chunks run locally.
# Prefect's default starts all 51 states at once, each holding its state's records: the whole
# country in memory, and 51 threads contending for two cores (their summed task time was 43×
# the stage's wall time).
LEVEL_WORKERS = 2


@flow(name="dpatlas-release", flow_run_name=release_run_name, log_prints=True,
      on_failure=[on_release_failure],
      task_runner=ThreadPoolTaskRunner(max_workers=LEVEL_WORKERS))
def release(config_path: str, release_id: Optional[str] = None,
            noise_seed: Optional[int] = None) -> ReleaseOutcome:
    """Run (or resume) a release; returns its :class:`~dpatlas.release.outcome.ReleaseOutcome`.

    ``noise_seed`` makes the noise repeatable: tests only, refused unless the config's
    ``publish.mode`` is ``test`` (a test root, whose manifests say NOT FOR RELEASE). Without it
    noise comes from the operating system's CSPRNG.
    """
    # the peak follows the data, not the threads (dpatlas.core.memory); `dpatlas release`
    # has set it before Prefect started any thread, which is what works best
    limit_malloc_arenas()
    freeze_heap_at_exit()  # the process's shutdown does not collect its heap again
    cfg = load_config(Path(config_path))
    # an empty id given is refused, not replaced by a fresh one (issue 31, O6)
    rid = validate_release_id(release_id if release_id is not None
                              else cfg.release_id or new_release_id())
    _name_run_after(rid)
    preflight(cfg, rid, noise_seed)  # before anything is written
    root, internal = cfg.publish.root, cfg.publish.internal / rid
    # The lease owner is this host and internal folder: the local lock below makes it unique
    # on this host, so a crashed run resumes at once here, while another host (another
    # owner) must wait for the lease to expire.
    owner = f"{socket.gethostname()}:{Path(os.path.realpath(internal))}"
    # A published id is a no-op that writes nothing (no lock file either: the documented
    # rerun must work on a read-only file system). Published is final, so this needs no lock.
    if release_status(cfg.ledger, rid, root / rid) == "published":
        return _already_published(cfg, rid)
    with ReleaseLock(internal, rid), contextlib.ExitStack() as cluster:
        status = release_status(cfg.ledger, rid, root / rid)
        if status == "published":  # by a run just now
            return _already_published(cfg, rid)
        # charged (in progress or failed): its draw log must be there, never begun afresh
        start = _open_release_or_refuse(cfg, rid, internal, owner,
                                        charged=status in ("in_progress", "failed"))

        # One Dask cluster for the whole release (runner dask), from validation on; closed
        # on every path.
        address = cluster.enter_context(release_cluster(cfg))
        # 1-2. Ingest and validate every partition (on the workers with runner dask:
        # flows/validation.py), then the checks that span partitions, all before any noise is
        # drawn or any budget charged.
        partitions = list_partitions(cfg.input)
        # The local runner's draws and publish parts computed in processes when there are
        # enough records to repay starting them (dpatlas.release.compute_pool), forked from a
        # server that imports what they run (started by `dpatlas release` before it imported
        # this flow, else now); closed once the parts are written.
        compute_processes = cluster.enter_context(contextlib.ExitStack())
        compute_processes.enter_context(compute_pool(
            pool_processes(cfg, sum(part.rows for part in partitions))))
        # the boundary file (public) read on the flow's task runner meanwhile, checked below
        boundaries_read = read_boundaries.submit(cfg.boundaries.path,
                                                 cfg.boundaries.geoid_column)
        validated = validate_release_input(cfg, rid, address, internal, partitions)
        reports, staged = validated.reports, validated.staged
        check_change_limit(reports, cfg.validation.max_changed_share, cfg.input.rank_scale)
        contributions = (bound_contributions(staged, cfg.validation.contributions, internal,
                                             cfg.input.columns, validated.found)
                         if cfg.input.columns.person_id else None)
        record_validation(internal, reports, contributions)
        chunks, sizes = plan_chunks(staged, cfg.partition_tracts,
                                    validated.counts_after(contributions))
        location, worker_chunks = None, chunks
        if cfg.staging_url:  # the workers read the partitions there, not through the scheduler
            location = staging.release_location(cfg.staging_url, rid)
            worker_chunks = stage_chunks(chunks, validated.staged_urls(location, contributions))
        # quote: Prefect would otherwise visit each of the tracts' GEOIDs looking for futures
        # (0.4 s of the flow's own time at 74,000 tracts)
        boundaries = check_boundaries(quote(boundaries_read.result()), cfg.boundaries.path,
                                      quote(set(sizes["geoid"])))

        # 3. Allocate the budget; check the release can complete; charge the ledger (refused
        # over the cap) and take the release's lease, before any noise.
        budget = allocate_budget(cfg)
        # the level tasks, made once: the layout records them, and they are the ones drawn
        units = level_tasks(sizes) if budget.levels else []
        # a resume under another plan, or whose draws are grouped otherwise, is refused here
        plan = record_plan(internal, budget, draw_layout(chunks, units))
        if os.path.lexists(root / rid):  # a crash past publish: nothing is drawn again
            DrawLog(internal).require_recorded(
                _needed_draws(chunks, units),
                f"release {rid} is already published at {root / rid}")
        stage_parameters = {"chunks": worker_chunks, "budget": budget, "min_n": cfg.publish.min_n,
                            "internal": str(internal), "noise_seed": noise_seed,
                            "staging_location": location,
                            "groups": local_task_groups(cfg, partial(chunk_records, chunks, sizes))}
        cells = sorted(sizes["cell"].unique())
        # every subflow called after the charge, measured before it (the server refuses a
        # run whose parameters pass its limit: found then, the budget would be spent)
        subflows = [(select_and_estimate, stage_parameters),
                    (write_publish_parts, _publish_parameters(cfg, rid, internal, location,
                                                              chunks, cells, boundaries,
                                                              budget))]
        levels_parameters = levels_subflow_parameters(cfg, staged, chunks, worker_chunks, units,
                                                      budget, internal, noise_seed, location)
        if levels_parameters is not None:
            subflows.append((levels_on_workers, levels_parameters))
        preflight(cfg, rid, noise_seed, stage="before-charge", budget=budget, sizes=sizes,
                  subflows=subflows)
        charge_release(cfg.ledger, rid, budget, cells, start.config_sha256, owner, plan)
        with Ledger(cfg.ledger.url).leased(rid, owner, LEASE_SECONDS) as lease:
            crashpoint("after-ledger-charge")

            # 4-5. Select a mechanism per tract, then estimate, chunk by chunk.
            stage = select_and_estimate.with_options(
                task_runner=release_task_runner(cfg, address), flow_run_name=select_run_name(rid))
            with subflow_without_heartbeat():
                results = stage(**stage_parameters)
            # the levels on the workers too, with runner dask (flows/levels.py)
            level_results = estimate_release_levels(cfg, rid, address, staged, chunks,
                                                    worker_chunks, units, budget, internal,
                                                    noise_seed, location,
                                                    level_records(units, sizes))

            # 6. Publish: the parts of the map-ready files written on the task runner (the
            # workers), then committed here with the manifest (atomically, under the lease);
            # complete the ledger entry, then show the release in the feed.
            mark_root(cfg)
            plan, parts, archives, level_parts, overview = _publish_parts(
                cfg, rid, address, results, boundaries, budget, level_results, internal,
                location, chunks)
            compute_processes.close()  # the parts are written: its workers' work is done
            # quote: the parts carry every tract's GEOID and the overview's rows, which
            # Prefect would visit one by one looking for futures (none are there)
            folder = publish_release(cfg, rid, quote(plan), quote(parts), quote(archives),
                                     quote(level_parts), budget,
                                     start.input_sha256, _noise_source(internal, noise_seed),
                                     start.started, internal,
                                     _ledger_entry(cfg, rid, budget, cells),
                                     _input_facts(cfg, contributions), lease.check,
                                     quote(overview))
            crashpoint("after-publish")
            lease.check()
            complete_release(cfg.ledger, rid, folder, owner)
            crashpoint("after-ledger-complete")
        show_in_feed(root, rid, ledger_url=cfg.ledger.url, base_url=cfg.publish.base_url)
        return report_release(cfg.ledger, folder, "published", cfg.publish.base_url)


def publish_run_name(release_id: str) -> str:
    """The publish parts' subflow run: ``publish-parts-<id>`` (its task runs are
    ``publish-part-<part>`` and ``cell-tiles-<cell>``)."""
    return f"publish-parts-{release_id}"


@flow(name="dpatlas-publish-parts", persist_result=False)
def write_publish_parts(parts: list[PublishPart], job: PartJob, levels: list[LevelJob]
                        ) -> tuple[list[PartResult], list[tuple[TileJob, str]],
                                   list[LevelResult], Optional[MadeOverview]]:
    """Every part's tract files and every level's files (side by side), then every tract
    archive from the parts' features, as soon as the parts are written, and (several cells)
    each level's archive of each cell from its level task's features, and beside them the
    overview maps, each a task on the flow's task runner (the Dask workers with ``runner:
    dask``); nothing is published here (the release flow commits them). No archive is built
    once a part failed its output check, and none is kept once a level failed its check: the
    release is refused."""
    # the parts first: the tract archives and the overview wait for them, the levels can
    # finish beside those, on workers the parts leave free. The local runner's compute pool
    # takes work in the order its task threads reach it: when it has a process for every part
    # (a one-cell national release: two), the levels, started beside the parts, took a part's
    # process in two runs of four, whose publish stage took 15.0 and 16.0 s against 14.1-15.2
    # (docs/national.md), so there they start once the parts are written, after the overview.
    def start_levels():
        return publish_level.map(levels, unmapped(job)) if levels else None

    levels_wait = 0 < len(parts) <= pool_size()
    part_futures = publish_part.map(parts, unmapped(job))
    level_futures = None if levels_wait else start_levels()
    results = part_futures.result()
    if any(r.failed for r in results):
        level_futures = level_futures if level_futures is not None else start_levels()
        return results, [], level_futures.result() if level_futures is not None else [], None
    # the tract archives and, beside them, the overview maps and the levels
    # (not quoted: a quote is a tuple the Dask runner would take apart)
    tract_tiles = tile_jobs(results, list(job.cells))
    overview = publish_overview.submit(results, job)
    tract_built = publish_tiles.map(tract_tiles, unmapped(job)) if tract_tiles else None
    if levels_wait:
        level_futures = start_levels()
    level_results = level_futures.result() if level_futures is not None else []
    if any(not r.check[1].success for r in level_results):
        overview.wait()  # nothing left writing into the staging folder
        if tract_built is not None:
            tract_built.wait()
        return results, [], level_results, None
    # with several cells each level's archive of each cell
    level_tiles = level_tile_jobs(level_results)
    level_built = publish_tiles.map(level_tiles, unmapped(job)).result() if level_tiles else []
    built = (tract_built.result() if tract_built is not None else []) + level_built
    return (results, list(zip(tract_tiles + level_tiles, built)), level_results,
            overview.result())


def _publish_parts(cfg: ReleaseConfig, rid: str, address: Optional[str], results: list[Path],
                   boundaries, budget,
                   level_results: list[Path], internal: Path, location: Optional[str],
                   chunks: list[Chunk]):
    """The parts of the release written (none when it is already in place): with a staging
    location the parts read the chunks' results there and write there, else in the internal
    folder; on the release's Dask cluster (``address``) with ``runner: dask``."""
    # a crash after the rename: nothing to write (publish_release checks the folder)
    if release_folder(cfg.publish.root, rid) is not None:
        return None, [], [], [], None
    where, inputs = _publish_location(internal, location, chunks)
    plan = plan_publish(cfg, rid, results, boundaries, budget, level_results, where, inputs)
    # local runner: two threads more than the draws have, so the tract archive and the
    # overview start beside the level tasks still running (the threads mostly wait: on the
    # compute pool's workers or on tippecanoe)
    stage = write_publish_parts.with_options(task_runner=release_task_runner(
                                                 cfg, address, threads=LOCAL_WORKERS + 2),
                                             flow_run_name=publish_run_name(rid))
    with subflow_without_heartbeat():
        parts, archives, levels, overview = stage(plan.parts, plan.job, plan.level_jobs)
    return plan, parts, archives, levels, overview


def _publish_location(internal: Path, location: Optional[str], chunks: list[Chunk]
                      ) -> tuple[str, Optional[list[str]]]:
    """Where the parts are written, and where they read the chunks' results (None: the
    results in the internal folder)."""
    if location:
        return staging.join(location, "publish"), draw_urls(location, "estimate", chunks)
    return str(internal / "publish"), None


def _publish_parameters(cfg: ReleaseConfig, rid: str, internal: Path, location: Optional[str],
                        chunks: list[Chunk], cells: list, boundaries, budget) -> dict:
    """The publish subflow's parameters as :func:`_publish_parts` will pass them (the chunks'
    results are where ``select_and_estimate`` returns them), before anything is drawn."""
    where, inputs = _publish_location(internal, location, chunks)
    inputs = inputs or [str(draw_path(internal, "estimate", c.name))
                        for c in chunks]
    return publish_parameters(cfg, rid, inputs, [str(c) for c in cells], boundaries["geoid"],
                              budget, where)


def _needed_draws(chunks: list[Chunk], units: list[LevelTask]) -> set[tuple[str, str]]:
    """Every draw the release publishes: each chunk's selection and estimates, and each level
    task's (``units``: none without levels), as (stage, chunk) in its draw log."""
    return ({(stage, c.name) for c in chunks for stage in ("select", "estimate")}
            | {("levels", u.name) for u in units})


def _open_release_or_refuse(cfg: ReleaseConfig, rid: str, internal: Path, owner: str,
                            charged: bool = False):
    """Open (or resume) the release. A resume whose input or config changed is refused; if it
    was charged, the ledger marks it failed with why (its budget stays spent, never refunded),
    so it is not left looking in progress; the original input resumes it, failed or not.
    ``charged``: the ledger holds its charge (a missing draw log is refused)."""
    try:
        return open_release(cfg, internal, charged)
    except DrawLogMissing:
        row = Ledger(cfg.ledger.url).release(rid)
        holder = row.get("lease_owner") if row else None
        if holder and holder != owner:  # another host's run: its log is in its own folder
            raise DrawLogMissing(
                f"release {rid} is charged and its lease in the ledger is held (or was last "
                f"held) by {holder}: its draw log is in that owner's internal folder, not in "
                f"{internal}; wait for that run to finish, or resume it there (a release "
                "resumes only where its draw log is)") from None
        raise
    except InputChanged as err:
        what = err.what
        status = _fail_charge(cfg, rid, owner, f"the {what} changed since the charge; "
                                               f"restore the original {what} to resume")
        if status is not None:
            raise InputChanged(
                f"the {what} changed since release {rid} was charged: a release resumes only "
                f"on what it was charged for, so restore the original {what} and run again to "
                f"resume it with no new charge, or leave {rid} and start a new release id (the "
                f"budget charged for {rid} stays spent; the ledger lists it as {status})",
                err.changed) from None
        raise InputChanged(
            f"the {what} changed since release {rid} began (before its charge: nothing was "
            f"spent and no noise drawn): restore the original {what} and run again, or start "
            f"a new release id (or delete {internal} to start {rid} afresh)",
            err.changed) from None


def _fail_charge(cfg: ReleaseConfig, rid: str, owner: str, reason: str) -> str | None:
    """Mark the in-progress charge of ``rid`` failed, with ``reason``, unless another run
    holds it now. Returns its status in the ledger after (None: the ledger holds no charge)."""
    ledger = Ledger(cfg.ledger.url)
    row = ledger.release(rid)
    if row is None:
        return None
    if row["status"] != "in_progress":
        return row["status"]
    mine = row.get("lease_owner") == owner
    try:
        ledger.fail_release(rid, reason, owner if mine else None)
    except (ReleaseBusy, LeaseLost):  # another run holds it now: leave it to that run
        return row["status"]
    return "failed"


def _already_published(cfg: ReleaseConfig, rid: str) -> ReleaseOutcome:
    root = cfg.publish.root
    show_in_feed(root, rid, only_if_incomplete=True,  # completes an update a crash interrupted
                 ledger_url=cfg.ledger.url, base_url=cfg.publish.base_url)
    return report_release(cfg.ledger, root / rid, "already_published",
                          cfg.publish.base_url)


def _noise_source(internal: Path, noise_seed: Optional[int]) -> Counter:
    """The noise sources of the release's draws, as its log records them (a release begun
    seeded and resumed without a seed drew from both); draws recorded without one (migrated
    from state.json) are counted as this run's."""
    sources = DrawLog(internal).noise_sources()
    unknown = sum(n for source, n in sources.items() if source.startswith("unknown"))
    known = Counter({s: n for s, n in sources.items() if not s.startswith("unknown")})
    if unknown or not known:
        known[noise_source(noise_seed)] += unknown
    return known


def _ledger_entry(cfg: ReleaseConfig, rid: str, budget, cells: list[str]) -> dict:
    """The manifest's account of the charge: the ledger's charges summed."""
    charged = charges(budget, cells)
    return {"dataset": cfg.ledger.dataset, "release_id": rid, "charges": len(charged),
            "epsilon": sum(c.epsilon for c in charged),
            "delta": sum(c.delta for c in charged)}


def _input_facts(cfg: ReleaseConfig, contributions: Optional[dict]) -> dict:
    """What the manifest states about the privacy unit (see dpatlas.release.manifest.assumptions)."""
    return {"person_id_checked": contributions is not None,
            "person_id_column": cfg.input.columns.person_id,
            "contributions_policy": cfg.validation.contributions,
            "validation_policy": cfg.validation.policy}
