"""Publishing in parts (issue 35, item 1): the tract files are written by tasks that can run
anywhere (the Dask workers of a cluster, or the flow's own threads), and the flow only
commits what they wrote.

A release is cut into parts (:func:`plan_parts`): a release of one state is one part that
writes its single files (``tracts.parquet``, ``tracts.csv``, ``tracts.geojson``) and its tiles,
as a release written whole does; a release of several states is cut into parts of consecutive
states of about :data:`PART_ROWS` tract-cells, and a state larger than that at its number of
cells into parts of some of its cells each (state × group of cells). Each part writes its
states' files (``tracts/state=XX/part-<k>.parquet`` ...; a cut state's CSV and GeoJSON pieces
are joined by the commit) and, with several cells, each cell's features for that cell's
archive. A part reads what it needs by path or URL (fsspec): the chunks'
results, filtered to its states' GEOIDs, and the public boundaries; it assembles its groups of
cells, fits the small-area model (per cell and state, so a part holds whole fits), checks each
group against the output contract in a GX project of its own, and writes its files into its
folder of the publish location (``<location>/<part>/``): the internal folder, or the staging
location given by ``staging_url``. Then the tile archives are built from every part's
GeoJSON (:func:`tile_jobs`, one per cell), also as tasks.

Nothing a part writes is public: the flow collects the files into the release's staging
folder only once every part and every archive succeeded (:func:`collect`), records the
checks, and then writes the manifest, hashes, feed and STAC as for a release written whole;
nothing is visible before the one rename. A part draws no noise (it reads DP outputs and public
values only), so a part that failed or was interrupted is simply written again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Optional

import geopandas as gpd
import pandas as pd

from dpatlas.core.locations import (join, local_path, readable_folder, remove_tree, url_fs,
                                    writable_folder)
from dpatlas.publication import tiles, tract_values
from dpatlas.publication.cell_stream import (Overview, Streamed, TractSummary,
                                             assembled_groups, cell_groups, draw_overview,
                                             geoid_filters, stream_groups,
                                             streaming_executors)
from dpatlas.publication.cell_tiles import level_cell_tiles_file, per_cell
from dpatlas.publication.geojson import FEATURE_COLLECTION_TAIL
from dpatlas.publication.model_estimates import add_model_estimates
from dpatlas.publication.state_parts import piece_name
from dpatlas.publication.static_map import MAP_FILE
from dpatlas.publication.tract_files import CSV_SCHEMA_FILE, PublishError, footprint

# Tract-cells per part of a release of several states (whole states, consecutive in GEOID
# order): a part's output check costs about a second of GX whatever its size (1.08 CPU-s for
# 1,000 rows, 1.29 for 20,000, 2.33 for 60,000 in a fresh GX project), and each part is a task
# run and a run in the Data Docs besides, so a one-cell national release (74,000 tracts) is 2
# parts rather than 51, at 42 cells 105 rather than 189 at 20,000, and a state larger than a
# part at its number of cells (California at 42: 338,000 tract-cells) is cut into parts of
# some of its cells each, so that no one task bounds how far publishing spreads (the longest
# part of the full-scale national runs at 1 and 6 cells took 10.6 CPU-s, a cell's tract
# archive 28-31).
PART_ROWS = 40_000
WHOLE = "all"  # the one part of a release of one state
GX_PROJECT = ".gx"  # a part's GX project, in its folder (never collected into the release)
TILES_FOLDER = "tiles"


@dataclass(frozen=True)
class PublishPart:
    """Some states of a release and its groups of cells. ``states`` None: the whole release
    (of one state), written as single files."""
    name: str
    states: Optional[tuple[str, ...]]
    groups: tuple[tuple[str, ...], ...]
    run: str = "published"  # its output checks' run name (``-<k>-of-<n>`` per group added)
    # the part's place among its state's (a state cut by cells): its GeoParquet is published
    # as ``part-<piece>.parquet``; its CSV and GeoJSON are joined with the others' in order
    piece: int = 0

    def geoid_range(self) -> Optional[tuple[str, str]]:
        """The GEOIDs of its states as a half-open range (states are consecutive)."""
        if self.states is None:
            return None
        return self.states[0], self.states[-1] + ":"  # ":" sorts after every digit


def plan_parts(cells: list[str], geoids) -> list[PublishPart]:
    """The parts of a release of ``cells`` over the boundary tracts ``geoids``."""
    per_state = Counter(str(g)[:2] for g in geoids)
    if len(per_state) <= 1:
        return [PublishPart(WHOLE, None, _groups(cells, len(geoids)))]
    # (states, their cells, piece or None): consecutive states packed together, and a state
    # too large for one part cut by its cells (piece k: its k-th group of cells)
    packed: list[tuple[list[str], list[str], Optional[int]]] = []
    packing: list[str] = []
    rows = 0
    for state in sorted(per_state):
        size = per_state[state] * max(1, len(cells))
        cut = size > PART_ROWS and len(cells) > 1
        if packing and (cut or rows + size > PART_ROWS):
            packed.append((packing, cells, None))
            packing, rows = [], 0
        if cut:
            step = max(1, PART_ROWS // per_state[state])
            packed += [([state], cells[i:i + step], i // step)
                       for i in range(0, len(cells), step)]
            continue
        packing.append(state)
        rows += size
    if packing:
        packed.append((packing, cells, None))
    # one part: its checks are the release's ("published"), as for a release written whole
    return [PublishPart(name, tuple(states), _groups(some, sum(per_state[s] for s in states)),
                        "published" if len(packed) == 1 else f"published-{name}", piece or 0)
            for name, (states, some, piece) in zip(map(_part_name, packed), packed)]


def _part_name(packed: tuple[list[str], list[str], Optional[int]]) -> str:
    """``states-01-05`` (its first and last states), or ``states-06-cells-<k>`` (the k-th
    part, from 1, of a state cut by its cells)."""
    states, _, piece = packed
    if piece is not None:
        return f"states-{states[0]}-cells-{piece + 1}"
    return f"states-{states[0]}" + (f"-{states[-1]}" if len(states) > 1 else "")


def _groups(cells: list[str], tracts: int) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(g) for g in cell_groups(cells, tracts))


@dataclass(frozen=True)
class PartJob:
    """What every part of a release reads (paths or URLs; no person-level rows): the chunks'
    result files, the boundaries' GeoParquet, the county and state rows (``levels``: the
    model reads its states'; None without levels), the folder the parts go to, the public config
    (what the files and tiles say), the release's cells, and, with the small-area model, the
    plan's budget steps (``Step.as_dict``)."""
    release_id: str
    config: dict
    results: tuple[str, ...]
    boundaries: str
    levels: Optional[str]
    location: str
    cells: tuple[str, ...]
    model_steps: Optional[tuple[dict, ...]]
    standard_error_max: float


