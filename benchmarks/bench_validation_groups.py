"""The input contract run by partition against run in groups (the local runner), side by side.

On the data a release reads (``--data``: a folder with ``microdata/`` and ``tracts.parquet``,
such as the one ``bench_national.py`` generates under its ``--work``), with the demo's
release config, every partition is read once; then, in one process and one thread, each
way runs its checks into a fresh release folder:

- by partition: one run of the input contract per partition (``apply_policy``);
- grouped: the local runner's groups (``validation_groups.input_groups``), one run each
  (``apply_policy_to_group``);
- by partition again, then grouped again: the first of four runs pays for Great
  Expectations' imports and caches, so the last two are the pair to compare.

It prints the CPU and wall seconds of each, and the fixed cost of a run and the cost of a
record fitted over the by-partition runs (seconds = fixed + per record x records).

    .venv/bin/python benchmarks/bench_validation_groups.py --data /tmp/dpatlas-national/data
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="a folder with microdata/ and tracts.parquet")
    args = ap.parse_args()

    from dpatlas.cli.demo import release_config
    from dpatlas.core.config import parse_config
    from dpatlas.release.ingest import partitions, read_partition
    from dpatlas.release.validate import input_column_names
    from dpatlas.release.validation_groups import apply_policy_to_group, input_groups

    with tempfile.TemporaryDirectory(prefix="bench-validation-") as tmp:
        work = Path(tmp)
        cfg = parse_config(release_config(args.data, work / "releases"))
        columns = input_column_names(cfg.input.columns)
        parts = partitions(cfg.input)
        frames = {p.key: read_partition(cfg.input, p.key, p.cells) for p in parts}
        groups = input_groups(parts)
        print(f"{len(parts)} partitions, {sum(len(f) for f in frames.values()):,} records; "
              f"{len(groups)} groups of {[sum(p.rows for p in g) for g in groups]} records")
        ways = {"by partition": [[p] for p in parts], "grouped": groups}
        for round_ in (1, 2):
            for name, way in ways.items():
                internal = work / f"{name.replace(' ', '-')}-{round_}"
                seconds = []
                c0, w0 = time.process_time(), time.perf_counter()
                for group in way:
                    t0 = time.perf_counter()
                    apply_policy_to_group([(p.key, frames[p.key]) for p in group], "fail",
                                          internal, str(cfg.input.path), columns)
                    seconds.append((sum(len(frames[p.key]) for p in group),
                                    time.perf_counter() - t0))
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                print(f"round {round_}, {name}: {len(way)} runs, {cpu:.2f} CPU-s, "
                      f"{wall:.2f} s wall")
                if name == "by partition" and round_ == 2:
                    rows, secs = np.array(seconds, dtype=float).T
                    fixed, per_record = np.linalg.lstsq(
                        np.vstack([np.ones_like(rows), rows]).T, secs, rcond=None)[0]
                    print(f"  a run: {fixed:.3f} s fixed + {per_record * 1e6:.2f} us a record "
                          f"(least squares over the {len(way)} runs)")


if __name__ == "__main__":
    main()
