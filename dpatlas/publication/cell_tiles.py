"""Vector tiles per cell (issue 35, item 3): a release with several cells publishes one tract
archive per cell, ``tracts-<cell>.pmtiles``, instead of one ``tracts.pmtiles`` where every
cell's feature is stacked on the same polygon. tippecanoe then builds one cell at a time (its
peak is one cell's, whatever the number of cells) and a map showing one cell fetches only
that cell's tiles. A release with one cell keeps ``tracts.pmtiles`` as before.

Each cell's rows are one contiguous run of ``tracts.geojson``'s features (rows are written
cell by cell); its archive is built from a FeatureCollection of that run alone (the same head,
so the same bbox), written beside the staging files under a dot name and removed once built.
The manifest's ``cell_tiles`` maps each cell to its archive (the web map reads it).
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from dpatlas.publication import tiles
from dpatlas.publication.geojson import FEATURE_COLLECTION_TAIL
from dpatlas.publication.tract_files import PublishError

# A cell whose name is made of these is named as it is; any other (spaces, slashes, dots,
# non-ASCII, very long) by a digest of its name after a double dash, which no name of the first
# kind can start with, so two cells never share an archive.
_PLAIN_CELL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
CELL_TILES_PREFIX = "tracts-"
MANIFEST_KEY = "cell_tiles"


def cell_tiles_file(cell: str) -> str:
    """The archive of ``cell``'s tracts: ``tracts-<cell>.pmtiles``, or ``tracts--<digest>``
    for a cell whose name is not plain ASCII letters, digits, ``_`` and ``-``."""
    cell = str(cell)
    if _PLAIN_CELL.fullmatch(cell):
        return f"{CELL_TILES_PREFIX}{cell}.pmtiles"
    return f"{CELL_TILES_PREFIX}-{hashlib.sha256(cell.encode()).hexdigest()[:16]}.pmtiles"


def is_cell_tiles_file(name: str) -> bool:
    """Whether a published file's name is a cell's tract archive."""
    return name.startswith(CELL_TILES_PREFIX) and name.endswith(".pmtiles") and "/" not in name


def cell_tiles_title(name: str) -> str:
    """The STAC title of a cell's archive ``tracts-<cell>.pmtiles`` (its cell named when the
    name holds it, not when it is a digest)."""
    cell = name.removeprefix(CELL_TILES_PREFIX).removesuffix(".pmtiles")
    whose = "one cell" if cell.startswith("-") else f"cell {cell}"
    return f"Tracts of {whose}: vector tiles (PMTiles)"


def per_cell(cells: list[str]) -> bool:
    """Whether a release with ``cells`` publishes an archive per cell (more than one cell)."""
    return len(cells) > 1


def cell_runs(props) -> list[tuple[str, slice]]:
    """The runs of equal ``cell`` in a group's rows (rows are written cell by cell)."""
    cells = props["cell"].astype(str).to_numpy()
    cuts = [0, *(i for i in range(1, len(cells)) if cells[i] != cells[i - 1]), len(cells)]
    return [(cells[a], slice(a, b)) for a, b in zip(cuts, cuts[1:]) if b > a]


def cell_tile_builder(staging: Path, release_id: str, config: dict, cells: list[str],
                      tiler: ThreadPoolExecutor) -> "CellTileBuilder | None":
    """The builder of each cell's archive for a release of several ``cells``, else None."""
    return CellTileBuilder(staging, release_id, config, tiler) if per_cell(cells) else None


class CellTileBuilder:
    """Builds each cell's archive, one at a time on ``tiler`` (one worker), as soon as its run
    of ``tracts.geojson`` is written (:meth:`add`, then :meth:`group_written`); :meth:`result`
    waits for them all."""

    def __init__(self, staging: Path, release_id: str, config: dict,
                 tiler: ThreadPoolExecutor):
        self.staging, self.tiler = Path(staging), tiler
        self.text = tiles.release_tile_text(release_id, config)
        self.min_zoom = tiles.tract_min_zoom(config.get("levels"))
        self.built: dict[str, Future] = {}
        self.pending: dict[str, list[tuple[int, int]]] = {}
        self.geojson, self.head = Path(), ""

    def add(self, geojson: Path, head: str, cell: str, start: int, end: int) -> None:
        """Note that bytes ``start:end`` of ``geojson`` (flushed) are features of ``cell``
        (a FeatureCollection opened by ``head``)."""
        cell = str(cell)
        if cell in self.built:
            raise PublishError(f"cell {cell}'s rows are in two groups of cells (a bug: a group "
                               "holds whole cells); nothing was published")
        self.geojson, self.head = Path(geojson), head
        self.pending.setdefault(cell, []).append((start, end))

    def group_written(self) -> None:
        """Start the archives of the cells of the group just written (one group holds whole
        cells), one at a time on the tiler."""
        for cell, ranges in self.pending.items():
            self.built[cell] = self.tiler.submit(self._build, self.geojson, self.head, cell,
                                                 ranges)
        self.pending = {}

    def _build(self, geojson: Path, head: str, cell: str, ranges: list[tuple[int, int]]) -> str:
        name = cell_tiles_file(cell)
        part = self.staging / f".{name}.geojson"
        try:
            with open(geojson, "rb") as src, open(part, "wb") as out:
                out.write(head.encode("utf-8"))
                for k, (start, end) in enumerate(ranges):
                    out.write(b"," if k else b"")
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

