"""Validation of the release's input: every partition, then what the contributions check needs.

The local runner validates the partitions on the release flow's two threads, in the release's
own GX project (:func:`_validate_partitions`), and the contributions check hashes in the flow.
With ``runner: dask`` both run on the release's workers, in a subflow of their own
(``dpatlas-validate``, run ``validate-<release id>``, task runs ``validate-<key>`` and
``contribution-bucket-<k>``): each partition is checked in a GX project of its own and staged
at the staging location (or in the internal folder the workers share), its (person, cell)
hashes written beside it, then one task per bucket of hashes finds the repeated ones. This
flow then imports every partition's run into the release's project and records it in the
offline report, in partition order, and renders the Data Docs once; a refusal names the
partition, after its run is in the site. Nothing is drawn or charged before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pandas as pd
from prefect import flow, unmapped
from prefect.futures import wait

from dpatlas.core.config import ReleaseConfig
from dpatlas.core.files import write_bytes_atomic
from dpatlas.core.locations import join, readable_folder, remove_tree
from dpatlas.release import staging
from dpatlas.release.contribution_buckets import BUCKETS, merge_buckets
from dpatlas.release.ingest import Partition
from dpatlas.release.validate import (ValidationFailed, input_column_names, quarantine_path,
                                      record_input_run)
from dpatlas.release.validation_groups import input_groups
from dpatlas.release.validate_parts import (GX_FOLDER, HASHES_FOLDER, PARTS_FOLDER,
                                            ValidatedPart)
from dpatlas.release.validation_report import report_index
from flows.cluster import release_task_runner, subflow_without_heartbeat
from tasks import validate_workers
from tasks.validate import build_validation_docs, validate_partitions


@dataclass
class ValidatedInput:
    """Every partition's report and staged rows (local files, in partition order); ``found``:
    the contributions check's repeated hashes, found on the workers (None: the check hashes
    itself); ``at_location``: the staged rows' URLs at the staging location, when the workers
    wrote them there."""

    reports: list[dict]
    staged: list[Path]
    found: Optional[tuple[dict, int]] = None
    at_location: dict[Path, str] = field(default_factory=dict)
    counts: dict[Path, pd.DataFrame] = field(default_factory=dict)  # n per (geoid, cell)

    def counts_after(self, contributions: Optional[dict]) -> dict[Path, pd.DataFrame]:
        """Each staged file's n per (geoid, cell), counted by its validation task, for the
        files the contributions check did not rewrite since (those are counted again)."""
        rewritten = _rewritten(contributions)
        return {p: c for p, c in self.counts.items() if p not in rewritten}

    def staged_urls(self, location: str, contributions: Optional[dict]) -> dict[Path, str]:
        """Each staged file's URL at ``location``: copied there, unless the workers wrote it
        there and the contributions check did not rewrite it since."""
        rewritten = _rewritten(contributions)
        urls = {p: u for p, u in self.at_location.items() if p not in rewritten}
        urls.update(staging.stage_files([p for p in self.staged if p not in urls], location))
        return urls


def _rewritten(contributions: Optional[dict]) -> set[Path]:
    """The staged files the contributions check rewrote (its report's ``files_rewritten``)."""
    return {Path(p) for p in (contributions or {}).get("files_rewritten", [])}


def validation_run_name(release_id: str) -> str:
    return f"validate-{release_id}"


def validate_release_input(cfg: ReleaseConfig, release_id: str, address: Optional[str],
                           internal: Path, parts: list[Partition]) -> ValidatedInput:
    """Validate and stage every partition of ``parts`` (the input's, as listed): on the flow's
    threads (local runner) or on the release's workers (``runner: dask``, its cluster at
    ``address``)."""
    if cfg.runner != "dask":
        return ValidatedInput(*_validate_partitions(cfg, internal, parts))
    where = (staging.release_location(cfg.staging_url, release_id) if cfg.staging_url
             else str(internal))
    subflow = validate_on_workers.with_options(task_runner=release_task_runner(cfg, address),
                                               flow_run_name=validation_run_name(release_id))
    try:
        with subflow_without_heartbeat():
            validated, found = subflow(cfg.input, cfg.validation.policy,
                                       [p.key for p in parts], [p.cells for p in parts],
                                       str(internal), where, str(report_index(internal)),
                                       bool(cfg.input.columns.person_id))
    except BaseException:
        # A task failed (an unreadable partition, a worker lost): what the others wrote there
        # is not recorded, and a rerun validates every partition again. The rows they set
        # aside are person-level: none is left at the staging location (the internal folder
        # keeps its own, as the local runner's do).
        _remove_unrecorded(where, elsewhere=where != str(internal))
        raise
    finally:
        remove_tree(join(where, HASHES_FOLDER))  # person-level hashes: not kept
    return _record_parts(cfg, internal, where, validated, found)


def _remove_unrecorded(where: str, elsewhere: bool) -> None:
    """The partitions' GX projects, and at a staging location (``elsewhere``) their
    quarantine files and staged rows, written by validation tasks whose run the flow never
    recorded."""
    remove_tree(join(where, PARTS_FOLDER))
    if elsewhere:
        remove_tree(join(where, "quarantine"))
        remove_tree(join(where, "staged"))


@flow(name="dpatlas-validate", persist_result=False)
def validate_on_workers(input_cfg, policy: str, keys: list[str], cells: list, internal: str,
                        where: str, docs_index: str, hash_ids: bool
                        ) -> tuple[list[ValidatedPart], Optional[tuple[dict, int]]]:
    """Every partition's validation, one task each, then (when every partition passed and
    ``hash_ids``) one task per bucket of their (person, cell) hashes."""
    futures = validate_workers.validate_partition.map(
        unmapped(input_cfg), unmapped(policy), keys, unmapped(internal), unmapped(where),
        unmapped(docs_index), unmapped(hash_ids), cells)
    validated = futures.result()  # an input error (not a broken contract) raises here
    hashed = [part.hashes for part in validated]
    if not hash_ids or any(part.refusal for part in validated) or None in hashed:
        return validated, None
    buckets = validate_workers.find_repeated.map(list(range(BUCKETS)),
                                                 unmapped(hashed)).result()
    return validated, (merge_buckets(buckets), sum(p.report["rows_out"] for p in validated))


def _record_parts(cfg: ReleaseConfig, internal: Path, where: str,
                  validated: list[ValidatedPart], found) -> ValidatedInput:
    """Every partition's run in the release's project and offline report (partition order),
    its quarantine file and staged rows in the internal folder, then the Data Docs once; the
    first refusal raised after."""
    from data_contracts import ReleaseDocs, import_release_runs

    release, columns = ReleaseDocs.in_folder(internal), input_column_names(cfg.input.columns)
    elsewhere = where != str(internal)  # at the staging location: copied here
    reports, staged, at_location, counts = [], [], {}, {}
    for part in validated:
        with readable_folder(part.project) as folder:
            import_release_runs(ReleaseDocs(folder / GX_FOLDER, folder / ".gx-docs"), release)
        qfile = quarantine_path(internal, part.key) if part.quarantine else None
        if qfile is not None and elsewhere:
            write_bytes_atomic(qfile, staging.read_bytes(part.quarantine), private=True)
        record_input_run(internal, part.key, cfg.validation.policy, part.check, qfile,
                         str(cfg.input.path), columns)
        if part.refusal:
            continue
        reports.append(part.report)
        local = internal / "staged" / f"input-{part.key}.parquet"
        if elsewhere:  # the flow's own readers (chunk plan, levels, contributions) read a copy
            write_bytes_atomic(local, staging.read_bytes(part.staged), private=True)
            at_location[local] = part.staged
        staged.append(local)
        if part.counts is not None:
            counts[local] = part.counts
    remove_tree(join(where, PARTS_FOLDER))
    if elsewhere:  # the offending rows are kept in the internal folder only
        remove_tree(join(where, "quarantine"))
    build_validation_docs(internal)
    refused = [part for part in validated if part.refusal]
    if refused:
        raise ValidationFailed(refused[0].refusal)
    return ValidatedInput(reports, staged, found, at_location, counts)


def _validate_partitions(cfg: ReleaseConfig, internal: Path, parts: list[Partition]
                         ) -> tuple[list[dict], list[Path]]:
    """Read and validate every partition, one task per group of partitions (one each unless
    the input has many: :func:`~dpatlas.release.validation_groups.input_groups`), two at a
    time (the flow's task runner: one group is read and staged while another is checked; the
    checks themselves take turns, GX's context being one per release and not thread-safe).
    The two hold at most one partition's records together (a larger group waits to be alone:
    :class:`~dpatlas.release.validation_groups.RowsInHand`).
    Results come back in partition order, and a partition that breaks the contract refuses
    the release with its own message (the first such in partition order). Then the release's
    Data Docs site is rendered once, with every run."""
    futures = [validate_partitions.submit(cfg.input, cfg.validation.policy,
                                          [part.key for part in group], internal,
                                          [part.cells for part in group],
                                          int(sum(part.rows for part in group)))
               for group in input_groups(parts)]
    wait(futures)
    reports, staged = [], []
    for future in futures:
        for path, report in future.result():  # raises the partition's own refusal
            reports.append(report)
            staged.append(Path(path))
    build_validation_docs(internal)
    return reports, staged
