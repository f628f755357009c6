"""Consecutive units of a drawing stage (chunks, level tasks) run by a few task runs each.

On the local runner every task run costs the flow about 24 ms of its own (GIL-held) time and
the Prefect server about as much again, whatever the task does. The national release selected
and estimated 67 chunks in 134 task runs and estimated the levels of 51 states in 51: about
9 CPU-s of Prefect work while two threads did the arithmetic. The local runner therefore
gives each task run a run of consecutive units of about equal records
(:func:`consecutive_groups`, at most :data:`LOCAL_TASK_GROUPS` runs a stage), which keeps two
threads busy to the end while paying for a dozen task runs, not a hundred.

Only the task runs are grouped: every unit still draws once, under its own name and seed, in
the release's draw log (``dpatlas.release.draws``), so the noise, the resume and the layout a
resume checks are the same as with a run per unit. Runners with workers keep a run per unit:
there the units spread over the workers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from dpatlas.release.cell_groups import records_by_state_and_cell

# Task runs per stage on the local runner: enough that the last runs are short (the two
# threads finish together, each run being ~1/16 of the work), few enough that Prefect's own
# cost per run stays under a second a stage.
LOCAL_TASK_GROUPS = 16


def consecutive_groups(weights: Sequence[float], max_groups: int) -> list[list[int]]:
    """The indices of ``weights``, in order, cut into at most ``max_groups`` runs of about
    equal total weight (a run closes once the weights so far reach its share of the total);
    one run per index when there are no more than ``max_groups``."""
    if max_groups < 1:
        raise ValueError(f"max_groups must be at least 1, got {max_groups}")
    n = len(weights)
    if n <= max_groups:
        return [[k] for k in range(n)]
    cumulative = np.cumsum(np.maximum(np.asarray(weights, dtype=float), 0.0))
    if cumulative[-1] <= 0:  # no weights: count the units instead
        cumulative = np.arange(1, n + 1, dtype=float)
    total = cumulative[-1]
    groups: list[list[int]] = []
    start = 0
    for k in range(n - 1):
        if cumulative[k] >= total * (len(groups) + 1) / max_groups:
            groups.append(list(range(start, k + 1)))
            start = k + 1
    groups.append(list(range(start, n)))
    return groups


def chunk_records(chunks: Sequence, sizes: pd.DataFrame) -> list[int]:
    """The records of each chunk (its tracts' ``n`` over its cells, from ``plan_chunks``'
    sizes: geoid, cell, n per tract-cell)."""
    by_geoid = sizes.sort_values("geoid", kind="stable")
    geoids = by_geoid["geoid"].astype(str).to_numpy()
    counts = by_geoid["n"].to_numpy()
    cells = by_geoid["cell"].astype(str).to_numpy()
    records = []
    for chunk in chunks:
        lo = np.searchsorted(geoids, chunk.first_geoid, side="left")
        hi = np.searchsorted(geoids, chunk.last_geoid, side="right")
        n = counts[lo:hi]
        if chunk.cells is not None:
            n = n[np.isin(cells[lo:hi], [str(c) for c in chunk.cells])]
        records.append(int(n.sum()))
    return records


def level_records(units: Sequence, sizes: pd.DataFrame) -> list[int]:
    """The records of each level task (its state's ``n`` over its cells, from the sizes).

    One pass over the tract-cells into n per (state, cell), then a sum per unit: a mask of
    every tract-cell per unit cost units x tract-cells (1.4 s of the flow's own time at 6
    national cells, 65 units; 278 units at 42 cells)."""
    per_state_cell = records_by_state_and_cell(sizes)  # the grouping level_tasks made
    per_cell = {state: rows.droplevel(0).to_dict()
                for state, rows in per_state_cell.groupby(level=0)}
    records = []
    for unit in units:
        mine = per_cell.get(unit.state, {})
        wanted = mine if unit.cells is None else [str(c) for c in unit.cells]
        records.append(int(sum(mine.get(cell, 0) for cell in wanted)))
    return records


def group_label(names: Sequence[str]) -> str:
    """A run of units in a task or run name: ``input-17-0``, or ``input-01-0-to-input-04-1``
    (chunks; partitions' keys: ``17``, or ``01-to-08``)."""
    return names[0] if len(names) == 1 else f"{names[0]}-to-{names[-1]}"
