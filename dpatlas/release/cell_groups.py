"""Cells grouped so that one task holds a bounded number of records, however many cells.

A task (a chunk's selection and estimation, a state's county and state estimates) reads the
records of its tracts for every cell. With many cells (the Opportunity Atlas publishes 42:
race × gender × parent-income groups) those records grow with the cells: a chunk of 2,000
tracts holds ~140,000 records a cell, California ~570,000. So a task takes a *group* of whole
cells: cells in sorted order, greedily, each group at most :data:`TASK_RECORDS` records (a
single cell above it is a group on its own). Memory then follows the bound, not the cells.

What a task does with its records is the same whatever its group: every estimate is per
(unit, cell), and cells compose sequentially anyway (each is charged in the ledger). Only the
task boundaries change, and they depend on the record counts per tract and cell (``n``, which
the release publishes) and on the input's cells.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np
import pandas as pd

# Records one task reads at most (unless one cell alone holds more). Selection and estimation
# take ~370 bytes a record at their peak (the 6-cell national release: 310 MiB for a chunk
# of 840,000 records) and two tasks run at once: two million records keep a task near
# 0.75 GiB, a worker well inside its 4 GiB. A million (until 2026-12-02) made twice the task
# runs, each costing the flow ~30 ms and its worker ~0.1 CPU-s outside the task's function
# (the 12-cell national release: 434 task runs; at 42 cells ~1,080 planned).
# At 6 cells a chunk of 2,000 tracts stays one group, as before, and at 12 cells now too.
TASK_RECORDS = 2_000_000


def records_by_state_and_cell(sizes: pd.DataFrame) -> pd.Series:
    """``n`` summed per (state, cell) from n per (geoid, cell) (``sizes``), indexed by both.
    A GEOID's first two digits are its state, read through the categories (74,001 GEOIDs,
    not one string per tract-cell): one pass, whatever the number of tasks asking."""
    geoids, cells = (pd.Categorical(sizes[c]) for c in ("geoid", "cell"))
    states = np.asarray(geoids.categories.astype(str).str[:2])[geoids.codes]
    cell_names = np.asarray(cells.categories.astype(str))[cells.codes]
    return pd.Series(sizes["n"].to_numpy()).groupby([states, cell_names]).sum()


def greedy_groups(counts: Mapping[Optional[str], int], bound: int
                  ) -> list[tuple[tuple[Optional[str], ...], int]]:
    """Cells with their record ``counts`` as groups of at most ``bound`` records, with each
    group's total: cells in sorted order (a null cell last), a group closed when the next
    cell would take it past the bound, so a group holds one cell at least, however large.
    The one grouping of the release: tasks here, validation partitions in
    :mod:`dpatlas.release.ingest`."""
    if bound < 1:
        raise ValueError(f"the record bound must be at least 1, got {bound}")
    groups: list[tuple[tuple[Optional[str], ...], int]] = []
    for cell in sorted(counts, key=lambda c: (c is None, c or "")):
        n = int(counts[cell])
        if groups and groups[-1][1] + n <= bound:
            groups[-1] = (groups[-1][0] + (cell,), groups[-1][1] + n)
        else:
            groups.append(((cell,), n))
    return groups


def group_cells(records_per_cell: pd.Series, bound: Optional[int] = None
                ) -> list[Optional[tuple[str, ...]]]:
    """The cell groups of one task's records: ``records_per_cell`` is indexed by cell;
    ``bound``: :data:`TASK_RECORDS` unless given.

    ``[None]`` (every cell, one task, named as without groups) when there is nothing to
    split (all fit in one group, or there is one cell), so a release whose tasks were never
    split keeps its task names (and resumes under them)."""
    bound = TASK_RECORDS if bound is None else bound
    counts = records_per_cell.groupby(level=0).sum()
    groups = greedy_groups({str(cell): int(n) for cell, n in counts.items()}, bound)
    if len(groups) < 2:
        return [None]
    return [cells for cells, _ in groups]


def group_suffix(index: int, groups: list) -> str:
    """The task name's suffix of group ``index``: none when the task was not split (cell
    text is arbitrary, so names carry the group's index, never its cells)."""
    return "" if len(groups) == 1 and groups[0] is None else f"-c{index}"
