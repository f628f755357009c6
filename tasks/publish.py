from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Optional

import geopandas as gpd
import pandas as pd
from prefect import get_run_logger, task

from dpatlas.publication import feed as feed_files
from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.compute_pool import compute
from dpatlas.core.config import ReleaseConfig, public_config
from dpatlas.publication.feed import update_feed
from dpatlas.release.manifest import build_manifest, input_commitment
from dpatlas.publication.cell_stream import CellGroupChecks, finish_release, release_cells
from dpatlas.publication.model_estimates import fit_summary
from dpatlas.publication.cell_tiles import LEVEL_MANIFEST_KEY as LEVEL_CELL_TILES_KEY
from dpatlas.publication.release_parts import (LevelJob, LevelResult, MadeOverview, PartJob,
                                               PartResult, PublishPart, TileJob,
                                               boundaries_location,
                                               build_tile_job, collect, collect_levels,
                                               level_cell_tiles, level_jobs,
                                               level_rows_location, model_fits, part_project,
                                               plan_level_jobs, plan_parts, remove_parts,
                                               write_boundaries, write_level_part,
                                               write_level_rows,
                                               write_overview, write_part)
from dpatlas.publication.level_files import assemble_level
from dpatlas.publication.tract_files import (PublishError, release_folder, stage_release,
                                             standard_error_maximum, verify_release)
from dpatlas.release.outcome import format_counts
from dpatlas.release.validate import write_release_docs
from dpatlas.release.validation_report import record_run

from .common import RETRY_IO, TASK_OPTIONS


@dataclass
class PublishPlan:
    """What publishing a release is made of: its cells, its county and state tables, its
    parts and what every part reads (dpatlas.publication.release_parts)."""
    cells: list[str]
    levels: dict
    parts: list[PublishPart]
    job: PartJob
    level_jobs: list[LevelJob]


def plan_publish(cfg: ReleaseConfig, release_id: str, result_files: list[Path],
                 boundaries: gpd.GeoDataFrame, budget: BudgetPlan,
                 level_files: Optional[list[Path]], location: str,
                 part_inputs: Optional[list[str]] = None) -> PublishPlan:
    """The parts of the release and what they read, written to ``location`` (the
    boundaries, the county and state rows: public values and DP outputs). ``result_files``:
    the chunks' results here; ``part_inputs``: the same where the parts read them (URLs of
    the staging location; default ``result_files``)."""
    cells = release_cells(result_files)
    levels = assemble_levels(level_files or [], boundaries, budget, cells)
    job = _part_job(cfg, release_id, part_inputs or result_files, cells, budget, location,
                    write_boundaries(boundaries, location), write_level_rows(levels, location))
    return PublishPlan(cells, levels, plan_parts(cells, boundaries["geoid"]), job,
                       level_jobs(levels, boundaries["geoid"], cells, location))


def publish_parameters(cfg: ReleaseConfig, release_id: str, part_inputs: list[str],
                       cells: list[str], geoids, budget: BudgetPlan, location: str) -> dict:
    """The publish subflow's parameters as :func:`plan_publish` will make them, from public
    values alone and writing nothing: the preflight measures them against the Prefect
    server's limit before the charge (found after it, the budget would be spent on a release
    that cannot publish)."""
    levels = [lp.level for lp in budget.levels]
    job = _part_job(cfg, release_id, part_inputs, cells, budget, location,
                    boundaries_location(location),
                    level_rows_location(location) if levels else None)
    return {"parts": plan_parts(cells, geoids), "job": job,
            "levels": plan_level_jobs(levels, geoids, cells, location)}


def _part_job(cfg: ReleaseConfig, release_id: str, inputs, cells: list[str],
              budget: BudgetPlan, location: str, boundaries_at: str,
              levels_at: Optional[str]) -> PartJob:
    return PartJob(release_id=release_id, config=public_config(cfg),
                   results=tuple(str(p) for p in inputs), boundaries=boundaries_at,
                   levels=levels_at, location=location, cells=tuple(cells),
                   model_steps=(tuple(s.as_dict() for s in budget.steps)
                                if cfg.small_area.model else None),
                   standard_error_max=standard_error_maximum())


