from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Optional

import geopandas as gpd
import pandas as pd
from prefect import get_run_logger, task

from dpatlas.core.config import Columns, InputConfig
from dpatlas.release.contributions import check_contributions
from dpatlas.release import cell_groups
from dpatlas.release.estimate import (Chunk, all_sizes, split_into_chunks, staged_counts,
                                      tracts_of)
from dpatlas.core.files import write_atomic, write_json_atomic
from dpatlas.core.memory import return_arrow_memory
from dpatlas.release import staged_layout
from dpatlas.release.boundaries import load_boundaries
from dpatlas.release.task_groups import group_label
from dpatlas.release.validation_groups import ROWS_IN_HAND, apply_policy_to_group
from dpatlas.release.validate import (BoundaryCoverageError, check_changed_share,
                                      check_one_partition_per_tract, check_rank_scale,
                                      input_column_names, write_release_docs)

from .common import RETRY_IO, TASK_OPTIONS
from .ingest import ingest_partition


def _validation_run_name() -> str:
    from prefect.runtime import task_run

    return f"validate-{group_label(task_run.parameters['keys'])}"


@task(name="validate", task_run_name=_validation_run_name, **RETRY_IO)
def validate_partitions(cfg: InputConfig, policy: str, keys: list[str], internal: Path,
                        cells: list[tuple[str | None, ...] | None], rows: int
                        ) -> list[tuple[Path, dict]]:
    """Read partitions ``keys`` (``cells``: each one's, as listed), apply the input contract
    (one run for them all: :mod:`dpatlas.release.validation_groups`) and stage each one's
    clean rows for the later stages. One task, not an ingest task and a validate task: the
    frames never leave the task, and the flow schedules half as many task runs. The
    validation report names the input file or folder as the data asset. ``rows``: their
    records as listed, held in hand beside the other task's within a bound
    (:class:`~dpatlas.release.validation_groups.RowsInHand`)."""
    with ROWS_IN_HAND.holding(rows):
        try:
            return _read_check_stage(cfg, policy, keys, internal, cells)
        finally:  # the frames are gone: what they and the staging passed through the pool
            return_arrow_memory()


def _read_check_stage(cfg: InputConfig, policy: str, keys: list[str], internal: Path,
                      cells: list[tuple[str | None, ...] | None]) -> list[tuple[Path, dict]]:
    frames = [(key, ingest_partition(cfg, key, part_cells))
              for key, part_cells in zip(keys, cells)]
    return_arrow_memory()  # the tables the frames were read from, before the check
    checked = apply_policy_to_group(frames, policy, internal, str(cfg.path),
                                    input_column_names(cfg.columns))
    del frames
    staged = []
    for clean, report in checked:
        path = internal / "staged" / f"input-{report.partition}.parquet"
        # laid out to be read back by GEOID range and cells
        write_atomic(path, partial(staged_layout.write, clean), private=True)
        get_run_logger().info("partition %s: %d rows valid, %d quarantined, %d clipped, "
                              "%d dropped", report.partition, report.rows_out,
                              report.quarantined, report.clipped, report.dropped)
        staged.append((path, report.as_dict()))
    return staged


@task(name="validation-docs", **RETRY_IO)
def build_validation_docs(internal: Path) -> Path:
    """The release's Data Docs site with every input partition's validation, rendered once
    after the last partition (not after each one)."""
    return write_release_docs(internal)


@task(name="check-changed-share", **TASK_OPTIONS)
def check_change_limit(reports: list[dict], max_share: float,
                       rank_scale: str = "unit") -> None:
    """Refuse when clip/drop changed more than ``max_share`` of all input rows, or when
    declared percentiles never exceed 1 (ranks on [0, 1])."""
    check_changed_share(reports, max_share)
    check_rank_scale(reports, rank_scale)


@task(name="check-contributions", **TASK_OPTIONS)
def bound_contributions(staged: list[Path], policy: str, internal: Path,
                        columns: Columns | None = None, found=None) -> dict:
    """At most one record per (person, cell) across every staged partition: fail or bound.
    ``columns`` (``input.columns``) names the quarantine file's columns; ``found``: the
    repeated hashes found on the workers (see check_contributions)."""
    report = check_contributions(staged, policy, internal,
                                 input_column_names(columns) if columns else None, found)
    if report["checked"]:
        get_run_logger().info("contributions (%s): %d records, %d person(s) with several "
                              "records in a cell, %d record(s) removed", policy,
                              report["records"], report["persons_repeated"],
                              report["records_removed"])
    return report


@task(name="read-boundaries", **RETRY_IO)
def read_boundaries(path: Path, geoid_column: str) -> gpd.GeoDataFrame:
    """The boundary file's tracts, checked (:func:`~dpatlas.release.boundaries.load_boundaries`):
    public, so read beside the input's validation, not after it."""
    return load_boundaries(path, geoid_column)


@task(name="check-boundaries", **TASK_OPTIONS)
def check_boundaries(boundaries: gpd.GeoDataFrame, path: Path,
                     data_geoids: set[str]) -> gpd.GeoDataFrame:
    """``boundaries`` (read from ``path``) with a polygon for every tract of the data, else
    refused before any noise is drawn."""
    missing = sorted(data_geoids - set(boundaries["geoid"]))
    if missing:
        raise BoundaryCoverageError(
            f"{len(missing)} tract(s) in the data have no boundary in {path} "
            f"(e.g. {', '.join(missing[:5])}); no noise was drawn and nothing was published. "
            "Use a boundary file that covers every tract of the input.")
    get_run_logger().info("boundaries: %d tracts, covering all %d tracts with data",
                          len(boundaries), len(data_geoids))
    return boundaries


@task(name="record-validation", **RETRY_IO)
def record_validation(internal: Path, reports: list[dict], contributions: dict | None) -> Path:
    """What validation did (internal, not DP): ``validation.json`` in the internal folder."""
    return write_json_atomic(internal / "validation.json",
                             {"partitions": reports, "contributions": contributions},
                             private=True, indent=2, default=str)


@task(name="plan-chunks", **TASK_OPTIONS)
def plan_chunks(staged: list[Path], chunk_tracts: int,
                counts: Optional[dict[Path, pd.DataFrame]] = None
                ) -> tuple[list[Chunk], pd.DataFrame]:
    """The chunks to select and estimate, and n per (tract, cell) for the pre-charge checks.
    ``counts``: staged files' counts made by their validation tasks (the others are read)."""
    counts = staged_counts(staged, counts)
    sizes = all_sizes(counts)
    check_one_partition_per_tract(counts, sizes)
    chunks = split_into_chunks(tracts_of(counts), chunk_tracts, counts)
    split = sum(c.cells is not None for c in chunks)
    get_run_logger().info("%d tract-cells in %d chunk(s) of up to %d tracts%s", len(sizes),
                          len(chunks), chunk_tracts,
                          f" ({split} of them a group of cells, up to {cell_groups.TASK_RECORDS:,} "
                          "records each)" if split else "")
    return chunks, sizes
