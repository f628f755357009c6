"""Applying the validation policy to one partition, with the input contract (Great Expectations).

- ``fail`` (default): any failed expectation stops the release before any noise is drawn; the
  message names each failed expectation and its count, and where the offending rows went.
- ``clip``: ranks outside [0, 1] are clipped to the bounds (a per-record transformation, so
  DP-safe); whatever else fails still stops the release.
- ``drop``: offending rows go to the quarantine file and the rest goes on; a failure that is
  not about rows (a missing column) still stops the release.

Rejected rows always go to a quarantine file in the internal folder, never silently away.
Clip and drop are refused when, over all partitions, they would change more than
``validation.max_changed_share`` of the rows (:func:`check_changed_share`): a whole file on the
wrong scale must not be "cleaned" into a release.

How many records a person has is not checked here, partition by partition: a person may
appear in two states, so that is decided once, across all partitions, by
:func:`dpatlas.release.contributions.check_contributions`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dpatlas.core.errors import ReleaseRefused
from dpatlas.core.files import seal_private, write_parquet_atomic
from dpatlas.release.ingest import SPLIT_KEY
from dpatlas.release.validation_report import record_run
from dpatlas.release.validation_words import fixes, quarantine_frame, user_name

if TYPE_CHECKING:  # Great Expectations is imported when something is validated, not before
    from data_contracts import ContractResult

_EXAMPLES = 5


class ValidationFailed(RuntimeError, ReleaseRefused):
    """The input breaks its contract under the configured policy; no noise has been drawn."""


class BoundaryCoverageError(RuntimeError, ReleaseRefused):
    """Tracts with data but no boundary: the release cannot be mapped."""


@dataclass
class PartitionReport:
    """What validation did to one partition (internal: these counts are not DP)."""

    partition: str
    policy: str
    rows_in: int
    rows_out: int
    clipped: int  # rows whose ranks were clipped to [0, 1] (policy clip)
    dropped: int  # rows removed from the release (policy drop); rows_out = rows_in - dropped
    quarantined: int  # rows written to the quarantine file (under every policy)
    quarantine_file: Path | None
    largest_rank: float | None  # before clipping, on the [0, 1] scale: tells a scale mix-up
    failures: list[dict]
    docs_index: Path | None

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["quarantine_file"] = str(self.quarantine_file) if self.quarantine_file else None
        d["docs_index"] = str(self.docs_index) if self.docs_index else None
        return d


def contract_frame(df: pd.DataFrame, columns: dict[str, str] | None = None) -> pd.DataFrame:
    """The columns the input contract checks. ``columns`` (:func:`input_column_names`): the
    input's columns; an input without a cell column has the pipeline's one cell (``all``,
    written by the reader), which is not the input's to check: the report would say a column
    the input lacks was checked (and the check cost 0.4 us a record, 2 s of 5 M)."""
    from_input = columns is None or "cell" in columns
    cols = ["geoid", "x", "y"] + [c for c in ("person_id", "cell") if c in df.columns
                                  and (c != "cell" or from_input)]
    return df[cols].reset_index(drop=True)


def input_column_names(columns) -> dict[str, str]:
    """The pipeline's column names (geoid, x, y, person_id, cell) to the input's, as the
    config maps them (``input.columns``): what a refusal names."""
    named = {"geoid": columns.geoid, "x": columns.parent_rank, "y": columns.child_rank,
             "person_id": columns.person_id, "cell": columns.cell}
    return {ours: theirs for ours, theirs in named.items() if theirs}


def _failures(result: "ContractResult") -> list[dict]:
    return [{"expectation": f.expectation, "column": f.column, "count": f.unexpected_count,
             "details": f.details} for f in result.failures]


def _is_row_level(f: dict) -> bool:
    # Table- and column-level failures (a missing column) and expectations that could not be
    # evaluated have no offending rows: dropping rows cannot fix them.
    return f["count"] > 0


def _largest_rank(df: pd.DataFrame) -> float | None:
    values = df[["x", "y"]].to_numpy(dtype=float)
    return None if np.isnan(values).all() else float(np.nanmax(values))


def _blank_geoids(df: pd.DataFrame) -> str:
    blank = df["geoid"].isna().to_numpy()
    if not blank.any():
        return ""
    rows = ", ".join(str(r) for r in df.loc[blank, "row"].head(_EXAMPLES))
    return f"; {int(blank.sum())} rows have a blank GEOID, e.g. input rows {rows}"


def _geoids_like(df: pd.DataFrame, pattern: str) -> tuple[pd.Series, str]:
    """The GEOIDs that match ``pattern`` whole, and the first few of them, quoted."""
    geoids = df["geoid"].dropna().astype(str)
    found = geoids[geoids.str.fullmatch(pattern)]
    return found, ", ".join(repr(g) for g in found.unique()[:_EXAMPLES])


def _lost_leading_zeros(df: pd.DataFrame) -> str:
    """A hint when GEOIDs are 10 digits: integers that lost their leading zero."""
    ten, shown = _geoids_like(df, r"[0-9]{10}")
    if ten.empty:
        return ""
    return (f"  {len(ten)} GEOIDs are 10 digits, e.g. {shown}: they look like integers that "
            f"lost their leading zero ({ten.iloc[0]} is 0{ten.iloc[0]}, state "
            f"0{ten.iloc[0][0]}); write and read GEOIDs as text (e.g. pandas dtype=str) so "
            "they keep all 11 digits")


def _bad_cells(df: pd.DataFrame, expectation: str) -> str:
    """The first input rows whose cell is missing (or blank, for the regex expectation)."""
    cells = df["cell"]
    missing = cells.isna().to_numpy()
    bad = missing if expectation == "expect_column_values_to_not_be_null" else (
        ~missing & (cells.where(~missing, "x").astype(str).str.strip() == "").to_numpy())
    if not bad.any():
        return ""
    rows = ", ".join(str(r) for r in df.loc[bad, "row"].head(_EXAMPLES))
    what = "no cell" if expectation == "expect_column_values_to_not_be_null" else "a blank cell"
    return f" have {what}, e.g. input rows {rows} (counting from 0)"


def _written_as_floats(df: pd.DataFrame) -> str:
    """A hint when GEOIDs end in ``.0``: a numeric column written out (a float, or an integer
    with a blank cell), not 11-character text."""
    floats, shown = _geoids_like(df, r"[0-9]{1,11}\.0+")
    if floats.empty:
        return ""
    return (f"  {len(floats)} GEOIDs end in a decimal part, e.g. {shown}: they were written "
            "from a numeric column, where leading zeros may be lost too; GEOIDs must be text: "
            "write and read them as text (e.g. pandas dtype=str) so they keep all 11 digits")


def _failure_message(df: pd.DataFrame, policy: str, partition: str, failures: list[dict],
                     qfile: Path | None, docs_index: Path | None,
                     columns: dict[str, str] | None = None) -> str:
    lines = [f"input partition {partition} breaks its contract (policy '{policy}'); "
             "no noise was drawn and nothing was published:"]
    for f in failures:
        name = user_name(f["column"], columns)
        col = f" on column '{name}'" if f["column"] else ""
        extra = ""
        if f["column"] == "geoid" and f["expectation"] == "expect_column_values_to_not_be_null":
            extra = _blank_geoids(df)
        elif f["column"] == "cell" and "row" in df.columns:
            extra = _bad_cells(df, f["expectation"])
        lines.append(f"  - {f['expectation']}{col}: {f['count']} row(s){extra}")
    if any(f["column"] == "geoid" for f in failures):
        lines += [hint for hint in (_lost_leading_zeros(df), _written_as_floats(df)) if hint]
    if any(f["column"] in ("x", "y") for f in failures):  # ranks out of [0, 1]
        lines += [f"  {hint}" for hint in (_percentile_hint(_largest_rank(df)),) if hint]
    if qfile:
        lines.append(f"  offending rows written to {qfile}")
    if docs_index:
        lines.append(f"  validation report: {docs_index}")
    lines += [f"  fix: {fix}" for fix in fixes(failures, columns, policy)]
    return "\n".join(lines)


def seal_release_docs(docs) -> None:
    """Great Expectations writes its project and Data Docs with the umask's modes; they quote
    input values (unexpected rows), so they are narrowed to the internal folder's 0700 / 0600."""
    seal_private(docs.project_dir)
    seal_private(docs.docs_dir)


