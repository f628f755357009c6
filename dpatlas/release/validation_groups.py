"""Several input partitions checked in one run of the input contract (the local runner).

A run of the input contract costs Great Expectations about 0.2 CPU-s whatever its rows (it
builds and resolves a metric graph for each of the suite's expectations, and stores the run),
then about 1.1 us a row. On the national benchmark's 51 states (5.2 M records) that fixed
part was 10 of validation's 16 CPU-s, and on the local runner the checks take turns (one GX
project per release, not thread-safe), so it was 10 s of the release's wall time as well.

So when an input has more than :data:`MAX_INPUT_RUNS` partitions, consecutive partitions
share a run (:func:`input_groups`): groups of about equal rows, never above
:data:`GROUP_MAX_ROWS` (a larger partition is checked alone, as it is read alone). An input
of a few partitions keeps one run per partition, where the fixed part is small and a run per
partition reads best.

A group's run is recorded like a partition's (``input-<first>-to-<last>``, its asset naming
every partition). When it passes, every partition passed: the partitions of an input are
read by the same reader into the same columns and types (ranks float64, GEOIDs and cells
text), and the contract's expectations are per row, per column or per table, so a group
breaks none of them unless one of its partitions does. When it fails, each of its partitions
is checked again on its own (:func:`dpatlas.release.validate.apply_policy`), so the refusal,
the quarantine file and the report name the partition and its rows exactly as when partitions
are checked one by one.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from dpatlas.release import ingest
from dpatlas.release.ingest import PARTITION_RECORDS, Partition
from dpatlas.release.task_groups import group_label
from dpatlas.release.validate import (CheckedPartition, PartitionReport, _failures,
                                      apply_policy, clip_ranks, contract_frame, group_asset,
                                      seal_release_docs)
from dpatlas.release.validation_report import record_run
from dpatlas.release.validation_words import fixes

# At most this many runs of the input contract for an input of many partitions: 8 x 0.2 CPU-s
# of fixed cost, against 10 CPU-s for 51 states checked one by one.
MAX_INPUT_RUNS = 8
# A group holds at most half the records of one partition (ingest.PARTITION_RECORDS): the
# flow's two threads have two groups in hand (one checked while the next is read and staged),
# so together they hold no more than one partition. A 4 M-record group took about 0.9 GiB
# at its peak (read, checked, staged), so with groups of up to 4 M the flow of a national
# release with 6 cells (31 M records) peaked at 1.8 GiB in validation; with 2 M, 1.2 GiB
# (benchmarks/bench_national.py --cells 6). With one cell the groups hold about 0.65 M
# records and this bound does not bind.
GROUP_MAX_ROWS = PARTITION_RECORDS // 2


class RowsInHand:
    """The records the flow's validation tasks hold at once (read and not yet staged): at most
    :data:`~dpatlas.release.ingest.PARTITION_RECORDS` together. Groups of up to
    :data:`GROUP_MAX_ROWS` still go two at a time; a partition above that (a large state, or
    a group of a split state's cells, up to 4 M records: many of them at 12 cells) waits for
    the other task to finish and is held alone. Two 4 M-record partitions in hand took the
    flow of a national release with 12 cells to 1.7 GiB. A group is always let in when
    nothing else is held, so every group runs, whatever its size; and groups are let in in the
    order they asked (a large one is not passed by the small ones behind it)."""

    def __init__(self) -> None:
        self._held = 0
        self._tickets = self._serving = 0
        self._changed = threading.Condition()

    @contextmanager
    def holding(self, rows: int):
        limit = ingest.PARTITION_RECORDS  # read at each call: tests set a small one
        with self._changed:
            ticket, self._tickets = self._tickets, self._tickets + 1
            self._changed.wait_for(lambda: self._serving == ticket and (
                self._held == 0 or self._held + rows <= limit))
            self._serving += 1
            self._held += rows
            self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._held -= rows
                self._changed.notify_all()


ROWS_IN_HAND = RowsInHand()  # one per process: the local runner's flow


def input_groups(parts: list[Partition], max_runs: int = MAX_INPUT_RUNS,
                 max_rows: int = GROUP_MAX_ROWS) -> list[list[Partition]]:
    """The partitions, in order, in groups checked by one run each: one group per partition
    when there are at most ``max_runs``; otherwise consecutive partitions until a group holds
    a ``max_runs``-th of the rows, a group never growing past ``max_rows``."""
    if len(parts) <= max_runs:
        return [[part] for part in parts]
    target = -(-sum(p.rows for p in parts) // max_runs)
    groups: list[list[Partition]] = []
    group: list[Partition] = []
    rows = 0
    for part in parts:
        if group and rows + part.rows > max_rows:
            groups.append(group)
            group, rows = [], 0
        group.append(part)
        rows += part.rows
        if rows >= target:
            groups.append(group)
            group, rows = [], 0
    if group:
        groups.append(group)
    return groups


def apply_policy_to_group(frames: list[tuple[str, pd.DataFrame]], policy: str, internal: Path,
                          source: str | None = None, columns: dict[str, str] | None = None
                          ) -> list[tuple[pd.DataFrame, PartitionReport]]:
    """:func:`~dpatlas.release.validate.apply_policy` for each of ``frames`` ((partition,
    rows), in order), with one run of the contract for them all when it passes; each
    partition's rows that go on and its report."""
    if len(frames) == 1:
        (key, df), = frames
        return [apply_policy(df, policy, key, internal, source, columns)]
    from data_contracts import RELEASE_CONTEXT_LOCK, ReleaseDocs, validate_input

    keys = [key for key, _ in frames]
    checked = [clip_ranks(df, policy) for _, df in frames]
    run = f"input-{group_label(keys)}"
    rows = pd.concat([contract_frame(df, columns) for df, _, _ in checked], ignore_index=True)
    docs = ReleaseDocs.in_folder(internal)
    with RELEASE_CONTEXT_LOCK:  # one release project: the checks take turns (see apply_policy)
        result = validate_input(rows, release=docs, run_name=run)
        seal_release_docs(docs)
        index = record_run(internal, run, group_asset(keys, source), result, columns=columns,
                           fixes=fixes(_failures(result), columns, policy))
    del rows
    if not result.success:  # which partition, which rows: each checked again on its own
        return [apply_policy(df, policy, key, internal, source, columns) for key, df in frames]
    # each partition as checked alone and passed: no failure, no offending row
    return [CheckedPartition(key, policy, df, result, [], np.zeros(len(df), dtype=bool),
                             clipped, largest).kept(index, internal)
            for key, (df, clipped, largest) in zip(keys, checked)]
