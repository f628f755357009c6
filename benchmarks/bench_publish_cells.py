"""Publish's memory against the number of cells (issue 22, item 3): the whole-table path
(every tract-cell assembled, checked and written at once, as main did) beside the path that
publishes a group of cells at a time (``dpatlas.publication.cell_stream``), for N cells over
the national boundaries.

Result rows are fabricated per tract-cell (status released, values in [0, 1], intervals
around them), split into chunk files as the flow's are. Each (path, N) runs in a child
process, which reports its own peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``: the
flow process's share; tippecanoe runs as a grandchild and is not in it) and its CPU seconds
(process, and children such as tippecanoe). The output contract is checked (Great
Expectations, as the release does); the small-area model and the county/state files are
not run (they are the same in both paths and not what grows here).

    .venv/bin/python benchmarks/bench_publish_cells.py \
        --boundaries /tmp/nat-base/data/tracts.parquet --cells 1 6 12 [--tiles]

Without ``--tiles`` the tiles are not built (tippecanoe's memory is its own process's and its
work is the same both ways); the GeoJSON it reads is written either way.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
CHUNKS = 8
INTERVALS = SimpleNamespace(level=0.95)
CONFIG = {"release": "bench", "intervals": {"enabled": True, "level": 0.95,
                                            "low_reliability_width": 0.3}}


def fabricate_results(boundaries, cells: int, folder: Path) -> list[Path]:
    """Plausible result rows for every tract and cell, in CHUNKS files (chunks of tracts)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(cells)
    geoids = boundaries["geoid"].to_numpy()
    paths = []
    for k, part in enumerate(np.array_split(np.arange(len(geoids)), CHUNKS)):
        n = len(part)
        frames = []
        for c in range(cells):
            p25, p75 = rng.uniform(0.2, 0.6, n), rng.uniform(0.4, 0.8, n)
            frames.append(pd.DataFrame({
                "geoid": geoids[part], "cell": f"cell-{c + 1:02d}", "n": rng.integers(20, 400, n),
                "mechanism": "NoisyStats", "status": "released", "reason": None,
                "p25_raw": p25, "p75_raw": p75, "epsilon_spent": 1.0, "delta_spent": 0.0,
                "p25_lo": np.clip(p25 - 0.1, 0, 1), "p25_hi": np.clip(p25 + 0.1, 0, 1),
                "p75_lo": np.clip(p75 - 0.1, 0, 1), "p75_hi": np.clip(p75 + 0.1, 0, 1),
                "p25_se": 0.05, "p75_se": 0.05}))
        paths.append(folder / f"chunk-{k}.parquet")
        pd.concat(frames, ignore_index=True).to_parquet(paths[-1], index=False)
    return paths


def publish_whole(result_files, boundaries, root: Path, internal: Path) -> Path:
    """The path before streaming: every result at once, assembled, checked and written as
    one group."""
    return publish_by_cells(result_files, boundaries, root, internal, max_rows=2**62)


def publish_by_cells(result_files, boundaries, root: Path, internal: Path,
                     max_rows: int | None = None) -> Path:
    """The streamed path, as tasks/publish.py runs it (without model and levels); groups of
    at most ``max_rows`` tract-cells (default: publish's own bound)."""
    from dpatlas.publication import cell_stream as S
    from tasks.publish import _check_contract, _check_output_contracts

    cfg = SimpleNamespace(intervals=INTERVALS)
    cells = S.release_cells(result_files)
    groups = S.cell_groups(cells, len(boundaries), max_rows)
    geoids = list(boundaries["geoid"])

    def check_group(rows, index, count):  # as a publish part checks its groups
        return _check_contract("tract", rows, geoids if index == 0 else None, cfg, internal,
                               f"published-{index + 1}-of-{count}")

    checks = S.CellGroupChecks(group=check_group,
                               finish=partial(_check_output_contracts, {}, cfg, internal))
    return S.write_release_by_cells(
        S.assembled_groups(result_files, groups, boundaries), cells,
        lambda summary: {"release_id": "bench", "counts": summary.counts()}, root, "bench",
        config=CONFIG, checks=checks, group_count=len(groups), internal_dir=internal)


def child(args) -> None:
    """One (path, N) run: fabricate (not measured), publish, print a JSON line."""
    from dpatlas.publication import tiles
    from dpatlas.release.boundaries import load_boundaries

    if not args.tiles:  # an empty archive: tippecanoe's work is the same both ways
        tiles.build_tiles = lambda geojson, out, **_: Path(out).write_bytes(b"") and None
    work = Path(args.work)
    boundaries = load_boundaries(args.boundaries)
    files = fabricate_results(boundaries, args.cells, work)
    del boundaries  # publish gets its own copy, as the flow's task does
    import gc
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    boundaries = load_boundaries(args.boundaries)
    t0, c0 = time.perf_counter(), os.times()
    publish = publish_whole if args.path == "whole" else publish_by_cells
    folder = publish(files, boundaries, work / "root", work / "internal")
    c1 = os.times()
    print(json.dumps({
        "path": args.path, "cells": args.cells, "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(c1.user + c1.system - c0.user - c0.system, 1),
        "children_cpu_s": round(c1.children_user + c1.children_system
                                - c0.children_user - c0.children_system, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "rss_before_publish_mib": round(before / 1024),
        "rows": json.loads((folder / "manifest.json").read_text())["counts"]["rows"]}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boundaries", default="/tmp/nat-base/data/tracts.parquet")
    ap.add_argument("--cells", type=int, nargs="+", default=[1, 6, 12])
    ap.add_argument("--paths", nargs="+", default=["whole", "cells"], choices=["whole", "cells"])
    ap.add_argument("--tiles", action="store_true", help="build the tiles (tippecanoe)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(SimpleNamespace(**{**vars(args), "cells": args.cells[0]}))
        return
    print(f"load average at start: {os.getloadavg()}")
    print(f"{'path':6} {'cells':>5} {'rows':>8} {'peak RSS MiB':>12} {'CPU s':>6} "
          f"{'children CPU s':>14} {'wall s':>7}")
    for cells in args.cells:
        for path in args.paths:
            with tempfile.TemporaryDirectory(prefix="bench-publish-cells-") as work:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", "--path", path, "--cells", str(cells),
                     "--work", work, "--boundaries", args.boundaries]
                    + (["--tiles"] if args.tiles else []),
                    cwd=ROOT, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"{path} with {cells} cell(s) failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{r['path']:6} {r['cells']:>5} {r['rows']:>8} {r['peak_rss_mib']:>12} "
                      f"{r['cpu_s']:>6} {r['children_cpu_s']:>14} {r['wall_s']:>7}", flush=True)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