@dataclass
class PartResult:
    """What a part wrote (its ``files``, named as the release names them, in ``folder``) and
    what the flow needs of it: the manifest's counts, the columns, the overview cell's rows,
    each group's check (run name, result), the model's fits, each cell's features for its
    archive, and (the part of a one-state release) its tiles. ``failed``: a group broke the
    output contract (its check is the last of ``checks``); nothing of it is to be published."""
    part: PublishPart
    folder: str
    files: list[str] = field(default_factory=list)
    summary: TractSummary = field(default_factory=TractSummary)
    columns: list[str] = field(default_factory=list)
    shown: Optional[gpd.GeoDataFrame] = None
    suites: list[str] = field(default_factory=list)
    checks: list[tuple[str, Any]] = field(default_factory=list)
    model_fits: list[dict] = field(default_factory=list)
    features: dict[str, str] = field(default_factory=dict)
    tiles: Any = None
    failed: bool = False


class _GroupRefused(PublishError):
    """A group of a part broke the output contract (its check is in the part's result)."""


def write_part(part: PublishPart, job: PartJob) -> PartResult:
    """Write one part's files into ``<job.location>/<part.name>/`` and say what it wrote."""
    with writable_folder(join(job.location, part.name)) as folder:
        boundaries = read_boundaries(job.boundaries, part.geoid_range())
        result = PartResult(part, join(job.location, part.name))
        model = (partial(_with_model, read_level_rows(job.levels, part),
                         list(job.model_steps), result.model_fits)
                 if job.model_steps is not None else None)
        groups = assembled_groups(list(job.results), [list(g) for g in part.groups],
                                  boundaries, model, part.geoid_range())
        check = partial(_check_group, part, list(boundaries["geoid"]), job.standard_error_max,
                        folder, result.checks)
        try:
            with streaming_executors() as (checker, tiler):
                streamed = stream_groups(folder, groups, list(job.cells), job.config, check,
                                         len(part.groups), checker,
                                         tiler if part.states is None else None,
                                         job.release_id,
                                         by_state=None if part.states is None else True)
                result.suites = streamed.all_suites()
                built = streamed.tiles.result()
        except _GroupRefused:
            result.failed = True
            return result
        if part.states is None:
            result.tiles = built
        else:  # the tract archive's input, for the archive built from every part's
            result.features = streamed.tiles.features()
        result.files = [_as_piece(folder, name, part.piece) for name in streamed.files]
        result.summary = streamed.summary
        result.columns, result.shown = streamed.columns, streamed.shown
        return result


