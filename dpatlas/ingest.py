"""Reading the microdata one partition (state) at a time, into the pipeline's own columns.

Output columns: ``row`` (position in the input, for quarantine reports), ``geoid`` (str),
``x`` and ``y`` (ranks on [0, 1] scale, not yet validated), ``cell`` (str), and ``person_id``
when the config names one. The raw input is never modified.

A hive-partitioned Parquet dataset (``.../state=17/part.parquet``) is read one state at a time
with pyarrow, so memory holds one state. A single Parquet or CSV file is read once and split.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from .config import InputConfig


class InputError(ValueError):
    """The input cannot be read as configured (missing file or column)."""


@dataclass(frozen=True)
class Partition:
    key: str  # state FIPS, or "all" for inputs that are not partitioned
    rows: int


def _dataset(cfg: InputConfig) -> ds.Dataset:
    path = Path(cfg.path)
    if not path.exists():
        raise InputError(f"input not found: {path}")
    if cfg.format == "csv":
        return ds.dataset(path, format="csv")
    partitioning = "hive" if path.is_dir() else None
    return ds.dataset(path, format="parquet", partitioning=partitioning)


def _check_columns(cfg: InputConfig, names: list[str]) -> None:
    c = cfg.columns
    needed = [c.geoid, c.parent_rank, c.child_rank] + [v for v in (c.person_id, c.cell) if v]
    missing = [n for n in needed if n not in names]
    if missing:
        raise InputError(f"input {cfg.path} lacks column(s) {missing}; it has {names}. "
                         "Map your column names under input.columns in the config.")


def partitions(cfg: InputConfig) -> list[Partition]:
    """The partitions of the input, in order, with their row counts."""
    dataset = _dataset(cfg)
    _check_columns(cfg, dataset.schema.names)
    if "state" in dataset.schema.names and Path(cfg.path).is_dir() and cfg.format == "parquet":
        counts = (dataset.to_table(columns=["state"]).group_by("state")
                  .aggregate([("state", "count")]).to_pandas())
        counts["state"] = counts["state"].astype(str).str.zfill(2)
        return [Partition(s, int(n)) for s, n in sorted(zip(counts["state"], counts["state_count"]))]
    return [Partition("all", dataset.count_rows())]


def read_partition(cfg: InputConfig, key: str) -> pd.DataFrame:
    """One partition's records in the pipeline's columns."""
    dataset = _dataset(cfg)
    c = cfg.columns
    cols = [c.geoid, c.parent_rank, c.child_rank] + [v for v in (c.person_id, c.cell) if v]
    if key == "all":
        table = dataset.to_table(columns=cols)
        offset = 0
    else:
        # Row positions count from the start of the whole dataset, in partition order, so a
        # quarantine report can point at the offending input rows.
        flt = ds.field("state").cast(pa.string()) == key
        if pa.types.is_integer(dataset.schema.field("state").type):
            flt = ds.field("state") == int(key)
        table = dataset.to_table(columns=cols, filter=flt)
        offset = sum(p.rows for p in partitions(cfg) if p.key < key)
    geoid = table.column(c.geoid).to_pandas()
    if pd.api.types.is_integer_dtype(geoid):
        # numeric GEOIDs lose their leading zero (Alabama is 01): restore it
        geoid = geoid.astype("int64").astype(str).str.zfill(11)
    else:
        geoid = geoid.astype("string").astype(object)
    scale = 100.0 if cfg.rank_scale == "percentile" else 1.0
    df = pd.DataFrame({
        "row": np.arange(offset, offset + table.num_rows, dtype=np.int64),
        "geoid": geoid.to_numpy(dtype=object),
        "x": pd.to_numeric(table.column(c.parent_rank).to_pandas(), errors="coerce") / scale,
        "y": pd.to_numeric(table.column(c.child_rank).to_pandas(), errors="coerce") / scale,
        "cell": (table.column(c.cell).to_pandas().astype(str).to_numpy(dtype=object)
                 if c.cell else "all"),
    })
    if c.person_id:
        df["person_id"] = table.column(c.person_id).to_pandas().to_numpy()
    return df


def input_fingerprint(cfg: InputConfig) -> str:
    """sha256 over the input files' names, sizes and contents (streamed)."""
    path = Path(cfg.path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
