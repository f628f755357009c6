"""Vector tiles per cell (issue 35, item 3): a release with several cells publishes one tract
archive per cell, ``tracts-<cell>.pmtiles``, instead of one ``tracts.pmtiles`` where every
cell's feature is stacked on the same polygon. tippecanoe then builds one cell at a time (its
peak is one cell's, whatever the number of cells) and a map showing one cell fetches only
that cell's tiles. A release with one cell keeps ``tracts.pmtiles`` as before.

Each cell's rows are one contiguous run of ``tracts.geojson``'s features (rows are written
cell by cell); its archive is built from a FeatureCollection of that run alone (the same head,
so the same bbox), written beside the staging files under a dot name and removed once built.
The manifest's ``cell_tiles`` maps each cell to its archive (the web map reads it).

The county and state levels follow (:func:`level_cell_tiles_file`): ``counties-<cell>.pmtiles``
and ``states-<cell>.pmtiles``, listed in the manifest's ``level_cell_tiles``.
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from dpatlas.publication import tiles
from dpatlas.publication.geojson import (FEATURE_COLLECTION_TAIL, geojson_parts,
                                        geometry_texts, json_columns, tile_input_texts,
                                        write_feature_texts, write_features)
from dpatlas.publication.tract_files import PublishError

# A cell whose name is made of these is named as it is; any other (spaces, slashes, dots,
# non-ASCII, very long) by a digest of its name after a double dash, which no name of the first
# kind can start with, so two cells never share an archive.
_PLAIN_CELL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
CELL_TILES_PREFIX = "tracts-"
# The head of a cell's FeatureCollection written from several states' features
# (CellTileBuilder.add_features): no bbox, which is known only once every state is in.
_BARE_HEAD = '{"type":"FeatureCollection","features":['

MANIFEST_KEY = "cell_tiles"
# {level: {cell: archive}}: the county and state archives of a release of several cells
LEVEL_MANIFEST_KEY = "level_cell_tiles"


def cell_tiles_file(cell: str, layer: str = "tracts") -> str:
    """The archive of ``cell``'s tracts: ``tracts-<cell>.pmtiles``, or ``tracts--<digest>``
    for a cell whose name is not plain ASCII letters, digits, ``_`` and ``-``; ``layer``
    ``counties`` or ``states``: that level's archive of the cell, named alike."""
    cell = str(cell)
    if _PLAIN_CELL.fullmatch(cell):
        return f"{layer}-{cell}.pmtiles"
    return f"{layer}--{hashlib.sha256(cell.encode()).hexdigest()[:16]}.pmtiles"


def level_cell_tiles_file(level: str, cell: str) -> str:
    """The archive of ``cell``'s counties or states (``level``): ``counties-<cell>.pmtiles``,
    ``states-<cell>.pmtiles`` (a release of several cells; one cell keeps ``counties.pmtiles``
    and ``states.pmtiles``)."""
    return cell_tiles_file(cell, tiles.LEVEL_TILES[level].layer)


def cell_features_file(cell: str) -> str:
    """The FeatureCollection of ``cell``'s features an archive is built from (a dot name: it is
    never published)."""
    return f".{cell_tiles_file(cell)}.geojson"


def is_cell_tiles_file(name: str) -> bool:
    """Whether a published file's name is a cell's tract archive."""
    return name.startswith(CELL_TILES_PREFIX) and name.endswith(".pmtiles") and "/" not in name


def level_of_cell_tiles_file(name: str) -> str | None:
    """The level (``county``, ``state``) whose cell archive ``name`` is; None for any other."""
    for level, spec in tiles.LEVEL_TILES.items():
        if (name.startswith(f"{spec.layer}-") and name.endswith(".pmtiles")
                and "/" not in name):
            return level
    return None


def cell_tiles_title(name: str) -> str:
    """The STAC title of a cell's archive ``tracts-<cell>.pmtiles`` (or a level's,
    ``counties-<cell>.pmtiles``): its cell named when the name holds it, not when it is a
    digest."""
    level = level_of_cell_tiles_file(name)
    layer = tiles.LEVEL_TILES[level].layer if level else "tracts"
    cell = name.removeprefix(f"{layer}-").removesuffix(".pmtiles")
    whose = "one cell" if cell.startswith("-") else f"cell {cell}"
    return f"{layer.capitalize()} of {whose}: vector tiles (PMTiles)"