def _as_piece(folder: Path, name: str, piece: int) -> str:
    """A written file's name as published: a GeoParquet part renamed ``part-<piece>.parquet``
    (the part is its state's piece-th)."""
    published = piece_name(name, piece)
    if published != name:
        os.replace(folder / name, folder / published)
    return published


def _with_model(level_rows: dict, steps: list[dict], fits: list[dict],
                table: gpd.GeoDataFrame) -> gpd.GeoDataFrame:
    table, group_fits = add_model_estimates(table, level_rows, None, steps)
    fits.extend(group_fits)
    return table


def _check_group(part: PublishPart, geoids: list[str], se_max: float, folder: Path,
                 checks: list, rows: pd.DataFrame, index: int, count: int) -> str:
    """One group's rows against the tract contract, in the part's own GX project; every
    boundary tract of its states in its first group's run. The run is the part's
    (``published``, or ``published-<part>`` when there are several), with ``-<k>-of-<n>``
    when the part has several groups."""
    from data_contracts import ReleaseDocs, validate_published

    run = part.run + ("" if count == 1 else f"-{index + 1}-of-{count}")
    check = validate_published(rows, boundary_geoids=geoids if index == 0 else None,
                               standard_error_max=se_max,
                               release=ReleaseDocs(folder / GX_PROJECT, folder / ".gx-docs"),
                               run_name=run)
    checks.append((run, replace(check, validation_result=None)))  # GX's object stays here
    if not check.success:
        raise _GroupRefused(f"{run}: the release table breaks its output contract")
    return check.suite


# ---------------------------------------------------------------------------------- tiles


@dataclass(frozen=True)
class TileJob:
    """One tract archive (``archive``: its name in the release) from every part's GeoJSON of
    its cell (``inputs``: (part name, path or URL)); ``level`` county or state: that level's
    archive of the cell, from its level task's features of the cell."""
    archive: str
    cell: Optional[str]
    inputs: tuple[tuple[str, str], ...]
    level: str = "tract"

    @property
    def name(self) -> str:
        cell = self.cell if self.cell is not None else "all"
        return cell if self.level == "tract" else f"{self.level}-{cell}"


def tile_jobs(results: list[PartResult], cells: list[str]) -> list[TileJob]:
    """The tract archive to build from the parts of a release of several states: one,
    ``tracts.pmtiles``, from every part's input (``PartResult.features``: the polygons of
    the geometry cell's rows, tract_values.TractMapWriter). None for the one part of a
    one-state release, which built its archive itself."""
    if len(results) == 1 and results[0].part.states is None:
        return []
    inputs = tuple((r.part.name, join(r.folder, name)) for r in results
                   for name in r.features.values())  # a state cut by cells: in one part
    return [TileJob(tiles.TILES_FILE, None, inputs)]


