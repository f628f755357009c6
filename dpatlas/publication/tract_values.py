"""The tracts' polygons tiled once, their values published apart (issue 35: the map's tracts).

A release published one tract archive per cell, each tract's polygon tiled again in every
cell with that cell's values. tippecanoe's cost is mostly the polygons and the properties it
carries through every zoom (about 31 user CPU-s a cell for the national tracts; the polygons
with the GEOID alone, 9.4), so at 42 cells the archives were a third of the release's work on
the workers and its longest task. Now:

* ``tracts.pmtiles`` holds each tract's polygon once, with its GEOID alone
  (:data:`GEOMETRY_PROPERTIES`), whatever the number of cells. Every cell holds every tract
  (the assembly joins each cell's rows to every boundary), so the polygons are those of one
  cell's rows: :func:`geometry_cell`'s.
* each (cell, state) pair's values are a JSON document of their own,
  ``tract-values/<cell>/<state>.json`` (:func:`values_file`): the columns the archives
  carried (every published column but the geometry and what the map never shows,
  ``tiles.NOT_IN_TILES``) and one row per tract, GEOID first. The web map fetches the shown
  cell's documents of the states in view and paints each polygon by its GEOID
  (MapLibre's feature state), so a map showing one cell fetches that cell's values alone,
  and switching cells fetches no tiles.

The document, for a reader without this code::

    {"cell": "<cell>", "state": "<state FIPS>",
     "columns": ["geoid", "name", ...], "rows": [["01001000100", "Census Tract 1", ...], ...]}

Values are written as the published GeoJSON's properties are (``geojson.json_columns``): a
value not published is null.
"""

from __future__ import annotations

import re
from pathlib import Path

from dpatlas.publication.cell_tiles import cell_key

VALUES_FOLDER = "tract-values"
# The properties the tract archive carries: the GEOID, which the map's feature state keys on.
GEOMETRY_PROPERTIES = ("geoid",)
# The manifest's entry: {"columns": the documents' columns, "folders": {cell: its folder}}
# (the web map reads it).
MANIFEST_KEY = "tract_values"
_STATE = re.compile(r"[0-9]{2}")


def cell_folder(cell: str) -> str:
    """``tract-values/<cell>``: the folder of ``cell``'s documents (``-<digest>`` for a cell
    whose name is not plain ASCII letters, digits, ``_`` and ``-``: ``cell_tiles.cell_key``,
    which no plain name starts with, so two cells never share a folder)."""
    return f"{VALUES_FOLDER}/{cell_key(cell)}"


def values_file(cell: str, state: str) -> str:
    """The document of ``cell``'s tracts in ``state`` (two-digit FIPS), relative to the
    release."""
    state = str(state)
    if not _STATE.fullmatch(state):
        raise ValueError(f"a tract's state is a two-digit FIPS code, not {state!r}")
    return f"{cell_folder(cell)}/{state}.json"


# A document's name as the manifest lists it: :func:`values_file`'s form, nothing else.
_DOCUMENT = re.compile(rf"{VALUES_FOLDER}/([A-Za-z0-9][A-Za-z0-9_-]{{0,63}}|-[0-9a-f]{{16}})"
                       r"/[0-9]{2}\.json")


def is_values_document(name) -> bool:
    """Whether a published file's name is a (cell, state)'s values document."""
    return isinstance(name, str) and _DOCUMENT.fullmatch(name) is not None


def document_title(name: str) -> str:
    """The STAC title of a values document: its cell named when the folder's name is the
    cell's (not a digest), and its state."""
    _, cell, state = name.split("/")
    whose = "one cell" if cell.startswith("-") else f"cell {cell}"
    return f"Tract values of {whose}, state {state.removesuffix('.json')}: the web map's (JSON)"


def geometry_cell(cells: list[str]) -> str:
    """The cell whose rows' polygons the tract archive is built from: the overview's (``all``
    when present, else the first in sorted order), so every part of a release picks the
    same one."""
    cells = [str(c) for c in cells]
    return "all" if "all" in cells else sorted(cells)[0]


# Every row of a document has the document's cell and state: said once, in its head.
_IN_HEAD = ("cell", "state")


def value_columns(columns, not_in_tiles) -> list[str]:
    """The columns a document's rows hold, in the table's order with ``geoid`` first: every
    column but ``geometry``, ``not_in_tiles`` and the cell and state (the document's)."""
    left_out = {"geometry", *not_in_tiles, *_IN_HEAD}
    kept = [c for c in columns if c not in left_out]
    if "geoid" not in kept:
        raise ValueError("the tract table has no geoid column")
    return ["geoid", *(c for c in kept if c != "geoid")]


def manifest_entry(columns: list[str], cells) -> dict:
    """The manifest's :data:`MANIFEST_KEY`: the documents' ``columns`` and each cell's
    folder."""
    return {"columns": list(columns),
            "folders": {str(c): cell_folder(c) for c in sorted({str(c) for c in cells})}}


def _states(values: dict[str, list]) -> list[str]:
    if "state" in values:
        return [str(s) for s in values["state"]]
    return [str(g)[:2] for g in values["geoid"]]


def documents(values: dict[str, list], columns: list[str]) -> dict[str, bytes]:
    """The documents of the rows whose :func:`geojson.json_columns` are ``values`` (every
    row with a ``cell``): {file name: JSON bytes}, one per (cell, state), rows in their
    order."""
    import orjson

    rows = list(zip(*(values[c] for c in columns)))
    picked: dict[tuple[str, str], list] = {}
    for key, row in zip(zip(map(str, values["cell"]), _states(values)), rows):
        picked.setdefault(key, []).append(row)
    return {values_file(cell, state): orjson.dumps(
                {"cell": cell, "state": state, "columns": columns, "rows": chosen})
            for (cell, state), chosen in picked.items()}


