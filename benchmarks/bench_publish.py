"""The static map of the publish stage (p25_map.png), before and after, side by side (issue 11).

Before: the previous ``write_map`` (geopandas plots, one hatched patch per low-reliability
tract), kept below as a labelled reference for this comparison only. After:
``dpatlas.publication.png_map.write_map`` (one collection per layer, the low-reliability tracts merged
and hatched as one shape). Both draw the same table in the same process, alternating; the
figure of each is the best of ``--repeats`` runs. Also printed: the merge alone, how many
pixels of the two PNGs differ, and the GeoJSON writer's time on the same table (unchanged
here; it is the other per-tract writer of the stage).

Geographies: a published release (``--release``, e.g. the demo's: ``dpatlas demo --out
/tmp/p1-demo``), and a synthetic one of ``--tracts`` tracts (``synth_boundaries``) with about
``--weak-share`` of its released tracts of low reliability (91% in the national run).

    .venv/bin/python benchmarks/bench_publish.py [--release DIR] [--tracts 20000]
        [--weak-share 0.91] [--repeats 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd

from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication.geojson import write_geojson_rfc7946
from dpatlas.publication.png_map import low_reliability_shape, write_map
from dpatlas.publication.static_map import low_reliability
from dpatlas.evaluation.synthetic_input import tract_geoids

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402

# Real state FIPS codes, one synthetic state per ~3,300 tracts (Illinois-sized).
_STATES = ("17", "18", "19", "20", "21", "26", "27", "29", "39", "55", "06", "48")
_TRACTS_PER_STATE = 3300
_MAX_WIDTH = 0.5  # the config's default intervals.low_reliability_width


def wider_than(table, max_width) -> pd.Series:
    """The previous map's rule for hatching: an interval wider than a fixed width."""
    if max_width is None or "p25_lo" not in table:
        return pd.Series(False, index=table.index)
    return (table["p25_hi"] - table["p25_lo"]) > max_width


def reference_write_map(table, path, title, max_width=None):
    """REFERENCE ONLY: the previous write_map, one hatched patch per low-reliability tract
    (and a full redraw after each geopandas layer). Kept here for the before figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(7, 8))
    released = table[table["status"] == "released"]
    other = table[table["status"] != "released"]
    if len(other):
        other.plot(ax=ax, color="#dddddd", linewidth=0.1, edgecolor="white")
    if len(released):
        released.plot(ax=ax, column="p25", cmap="RdYlBu", vmin=0.2, vmax=0.6, linewidth=0.1,
                      edgecolor="white", legend=True,
                      legend_kwds={"label": "p25: child rank at parent rank 25 (DP)",
                                   "shrink": 0.6})
    handles = [Patch(facecolor="#dddddd", label="suppressed or failed")]
    weak = table[wider_than(table, max_width)]
    if len(weak):
        weak.plot(ax=ax, facecolor="none", hatch="////", edgecolor="#555555", linewidth=0.0)
        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="////",
                             label=f"low reliability: interval wider than {max_width:g}"))
    ax.legend(handles=handles, loc="lower left", fontsize=7, frameon=False)
    ax.set_axis_off()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def release_table(folder: Path) -> tuple[gpd.GeoDataFrame, float | None]:
    """A published release's table and its low-reliability width (None without intervals)."""
    table = gpd.read_parquet(folder / "tracts.parquet")
    ci = json.loads((folder / "config.json").read_text()).get("intervals") or {}
    return table, (ci.get("low_reliability_width") if ci.get("enabled") else None)