def write_release_docs(internal: Path) -> Path:
    """Render the release's Data Docs site (``internal/data_docs``) from every validation run
    stored so far, and seal it; returns its index. Called once after a batch of checks (all
    input partitions, the output checks) and when a check refuses the release."""
    from data_contracts import RELEASE_CONTEXT_LOCK, ReleaseDocs, build_release_docs

    docs = ReleaseDocs.in_folder(internal)
    with RELEASE_CONTEXT_LOCK:  # no check writes into the project while it is sealed
        index = build_release_docs(docs)
        seal_release_docs(docs)
    return index


def input_asset(partition: str, source: str | None = None) -> str:
    """The data asset an input check validated, as its report names it."""
    what = f"input partition {partition}"
    if re.fullmatch(r"[0-9]{2}", partition):
        what += f" (state {partition})"
    elif split := SPLIT_KEY.fullmatch(partition):  # a large state's cells
        what += f" (state {split[1]}, cell group {split[2]})"
    return f"{what} of {source}" if source else what


def group_asset(partitions: list[str], source: str | None = None) -> str:
    """The data asset an input check of several partitions together validated."""
    what = "input partitions " + ", ".join(partitions)
    return f"{what} of {source}" if source else what


@dataclass
class CheckedPartition:
    """One partition checked against the input contract (:func:`check_partition`), before its
    run is recorded in the release's report and the policy decides what goes on."""

    partition: str
    policy: str
    df: pd.DataFrame  # after clipping (policy clip)
    result: "ContractResult"
    failures: list[dict]
    bad: np.ndarray  # the offending rows
    clipped: int
    largest: float | None

    def quarantine_file(self, internal: Path) -> Path | None:
        """Where the offending rows go in the internal folder (None: there are none)."""
        return quarantine_path(internal, self.partition) if self.bad.any() else None

    def record(self, internal: Path, source: str | None, columns: dict[str, str] | None
               ) -> Path:
        """The run in the release's offline report (``input-<partition>``); returns its index."""
        return record_input_run(internal, self.partition, self.policy, self.result,
                                self.quarantine_file(internal), source, columns)

    def quarantined_rows(self, columns: dict[str, str] | None) -> pd.DataFrame:
        return quarantine_frame(self.df[self.bad], columns)

    def refused(self) -> bool:
        """The contract is broken and the policy cannot go on (not drop of row-level failures)."""
        droppable = (self.policy == "drop" and self.bad.any()
                     and all(map(_is_row_level, self.failures)))
        return not self.result.success and not droppable

    def refusal(self, internal: Path, docs_index: Path | None,
                columns: dict[str, str] | None) -> str:
        return _failure_message(self.df, self.policy, self.partition, self.failures,
                                self.quarantine_file(internal), docs_index, columns)

    def kept(self, docs_index: Path | None, internal: Path
             ) -> tuple[pd.DataFrame, PartitionReport]:
        """The rows that go on (without the offending ones under drop) and the report."""
        df = self.df
        report = PartitionReport(partition=self.partition, policy=self.policy,
                                 rows_in=len(df), rows_out=len(df), clipped=self.clipped,
                                 dropped=0, quarantined=int(self.bad.sum()),
                                 quarantine_file=self.quarantine_file(internal),
                                 largest_rank=self.largest, failures=self.failures,
                                 docs_index=docs_index)
        if self.bad.any() and not self.refused():  # policy drop
            df = df[~self.bad].reset_index(drop=True)
            report.rows_out = len(df)
            report.dropped = int(self.bad.sum())
        return df, report


