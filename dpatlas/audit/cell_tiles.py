"""Which tract archives a release has, and whose rows each must hold: ``tracts.pmtiles`` (every
cell's rows: a release of one cell, or one published before issue 35), else one archive per
cell, ``tracts-<cell>.pmtiles``, holding that cell's rows and no other's. The archive's name is
derived here from the cell, as the publication names it (a cell of plain ASCII letters,
digits, ``_`` and ``-``: itself; any other: ``-`` and the first 16 hex digits of the sha256 of
its name), never taken from the manifest, so an archive swapped with another cell's is found."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

WHOLE_ARCHIVE = "tracts.pmtiles"
_PLAIN_CELL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def cell_archive_name(cell: str, layer: str = "tracts") -> str:
    """The name of ``cell``'s tract archive in a release of several cells (``layer``
    ``counties`` or ``states``: that level's archive of the cell)."""
    cell = str(cell)
    if _PLAIN_CELL.fullmatch(cell):
        return f"{layer}-{cell}.pmtiles"
    return f"{layer}--{hashlib.sha256(cell.encode()).hexdigest()[:16]}.pmtiles"


@dataclass(frozen=True)
class TractArchive:
    """A tract archive to check: its file name and the cell whose rows it holds (None: every
    cell's)."""

    name: str
    cell: str | None

    @property
    def stem(self) -> str:
        return self.name.removesuffix(".pmtiles")


def tract_archives(folder: Path, m: dict, cells: set[str]) -> tuple[list[TractArchive],
                                                                     list[str]]:
    """The tract archives of the release in ``folder`` (manifest ``m``, its table's ``cells``)
    and the problems with them: a cell without its archive, a listed archive of no cell, a
    manifest ``cell_tiles`` that names other archives than the cells' own."""
    listed = set(m.get("files") or {})
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