def synthetic_table(n_tracts: int, weak_share: float, seed: int) -> gpd.GeoDataFrame:
    """Synthetic tracts with release-like columns: 97.7% released (the demo's share), p25
    around 0.4 (some beyond the colour scale), ``weak_share`` of the released too wide."""
    states = max(1, round(n_tracts / _TRACTS_PER_STATE))
    if states > len(_STATES):
        raise SystemExit(f"--tracts {n_tracts}: at most {len(_STATES) * _TRACTS_PER_STATE}")
    sizes = np.full(states, n_tracts // states)
    sizes[: n_tracts % states] += 1
    geoids = np.concatenate([tract_geoids(s, int(k), 100)[0]
                             for s, k in zip(_STATES[:states], sizes)])
    table = synth_boundaries(geoids, seed=seed)
    rng = np.random.default_rng(seed)
    n = len(table)
    table["status"] = np.where(rng.random(n) < 0.977, "released", "suppressed")
    table["p25"] = np.where(table["status"] == "released", rng.normal(0.4, 0.12, n), np.nan)
    width = np.where(rng.random(n) < weak_share, 0.75, 0.25)
    table["p25_lo"] = table["p25"] - width / 2
    table["p25_hi"] = table["p25"] + width / 2
    return table


class Seconds(float):
    """Wall seconds of the best run, with that run's CPU seconds."""

    cpu: float = 0.0


def best_seconds(fn, repeats: int) -> Seconds:
    best = Seconds("inf")
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        if wall < best:
            best = Seconds(wall)
            best.cpu = cpu
    return best


def differing_pixels(a: Path, b: Path) -> str:
    """Share of pixels whose colour differs by more than 10% in some channel."""
    from matplotlib.image import imread

    x, y = imread(a), imread(b)
    if x.shape != y.shape:
        return f"sizes differ: {x.shape} vs {y.shape}"
    share = float((np.abs(x - y).max(axis=2) > 0.1).mean())
    return f"{share:.2%} of {x.shape[1]}x{x.shape[0]} pixels"


def warm_up(table: gpd.GeoDataFrame, out: Path) -> None:
    """Draw a few tracts both ways first, so neither figure includes matplotlib's imports."""
    small = table.iloc[:20]
    reference_write_map(small, out / "warm-up.png", "warm-up", _MAX_WIDTH)
    write_map(small, out / "warm-up.png", "warm-up", True)


def compare(label: str, table: gpd.GeoDataFrame, max_width: float | None, out: Path,
            repeats: int) -> None:
    warm_up(table, out)
    released = int((table["status"] == "released").sum())
    weak = low_reliability(table).to_numpy()  # today's rule: an interval across colour classes
    title = f"{label}: p25 by tract ({released} of {len(table)} released)"
    before, after = out / f"{label}-before.png", out / f"{label}-after.png"
    t_before = t_after = Seconds("inf")
    for _ in range(repeats):  # alternate, so both see the same machine load
        t_before = min(t_before, best_seconds(
            lambda: reference_write_map(table, before, title, max_width), 1))
        t_after = min(t_after, best_seconds(lambda: write_map(table, after, title, True), 1))
    # min keeps the Seconds (with its CPU) of the faster run
    geoms = table.geometry.to_numpy()
    t_merge = best_seconds(lambda: low_reliability_shape(geoms[weak]), repeats)
    t_geojson = best_seconds(lambda: write_geojson_rfc7946(table, out / f"{label}.geojson"),
                             repeats)
    print(f"\n{label}: {len(table):,} tracts, {int(weak.sum()):,} hatched as low reliability")
    print(f"  {'write_map':<34}{'before':>9}{'after':>9}{'ratio':>8}")
    print(f"  {'p25_map.png':<34}{t_before:>8.2f}s{t_after:>8.2f}s{t_before / t_after:>7.1f}x")
    print(f"  {'  CPU':<34}{t_before.cpu:>8.2f}s{t_after.cpu:>8.2f}s"
          f"{t_before.cpu / max(t_after.cpu, 1e-9):>7.1f}x")
    print(f"  merging the hatched tracts (inside 'after'): {t_merge:.2f} s ({t_merge.cpu:.2f} s "
          "CPU)")
    print(f"  pixels differing, before vs after: {differing_pixels(before, after)}")
    print(f"  GeoJSON writer on the same table (not changed here): {t_geojson:.2f} s "
          f"({t_geojson.cpu:.2f} s CPU)")
    print(f"  images: {before}  {after}")


def main() -> None:
    with measure("bench_publish, whole run") as run:
        _main()
    print(run.line())


def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", type=Path, default=None,
                    help="a published release folder (tracts.parquet, config.json)")
    ap.add_argument("--tracts", type=int, default=20000)
    ap.add_argument("--weak-share", type=float, default=0.91)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dpatlas-bench-publish-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.release is not None:
        table, width = release_table(args.release)
        compare("release", table, width, out, args.repeats)
    if args.tracts > 0:
        t0 = time.perf_counter()
        table = synthetic_table(args.tracts, args.weak_share, args.seed)
        print(f"\n(synthetic geography generated in {time.perf_counter() - t0:.1f} s)")
        compare(f"synthetic-{len(table)}", table, _MAX_WIDTH, out, args.repeats)


if __name__ == "__main__":
    main()