def record_input_run(internal: Path, partition: str, policy: str, result: "ContractResult",
                     quarantine: Path | None, source: str | None,
                     columns: dict[str, str] | None) -> Path:
    """A partition's input check in the release's offline report, as run ``input-<partition>``
    (``quarantine``: its offending rows' file); returns the report's index."""
    return record_run(internal, f"input-{partition}", input_asset(partition, source), result,
                      columns=columns, quarantine=quarantine,
                      fixes=fixes(_failures(result), columns, policy))


def quarantine_path(internal: Path, partition: str) -> Path:
    return Path(internal) / "quarantine" / f"input-{partition}.parquet"


def clip_ranks(df: pd.DataFrame, policy: str) -> tuple[pd.DataFrame, int, float | None]:
    """The partition as checked (positional index; ranks clipped to [0, 1] under policy
    clip), how many rows were clipped, and its largest rank before clipping."""
    df = df.reset_index(drop=True)
    largest = _largest_rank(df)
    clipped = 0
    if policy == "clip":
        out_of_bounds = ((df["x"] < 0) | (df["x"] > 1) | (df["y"] < 0) | (df["y"] > 1))
        clipped = int(out_of_bounds.sum())
        df = df.assign(x=df["x"].clip(0.0, 1.0), y=df["y"].clip(0.0, 1.0))
    return df, clipped, largest


