"""What a tract archive's attributes cost tippecanoe: a release's own tract GeoJSON tiled as
published (every attribute), with the GEOID alone, and with no attribute.

    .venv/bin/python benchmarks/bench_tile_attributes.py --release DIR [--max-zoom 10]

``DIR`` is a published release (``tracts.geojson``, or ``tracts-geojson/state=XX/`` of a
release of several states). The variants: every attribute (the published features), the
attributes the archive holds alone (the columns ``tiles.NOT_IN_TILES`` excludes left out of
the input, and the GEOID/cell feature ids tippecanoe cannot keep), the GEOID alone, none.
Each variant runs tippecanoe with the release's options
(:func:`dpatlas.publication.tiles.tippecanoe_arguments`, from z6 as with counties) on the
same features; the figures are tippecanoe's CPU seconds (user + system, of the child process),
its wall time and the archive's bytes. A fourth line times what such a design would publish
beside one geometry archive: each feature's values (every attribute but the geometry) as
compact JSON keyed by GEOID, written the way the GeoJSON writer writes its properties. Run it
alone: the CPU figures are the point (each line also prints the load average).

Why: a release of several cells builds one tract archive per cell, each carrying every
attribute of every feature, while the geometry is the same in every cell. If the attributes
are most of the cost, one geometry archive plus each cell's values as data (joined by GEOID in
the browser) would cost the geometry once instead of once per cell (issue 35's estimate).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402


def tract_geojson_files(release: Path) -> list[Path]:
    single = release / "tracts.geojson"
    if single.is_file():
        return [single]
    files = sorted(release.glob("tracts-geojson/state=*/tracts.geojson"))
    if not files:
        raise SystemExit(f"{release}: no tracts.geojson nor tracts-geojson/state=*/")
    return files


def write_variant(files: list[Path], keep, out: Path, ids: bool = True) -> int:
    """The features of ``files`` with their properties cut to ``keep`` (None: all; a callable:
    the names it accepts), without their ``id`` unless ``ids``, as one FeatureCollection at
    ``out``; returns the number of features."""
    features = []
    for path in files:
        for feature in json.loads(path.read_text())["features"]:
            if keep is not None:
                kept = keep if callable(keep) else keep.__contains__
                feature = {**feature, "properties": {k: v for k, v in
                                                     feature["properties"].items() if kept(k)}}
            if not ids:
                feature = {k: v for k, v in feature.items() if k != "id"}
            features.append(feature)
    out.write_text(json.dumps({"type": "FeatureCollection", "features": features},
                              separators=(",", ":")))
    return len(features)


def tile(geojson: Path, out: Path, max_zoom: int, label: str) -> tuple[dict, str]:
    from dpatlas.publication import tiles

    argv = [str(tiles.tippecanoe_binary()),
            *tiles.tippecanoe_arguments(geojson, out, min_zoom=tiles.MIN_ZOOM_WITH_COUNTIES,
                                        max_zoom=max_zoom)]
    with measure(f"{label}, tippecanoe") as span:
        # tippecanoe notes on stderr that the GEOID feature ids are not numeric (the same in
        # every variant and in the release's own build); shown only if it fails
        done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"tippecanoe failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"cpu": span.cpu_children, "wall": span.wall, "bytes": out.stat().st_size}, span.line()


def write_values(files: list[Path], out: Path) -> tuple[dict, str]:
    """Each feature's properties as one JSON object keyed by GEOID (the values a
    geometry-once design would publish per cell), timed from the parsed features."""
    features = [f for path in files for f in json.loads(path.read_text())["features"]]
    with measure("values keyed by GEOID, JSON") as span:
        values = {f["properties"]["geoid"]: f["properties"] for f in features}
        out.write_text(json.dumps(values, ensure_ascii=False, allow_nan=False,
                                  separators=(",", ":")))
    return {"cpu": span.cpu_process, "wall": span.wall, "bytes": out.stat().st_size}, span.line()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True)
    parser.add_argument("--max-zoom", type=int, default=10)
    args = parser.parse_args()
    files = tract_geojson_files(args.release)
    from dpatlas.publication.tiles import NOT_IN_TILES

    # (label, properties kept, feature ids kept); the second: what the archive holds, the
    # columns it leaves out (--exclude) not in its input at all
    variants = [("every attribute (as published)", None, True),
                ("the archive's attributes alone", lambda k: k not in NOT_IN_TILES, False),
                ("geoid only", {"geoid"}, True), ("no attribute", set(), True)]
    print(f"release {args.release}: {len(files)} tract GeoJSON file(s); tippecanoe z6-"
          f"z{args.max_zoom}, one run per variant, one after another")
    rows = []
    with measure("bench_tile_attributes, whole run") as run, \
            tempfile.TemporaryDirectory(prefix="dpatlas-tile-attributes-") as tmp:
        for label, keep, ids in variants:
            source = Path(tmp) / "variant.geojson"
            count = write_variant(files, keep, source, ids)
            figures, line = tile(source, Path(tmp) / "variant.pmtiles", args.max_zoom, label)
            rows.append((label, figures))
            print(f"  {label:32s} {count:7,d} features  tippecanoe {figures['cpu']:6.1f} CPU-s  "
                  f"{figures['wall']:6.1f} s wall  {figures['bytes'] / 1e6:7.1f} MB", flush=True)
            print(f"    {line}")
        figures, line = write_values(files, Path(tmp) / "values.json")
        print(f"  {'values keyed by GEOID (JSON)':32s} {len(files):7,d} file(s)  written in "
              f"{figures['cpu']:6.1f} CPU-s  {figures['wall']:6.1f} s wall  "
              f"{figures['bytes'] / 1e6:7.1f} MB", flush=True)
        print(f"    {line}")
    full = rows[0][1]["cpu"]
    for label, figures in rows[1:]:
        print(f"  {label}: {figures['cpu'] / full:.2f} of the published archive's CPU")
    print(run.line())


if __name__ == "__main__":
    main()
