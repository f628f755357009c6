"""How a staged partition's records lie in its Parquet file, so that a task reads its own alone.

A chunk reads a GEOID range of some cells of its partition, and a level task its state's
records of some cells (:func:`dpatlas.release.estimate.read_chunk`,
:func:`dpatlas.release.levels.read_state`: ``read_parquet`` with ``filters``). Parquet skips a
row group only when the group's min and max rule it out. Written as it came, in row groups of
pyarrow's default 1 Mi rows, a group spans a whole state's GEOIDs: a chunk of 2,000 of
California's 8,161 tracts read four times the records it kept, and at many cells every task of
a state's group of cells read the cells of the others, so the rows read grew with the square
of the cells.

So the records are written in (cell, GEOID) order, in row groups of :data:`ROW_GROUP_ROWS`:
each group then holds one cell, or two, over a narrow GEOID range. Sorting is stable: the
records of each (tract, cell) keep their order, which is all an estimate reads. An input
already in that order (the project's generators write it) is not sorted again.
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

# The order of the records: a chunk's filter is a range of GEOIDs within some cells.
ORDER = ("cell", "geoid")


def clustered(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` in (cell, GEOID) order (stable), or ``frame`` itself when it is so already."""
    keys = [k for k in ORDER if k in frame.columns]
    if len(frame) < 2 or not keys or in_order(frame, keys):
        return frame
    return frame.sort_values(keys, kind="stable", ignore_index=True)


def in_order(frame: pd.DataFrame, keys: list[str]) -> bool:
    """Whether the rows are sorted by ``keys`` (lexicographically, each ascending)."""
    tied = np.ones(len(frame) - 1, dtype=bool)  # rows equal to the next in every key so far
    for key in keys:
        values = pa.array(frame[key])
        if values.null_count:  # no null cells or GEOIDs reach staging; sort to be sure
            return False
        first, second = values[:-1], values[1:]
        if np.any(tied & _bools(pc.greater(first, second))):
            return False
        tied &= _bools(pc.equal(first, second))
    return True


def _bools(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def write(frame: pd.DataFrame, target) -> None:
    """``frame`` (clustered already) as Parquet at ``target`` (a path or a binary buffer), no
    index, in row groups of :data:`ROW_GROUP_ROWS`."""
    frame.to_parquet(target, index=False, row_group_size=ROW_GROUP_ROWS)
