"""The names of a state-parted release's tract files (issue 35, item 2; the checks are in
:mod:`.parts`): which manifest names are parts, and what lies in the parts' folders unlisted."""

from __future__ import annotations

import re
from pathlib import Path


# A part's folder, its file's pattern, the single file the parts replace. A state's GeoParquet
# may be several files, part-0.parquet, part-1.parquet ... (a state written by several publish
# tasks, each some of its cells); its CSV and GeoJSON are one file each.
KINDS = (("tracts", r"part-[0-9]+\.parquet", "tracts.parquet"),
         ("tracts-csv", r"tracts\.csv", "tracts.csv"),
         ("tracts-geojson", r"tracts\.geojson", "tracts.geojson"))
PART_NAME = re.compile(r"^(tracts|tracts-csv|tracts-geojson)/state=([0-9]{2})/"
                       r"(part-([0-9]+)\.parquet|tracts\.csv|tracts\.geojson)$")
PARTS_FOLDERS = tuple(folder for folder, _, _ in KINDS)
# The tracts' values published apart from their polygons: a folder per cell (its name, or a
# dash and 16 hex digits of its digest), a document per state.
VALUES_FOLDER = "tract-values"
VALUES_NAME = re.compile(r"^tract-values/([A-Za-z0-9][A-Za-z0-9_-]{0,63}|-[0-9a-f]{16})/"
                         r"([0-9]{2})\.json$")


def is_values_document(name) -> bool:
    """A name of a (cell, state)'s values document's form."""
    return isinstance(name, str) and VALUES_NAME.match(name) is not None




def is_part(name) -> bool:
    """A name of a part's form whose file is its folder's (``tracts-csv/.../tracts.csv``)."""
    match = PART_NAME.match(name) if isinstance(name, str) else None
    return match is not None and any(
        match.group(1) == folder and re.fullmatch(file, match.group(3))
        for folder, file, _ in KINDS)


def listed_parts(m: dict) -> dict[str, dict[str, list[str]]]:
    """{state: {joined file: the parts' names in the manifest, in piece order}} of the parts
    listed."""
    parts: dict[str, dict[str, list[str]]] = {}
    joined = {folder: single for folder, _, single in KINDS}
    for name in sorted((n for n in (m.get("files") or {}) if is_part(n)), key=_piece):
        match = PART_NAME.match(name)
        parts.setdefault(match.group(2), {}).setdefault(joined[match.group(1)], []).append(name)
    return parts


def _piece(name: str) -> tuple[str, str, int]:
    match = PART_NAME.match(name)
    return match.group(1), match.group(2), int(match.group(4) or 0)


def piece_numbers(names: list[str]) -> list[int]:
    """The piece numbers of a state's GeoParquet parts (``part-<k>.parquet``), in order."""
    return [_piece(name)[2] for name in names]


def unlisted_parts(folder: Path, files: dict) -> list[str]:
    """Everything under the parts' folders and ``tract-values/`` (each a folder of folders of
    files: a state's, a cell's) the manifest does not list (a folder that is a symbolic link,
    or not a folder, is named, never followed)."""
    extra = []
    for name in (*PARTS_FOLDERS, VALUES_FOLDER):
        top = folder / name
        if top.is_symlink() or (top.exists() and not top.is_dir()):
            extra.append(name)
            continue
        for state in (sorted(top.iterdir()) if top.is_dir() else []):
            if state.is_symlink() or not state.is_dir():
                extra.append(f"{name}/{state.name}")
                continue
            extra += [f"{name}/{state.name}/{p.name}" for p in sorted(state.iterdir())
                      if f"{name}/{state.name}/{p.name}" not in files]
    return extra