def archive_input_texts(values: dict[str, list], geometry: list[str]) -> list[str]:
    """The rows' features as a tract archive's input (:func:`geojson.tile_input_texts`) from
    their :func:`geojson.json_columns` ``values`` and :func:`geojson.geometry_texts`: every
    column but those the archive leaves out (``tiles.NOT_IN_TILES``), no id. tippecanoe
    parses every property of its input, ``--exclude`` or not: on the national one-cell
    tracts the left-out columns were a tenth to a fifth of its CPU
    (``benchmarks/bench_tile_attributes.py``), and the archive is the same."""
    return tile_input_texts({c: v for c, v in values.items() if c not in tiles.NOT_IN_TILES},
                            geometry)


def per_cell(cells: list[str]) -> bool:
    """Whether a release with ``cells`` publishes an archive per cell (more than one cell)."""
    return len(cells) > 1


def cell_runs(props) -> list[tuple[str, slice]]:
    """The runs of equal ``cell`` in a group's rows (rows are written cell by cell)."""
    cells = props["cell"].astype(str).to_numpy()
    cuts = [0, *(i for i in range(1, len(cells)) if cells[i] != cells[i - 1]), len(cells)]
    return [(cells[a], slice(a, b)) for a, b in zip(cuts, cuts[1:]) if b > a]


def cell_tile_builder(staging: Path, release_id: str, config: dict, cells: list[str],
                      tiler: ThreadPoolExecutor | None) -> "CellTileBuilder | None":
    """The builder of each cell's archive for a release of several ``cells``. Without a
    ``tiler`` (a publish part of a release of several states), one cell or several: the
    writer of each cell's archive input (:func:`cell_features_file`), from which the archive
    is built with every part's (``tracts.pmtiles`` with one cell). Else None: the one cell's
    archive is built from the published ``tracts.geojson``."""
    if per_cell(cells) or tiler is None:
        return CellTileBuilder(staging, release_id, config, tiler)
    return None


