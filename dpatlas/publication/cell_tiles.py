"""Vector tiles per cell for the county and state levels (issue 35, item 3): a release with
several cells publishes ``counties-<cell>.pmtiles`` and ``states-<cell>.pmtiles``, listed in
the manifest's ``level_cell_tiles``; a release with one cell keeps ``counties.pmtiles`` and
``states.pmtiles``. tippecanoe then builds one cell at a time and a map showing one cell
fetches only that cell's tiles.

The tracts are tiled once whatever the cells, their values published apart
(:mod:`dpatlas.publication.tract_values`).
"""

from __future__ import annotations

import hashlib
import re

from dpatlas.publication import tiles

# A cell whose name is made of these is named as it is; any other (spaces, slashes, dots,
# non-ASCII, very long) by a digest of its name after a double dash, which no name of the first
# kind can start with, so two cells never share an archive.
_PLAIN_CELL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

# {level: {cell: archive}}: the county and state archives of a release of several cells
LEVEL_MANIFEST_KEY = "level_cell_tiles"


def cell_key(cell: str) -> str:
    """``cell`` as a file or folder name: itself when plain ASCII letters, digits, ``_`` and
    ``-``, else ``-`` and 16 hex digits of its name's sha256 (the county and state archives
    and the tracts' values folders alike)."""
    cell = str(cell)
    if _PLAIN_CELL.fullmatch(cell):
        return cell
    return f"-{hashlib.sha256(cell.encode()).hexdigest()[:16]}"


def cell_tiles_file(cell: str, layer: str) -> str:
    """The archive of ``cell``'s units of ``layer`` (``counties`` or ``states``):
    ``<layer>-<cell>.pmtiles``, or ``<layer>--<digest>`` for a cell whose name is not plain
    (:func:`cell_key`)."""
    return f"{layer}-{cell_key(cell)}.pmtiles"


def level_cell_tiles_file(level: str, cell: str) -> str:
    """The archive of ``cell``'s counties or states (``level``): ``counties-<cell>.pmtiles``,
    ``states-<cell>.pmtiles`` (a release of several cells; one cell keeps ``counties.pmtiles``
    and ``states.pmtiles``)."""
    return cell_tiles_file(cell, tiles.LEVEL_TILES[level].layer)


def level_of_cell_tiles_file(name: str) -> str | None:
    """The level (``county``, ``state``) whose cell archive ``name`` is; None for any other."""
    for level, spec in tiles.LEVEL_TILES.items():
        if (name.startswith(f"{spec.layer}-") and name.endswith(".pmtiles")
                and "/" not in name):
            return level
    return None


def cell_tiles_title(name: str) -> str:
    """The STAC title of a level's archive of one cell, ``counties-<cell>.pmtiles``: its cell
    named when the name holds it, not when it is a digest."""
    layer = tiles.LEVEL_TILES[level_of_cell_tiles_file(name)].layer
    cell = name.removeprefix(f"{layer}-").removesuffix(".pmtiles")
    whose = "one cell" if cell.startswith("-") else f"cell {cell}"
    return f"{layer.capitalize()} of {whose}: vector tiles (PMTiles)"


def per_cell(cells: list[str]) -> bool:
    """Whether a release with ``cells`` publishes an archive per cell (more than one cell)."""
    return len(cells) > 1
