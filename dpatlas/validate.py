"""Applying the validation policy to one partition, with the input contract (Great Expectations).

- ``fail`` (default): any failed expectation stops the release before any noise is drawn; the
  message names each failed expectation and its count, and where the offending rows went.
- ``clip``: ranks outside [0, 1] are clipped to the bounds (a per-record transformation, so
  DP-safe); whatever else fails still stops the release.
- ``drop``: offending rows go to the quarantine file and the rest goes on. Duplicate person ids
  always stop the release: which copy to drop would depend on other records.

Rejected rows always go to a quarantine file in the internal folder, never silently away.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from data_contracts import ContractResult, validate_input


class ValidationFailed(RuntimeError):
    """The input breaks its contract under the configured policy; no noise has been drawn."""


@dataclass
class PartitionReport:
    partition: str
    rows_in: int
    rows_out: int
    clipped: int
    quarantined: int
    quarantine_file: Path | None
    failures: list[dict]
    docs_index: Path | None

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["quarantine_file"] = str(self.quarantine_file) if self.quarantine_file else None
        d["docs_index"] = str(self.docs_index) if self.docs_index else None
        return d


def _contract_frame(df: pd.DataFrame) -> pd.DataFrame:
    cols = ["geoid", "x", "y"] + (["person_id"] if "person_id" in df.columns else [])
    return df[cols].reset_index(drop=True)


def _failures(result: ContractResult) -> list[dict]:
    return [{"expectation": f.expectation, "column": f.column, "count": f.unexpected_count,
             "details": f.details} for f in result.failures]


def _is_duplicate_check(f: dict) -> bool:
    return "unique" in f["expectation"]


def apply_policy(df: pd.DataFrame, policy: str, partition: str, internal: Path
                 ) -> tuple[pd.DataFrame, PartitionReport]:
    docs = internal / "data_docs" / f"input-{partition}"
    quarantine = internal / "quarantine" / f"input-{partition}.parquet"
    df = df.reset_index(drop=True)
    clipped = 0
    if policy == "clip":
        out_of_bounds = ((df["x"] < 0) | (df["x"] > 1) | (df["y"] < 0) | (df["y"] > 1))
        clipped = int(out_of_bounds.sum())
        df = df.assign(x=df["x"].clip(0.0, 1.0), y=df["y"].clip(0.0, 1.0))
    result = validate_input(_contract_frame(df), docs_dir=docs)
    failures = _failures(result)
    bad = np.asarray(result.bad_rows, dtype=bool)
    qfile = None
    if bad.any():
        quarantine.parent.mkdir(parents=True, exist_ok=True)
        df[bad].to_parquet(quarantine, index=False)
        qfile = quarantine
    report = PartitionReport(partition, len(df), len(df), clipped, int(bad.sum()), qfile,
                             failures, result.docs_index)
    stop = not result.success and (policy != "drop" or any(map(_is_duplicate_check, failures))
                                   or not bad.any())
    if stop:
        lines = [f"input partition {partition} breaks its contract (policy '{policy}'); "
                 "no noise was drawn and nothing was published:"]
        for f in failures:
            col = f" on column '{f['column']}'" if f["column"] else ""
            lines.append(f"  - {f['expectation']}{col}: {f['count']} row(s)")
        if qfile:
            lines.append(f"  offending rows written to {qfile}")
        if result.docs_index:
            lines.append(f"  validation report: {result.docs_index}")
        if policy == "fail":
            lines.append("  fix the input, or set validation.policy to 'clip' (ranks) or "
                         "'drop' (rows) in the config")
        raise ValidationFailed("\n".join(lines))
    if bad.any():  # policy drop
        df = df[~bad].reset_index(drop=True)
        report.rows_out = len(df)
    return df, report
