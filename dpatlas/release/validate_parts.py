"""One input partition validated on a worker (``runner: dask``, issue 35).

The local runner validates every partition in the release's own GX project, one at a time
(:func:`dpatlas.release.validate.apply_policy`). On the workers each partition's run goes
into a GX project of its own, ``<where>/validation-parts/<key>/``, so no lock is shared
between processes; the task writes its quarantine file and staged rows at ``<where>`` (the
internal folder the workers share, or the release's staging location), hashes the staged
rows' (person, cell) pairs for the contributions check
(:mod:`dpatlas.release.contribution_buckets`), and returns what the flow records: the run
(imported into the release's project and offline report by the flow, in partition order),
the report, and, when the contract refuses the partition, the refusal's text (the flow
raises it once the run is in the Data Docs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import pandas as pd

from dpatlas.core.locations import join, writable_folder
from dpatlas.release import staged_layout, staging
from dpatlas.release.contribution_buckets import write_hash_buckets
from dpatlas.release.estimate import tract_cell_counts
from dpatlas.release.validate import check_partition

PARTS_FOLDER = "validation-parts"
HASHES_FOLDER = "contribution-hashes"
GX_FOLDER = "gx"


@dataclass
class ValidatedPart:
    """What a partition's validation task returns (no rows: those are at ``staged``)."""

    key: str
    check: object  # its ContractResult, without GX's own object
    project: str  # the folder of its GX project (path or URL)
    report: Optional[dict] = None  # PartitionReport.as_dict(); None when refused
    refusal: Optional[str] = None  # the refusal's text
    quarantine: Optional[str] = None  # where its offending rows were written
    staged: Optional[str] = None  # its clean rows
    hashes: Optional[str] = None  # the folder of its (person, cell) hashes
    # n per (geoid, cell) of its clean rows: the flow plans the chunks from these, without
    # reading the records again (public-size counts of confidential rows: internal only)
    counts: Optional[pd.DataFrame] = None


def validate_part(df: pd.DataFrame, policy: str, key: str, internal: str, where: str,
                  docs_index: str, columns: Optional[dict[str, str]] = None,
                  hash_ids: bool = False) -> ValidatedPart:
    """Check ``df`` (partition ``key``) against the input contract in a GX project of its own,
    apply ``policy``, and write what goes on at ``where``. ``internal`` and ``docs_index``
    (the release's internal folder and offline report, on the flow's machine) are what a
    refusal and the report name; ``hash_ids``: hash the staged rows for the contributions
    check."""
    from data_contracts import ReleaseDocs

    project = join(where, PARTS_FOLDER, key)
    with writable_folder(project) as folder:
        checked = check_partition(df, policy, key, ReleaseDocs(folder / GX_FOLDER,
                                                               folder / ".gx-docs"), columns)
    part = ValidatedPart(key, replace(checked.result, validation_result=None), project)
    qfile = checked.quarantine_file(Path(internal))
    if qfile is not None:
        part.quarantine = join(where, "quarantine", qfile.name)
        staging.write_parquet(checked.quarantined_rows(columns), part.quarantine)
    if checked.refused():
        part.refusal = checked.refusal(Path(internal), Path(docs_index), columns)
        return part
    clean, report = checked.kept(Path(docs_index), Path(internal))
    part.report = report.as_dict()
    part.staged = join(where, "staged", f"input-{key}.parquet")
    staging.write_parquet(clean, part.staged, staged_layout.write)  # read back by GEOID range
    part.counts = tract_cell_counts(clean)
    if hash_ids and "person_id" in clean.columns:
        part.hashes = join(where, HASHES_FOLDER, key)
        write_hash_buckets(part.staged, part.hashes)
    return part
