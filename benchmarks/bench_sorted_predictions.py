"""The Theil–Sen sorted predictions (``mechanisms/sorted_predictions.py``): what the build of a
partition costs, and where copying a row's sorted values one slice at a time starts to beat
one gather and scatter for a whole group of equal-size tracts (``_SLICE_ROW_LENGTH``).

    .venv/bin/python benchmarks/bench_sorted_predictions.py \\
        [--staged INTERNAL/staged/input-06.parquet] [--tracts 3000] [--repeats 3] \\
        [--values 4000000]

Without ``--staged`` the records are generated: tract sizes log-normal around 50 (3 to 700,
like a state of the default national data), x on the 0.01 grid (tied x, dropped pairs).
Printed, each the least CPU of ``--repeats`` (alternated):
- the build of all the tracts' sorted predictions at x = 0.25 and 0.75, against the pair by
  pair path it replaced (``all_pairs``, ``theil_sen_predictions``, ``Segments.build``), whose
  values it equals (checked here too);
- per row length, the two ways of copying a group's sorted rows, and their ratio.
Run it alone: each line gives its load average.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import load_average  # noqa: E402

from mechanisms import sorted_predictions as SP  # noqa: E402
from mechanisms.batch import TractBatch  # noqa: E402
from mechanisms.median import Segments  # noqa: E402
from mechanisms.pairs import all_pairs, theil_sen_predictions  # noqa: E402

X_STARS = (0.25, 0.75)
LO, HI = -0.5, 1.5


def generated(tracts: int, seed: int = 0) -> TractBatch:
    rng = np.random.default_rng(seed)
    n = np.clip(np.round(rng.lognormal(np.log(50), 0.9, tracts)), 3, 700).astype(int)
    x = np.round(rng.uniform(0, 1, n.sum()), 2)
    y = np.clip(0.3 + 0.4 * x + rng.normal(0, 0.2, x.size), 0, 1)
    return TractBatch.from_labels(np.repeat(np.arange(tracts), n), x, y)


def staged(path: Path) -> TractBatch:
    frame = pd.read_parquet(path, columns=["geoid", "x", "y"])
    return TractBatch.from_labels(frame["geoid"].to_numpy(), frame["x"].to_numpy(),
                                  frame["y"].to_numpy())


def cpu(fn) -> tuple[float, object]:
    """The CPU seconds of one call, and its result."""
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def pair_by_pair(batch: TractBatch) -> list[Segments]:
    pairs = all_pairs(batch)
    tract, zs = theil_sen_predictions(batch, pairs, X_STARS, LO, HI)
    return [Segments.build(tract, z, batch.n_tracts) for z in zs]


def build_figures(batch: TractBatch, repeats: int) -> None:
    pairs = int((batch.n * (batch.n - 1) // 2).sum())
    grouped_s = paired_s = float("inf")
    for _ in range(repeats):  # alternated, the least of each
        built = want = None  # the last results are let go before the next calls
        t, built = cpu(lambda: SP.build_sorted_predictions(batch, X_STARS, LO, HI))
        grouped_s = min(grouped_s, t)
        t, want = cpu(lambda: pair_by_pair(batch))
        paired_s = min(paired_s, t)
    for seg, ref in zip(built.segments, want):
        if not (np.array_equal(seg.z, ref.z) and np.array_equal(seg.offsets, ref.offsets)):
            raise SystemExit("the grouped build differs from the pair-by-pair path")
    print(f"build of {batch.n_tracts:,} tracts, {pairs:,} pairs: least CPU-s grouped "
          f"{grouped_s:.3f}, pair by pair {paired_s:.3f} (grouped / pair by pair "
          f"{grouped_s / paired_s:.2f}); same values; load {load_average()}")


def copy_figures(repeats: int, values: int = 4_000_000) -> None:
    """For each row length, a group of sorted rows holding about ``values`` values, a random
    share of each row kept (as tied x drop pairs), copied both ways."""
    rng = np.random.default_rng(1)
    for length in (10, 28, 55, 91, 136, 190, 435, 1225, 4950):
        rows = max(values // length, 1)
        z = np.sort(rng.uniform(size=(rows, length)), axis=1)
        kept = rng.integers(length // 2, length + 1, rows)
        starts = np.concatenate([[0], np.cumsum(kept)[:-1]]).astype(np.int64)
        out = np.empty(int(kept.sum()))
        slices = gather = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            for row, at, k in zip(z, starts.tolist(), kept.tolist()):
                out[at:at + k] = row[:k]
            slices = min(slices, time.process_time() - start)
            start = time.process_time()
            out[SP.runs(starts, kept)] = z[np.arange(length) < kept[:, None]]
            gather = min(gather, time.process_time() - start)
        print(f"row length {length:>5}: {rows:,} rows; least CPU-ms slices {slices * 1e3:.1f}, "
              f"gather-scatter {gather * 1e3:.1f} (slices / gather {slices / gather:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--staged", type=Path, help="a staged input partition (parquet)")
    parser.add_argument("--tracts", type=int, default=3000, help="generated tracts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--values", type=int, default=4_000_000,
                        help="values per row length in the copy comparison")
    args = parser.parse_args()
    batch = staged(args.staged) if args.staged else generated(args.tracts)
    print(f"load average at the start: {load_average()}; slices from row length "
          f"{SP._SLICE_ROW_LENGTH} in the build")
    build_figures(batch, args.repeats)
    copy_figures(args.repeats, args.values)


if __name__ == "__main__":
    main()
