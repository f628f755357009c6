"""Which tract archives a release has, and whose rows each must hold.

A release whose manifest has ``tract_values`` tiles each tract's polygon once, in
``tracts.pmtiles``, with its GEOID alone, and publishes each (cell, state)'s values in a JSON
document of its own, ``tract-values/<cell>/<state>.json`` (:func:`values_document_name`).
Releases published before that have ``tracts.pmtiles`` with every cell's rows (one cell, or
from before issue 35), or one archive per cell, ``tracts-<cell>.pmtiles``, holding that
cell's rows and no other's.

Names are derived here from the cell, as the publication names them (a cell of plain ASCII
letters, digits, ``_`` and ``-``: itself; any other: ``-`` and the first 16 hex digits of the
sha256 of its name), never taken from the manifest, so a file swapped with another cell's is
found."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

WHOLE_ARCHIVE = "tracts.pmtiles"
VALUES_FOLDER = "tract-values"
VALUES_KEY = "tract_values"  # the manifest's {cell: folder of its documents}
_PLAIN_CELL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def _cell_name(cell: str) -> str:
    cell = str(cell)
    return cell if _PLAIN_CELL.fullmatch(cell) else (
        "-" + hashlib.sha256(cell.encode()).hexdigest()[:16])


def values_folder_name(cell: str) -> str:
    """The folder of ``cell``'s values documents: ``tract-values/<cell>``."""
    return f"{VALUES_FOLDER}/{_cell_name(cell)}"


def values_document_name(cell: str, state: str) -> str:
    """The values document of ``cell``'s tracts in ``state``."""
    return f"{values_folder_name(cell)}/{state}.json"


def values_apart(folder: Path, m: dict) -> bool:
    """Whether the release publishes its tracts' values apart from their polygons."""
    return VALUES_KEY in m or (folder / VALUES_FOLDER).exists() or any(
        str(name).startswith(VALUES_FOLDER + "/") for name in (m.get("files") or {}))


def cell_archive_name(cell: str, layer: str = "tracts") -> str:
    """The name of ``cell``'s tract archive in a release of several cells (``layer``
    ``counties`` or ``states``: that level's archive of the cell)."""
    return f"{layer}-{_cell_name(cell)}.pmtiles"


@dataclass(frozen=True)
class TractArchive:
    """A tract archive to check: its file name and the cell whose rows it holds (None: every
    cell's); ``polygons_only``: each tract's polygon once, with its GEOID alone (the values
    are in documents apart)."""

    name: str
    cell: str | None
    polygons_only: bool = False

    @property
    def stem(self) -> str:
        return self.name.removesuffix(".pmtiles")


def tract_archives(folder: Path, m: dict, cells: set[str]) -> tuple[list[TractArchive],
                                                                     list[str]]:
    """The tract archives of the release in ``folder`` (manifest ``m``, its table's ``cells``)
    and the problems with them: a cell without its archive, a listed archive of no cell, a
    manifest ``cell_tiles`` that names other archives than the cells' own."""
    listed = set(m.get("files") or {})
    if values_apart(folder, m):
        if WHOLE_ARCHIVE in listed or (folder / WHOLE_ARCHIVE).exists():
            return [TractArchive(WHOLE_ARCHIVE, None, polygons_only=True)], []
        return [], ["the tracts' values are published apart, but not tracts.pmtiles, their "
                    "polygons"]
    if WHOLE_ARCHIVE in listed or (folder / WHOLE_ARCHIVE).exists():
        return [TractArchive(WHOLE_ARCHIVE, None)], []
    expected = {cell_archive_name(c): c for c in sorted(cells)}
    archives = [TractArchive(name, cell) for name, cell in expected.items()
                if name in listed or (folder / name).exists()]
    if not archives and not any(_is_cell_archive(n) for n in listed):
        return [], []  # a release published without tiles
    problems = [f"cell {cell!r} has no tract archive {name} in the manifest's files"
                for name, cell in expected.items() if name not in listed]
    problems += [f"{name} is listed but is the archive of no cell of tracts.parquet"
                 for name in sorted(listed) if _is_cell_archive(name) and name not in expected]
    said = m.get("cell_tiles")
    if said is not None and said != {c: n for n, c in expected.items()}:
        problems.append(f"the manifest's cell_tiles {said} is not each cell's archive "
                        f"{ {c: n for n, c in expected.items()} }")
    return archives, problems


def _is_cell_archive(name: str) -> bool:
    return name.startswith("tracts-") and name.endswith(".pmtiles") and "/" not in name


def rows_of(table: dict, cell: str | None) -> dict:
    """The table's rows ({(geoid, cell): row}) an archive of ``cell`` must hold."""
    return table if cell is None else {k: r for k, r in table.items() if str(k[1]) == cell}
