"""What validating a state costs when its partition is split by cells: the validation task's
work (read the partition, check it against the input contract in a GX project of its own,
stage its clean rows, hash them for the contributions check) on one state of a release's
input, whole and as one-cell groups, side by side.

    .venv/bin/python benchmarks/bench_split_validation.py --config W6/run-dask/config.yaml \\
        [--state 06] [--json-out split.json]

A state of more than ``ingest.PARTITION_RECORDS`` records (4 M) is validated in groups of whole
cells, and each group's task reads its state's files and keeps its cells' records: it pays for
the group's records and for the records of the state it leaves. With the 6-cell input of
``bench_national.py`` no state passes 4 M records, so this splits one state into its six cells
(each group a sixth of its state, as California's 4 M-record groups of 24 M at 42 cells) and
fits, per record, with S the state's records and g a group's:

* a whole state: c + a·S (a: CPU per record validated; c, a task's fixed CPU, is taken from
  the whole state alone: it is one number against thousands of records);
* a group: c + a·g + b·(S − g) (b: CPU per record of the state read and left).

``benchmarks/estimate_cells.py --split-json`` plans the partitions of a 42-cell release with the
release's own grouping and prices each with a and b. Run it alone (the load average is
printed): each way is timed ``--repeats`` times and the least CPU kept.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402


def validate_once(cfg, key: str, cells, policy: str) -> int:
    """The validation task's body on ``key`` (``cells``: a group's), in a scratch folder;
    the records it validated."""
    from dpatlas.release.ingest import read_partition
    from dpatlas.release.validate import input_column_names
    from dpatlas.release.validate_parts import validate_part

    with tempfile.TemporaryDirectory(prefix="bench-split-") as scratch:
        df = read_partition(cfg.input, key, cells)
        part = validate_part(df, policy, key, scratch, scratch, str(Path(scratch) / "index"),
                             input_column_names(cfg.input.columns),
                             bool(cfg.input.columns.person_id))
        if part.refusal:
            raise SystemExit(f"{key}: refused: {part.refusal}")
        return len(df)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True,
                        help="a bench_national.py run's config.yaml (its input has cells)")
    parser.add_argument("--state", default="06")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()

    from dpatlas.core.config import load_config
    from dpatlas.release.ingest import partitions

    cfg = load_config(args.config)
    if not cfg.input.columns.cell:
        raise SystemExit(f"{args.config}: the input has no cell column")
    whole = [p for p in partitions(cfg.input) if p.key == args.state]
    if len(whole) != 1:
        raise SystemExit(f"state {args.state} is not one partition of {cfg.input.path}")
    import pyarrow.dataset as ds

    cells_of = ds.dataset(Path(cfg.input.path) / f"state={args.state}", format="parquet")
    cells = sorted({str(c) for c in cells_of.to_table(columns=[cfg.input.columns.cell])
                    .column(0).to_pylist()})
    if len(cells) < 2:
        raise SystemExit(f"state {args.state} has {len(cells)} cell: nothing to split")
    policy = cfg.validation.policy

    def least(label, key, group):
        spans = []
        for _ in range(args.repeats):
            with measure(label) as span:
                records = validate_once(cfg, key, group, policy)
            spans.append(span)
        best = min(spans, key=lambda s: s.cpu)
        print(best.line(), flush=True)
        return best.cpu, records

    state_cpu, state_records = least(f"state {args.state} whole", args.state, None)
    groups = [least(f"state {args.state} cell {cell} alone", f"{args.state}-c{k}", (cell,))
              for k, cell in enumerate(cells)]
    # a from the whole state (c taken as 0: one task's fixed CPU against millions of records
    # would be lost in the timing), b from the groups' excess over their share of it
    a = state_cpu / state_records
    left = sum(state_records - g for _, g in groups)
    b = (sum(cpu for cpu, _ in groups) - state_cpu) / left
    print(f"state {args.state}: {state_records:,} records in {len(cells)} cells; whole "
          f"{state_cpu:.2f} CPU-s, the {len(cells)} cells alone "
          f"{sum(cpu for cpu, _ in groups):.2f} CPU-s in all")
    print(f"per record validated a = {1e6 * a:.3f} µs; per record of the state read and left "
          f"b = {1e6 * b:.3f} µs")
    if args.json_out:
        args.json_out.write_text(json.dumps({
            "state": args.state, "records": state_records, "cells": len(cells),
            "whole_cpu": state_cpu, "groups": [{"cpu": c, "records": g} for c, g in groups],
            "per_record_validated": a, "per_record_left": b}, indent=1))


if __name__ == "__main__":
    main()
