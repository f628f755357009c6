"""The small-area model's fits of one state in every cell of a published release: all cells
in one ``fit_published`` call (a state's neighbours found once, as a publish part does) against
one call per cell (its neighbours found again for each cell, as before), side by side; then a
fit's kernel means as the model takes them (a product of the sparse kernel matrix with a
vector, ``KernelPairs.mean``) against the pairs selected and summed (the way before, kept here
as :func:`pairs_mean`), on the state's first cell, values checked equal to 1e-12.

    .venv/bin/python benchmarks/bench_model_cells.py --release DIR [--state 17] [--repeats 3]

``DIR`` is a published release of several cells partitioned by state (``tracts/state=XX/``,
``counties.parquet``, ``states.parquet``; its ``manifest.json`` gives the plan's noise, which
the fits take as the release's do). Both ways give the same values (checked); the
figures are this process's CPU seconds, the best of ``--repeats``. Run it alone: each line
prints the load average too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402


def pairs_mean(pairs, values, weights):
    """A kernel mean the way ``KernelPairs.mean`` took it before: the pairs whose neighbour is
    usable selected, then summed per point (``np.bincount``)."""
    import numpy as np

    matrix = pairs.matrix.tocoo()
    i, j, kernel = matrix.row, matrix.col, matrix.data
    ok = (np.isfinite(values) & (weights > 0))[j]
    i, j, w = i[ok], j[ok], kernel[ok] * weights[j[ok]]
    num = np.bincount(i, w * values[j], minlength=pairs.size)
    den = np.bincount(i, w, minlength=pairs.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


ROUNDS = 20


def kernel_means(tracts, repeats: int) -> None:
    """A fit's eight kernel means (2 value columns × 2 bandwidths × 2 passes) both ways,
    ``ROUNDS`` times in each timing."""
    import numpy as np

    from dpatlas.small_area.model import BANDWIDTHS_KM, tract_neighbours

    first = tracts[tracts["cell"].astype(str) == str(tracts["cell"].iloc[0])]
    kernels = tract_neighbours(first, first["geoid"]).kernels
    columns = [first[c].to_numpy(dtype=float) for c in ("p25", "p75")]
    se = first["p25_se"].to_numpy(dtype=float) if "p25_se" in first else np.ones(len(first))
    weights = np.where(np.isfinite(se), 1.0 / np.maximum(se, 1e-3) ** 2, 0.0)
    ways = {"kernel means, pairs selected and summed (before)": pairs_mean,
            "kernel means, sparse matrix products (KernelPairs.mean)":
                lambda pairs, v, w: pairs.mean(v, w)}
    best, got = {}, {}
    for label, mean in ways.items():
        spans = []
        for _ in range(repeats):
            with measure(label) as span:
                for _ in range(ROUNDS):  # a fit's means take a few ms: timed 20 at a time
                    got[label] = [mean(kernels[h], v, weights) for _ in range(2)
                                  for v in columns for h in BANDWIDTHS_KM]
            spans.append(span)
        best[label] = min(spans, key=lambda s: s.cpu)
        print(best[label].line())
    before, now = got.values()
    for a, b in zip(before, now):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)
    a, b = (s.cpu for s in best.values())
    print(f"CPU of a fit's kernel means ({ROUNDS} fits), before / now: {a / max(b, 1e-9):.2f} "
          "(the same values to 1e-12, checked)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--state", default="17")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import geopandas as gpd
    import numpy as np
    import pandas as pd

    from dpatlas.small_area.published import fit_published, noise_from_steps

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

    # the plan's noise, as the release's publish parts fit with it (no manifest: without)
    manifest = args.release / "manifest.json"
    noise = (noise_from_steps((json.loads(manifest.read_text()).get("budget") or {})
                              .get("steps")) if manifest.exists() else None)
    print(f"the directs' noise from the plan: {noise}")

    def per_cell():
        return [fit_published(tracts[tracts["cell"].astype(str) == c].reset_index(drop=True),
                              *levels, noise)[0] for c in cells]

    def at_once():
        return fit_published(tracts, *levels, noise)[0]

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
    kernel_means(tracts, args.repeats)


if __name__ == "__main__":
    main()
