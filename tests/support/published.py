"""Reading a release's tables whichever way they were published: ``<stem>.parquet``, or for
the tract table of a release of several states its parts ``tracts/state=XX/part-0.parquet``
(dpatlas/publication/state_parts.py) joined."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd


def read_published(folder: Path, stem: str, **kwargs) -> pd.DataFrame:
    """``folder``'s ``stem`` table (``pd.read_parquet`` ``kwargs``: ``columns``...)."""
    single = Path(folder) / f"{stem}.parquet"
    if stem == "tracts" and not single.exists() and (Path(folder) / "tracts").is_dir():
        return pd.read_parquet(Path(folder) / "tracts", partitioning=None, **kwargs)
    return pd.read_parquet(single, **kwargs)


# The data files of a release: the tract parts or files, the county and state files, the cell
# archives
DATA_FILES = ("tracts", "counties", "states")


def data_file_hashes(folder: Path, prefixes: tuple[str, ...] = DATA_FILES) -> dict[str, str]:
    """Every published file whose path in ``folder`` starts with one of ``prefixes``, by
    sha256: what does not depend on when or where the release ran."""
    folder = Path(folder)
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest()
            for n in sorted(n for n in names if n.startswith(prefixes))}