def check_partition(df: pd.DataFrame, policy: str, partition: str, docs,
                    columns: dict[str, str] | None = None) -> CheckedPartition:
    """Clip (policy clip), then run the input Checkpoint as ``input-<partition>`` in the GX
    project ``docs`` (a :class:`data_contracts.ReleaseDocs`), sealed after. ``columns``:
    the input's (:func:`contract_frame`)."""
    from data_contracts import validate_input

    df, clipped, largest = clip_ranks(df, policy)
    result = validate_input(contract_frame(df, columns), release=docs,
                            run_name=f"input-{partition}")
    seal_release_docs(docs)
    return CheckedPartition(partition, policy, df, result, _failures(result),
                            np.asarray(result.bad_rows, dtype=bool), clipped, largest)


def apply_policy(df: pd.DataFrame, policy: str, partition: str, internal: Path,
                 source: str | None = None, columns: dict[str, str] | None = None
                 ) -> tuple[pd.DataFrame, PartitionReport]:
    """Validate one partition against the input contract and apply ``policy``.

    The validation is a run named ``input-<partition>`` of the release's input Checkpoint:
    every partition's report is in the release's offline report (``internal/validation_report``,
    which names ``source``, the input file or folder, as the data asset; ``docs_index`` is its
    index) and in its one Data Docs site (``internal/data_docs``), which the caller renders
    once after the last partition (:func:`write_release_docs`), or this function before it
    refuses the release. ``columns`` (:func:`input_column_names`) names the input's columns
    in a refusal, the report and the quarantine file (whose ranks are on [0, 1], as
    validated; ``row`` is the input row).
    """
    from data_contracts import RELEASE_CONTEXT_LOCK, ReleaseDocs

    # Partitions may be validated in threads: the release's GX project, its sealing and the
    # offline report's index are touched by one at a time (reading and staging are not).
    with RELEASE_CONTEXT_LOCK:
        checked = check_partition(df, policy, partition, ReleaseDocs.in_folder(internal),
                                  columns)
        report_index = checked.record(internal, source, columns)
    qfile = checked.quarantine_file(internal)
    if qfile:
        write_parquet_atomic(checked.quarantined_rows(columns), qfile, private=True)
    if checked.refused():
        write_release_docs(internal)  # the refused run (and the ones before) in the site
        raise ValidationFailed(checked.refusal(internal, report_index, columns))
    return checked.kept(report_index, internal)