class CellTileBuilder:
    """Builds each cell's archive, one at a time on ``tiler`` (one worker), as soon as its run
    of ``tracts.geojson`` is written (:meth:`write_group`); :meth:`result` waits for them
    all."""

    def __init__(self, staging: Path, release_id: str, config: dict,
                 tiler: ThreadPoolExecutor):
        self.staging, self.tiler = Path(staging), tiler
        self.text = tiles.release_tile_text(release_id, config)
        self.min_zoom = tiles.tract_min_zoom(config.get("levels"))
        self.built: dict[str, Future] = {}
        self.pending: dict[str, tuple | None] = {}
        self.features_written: list[str] = []
        # each cell's FeatureCollection being written (add_features): its file, and whether
        # it holds a feature yet
        self.open: dict[str, list] = {}

    def write_group(self, fh, path: Path, head: str, props, geoms, ids, wrote: bool) -> bool:
        """Append a group's features to the open ``tracts.geojson`` (``fh`` at ``path``, opened
        by ``head``; ``wrote``: features came before), the same bytes as one
        :func:`write_features` of the group, and start the archives of its cells; whether the
        collection now holds a feature.

        When each cell's rows are consecutive (the flow: groups are assembled cell by cell),
        a cell's archive is built from its byte range of the file; when cells are interleaved
        (a whole table published in its own row order) each cell's features are also written
        to a FeatureCollection of their own."""
        runs = cell_runs(props)
        consecutive = len(runs) == len({cell for cell, _ in runs})
        for cell, rows in (runs if consecutive else [(None, slice(0, len(props)))]):
            start = fh.tell() + (1 if wrote else 0)  # after the separating comma
            wrote = write_features(fh, props.iloc[rows], geoms[rows],
                                   None if ids is None else ids[rows], after_others=wrote)
            fh.flush()
            if cell is not None:
                self._note(cell, (path, head, (start, fh.tell())))
        if not consecutive:
            self._write_own_collections(props, geoms, ids)
        self._start_pending()
        return wrote

    def add_group(self, table) -> None:
        """A group of whole cells written elsewhere: each cell's features, made here, to a
        FeatureCollection of their own, and its archive started."""
        inputs = ", ".join(str(self._part(c)) for c in dict.fromkeys(table["cell"].astype(str)))
        self._write_own_collections(*geojson_parts(table, inputs, per_cell=True))
        self._start_pending()

    def add_features(self, cells: np.ndarray, texts: list[str]) -> None:
        """The archive's input features (:func:`archive_input_texts`, made beside a state's
        published GeoJSON in a release partitioned by state,
        :class:`~dpatlas.publication.cell_stream.GeoJsonAppender`), ``texts``, of rows of
        ``cells``, appended to each cell's FeatureCollection of its own, in their order; a
        cell's collection stays open until :meth:`end_group`, so a group's states add to it
        one after the other. Its head has no ``bbox`` (optional in RFC 7946,
        and the collection is only tippecanoe's input: the archive's bounds are its
        features')."""
        for cell in map(str, dict.fromkeys(cells)):
            if cell not in self.open:
                if cell in self.built or cell in self.features_written or cell in self.pending:
                    raise PublishError(f"cell {cell}'s rows are in two groups of cells (a bug: "
                                       "a group holds whole cells); nothing was published")
                out = open(self._part(cell), "w", encoding="utf-8")
                out.write(_BARE_HEAD)
                self.open[cell] = [out, False]
            entry = self.open[cell]
            rows = np.flatnonzero(cells == cell)
            entry[1] = write_feature_texts(entry[0], [texts[i] for i in rows], entry[1])

    def end_group(self) -> None:
        """The group's cells are whole: their collections closed and their archives
        started."""
        self._close_open()
        self._start_pending()

    def close(self) -> None:
        """Close the cells' inputs still open: a group that failed before :meth:`end_group`
        (its part is refused; the unfinished files stay in the part's folder, never
        published). Nothing is noted or started."""
        opened, self.open = self.open, {}
        for out, _ in opened.values():
            out.close()

    def _close_open(self) -> None:
        opened, self.open = self.open, {}
        for cell, (out, _) in opened.items():
            out.write(FEATURE_COLLECTION_TAIL)
            out.close()
            self._note(cell, None)

    def _write_own_collections(self, props, geoms, ids) -> None:
        self.add_features(props["cell"].astype(str).to_numpy(),
                          archive_input_texts(json_columns(props), geometry_texts(geoms)))
        self._close_open()

    def _start_pending(self) -> None:
        for cell, source in self.pending.items():  # a group holds whole cells
            if self.tiler is None:  # features only: the archive is built from every part's
                self.features_written.append(cell)
                continue
            self.built[cell] = self.tiler.submit(self._build, cell, source)
        self.pending = {}

    def features(self) -> dict[str, str]:
        """Without a tiler: each cell's FeatureCollection written (its name in the folder)."""
        return {cell: cell_features_file(cell) for cell in sorted(self.features_written)}

    def _note(self, cell: str, source: tuple | None) -> None:
        if (cell in self.built or cell in self.features_written
                or (cell in self.pending and source is None)):
            raise PublishError(f"cell {cell}'s rows are in two groups of cells (a bug: a group "
                               "holds whole cells); nothing was published")
        self.pending[cell] = source

    def _part(self, cell: str) -> Path:
        """Where ``cell``'s FeatureCollection is written for tippecanoe (removed once built)."""
        return self.staging / cell_features_file(cell)

    def _build(self, cell: str, source: tuple | None) -> str:
        """``cell``'s archive, from its part (``source``: None) or from a byte range of
        ``tracts.geojson`` (``source``: its path, head and range)."""
        name, part = cell_tiles_file(cell), self._part(cell)
        try:
            if source is not None:
                geojson, head, (start, end) = source
                with open(geojson, "rb") as src, open(part, "wb") as out:
                    out.write(head.encode("utf-8"))
                    src.seek(start)
                    _copy_bytes(src, out, end - start)
                    out.write(FEATURE_COLLECTION_TAIL.encode("utf-8"))
            tiles.build_tiles(part, self.staging / name, min_zoom=self.min_zoom,
                              text=self.text)
        finally:
            part.unlink(missing_ok=True)
        return name

    def result(self) -> dict[str, str]:
        """Each cell's archive, once all are built (raises if one failed)."""
        return {cell: future.result() for cell, future in sorted(self.built.items())}


def _copy_bytes(src, out, length: int) -> None:
    while length > 0:
        chunk = src.read(min(length, 1 << 20))
        if not chunk:
            raise OSError("tracts.geojson ended before a cell's features (a bug)")
        out.write(chunk)
        length -= len(chunk)

