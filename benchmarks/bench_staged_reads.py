"""What the chunks' reads of a release's staged partitions cost, laid out as before and now.

The staged partitions of a release (its internal folder's ``staged/``) are written twice into a
scratch folder: as before 2026-12-02 (``to_parquet``: the input's order, pyarrow's default row
groups of 1 Mi rows) and in the staged layout (:mod:`dpatlas.release.staged_layout`: (cell,
GEOID) order, row groups of 128 Ki rows). Then every chunk the release plans
(``split_into_chunks`` with ``partition_tracts`` and ``TASK_RECORDS``) is read as its task
reads it (``read_chunk``), once per layout, alternating, ``--repeats`` times. A release reads
each chunk twice (selection, then estimation).

    .venv/bin/python benchmarks/bench_staged_reads.py \\
        --staged WORK/run-local/releases-internal/national-local/staged [--repeats 3]

Run it alone: the load average is printed. Every figure is CPU seconds of this process.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd

from dpatlas.core.config import ReleaseConfig
from dpatlas.release import cell_groups, staged_layout
from dpatlas.release.estimate import read_chunk, split_into_chunks, staged_counts, tracts_of

LAYOUTS = ("before", "layout")


def _write(frame: pd.DataFrame, path: Path, layout: str) -> float:
    start = time.process_time()
    if layout == "before":
        frame.to_parquet(path, index=False)
    else:
        staged_layout.write(frame, path)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--staged", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sources = sorted(args.staged.glob("input-*.parquet"))
    if not sources:
        parser.error(f"no staged partitions (input-*.parquet) in {args.staged}")
    print("load average at the start:", " ".join(f"{v:.2f}" for v in os.getloadavg()))
    chunk_tracts = ReleaseConfig.model_fields["partition_tracts"].default
    with tempfile.TemporaryDirectory(prefix="dpatlas-staged-reads-") as scratch:
        files: dict[str, list[Path]] = {layout: [] for layout in LAYOUTS}
        written = dict.fromkeys(LAYOUTS, 0.0)
        records = 0
        for source in sources:
            frame = pd.read_parquet(source)
            records += len(frame)
            for layout in LAYOUTS:
                path = Path(scratch) / layout / source.name
                path.parent.mkdir(exist_ok=True)
                written[layout] += _write(frame, path, layout)
                files[layout].append(path)
            del frame
        plans = {}
        for layout in LAYOUTS:
            counts = staged_counts(files[layout])
            plans[layout] = split_into_chunks(tracts_of(counts), chunk_tracts, counts,
                                              cell_groups.TASK_RECORDS)
        print(f"{len(sources)} partitions, {records:,} records, {len(plans['layout'])} chunks")
        print("| staged as | write CPU-s | chunk reads CPU-s (each repeat) | rows read |")
        print("| --- | ---: | --- | ---: |")
        reads: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
        rows = dict.fromkeys(LAYOUTS, 0)
        for _ in range(args.repeats):
            for layout in LAYOUTS:
                start = time.process_time()
                rows[layout] = sum(len(read_chunk(chunk)) for chunk in plans[layout])
                reads[layout].append(time.process_time() - start)
        for layout in LAYOUTS:
            print(f"| {layout} | {written[layout]:.2f} | "
                  f"{', '.join(f'{t:.2f}' for t in reads[layout])} | {rows[layout]:,} |")
        shutil.rmtree(scratch, ignore_errors=True)
    print("load average at the end:", " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()
