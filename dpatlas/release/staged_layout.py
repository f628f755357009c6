"""How a staged partition's records lie in its Parquet file, so that a task reads its own alone.

A chunk reads a GEOID range of some cells of its partition, and a level task its state's
records of some cells (:func:`dpatlas.release.estimate.read_chunk`,
:func:`dpatlas.release.levels.read_state`: ``read_parquet`` with ``filters``). Parquet skips a
row group only when the group's min and max rule it out. Written as it came, in row groups of
pyarrow's default 1 Mi rows, a group spans a whole state's GEOIDs: a chunk of 2,000 of
California's 8,161 tracts read four times the records it kept, and a chunk of a group of cells
read the other cells of its partition too (a partition holds up to 4 M records).

So the records are written grouped by cell, each cell's in GEOID order, in row groups of
:data:`ROW_GROUP_ROWS`: each group then holds one cell, or two, over a narrow GEOID range. An
input so grouped already (the project's generators write each cell's records in GEOID order,
cells in their own order) is written as it came; any other is sorted by (cell, GEOID), stably:
the records of each (tract, cell) keep their order, which is all an estimate reads.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

# Rows per row group. On California's staged partition at 4 cells (2.27 million records),
# eight chunk reads took 2.42 CPU-s in groups of 1 Mi rows and 0.50 in groups of 128 Ki
# (64 Ki: 0.45, a larger file); writing took 0.56 and 0.76 CPU-s.
ROW_GROUP_ROWS = 1 << 17


def clustered(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` grouped by cell, each cell's rows in GEOID order: ``frame`` itself when it is
    so already, else sorted by (cell, GEOID), stably."""
    if len(frame) < 2 or "geoid" not in frame.columns or is_clustered(frame):
        return frame
    keys = [k for k in ("cell", "geoid") if k in frame.columns]
    return frame.sort_values(keys, kind="stable", ignore_index=True)


def is_clustered(frame: pd.DataFrame) -> bool:
    """Whether each cell's rows are together (one run of rows a cell) and in GEOID order."""
    geoids = pa.array(frame["geoid"])
    cells = pa.array(frame["cell"]) if "cell" in frame.columns else None
    if geoids.null_count or (cells is not None and cells.null_count):
        return False  # no null cell or GEOID reaches staging; sorted to be sure
    falls = _bools(pc.greater(geoids[:-1], geoids[1:]))
    if cells is None:
        return not falls.any()
    same = _bools(pc.equal(cells[:-1], cells[1:]))
    if (same & falls).any():
        return False
    return int((~same).sum()) + 1 == len(pc.unique(cells))


def _bools(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


# Columns with a value per record, which Parquet's dictionary encoding cannot shorten: pyarrow
# tries it on every column by default and, on these, fills a dictionary page before falling
# back to plain values. Written plain from the start, California's staged partition (568,728
# records) took 0.051 CPU-s against 0.090, in 6.2 MB against 8.0 (same values).
PER_RECORD_COLUMNS = ("row", "person_id")


def write(frame: pd.DataFrame, target) -> None:
    """``frame`` as a staged partition at ``target`` (a path or a binary buffer): clustered
    (:func:`clustered`), as Parquet without the index, in row groups of
    :data:`ROW_GROUP_ROWS`, dictionary-encoded but for :data:`PER_RECORD_COLUMNS`."""
    clustered(frame).to_parquet(
        target, index=False, row_group_size=ROW_GROUP_ROWS,
        use_dictionary=[str(c) for c in frame.columns if c not in PER_RECORD_COLUMNS])
