"""The small-area model's fits of one state in every cell of a published release: all cells
in one ``fit_published`` call (a state's neighbours found once, as a publish part does) against
one call per cell (its neighbours found again for each cell, as before), side by side.

    .venv/bin/python benchmarks/bench_model_cells.py --release DIR [--state 17] [--repeats 3]

``DIR`` is a published release of several cells partitioned by state (``tracts/state=XX/``,
``counties.parquet``, ``states.parquet``). Both ways give the same values (checked); the
figures are this process's CPU seconds, the best of ``--repeats``. Run it alone: each line
prints the load average too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--state", default="17")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import geopandas as gpd
    import numpy as np
    import pandas as pd

    from dpatlas.small_area.published import fit_published

    files = sorted((args.release / "tracts" / f"state={args.state}").glob("*.parquet"))
    if not files:
        raise SystemExit(f"{args.release}: no tracts/state={args.state}/*.parquet")
    tracts = pd.concat([gpd.read_parquet(f) for f in files], ignore_index=True)
    tracts = gpd.GeoDataFrame(tracts, geometry="geometry", crs=gpd.read_parquet(files[0]).crs)
    levels = [pd.read_parquet(args.release / f"{name}.parquet")
              for name in ("counties", "states")]
    cells = sorted(tracts["cell"].astype(str).unique())
    print(f"state {args.state}: {len(tracts) // len(cells):,} tracts in each of {len(cells)} "
          f"cells ({len(tracts):,} rows)")

    def per_cell():
        return [fit_published(tracts[tracts["cell"].astype(str) == c].reset_index(drop=True),
                              *levels)[0] for c in cells]

    def at_once():
        return fit_published(tracts, *levels)[0]

    best = {}
    for label, run in (("one call per cell (neighbours found per cell)", per_cell),
                       ("all cells in one call (neighbours found once)", at_once)):
        spans = []
        for _ in range(args.repeats):
            with measure(label) as span:
                got = run()
            spans.append(span)
        best[label] = min(spans, key=lambda s: s.cpu)
        print(best[label].line())
        if label.startswith("one"):
            separate = pd.concat(got, ignore_index=True)
        else:
            order = np.concatenate([np.flatnonzero(tracts["cell"].astype(str) == c)
                                    for c in cells])
            np.testing.assert_array_equal(got.iloc[order].to_numpy(dtype=float),
                                          separate.to_numpy(dtype=float))
    a, b = (s.cpu for s in best.values())
    print(f"CPU, per cell / at once: {a / max(b, 1e-9):.2f} (the same values, checked)")


if __name__ == "__main__":
    main()