def check_one_partition_per_tract(counts: dict[Path, pd.DataFrame], sizes: pd.DataFrame
                                  ) -> None:
    """Refuse a tract and cell whose records lie in two staged partitions (``counts``: n per
    (geoid, cell) of each, :func:`dpatlas.release.estimate.staged_counts`; ``sizes``: their
    rows joined, :func:`~dpatlas.release.estimate.all_sizes`, where each partition's keys are
    unique, so a key seen twice is in two partitions). Each partition would estimate its part
    as a tract of its own, and the release could never be published; the input checks keep
    every state's records in one partition (a split state's cells in one group each), and
    this makes sure of it before the charge, whatever the input's layout."""
    twice = sizes[sizes.duplicated(["geoid", "cell"], keep=False)]
    if twice.empty:
        return
    geoid, cell = twice["geoid"].iloc[0], twice["cell"].iloc[0]
    held = sorted(Path(path).stem for path, frame in counts.items()
                  if ((frame["geoid"] == geoid) & (frame["cell"] == cell)).any())
    raise ValidationFailed(
        f"{twice['geoid'].nunique()} tract(s) have records in more than one input partition, "
        f"e.g. tract {geoid} (cell {cell!r}) in {', '.join(held)}; a tract's records "
        "must all lie in one partition (the folder of the state its GEOID names), so no noise "
        "was drawn and nothing was published")


def _percentile_hint(largest: float | None) -> str:
    """Advice when the largest rank (read as on [0, 1]) is in (1, 100]: percentiles."""
    if largest is not None and 1.0 < largest <= 100.0:
        return (f"the ranks go up to {largest:g}, so they look like percentiles: set "
                "input.rank_scale: percentile")
    return ""


def _largest_over(reports: list[dict]) -> float | None:
    """The largest rank of every partition (on the [0, 1] scale, before clipping)."""
    return max((r["largest_rank"] for r in reports if r.get("largest_rank") is not None),
               default=None)


def check_rank_scale(reports: list[dict], rank_scale: str) -> None:
    """Refuse percentiles (``input.rank_scale: percentile``) none of which exceeds 1: ranks on
    [0, 1] declared as percentiles would be divided by 100 and published squeezed into
    [0, 0.01], every tract's estimate wrong, with no other check noticing (issue 31 O4).

    ``reports`` are every partition's :meth:`PartitionReport.as_dict`. This reads the
    confidential ranks, so it only decides whether the release runs (an operator's refusal
    before the charge); it never changes what is published."""
    largest = _largest_over(reports)
    if rank_scale != "percentile" or largest is None or largest > 0.01:
        return
    raise ValidationFailed(
        "input.rank_scale is 'percentile' (ranks on [0, 100]) but no rank in the input "
        "exceeds 1: these look like ranks on [0, 1], which read as percentiles would be "
        "divided by 100 and published within [0, 0.01]. Set input.rank_scale: unit in the "
        "config; no noise was drawn and nothing was published.")


def check_changed_share(reports: list[dict], max_share: float) -> None:
    """Refuse a release whose clip/drop policy changed too much of the input.

    ``reports`` are :meth:`PartitionReport.as_dict` of every partition. The share is
    (clipped + dropped rows) / rows in, over all partitions together, so a bad state cannot
    hide among good ones. Raises :class:`ValidationFailed` when it exceeds ``max_share``
    (``validation.max_changed_share``); no noise has been drawn at that point.
    """
    rows_in = sum(int(r["rows_in"]) for r in reports)
    clipped = sum(int(r["clipped"]) for r in reports)
    dropped = sum(int(r["dropped"]) for r in reports)
    changed = clipped + dropped
    if rows_in == 0 or changed / rows_in <= max_share:
        return
    share = changed / rows_in
    policy = "/".join(sorted({r["policy"] for r in reports}))
    advice = _percentile_hint(_largest_over(reports))
    if not advice:
        advice = ("fix the input (the rows are in the quarantine files of the internal folder) "
                  "or, if this much change is expected, raise validation.max_changed_share")
    raise ValidationFailed(
        f"validation policy '{policy}' would change {changed:,} of {rows_in:,} input rows "
        f"({share:.2%}: {clipped:,} clipped, {dropped:,} dropped), more than "
        f"validation.max_changed_share {max_share:.2%}; no noise was drawn and nothing was "
        f"published. {advice[0].upper() + advice[1:]}.")

