"""Tile build time and archive size: the demo state and a 20-state release.

    .venv/bin/python benchmarks/bench_tiles.py [--release DIR] [--states 20] [--tracts 1075]

1. The demo state: ``--release DIR`` times ``build_tiles`` on that release's own
   ``tracts.geojson`` (e.g. demo/releases/latest); without it, a synthetic state of the demo's
   size (3,108 tracts) is made as in 2.
2. ``--states`` states of ``--tracts`` tracts each (a 20-state country of 21,500 tracts by
   default): synthetic boundaries (dpatlas.evaluation.synthetic_boundaries), made-up published
   values (no microdata or noise: the values do not change the tiling work), assembled and
   written exactly as publish does (publish.assemble, write_geojson_rfc7946); then the tiles.

Only ``build_tiles`` is timed (tippecanoe reading the GeoJSON and writing the archive).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

# Real state FIPS codes: the first --states of them are used (20 by default)
STATES = ["01", "04", "05", "06", "08", "09", "12", "13", "17", "18", "19", "20", "21", "22",
          "24", "25", "26", "27", "28", "29", "36", "39", "42", "48", "53"]
DEMO_TRACTS = 3108

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402


def made_up_results(geoids: np.ndarray, seed: int = 0) -> pd.DataFrame:
    """Estimator output of the published shape with random values (not a release: a load)."""
    rng = np.random.default_rng(seed)
    n = len(geoids)
    p25, p75, half = rng.uniform(0, 1, n), rng.uniform(0, 1, n), rng.uniform(0.02, 0.5, n)
    return pd.DataFrame({
        "geoid": geoids, "cell": "all", "n": rng.integers(2, 500, n),
        "mechanism": rng.choice(["NoisyStats", "DPExpTheilSen"], n), "status": "released",
        "reason": "", "p25_raw": p25, "p75_raw": p75, "epsilon_spent": 0.9999998614530536,
        "delta_spent": 0.0, "p25_lo": np.clip(p25 - half, 0, 1),
        "p25_hi": np.clip(p25 + half, 0, 1), "p75_lo": np.clip(p75 - half, 0, 1),
        "p75_hi": np.clip(p75 + half, 0, 1), "p25_se": np.minimum(half / 2, 0.5),
        "p75_se": np.minimum(half / 2, 0.5)})


def synthetic_geojson(states: list[str], tracts: int, out: Path) -> Path:
    from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
    from dpatlas.publication.geojson import write_geojson_rfc7946
    from dpatlas.publication.tract_files import assemble
    from dpatlas.evaluation.synthetic_input import tract_geoids

    t0 = time.perf_counter()
    geoids = np.concatenate([tract_geoids(s, tracts, max(1, tracts // 30))[0] for s in states])
    boundaries = synth_boundaries(geoids, seed=0)
    table = assemble(made_up_results(boundaries["geoid"].to_numpy()), boundaries)
    write_geojson_rfc7946(table, out)
    print(f"  input: {len(states)} state(s) x {tracts} tracts = {len(table)} features, "
          f"GeoJSON {out.stat().st_size / 2**20:.1f} MiB (made in "
          f"{time.perf_counter() - t0:.1f} s, not timed below)", flush=True)
    return out


def time_tiles(label: str, geojson: Path, out: Path) -> None:
    """Wall time and CPU time, tippecanoe's (a child) included (the machine is shared: wall
    time depends on the load, CPU time much less), archive size."""
    from dpatlas.publication.tiles import build_tiles

    with measure(f"{label}, build_tiles") as span:
        build = build_tiles(geojson, out)
    print(f"{label}: {build.features} tracts, z{build.min_zoom}-z{build.max_zoom}, "
          f"build {build.seconds:.1f} s wall, {span.cpu:.1f} s CPU, archive "
          f"{build.bytes / 2**20:.1f} MiB ({build.bytes / build.features / 1024:.2f} KiB per "
          "tract)", flush=True)
    print(f"  {span.line()}", flush=True)


def main() -> None:
    with measure("bench_tiles, whole run") as run:
        _main()
    print(run.line())


def _main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", type=Path, help="a release folder (its tracts.geojson)")
    ap.add_argument("--states", type=int, default=20)
    ap.add_argument("--tracts", type=int, default=1075, help="tracts per state")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not 1 <= args.states <= len(STATES):
        raise SystemExit(f"error: --states must be in 1..{len(STATES)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="dpatlas-tiles-"))
    out.mkdir(parents=True, exist_ok=True)

    if args.release:
        demo = args.release / "tracts.geojson"
        print(f"demo state: {demo}")
    else:
        print("demo state: synthetic, the demo's size")
        demo = synthetic_geojson(["17"], DEMO_TRACTS, out / "demo.geojson")
    time_tiles("demo state", demo, out / "demo.pmtiles")

    print(f"{args.states} states:")
    country = synthetic_geojson(STATES[:args.states], args.tracts, out / "states.geojson")
    time_tiles(f"{args.states} states", country, out / "states.pmtiles")
    print(f"files in {out}")


if __name__ == "__main__":
    main()