@task(name="publish-part", task_run_name="publish-part-{part.name}", **TASK_OPTIONS)
def publish_part(part: PublishPart, job: PartJob) -> PartResult:
    """One part's tract files (some states, or the whole release of one state), written where
    the flow collects them; draws no noise (DP outputs and public values only)."""
    result = compute(write_part, part, job)  # in a compute-pool worker, when there is one
    log = get_run_logger()
    for fit in result.model_fits:
        log.info("small-area model, cell %s, state %s: %s", fit["cell"], fit["state"],
                 fit_summary(fit))
    log.info("part %s: %d rows in %d file(s)%s", part.name, result.summary.rows,
             len(result.files), " (an output check failed)" if result.failed else "")
    return result


@task(name="publish-level", task_run_name="publish-level-{level.name}", **TASK_OPTIONS)
def publish_level(level: LevelJob, job: PartJob) -> LevelResult:
    """One level's files of its job's cells (``counties.*``, ``states.*``, with one cell
    their tiles), checked against its contract, written where the flow collects them."""
    return compute(write_level_part, level, job)


@task(name="overview", task_run_name="overview", **TASK_OPTIONS)
def publish_overview(results: list[PartResult], job: PartJob) -> MadeOverview:
    """The overview maps and footprint of every part's overview rows, written where the flow
    collects them, while the archives are built; draws no noise."""
    return compute(write_overview, results, job)


@task(name="cell-tiles", task_run_name="cell-tiles-{tile.name}", **TASK_OPTIONS)
def publish_tiles(tile: TileJob, job: PartJob) -> str:
    """One tract archive from every part's features of its cell; where it was built."""
    return build_tile_job(tile, job)


def already_published(cfg: ReleaseConfig, release_id: str) -> Optional[Path]:
    """The release's folder when a crash came after it became visible (one rename: it is
    complete; checked here), else None."""
    final = release_folder(cfg.publish.root, release_id)  # refuses a symlink or a file there
    if final is not None:
        verify_release(final)
    return final


@task(name="publish", **RETRY_IO)
def publish_release(cfg: ReleaseConfig, release_id: str, plan: Optional[PublishPlan],
                    parts: list[PartResult], archives: list[tuple[TileJob, str]],
                    level_parts: list[LevelResult], budget: BudgetPlan, input_sha256: str,
                    random_source: str | Mapping[str, int], started: str, internal: Path,
                    ledger_entry: dict, input_facts: dict,
                    check_lease: Optional[Callable[[], None]] = None,
                    overview: Optional[MadeOverview] = None) -> Path:
    """Commit the parts: record their output checks and the level files' (refused if one
    broke its contract), collect their files, archives and the county and state files into a
    staging folder, add the maps, the web map and the manifest, and publish the release
    atomically.

    ``plan``: None when the release was already in place (a crash after the rename).
    ``internal``: the release's internal folder (the staging folder goes there).
    ``input_facts``: see :func:`dpatlas.release.manifest.assumptions`. ``check_lease``: the
    ledger lease's check, called right before the release becomes visible. ``overview``: the
    overview maps and footprint made beside the archives (None: drawn here)."""
    final = already_published(cfg, release_id)
    if final is not None:
        get_run_logger().info("release %s is already in place at %s; checked", release_id, final)
        return final
    _record_part_checks(parts, level_parts, internal)
    levels = plan.levels
    fits = model_fits(parts) if cfg.small_area.model else None
    commitment = input_commitment(input_sha256, internal)
    counts: dict = {}  # the manifest's counts, for the log line

    # the tract archives, and (several cells) each level's archive of each cell
    tract_archives = [a for a in archives if a[0].level == "tract"]
    level_archives = [a for a in archives if a[0].level != "tract"]

    def manifest_of(summary) -> dict:
        manifest = build_manifest(cfg, release_id, budget, summary, commitment, random_source,
                                  started, input_facts, ledger_entry, levels, fits)
        if level_archives:
            manifest[LEVEL_CELL_TILES_KEY] = level_cell_tiles(level_archives)
        counts.update(manifest["counts"])
        return manifest

    level_suites = {r.job.level: r.check[1].suite for r in level_parts}

    def finish(tract_suites: list[str]) -> dict:  # the checks ran in the parts: the Data Docs
        contract = _check_output_contracts({}, cfg, internal, tract_suites)
        if level_suites:
            contract["output_contract"]["level_suites"] = level_suites
        return contract

    checks = CellGroupChecks(group=_never, finish=finish)
    config = public_config(cfg)

    def stage(staging: Path) -> tuple[list[str], dict]:
        streamed = collect(staging, parts, tract_archives, overview)
        return finish_release(staging, streamed, release_id, config, checks, manifest_of,
                              partial(collect_levels, results=level_parts,
                                      archives=level_archives))

    folder = stage_release(cfg.publish.root, release_id, stage, config=config,
                           internal_dir=internal, check_lease=check_lease)
    remove_parts(plan.job.location)
    get_run_logger().info("published release %s at %s (%s)", release_id, folder,
                          format_counts(counts["by_status"]))
    return folder