def write_documents(folder: Path, values: dict[str, list], columns: list[str]) -> list[str]:
    """Write :func:`documents` under ``folder``; their names. A document already there is a
    second group holding the same cell and state, which a release never makes (a group
    holds whole cells, a part whole states or cells): refused, not overwritten."""
    from dpatlas.publication.tract_files import PublishError

    written = []
    for name, text in documents(values, columns).items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "xb") as out:  # "x": never a second group's over the first's
                out.write(text)
        except FileExistsError:
            raise PublishError(f"{name}: a cell's rows of one state are in two groups of "
                               "cells (a bug: a group holds whole cells); nothing was "
                               "published") from None
        written.append(name)
    return written


def read_document(path: Path) -> dict:
    """A document as written: cell, state, columns, rows."""
    import orjson

    return orjson.loads(Path(path).read_bytes())


def geometry_input_texts(values: dict[str, list], geometry: list[str],
                         cell: str) -> list[str]:
    """The features of the rows of ``cell`` (the :func:`geometry_cell`) as the tract
    archive's input: the GEOID and the row's polygon (``geojson.geometry_texts``), no id."""
    from dpatlas.publication.geojson import tile_input_texts

    rows = [i for i, c in enumerate(values["cell"]) if str(c) == cell]
    kept = {name: [values[name][i] for i in rows] for name in GEOMETRY_PROPERTIES}
    return tile_input_texts(kept, [geometry[i] for i in rows])


# The tract archive's input, beside the staging files under a dot name (never published;
# removed once built).
GEOMETRY_INPUT = ".tracts-geometry.geojson"
_BARE_HEAD = '{"type":"FeatureCollection","features":['


class TractMapWriter:
    """The map's tracts of a release or of one publish part, a group of rows at a time
    (:meth:`add`): each (cell, state)'s values document into ``staging``, and the geometry
    cell's polygons to the archive's input. :meth:`finish` closes the input and, given a
    ``tiler`` (one thread), starts ``tracts.pmtiles`` on it; without one (a part of a
    release of several states) the input is left for an archive built from every part's
    (:meth:`features`)."""

    def __init__(self, staging: Path, release_id: str, config: dict, cells: list[str],
                 tiler=None):
        from dpatlas.publication import tiles

        self.staging, self.tiler = Path(staging), tiler
        self.cells = sorted({str(c) for c in cells})
        self.cell = geometry_cell(self.cells) if self.cells else None
        self.text = tiles.release_tile_text(release_id, config)
        self.min_zoom = tiles.tract_min_zoom(config.get("levels"))
        self.not_in_tiles = tiles.NOT_IN_TILES
        self.documents: list[str] = []
        self.columns: list[str] | None = None
        self._input, self._wrote, self._built = None, False, None

    def add(self, values: dict[str, list], geometry: list[str]) -> None:
        """A group's rows, as ``geojson.json_columns`` and ``geojson.geometry_texts`` made
        them for the published features."""
        if not values or not len(values.get("geoid", ())):
            return
        columns = value_columns(list(values), self.not_in_tiles)
        if self.columns is not None and columns != self.columns:
            raise ValueError(f"a group of rows has columns {columns}, the first {self.columns} "
                             "(a bug: every group is cast to the first one's schema)")
        self.columns = columns
        self.documents += write_documents(self.staging, values, columns)
        texts = geometry_input_texts(values, geometry, self.cell)
        if texts:
            from dpatlas.publication.geojson import write_feature_texts

            if self._input is None:
                self._input = open(self.staging / GEOMETRY_INPUT, "w", encoding="utf-8")
                self._input.write(_BARE_HEAD)
            self._wrote = write_feature_texts(self._input, texts, self._wrote)

    def finish(self) -> "TractMapWriter":
        """Every group is in: the input closed and, with a tiler, the archive started."""
        from dpatlas.publication.geojson import FEATURE_COLLECTION_TAIL

        if self._input is not None and not self._input.closed:
            self._input.write(FEATURE_COLLECTION_TAIL)
            self._input.close()
        if self.tiler is not None:
            self._built = self.tiler.submit(self._build)
        return self

    def close(self) -> None:
        """A group failed midway: the input closed unfinished (its part is refused; never
        published)."""
        if self._input is not None and not self._input.closed:
            self._input.close()

    def features(self) -> dict[str, str]:
        """Without a tiler: the archive's input written here (its name in the folder), keyed
        by the geometry cell; empty when this part holds none of its rows."""
        return {self.cell: GEOMETRY_INPUT} if self._input is not None else {}

    def manifest_entry(self) -> dict:
        """The manifest's :data:`MANIFEST_KEY` (:func:`manifest_entry`)."""
        return manifest_entry(self.columns or [], self.cells)

    def _build(self) -> str:
        from dpatlas.publication import tiles

        source = self.staging / GEOMETRY_INPUT
        if self._input is None:
            raise ValueError("no tract was written, so there is no tract archive to build")
        try:
            tiles.build_tiles(source, self.staging / tiles.TILES_FILE,
                              min_zoom=self.min_zoom, text=self.text)
        finally:
            source.unlink(missing_ok=True)
        return tiles.TILES_FILE

    def result(self) -> dict:
        """Waits for the archive (raises if tippecanoe failed); the manifest's entry."""
        if self._built is not None:
            self._built.result()
        return self.manifest_entry()
