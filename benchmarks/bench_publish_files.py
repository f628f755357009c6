"""The files of the publish stage on a published release's own tables (issue 22, item 2):
``write_release`` with its county and state files, timed as a whole (CPU of the process and
of its children, tippecanoe being a child, beside wall time and the load average) and per
writer (CPU under cProfile with a process-time clock; ``--profile``).

The tables come from a published release folder (``tracts.parquet``, ``counties.parquet``,
``states.parquet``, ``config.json``, ``manifest.json``), e.g. the national benchmark's:

    .venv/bin/python benchmarks/bench_national.py --runners local --work /tmp/nat
    .venv/bin/python benchmarks/bench_publish_files.py \
        --release /tmp/nat/run-local/releases/national-local [--repeats 1] [--profile]

Only the files are timed: assembling the tables, the output contract and the manifest's
budget accounting happen before ``write_release`` and are not this benchmark's.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import tempfile
import time
from functools import partial
from pathlib import Path

import geopandas as gpd

from dpatlas.publication.level_files import write_all_levels
from dpatlas.publication.tiles import release_tile_text
from dpatlas.publication.cell_stream import write_release

# Writers whose CPU is reported under --profile (cProfile cumulative, process-time clock).
WRITERS = ("write_release", "write_release_by_cells", "append", "write_features",
           "build_tiles", "to_csv", "write_map", "write_web_map",
           "write_level_files", "write_all_levels", "footprint", "sha256_file",
           "write_datapackage", "write_shared_library")


def read_tracts(folder: Path) -> gpd.GeoDataFrame:
    """The release's tract table: ``tracts.parquet``, or a national-style release's parts
    read as one table the way its codebook says (each part keeps its ``state`` column)."""
    if (folder / "tracts.parquet").is_file():
        return gpd.read_parquet(folder / "tracts.parquet")
    return gpd.read_parquet(folder / "tracts", partitioning=None)


def load(folder: Path):
    """The release's tract table, its level tables, config and manifest (without its
    file list, which write_release writes again)."""
    table = read_tracts(folder)
    levels = {level: gpd.read_parquet(folder / f"{stem}.parquet")
              for level, stem in (("county", "counties"), ("state", "states"))
              if (folder / f"{stem}.parquet").is_file()}
    config = json.loads((folder / "config.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    for key in ("files", "rounding", "extent"):
        manifest.pop(key, None)
    return table, levels, config, manifest


def publish_once(table, levels, config, manifest, root: Path, release_id: str) -> Path:
    interval_level = (config.get("intervals") or {}).get("level", 0.95)
    return write_release(table, manifest, root, release_id, config=config,
                         internal_dir=root.parent / "internal",
                         more_files=partial(write_all_levels, levels,
                                            interval_level=interval_level,
                                            tile_text=partial(release_tile_text, release_id,
                                                              config)))


def measured(fn) -> dict:
    """Wall, CPU of this process and CPU of its finished children around ``fn()``."""
    before, t0 = os.times(), time.perf_counter()
    fn()
    after, wall = os.times(), time.perf_counter() - t0
    own = (after.user - before.user) + (after.system - before.system)
    children = ((after.children_user - before.children_user)
                + (after.children_system - before.children_system))
    return {"wall": wall, "cpu_process": own, "cpu_children": children,
            "cpu_total": own + children, "load_average": os.getloadavg()}


def writer_cpu(profile: cProfile.Profile) -> dict:
    stats = pstats.Stats(profile)
    out = {}
    for (_, _, name), (_, _, _, cumulative, _) in stats.stats.items():
        if name in WRITERS:
            out[name] = out.get(name, 0.0) + cumulative
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--release", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--profile", action="store_true",
                    help="also the CPU of each writer (cProfile; adds its own overhead)")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args()
    table, levels, config, manifest = load(args.release)
    work = args.work or Path(tempfile.mkdtemp(prefix="dpatlas-bench-files-"))
    print(f"{len(table):,} tract rows, levels {sorted(levels)}; work in {work}")
    runs = []
    for i in range(args.repeats):
        root = work / f"run-{i}" / "releases"
        shutil.rmtree(root.parent, ignore_errors=True)
        root.mkdir(parents=True)
        release_id = args.release.name
        if args.profile:
            profile = cProfile.Profile(time.process_time)
            figures = measured(lambda: profile.runcall(
                publish_once, table, levels, config, manifest, root, release_id))
            figures["writers_cpu"] = writer_cpu(profile)
        else:
            figures = measured(lambda: publish_once(table, levels, config, manifest, root,
                                                    release_id))
        figures["bytes"] = {p.name: p.stat().st_size
                            for p in sorted((root / release_id).iterdir())}
        runs.append(figures)
        print(f"run {i}: wall {figures['wall']:.1f} s, CPU {figures['cpu_total']:.1f} s "
              f"(process {figures['cpu_process']:.1f}, children {figures['cpu_children']:.1f}),"
              f" load average {figures['load_average'][0]:.2f}")
        for name, seconds in sorted(figures.get("writers_cpu", {}).items(),
                                    key=lambda kv: -kv[1]):
            print(f"    {name:<26}{seconds:>7.2f} CPU-s (process)")
        shutil.rmtree(root.parent, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