def _never(rows, index, count) -> str:  # the parts checked every group of tract rows
    raise AssertionError("a committed release's tract groups were checked in their parts")


def _record_part_checks(parts: list[PartResult], level_parts: list[LevelResult],
                        internal: Path) -> None:
    """Every part's output checks and every level's in the release's report and Data Docs
    (their GX runs copied into its project); a broken contract refuses the release, saying
    what broke."""
    from data_contracts import ReleaseDocs, import_release_runs

    release = ReleaseDocs.in_folder(internal)
    for part in parts:
        asset = "the release's tract table, as it would be published"
        if part.part.states is not None:
            asset += f" (states {', '.join(part.part.states)})"
        for run, check in part.checks:
            record_run(internal, run, asset, check)
    for level in level_parts:
        asset = f"the release's {level.job.level} table, as it would be published"
        if level.job.pieces > 1:  # a level cut by its cells: this run checked some of them
            asset += f" (cells {', '.join(level.job.cells)})"
        record_run(internal, level.check[0], asset, level.check[1])
    for written in [*parts, *level_parts]:
        with part_project(written) as project:
            import_release_runs(ReleaseDocs(project, project.parent / ".gx-docs"), release)
    broken = [("release table", check) for part in parts for _, check in part.checks
              if not check.success]
    broken += [(f"{level.job.level} table", level.check[1]) for level in level_parts
               if not level.check[1].success]
    if broken:
        write_release_docs(internal)  # the refused check in the Data Docs site
        name, check = broken[0]
        raise PublishError(f"the {name} breaks its output contract; nothing was "
                           f"published:\n{check.summary()}")


def _check_output_contracts(rows: dict, cfg: ReleaseConfig, internal: Path,
                            tract_suites: list[str]) -> dict:
    """The county and state tables (``rows``: level -> its rows and the boundaries' units)
    against their output contracts (PublishError if one is broken), then the checks' Data
    Docs, rendered once; returns the manifest's ``output_contract``. ``tract_suites``: the
    suites the tract table's groups of cells were checked against already."""
    suites = {level: _check_contract(level, table, units, cfg, internal)
              for level, (table, units) in rows.items()}
    write_release_docs(internal)  # the output checks' Data Docs, rendered once
    contract = {"suite": tract_suites[0], "success": True}
    if suites:
        contract["level_suites"] = suites
    return {"output_contract": contract}