def build_tile_job(tile: TileJob, job: PartJob) -> str:
    """Build one archive into ``<location>/tiles/`` (where the flow collects it); its path or
    URL. tippecanoe reads the parts' GeoJSON under the parts' names in a folder of its own, so
    the archive's metadata (tippecanoe records its command line) is the same wherever the
    parts were written."""
    with writable_folder(join(job.location, TILES_FOLDER, f".{tile.archive}")) as work:
        inputs = []
        for name, source in tile.inputs:
            local = work / f"{name}.geojson"
            _fetch(source, local, link=_symlink)
            inputs.append(local)
        if tile.level == "tract":
            tiles.build_tiles(inputs, work / tile.archive,
                              min_zoom=tiles.tract_min_zoom(job.config.get("levels")),
                              text=tiles.release_tile_text(job.release_id, job.config))
        else:  # a level's archive of one cell: the level's layer and zooms
            spec = tiles.LEVEL_TILES[tile.level]
            tiles.build_tiles(inputs, work / tile.archive, min_zoom=spec.min_zoom,
                              max_zoom=spec.max_zoom, layer=spec.layer,
                              text=tiles.release_tile_text(job.release_id, job.config,
                                                           spec.layer))
        for local in inputs:
            local.unlink()
    archive = join(job.location, TILES_FOLDER, tile.archive)
    _move(join(job.location, TILES_FOLDER, f".{tile.archive}", tile.archive), archive)
    return archive


# --------------------------------------------------------------------------- the overview

OVERVIEW_FOLDER = "overview"


@dataclass(frozen=True)
class MadeOverview:
    """The overview maps in ``folder`` (path or URL; ``files``: every file written there) and
    the release's footprint, made beside the tract archives."""
    folder: str
    files: tuple[str, ...]
    overview: Overview


def overview_rows(results: list[PartResult]) -> gpd.GeoDataFrame:
    """The overview cell's rows of every part, in part order: the release's tract table of
    that cell (every boundary tract's polygon)."""
    shown = [r.shown for r in results if r.shown is not None]
    return (gpd.GeoDataFrame(pd.concat(shown, ignore_index=True), crs=shown[0].crs)
            if len(shown) > 1 else shown[0])


def write_overview(results: list[PartResult], job: PartJob) -> MadeOverview:
    """The overview PNG(s) and the footprint of the parts' overview rows, into
    ``<location>/overview/``. They are made from the tract table alone, so they are made
    while tippecanoe builds the archives, not after it in the commit (3.4 of the commit's
    5.1 s on the national benchmark)."""
    table = overview_rows(results)
    several_cells = len({c for r in results for c in r.summary.cells}) > 1
    folder = join(job.location, OVERVIEW_FOLDER)
    with writable_folder(folder) as local:
        extra = draw_overview(table, local, job.release_id, job.config, several_cells)
    return MadeOverview(folder, (MAP_FILE, *extra), Overview(tuple(extra), footprint(table)))


# ------------------------------------------------------------------------------- the commit


def collect(staging: Path, results: list[PartResult],
            archives: list[tuple[TileJob, str]],
            overview: Optional[MadeOverview] = None) -> Streamed:
    """Every part's files and every archive (``archives``: each job and where it was built)
    into ``staging`` (hard links where the parts share its file system, else copies), and what
    the release's remaining files and manifest are made from, as if the release had been
    written whole; with ``overview``, its maps too (else the commit draws them). Refuses a
    part that failed."""
    for r in results:
        if r.failed:
            raise PublishError(f"publish part {r.part.name} failed its output check")
    files: list[str] = []
    # a state cut by its cells: its CSV and GeoJSON are in each of its parts, joined here
    # (the first copied, not linked, as the others are appended to it)
    joined = {name for name, n in Counter(f for r in results for f in r.files).items() if n > 1}
    for r in results:
        for name in [*r.files, *_tiles_of(r)]:
            if name in files:
                _append_piece(join(r.folder, name), staging / name)
                continue
            _fetch(join(r.folder, name), staging / name,
                   link=shutil.copyfile if name in joined else os.link)
        files += [name for name in r.files if name not in files]
    # the CSV parts' one Table Schema: every part writes it alike; the first part's is taken
    _fetch(join(results[0].folder, CSV_SCHEMA_FILE), staging / CSV_SCHEMA_FILE)
    for tile, source in archives:  # the tract archives (the levels' are collect_levels')
        _fetch(source, staging / tile.archive)
    for name in overview.files if overview is not None else ():
        _fetch(join(overview.folder, name), staging / name)
    summary = TractSummary()
    for r in results:
        summary.merge(r.summary)
    suites = [s for r in results for s in r.suites]
    if len(results) == 1 and results[0].part.states is None:
        tiles_value = results[0].tiles
    else:  # the values' columns and each cell's folder (every part wrote the same map)
        tiles_value = tract_values.manifest_entry(
            tract_values.value_columns(results[0].columns, tiles.NOT_IN_TILES),
            {str(c) for r in results for c in r.summary.cells})
    # made beside the archives, the overview needs none of its rows here
    made = overview.overview if overview is not None else None
    return Streamed(summary, results[0].columns,
                    overview_rows(results) if made is None else None, suites[:-1],
                    _done(suites[-1]), _done(tiles_value), files, made)


