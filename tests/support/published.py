"""Reading a release's tables whichever way they were published: ``<stem>.parquet``, or for
the tract table of a release of several states its parts ``tracts/state=XX/part-0.parquet``
(dpatlas/publication/state_parts.py) joined."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def read_published(folder: Path, stem: str, **kwargs) -> pd.DataFrame:
    """``folder``'s ``stem`` table (``pd.read_parquet`` ``kwargs``: ``columns``...)."""
    single = Path(folder) / f"{stem}.parquet"
    if stem == "tracts" and not single.exists() and (Path(folder) / "tracts").is_dir():
        return pd.read_parquet(Path(folder) / "tracts", partitioning=None, **kwargs)
    return pd.read_parquet(single, **kwargs)