def _check_contract(level: str, table: pd.DataFrame, units: Optional[list], cfg: ReleaseConfig,
                    internal: Path, run: Optional[str] = None) -> str:
    """One level's table against its output contract (PublishError if broken). ``run``: the
    run's name (default ``published``, ``published-<level>`` above the tract)."""
    from data_contracts import ReleaseDocs, validate_published, validate_published_level

    release, se_max = ReleaseDocs.in_folder(internal), standard_error_maximum()
    run = run or ("published" if level == "tract" else f"published-{level}")
    if level == "tract":
        check = validate_published(table, boundary_geoids=units, standard_error_max=se_max,
                                   release=release, run_name=run)
    else:
        check = validate_published_level(table, level, boundary_units=units,
                                         standard_error_max=se_max, release=release,
                                         run_name=run)
    record_run(internal, run, f"the release's {level} table, as it would be published", check)
    if not check.success:
        write_release_docs(internal)  # the refused check in the Data Docs site
        name = "release table" if level == "tract" else f"{level} table"
        raise PublishError(f"the {name} breaks its output contract; nothing was "
                           f"published:\n{check.summary()}")
    return check.suite


def assemble_levels(level_files: list[Path], boundaries: gpd.GeoDataFrame, budget: BudgetPlan,
                    cells: list[str]) -> dict:
    """Each level's table (county, state), over the tract table's ``cells`` (sorted)."""
    if not budget.levels:
        return {}
    results = pd.concat([pd.read_parquet(p) for p in level_files], ignore_index=True)
    cells = cells or ["all"]  # the tract table of a release without records has cell "all"
    return {lp.level: assemble_level(results, boundaries, lp.level, cells)
            for lp in budget.levels}


@task(name="feed", **RETRY_IO)
def show_in_feed(root: Path, release_id: str, only_if_incomplete: bool = False,
                 ledger_url: Optional[str] = None, base_url: Optional[str] = None) -> None:
    """Add the release to the feed (idempotent: also completes an update a crash interrupted).

    ``only_if_incomplete``: write nothing when the feed already shows the release whole (a
    rerun of a published id must work on a read-only publish root). With ``ledger_url``, a
    missing or corrupt feed is first rebuilt from the release folders and that ledger."""
    damage = feed_files.feed_damage(root, adding=release_id) if ledger_url else None
    if damage is not None:
        rebuild_feed_from_ledger(root, ledger_url, damage)
    if only_if_incomplete and feed_shows(root, release_id):
        return
    try:
        update_feed(root, release_id, base_url)
    except feed_files.FeedError as e:
        raise feed_files.FeedError(
            f"release {release_id} is published and charged (its folder {Path(root) / release_id}"
            f" and the ledger say so), but the feed at {root} could not list it: {e}; fix "
            f"that, then rerun the same release id to list it") from e


def rebuild_feed_from_ledger(root: Path, ledger_url: str, damage: str) -> dict:
    """Rebuild the feed's indexes from the release folders and the ledger, saying why and
    what they list now."""
    from dpatlas.ledger import Ledger

    with Ledger(ledger_url, create=False) as ledger:
        done = feed_files.rebuild_feed(root, ledger.release)
    skipped = "; ".join(f"{rid}: {why}" for rid, why in done["skipped"].items()) or "none"
    print(  # a flow logs its tasks' prints (log_prints); outside one, the console shows it
        f"{damage}: feed.json, feed.atom and the STAC catalogue were rebuilt from the release "
        f"folders and the ledger: {len(done['releases'])} release(s) "
        f"({len(done['withdrawn'])} withdrawn), {len(done['synthetic'])} synthetic; folders "
        f"not listed: {skipped}")
    return done


def feed_shows(root: Path, release_id: str) -> bool:
    """The feed lists the release and its last update finished: the ``latest`` pointer and
    link (written last) agree with feed.json, and feed.atom names the release."""
    root = Path(root)
    feed = feed_files.read_feed(root)
    if feed_files.listed(root, release_id) is None:
        return False
    newest = feed.get("latest")
    link = root / feed_files.LATEST_LINK
    linked = os.readlink(link) if os.path.islink(link) else None
    atom = root / feed_files.FEED_ATOM
    return (feed_files.latest(root) == newest and linked == newest and atom.is_file()
            and release_id in atom.read_text(encoding="utf-8", errors="replace"))