def part_project(result: "PartResult | LevelResult"):
    """The GX project of a part or a level's files (where its output checks were stored) as a
    local folder (a context manager): downloaded first when it was written to object
    storage."""
    return readable_folder(join(result.folder, GX_PROJECT))


def _tiles_of(result: PartResult) -> list[str]:
    """The tract archive the part of a one-state release built itself."""
    if result.part.states is not None or result.tiles is None:
        return []
    return [tiles.TILES_FILE]


def model_fits(results: list[PartResult]) -> list[dict]:
    """Every part's fits, by cell then state (the order of a release written whole)."""
    return sorted((f for r in results for f in r.model_fits),
                  key=lambda f: (str(f["cell"]), str(f["state"])))


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


# ------------------------------------------------------------------- paths, URLs and reading


def _readable(location: str):
    """What a reader is given: the local path, or the URL for fsspec."""
    local = local_path(location)
    return location if local is None else local


def _fetch(source: str, dest: Path, link=os.link) -> None:
    """``source`` (path or URL) at ``dest``: linked (``link``) when local, else copied."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    local = local_path(source)
    if local is None:
        fs, path = url_fs(source)
        fs.get(path, str(dest))
        return
    try:
        link(local, dest)
    except OSError:
        shutil.copyfile(local, dest)


def _append_piece(source: str, dest: Path) -> None:
    """A later part's CSV or GeoJSON of a state appended to the state's file (``dest``), so
    that the state's file reads as if one part had written it: the CSV without its header,
    the GeoJSON's features after a comma (both parts' FeatureCollections open alike: every
    group of cells holds every boundary tract of the state, so their ``bbox`` is the same)."""
    with tempfile.TemporaryDirectory(prefix="dpatlas-piece-") as tmp:
        piece = Path(tmp) / dest.name
        _fetch(source, piece, link=_symlink)
        if dest.suffix == ".csv":
            _append_csv(piece, dest)
        else:
            _append_features(piece, dest)


def _append_csv(piece: Path, state_file: Path) -> None:
    """The rows of ``piece`` (a CSV with the same header) appended to ``state_file``."""
    with open(piece, "rb") as source, open(state_file, "ab") as out:
        source.readline()  # the header, which the state's file has
        shutil.copyfileobj(source, out, _COPY_BYTES)


def _append_features(piece: Path, state_file: Path) -> None:
    """The features of ``piece`` (a FeatureCollection opening as ``state_file``'s) appended
    to ``state_file``'s: its text without its head, after a comma, before the tail."""
    tail = FEATURE_COLLECTION_TAIL.encode()
    with open(state_file, "rb") as fh:
        head = fh.read(_HEAD_BYTES)
    head = head[:head.index(b'"features":[') + len(b'"features":[')]
    with open(piece, "rb") as source, open(state_file, "r+b") as out:
        if source.read(len(head)) != head:
            raise PublishError(f"{piece}: a part's GeoJSON of a state opens unlike the "
                               "state's other part (a bug); nothing was published")
        out.seek(-len(tail), os.SEEK_END)
        if out.read() != tail:
            raise PublishError(f"{state_file} does not end as a FeatureCollection (a bug)")
        size = os.fstat(source.fileno()).st_size - len(head) - len(tail)
        out.seek(-len(tail), os.SEEK_END)
        if size > 0:
            out.write(b"," if out.tell() > len(head) else b"")
            while size > 0:
                block = source.read(min(_COPY_BYTES, size))
                out.write(block)
                size -= len(block)
        out.write(tail)
        out.truncate()


_COPY_BYTES = 1 << 20
_HEAD_BYTES = 4096  # a FeatureCollection's head: its type and bbox


def _symlink(source: Path, dest: Path) -> None:
    os.symlink(os.path.abspath(source), dest)


def _move(source: str, dest: str) -> None:
    """``source`` renamed ``dest``, and the folder it was in removed."""
    local = local_path(source)
    if local is not None:
        os.replace(local, local_path(dest))
        shutil.rmtree(local.parent, ignore_errors=True)
        return
    fs, path = url_fs(source)
    fs.mv(path, url_fs(dest)[1])
    fs.rm(path.rsplit("/", 1)[0], recursive=True)


def read_boundaries(location: str, geoids: Optional[tuple[str, str]]) -> gpd.GeoDataFrame:
    """The boundaries the flow wrote for its parts, only the GEOID range ``geoids``."""
    return gpd.read_parquet(_readable(location), filters=geoid_filters(geoids) or None)


BOUNDARIES_FILE, LEVEL_ROWS_FILE = "boundaries.parquet", "levels.parquet"


def boundaries_location(location: str) -> str:
    """Where :func:`write_boundaries` puts the boundaries under ``location``."""
    return join(location, BOUNDARIES_FILE)


def level_rows_location(location: str) -> str:
    """Where :func:`write_level_rows` puts the county and state rows under ``location``."""
    return join(location, LEVEL_ROWS_FILE)


def level_table_location(location: str, job: LevelJob) -> str:
    """Where :func:`level_jobs` puts ``job``'s table under ``location``."""
    return join(location, _level_table_name(job))


def _level_table_name(job: LevelJob) -> str:
    return f"level-{job.name}.parquet"


def write_boundaries(boundaries: gpd.GeoDataFrame, location: str) -> str:
    """The boundaries, once, where every part reads its states' (public values)."""
    return _put_parquet(boundaries.to_parquet, location, BOUNDARIES_FILE)


def _put_parquet(write, location: str, name: str) -> str:
    """``write(path)`` to ``<location>/<name>``: directly, or through a temporary file."""
    target = join(location, name)
    local = local_path(location)
    if local is not None:
        local.mkdir(parents=True, exist_ok=True, mode=0o700)
        write(local / name)
        return target
    with tempfile.TemporaryDirectory(prefix="dpatlas-publish-") as tmp:
        write(Path(tmp) / name)
        fs, path = url_fs(target)
        fs.put(str(Path(tmp) / name), path)
    return target


def write_level_rows(levels: dict, location: str) -> Optional[str]:
    """The county and state tables without geometry (the model reads none of theirs), once,
    where every part reads its states' rows (DP outputs); None without levels."""
    if not levels:
        return None
    rows = pd.concat([pd.DataFrame(t.drop(columns="geometry")).assign(_level=level)
                      for level, t in levels.items()], ignore_index=True)
    return _put_parquet(lambda path: rows.to_parquet(path, index=False), location,
                        LEVEL_ROWS_FILE)


def read_level_rows(location: Optional[str], part: PublishPart) -> dict:
    """Level -> the rows of a part's states (every row for the whole release)."""
    if location is None:
        return {}
    rows = pd.read_parquet(_readable(location),
                           filters=geoid_filters(part.geoid_range()) or None)
    return {str(level): table.drop(columns="_level").reset_index(drop=True)
            for level, table in rows.groupby("_level", sort=False)}


def remove_parts(location: str) -> None:
    """The parts' folder, once the release is published: nothing there is needed again (a
    part is written afresh if its release is run again). A local folder that cannot be
    removed is left (the release is public already; retention clears the internal folder)."""
    try:
        remove_tree(location)
    except OSError:
        pass



# ------------------------------------------------------------------- the county and state files


# Unit-cells per task of a level's files: a level's task writes and checks every unit of its
# cells. With every cell in one task the county files were the release's longest task as the
# cells grew (6.3 CPU-s at 6 cells, about 44 at 42: issue 35), so a level is cut by groups of
# cells, as a large state's tract files are; the commit joins the pieces. 20,000 keeps the
# national counties (3,142 in the synthetic country; 3,143 in the 2010 census) at 6 cells a
# task, the size measured, and the states (51 units with DC) whole up to 392 cells.
LEVEL_PART_ROWS = 20_000


@dataclass(frozen=True)
class LevelJob:
    """One level's files (``counties.*`` or ``states.*``) of some of its cells to write from
    its table of those cells (``table``: a GeoParquet, path or URL, written by the flow) and
    check against its contract, with every unit of the boundaries in it. ``piece`` of
    ``pieces``: its place among its level's jobs (one job: the level's every cell); the commit
    joins the pieces' files in that order."""
    level: str
    table: str
    cells: tuple[str, ...]
    piece: int = 0
    pieces: int = 1

    @property
    def name(self) -> str:
        """``county``, or ``county-2-of-7`` for a level cut by its cells."""
        return self.level if self.pieces == 1 else f"{self.level}-{self.piece + 1}-of-{self.pieces}"


@dataclass
class LevelResult:
    """A level's files (named as the release names them, in ``folder``) and its check (run
    name, result)."""
    job: LevelJob
    folder: str
    files: list[str]
    check: tuple[str, Any]
    features: dict[str, str] = field(default_factory=dict)  # several cells: each cell's


def level_tile_jobs(results: list[LevelResult]) -> list[TileJob]:
    """Each level's archive of each cell (a release of several cells), from the features its
    level task wrote of that cell."""
    return [TileJob(level_cell_tiles_file(r.job.level, cell), cell,
                    ((tiles.LEVEL_TILES[r.job.level].layer, join(r.folder, name)),), r.job.level)
            for r in results for cell, name in r.features.items()]


def plan_level_jobs(levels: list[str], geoids, cells: list[str], location: str
                    ) -> list[LevelJob]:
    """The jobs of each of ``levels`` over the boundary tracts ``geoids``: its cells in
    groups of at most :data:`LEVEL_PART_ROWS` unit-cells (at least one cell a job), each
    reading its table at :func:`level_table_location`. Public values only: the preflight
    measures them before the charge, the commit gets the same."""
    jobs = []
    for level in levels:
        step = max(1, LEVEL_PART_ROWS // max(1, len(level_units(geoids, level))))
        groups = [tuple(cells[i:i + step]) for i in range(0, len(cells), step)] or [()]
        jobs += [LevelJob(level, "", group, k, len(groups)) for k, group in enumerate(groups)]
    return [replace(job, table=level_table_location(location, job)) for job in jobs]


def level_jobs(levels: dict, geoids, cells: list[str], location: str) -> list[LevelJob]:
    """The levels' tables (``levels``: level -> table) written where their jobs read them,
    each job's cells' rows (:func:`plan_level_jobs`)."""
    jobs = plan_level_jobs(list(levels), geoids, cells, location)
    for job in jobs:
        table = levels[job.level]
        if job.pieces > 1:
            table = table[table["cell"].astype(str).isin(job.cells)]
        _put_parquet(partial(table.to_parquet, index=False), location, _level_table_name(job))
    return jobs


def level_units(geoids, level: str) -> tuple[str, ...]:
    """The units of ``level`` the tracts ``geoids`` make up, each once, sorted."""
    from dpatlas.publication.level_files import unit_of

    return tuple(sorted(set(unit_of(list(geoids), level))))


def write_level_part(level: LevelJob, job: PartJob) -> LevelResult:
    """One level's files of its job's cells and tiles into ``<location>/level-<name>/``, and
    its table checked against its contract there (in a GX project of its own, as a part's
    tract rows), every unit of the boundaries in it."""
    from data_contracts import ReleaseDocs, validate_published_level

    from dpatlas.publication.level_files import write_level_files

    interval_level = (job.config.get("intervals") or {}).get("level", 0.95)
    where = join(job.location, f"level-{level.name}")
    with writable_folder(where) as folder:
        table = gpd.read_parquet(_readable(level.table))
        several = per_cell(list(job.cells))
        files = write_level_files(table, folder, level.level, interval_level,
                                  partial(tiles.release_tile_text, job.release_id, job.config),
                                  with_tiles=not several, per_cell=several)
        # several cells: an archive per cell, each its own task (level_tile_jobs)
        features = _level_cell_features(table, level.level, folder) if several else {}
        units = level_units(pd.read_parquet(_readable(job.boundaries), columns=["geoid"])
                            ["geoid"], level.level)
        run = f"published-{level.name}"
        check = validate_published_level(
            pd.DataFrame(table.drop(columns="geometry")), level.level,
            boundary_units=list(units), standard_error_max=job.standard_error_max,
            release=ReleaseDocs(folder / GX_PROJECT, folder / ".gx-docs"), run_name=run)
    return LevelResult(level, where, files, (run, replace(check, validation_result=None)),
                       features)


def _level_cell_features(table: gpd.GeoDataFrame, level: str, folder: Path) -> dict[str, str]:
    """Each cell's rows of a level's table as a FeatureCollection of their own in ``folder``
    (a dot name, never published): {cell: its file}."""
    from dpatlas.publication.geojson import write_geojson_rfc7946

    cells = table["cell"].astype(str)
    features = {}
    for cell in sorted(cells.unique()):
        name = f".{level_cell_tiles_file(level, cell)}.geojson"
        write_geojson_rfc7946(table[cells == cell], folder / name)
        features[cell] = name
    return features


def collect_levels(staging: Path, results: list["LevelResult"],
                   archives: list[tuple[TileJob, str]] = ()) -> list[str]:
    """Every level's files and its archives of each cell (``archives``: each job and where
    it was built) into ``staging``; their names. A level cut by its cells has its pieces'
    files joined in piece order: the CSV and GeoJSON appended to the first's, the GeoParquet
    pieces written as one file, the Table Schema (alike in every piece) the first's."""
    names = []
    for level in dict.fromkeys(r.job.level for r in results):
        pieces = sorted((r for r in results if r.job.level == level), key=lambda r: r.job.piece)
        if [r.job.piece for r in pieces] != list(range(pieces[0].job.pieces)):
            raise PublishError(f"the {level} files' pieces are not all there (a bug): "
                               f"{[r.job.name for r in pieces]}")
        first, rest = pieces[0], pieces[1:]
        for name in first.files:
            if name.endswith(".parquet") and rest:
                _join_parquet([join(r.folder, name) for r in pieces], staging / name)
            else:
                _fetch(join(first.folder, name), staging / name,
                       link=shutil.copyfile if rest else os.link)
                if not name.endswith(".schema.json"):
                    for r in rest:
                        _append_piece(join(r.folder, name), staging / name)
            names.append(name)
    for tile, source in archives:
        _fetch(source, staging / tile.archive)
        names.append(tile.archive)
    return names


def _join_parquet(sources: list[str], dest: Path) -> None:
    """The GeoParquet pieces (paths or URLs, alike but for their cells) as one file at
    ``dest``, their rows in order, with the first's metadata (its ``geo``: every piece holds
    every unit, so their bounding boxes are the same). A column null throughout one piece
    takes the type the others give it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="dpatlas-piece-") as tmp:
        tables = []
        for k, source in enumerate(sources):
            _fetch(source, Path(tmp) / f"{k}.parquet", link=_symlink)
            tables.append(pq.read_table(Path(tmp) / f"{k}.parquet"))
    joined = pa.concat_tables(tables, promote_options="permissive")
    pq.write_table(joined.replace_schema_metadata(tables[0].schema.metadata), dest)


def level_cell_tiles(archives: list[tuple[TileJob, str]]) -> dict[str, dict[str, str]]:
    """{level: {cell: archive}} of the levels' archives of each cell (the manifest's
    ``level_cell_tiles``; the web map switches each level's source with the cell)."""
    out: dict[str, dict[str, str]] = {}
    for tile, _ in archives:
        out.setdefault(tile.level, {})[str(tile.cell)] = tile.archive
    return out


__all__ = ["LevelJob", "LevelResult", "MadeOverview", "OVERVIEW_FOLDER", "PART_ROWS",
           "PartJob", "PartResult", "PublishPart", "TileJob", "build_tile_job", "collect",
           "collect_levels", "join", "level_cell_tiles", "level_jobs", "level_tile_jobs",
           "model_fits", "overview_rows", "part_project", "plan_level_jobs", "plan_parts",
           "read_boundaries",
           "read_level_rows", "remove_parts", "tile_jobs", "write_boundaries",
           "write_level_part", "write_level_rows", "write_overview", "write_part"]
