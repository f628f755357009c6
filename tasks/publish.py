from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Optional

import geopandas as gpd
import pandas as pd
from prefect import get_run_logger, task

from dpatlas.publication import feed as feed_files
from dpatlas.release.allocate import BudgetPlan
from dpatlas.core.config import ReleaseConfig, public_config
from dpatlas.publication.feed import update_feed
from dpatlas.release.manifest import build_manifest, input_commitment
from dpatlas.publication.cell_stream import (CellGroupChecks, assembled_groups, cell_groups,
                                            release_cells, write_release_by_cells)
from dpatlas.publication.model_estimates import add_model_estimates
from dpatlas.publication.tiles import release_tile_text
from dpatlas.publication.level_files import assemble_level, unit_of, write_all_levels
from dpatlas.publication.tract_files import (PublishError, release_folder,
                                             standard_error_maximum, verify_release)
from dpatlas.release.outcome import format_counts
from dpatlas.release.validate import write_release_docs
from dpatlas.release.validation_report import record_run

from .common import RETRY_IO


@task(name="publish", **RETRY_IO)
def publish_release(cfg: ReleaseConfig, release_id: str, result_files: list[Path],
                    boundaries: gpd.GeoDataFrame, budget: BudgetPlan, input_sha256: str,
                    random_source: str | Mapping[str, int], started: str, internal: Path,
                    ledger_entry: dict, input_facts: dict,
                    check_lease: Optional[Callable[[], None]] = None,
                    level_files: Optional[list[Path]] = None) -> Path:
    """Assemble, check against the output contract, and publish the release atomically.

    ``internal``: the release's internal folder (the files are staged there, outside the
    public tree). ``input_facts``: see :func:`dpatlas.release.manifest.assumptions`. ``check_lease``:
    the ledger lease's check, called right before the release becomes visible.
    ``level_files``: the county and state estimates (with levels beyond the tract).
    """
    final = release_folder(cfg.publish.root, release_id)  # refuses a symlink or a file there
    if final is not None:
        # A crash after the folder became visible: it is complete (one rename), check it.
        verify_release(final)
        get_run_logger().info("release %s is already in place at %s; checked", release_id, final)
        return final
    # A group of cells at a time (dpatlas.publication.cell_stream): the flow's memory does
    # not grow with the number of cells.
    cells = release_cells(result_files)
    groups = cell_groups(cells, len(boundaries))
    levels = assemble_levels(level_files or [], boundaries, budget, cells)
    model_fits = [] if cfg.small_area.model else None
    model = (partial(_with_model_estimates, levels, [s.as_dict() for s in budget.steps],
                     model_fits) if model_fits is not None else None)
    commitment = input_commitment(input_sha256, internal)

    counts: dict = {}  # the manifest's counts, for the log line

    def manifest_of(summary) -> dict:  # once every group is written: the fits are all in
        manifest = build_manifest(cfg, release_id, budget, summary, commitment, random_source,
                                  started, input_facts, ledger_entry, levels, model_fits)
        counts.update(manifest["counts"])
        return manifest

    geoids = list(boundaries["geoid"])
    level_rows = _level_rows_to_check(levels, boundaries)
    folder = write_release_by_cells(
        assembled_groups(result_files, groups, boundaries, model), cells,
        manifest_of, cfg.publish.root, release_id, config=public_config(cfg),
        checks=CellGroupChecks(
            group=partial(_check_tract_group, geoids, cfg, internal),
            finish=partial(_check_output_contracts, level_rows, cfg, internal)),
        group_count=len(groups), internal_dir=internal, check_lease=check_lease,
        more_files=partial(write_all_levels, levels, interval_level=cfg.intervals.level,
                           tile_text=partial(release_tile_text, release_id, public_config(cfg))))
    get_run_logger().info("published release %s at %s (%s)", release_id, folder,
                          format_counts(counts["by_status"]))
    return folder


def _with_model_estimates(levels: dict, steps: list[dict], fits: list[dict],
                          table: gpd.GeoDataFrame) -> gpd.GeoDataFrame:
    """A group's table with the small-area model's columns (post-processing of the tables as
    published, no budget; fitted per cell and state), its fits added to ``fits``."""
    table, group_fits = add_model_estimates(table, levels, get_run_logger(), steps)
    fits.extend(group_fits)
    return table


def _check_tract_group(geoids: Optional[list], cfg: ReleaseConfig, internal: Path, rows: pd.DataFrame,
                       index: int, count: int) -> str:
    """One group of cells' tract rows against the tract contract. The groups' runs make the
    whole table's checks: each row's checks in its group's run; (geoid, cell) unique in each
    group, and across groups since no cell is in two; every boundary tract in the table,
    checked in the first group's run alone (a run copies the boundary GEOIDs into each of
    its expectations: a run per group with them cost more than the checks themselves). Its
    run is ``published``, ``published-<k>-of-<count>`` with several groups."""
    run = "published" if count == 1 else f"published-{index + 1}-of-{count}"
    return _check_contract("tract", rows, geoids if index == 0 else None, cfg, internal, run)


def _level_rows_to_check(levels: dict, boundaries: gpd.GeoDataFrame) -> dict:
    """What the output checks of the county and state tables read, taken apart from the
    frames the writers read (pandas may consolidate a frame's blocks in place while reading
    it: no frame is shared with a thread that writes): level -> the table's rows without
    geometry and the boundaries' units at that level. (The tract table's groups are checked
    as they are written: :func:`_check_tract_group`.)"""
    geoids = list(boundaries["geoid"])
    return {level: (pd.DataFrame(t.drop(columns="geometry")), list(unit_of(geoids, level)))
            for level, t in levels.items()}


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
