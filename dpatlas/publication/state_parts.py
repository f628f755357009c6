"""Tract files partitioned by state (issue 35, item 2): a release whose tracts span more than
one state publishes, instead of ``tracts.parquet``, ``tracts.csv`` and ``tracts.geojson``, one
of each per state (XX: the state's FIPS code): ``tracts/state=XX/part-0.parquet``,
``tracts-csv/state=XX/tracts.csv`` and ``tracts-geojson/state=XX/tracts.geojson``, so a user who
wants one state downloads that state's files. A one-state release keeps its single files. A
state whose rows were written by several publish tasks (dpatlas.publication.release_parts: a
large state at many cells) has several GeoParquet files, ``part-0.parquet``, ``part-1.parquet``
..., each some of its cells; its CSV and GeoJSON are still one file each.
Each format has a folder of its own so that ``tracts/`` holds Parquet files only: a Parquet
dataset reader (pandas, pyarrow, DuckDB) given a folder reads every file in it.

The GeoParquet parts form a hive-partitioned dataset. GeoParquet 1.1 defines its metadata per
file, not for a collection: every part carries its own ``geo`` metadata (its own ``bbox``),
with the same version, primary column, encoding, geometry types and CRS as every other part
(the audit checks it). No ``_metadata``/``_common_metadata`` file is written: geopandas and
pandas do not read one, and it would be one more file to keep in step with the parts. Each
part keeps the ``state`` column, so a part read alone is the whole published schema; read the
dataset with ``partitioning=None`` (the folder names would otherwise add a second ``state``
column, of numbers, that clashes with the text one).

Parts are written while the groups of cells stream (:class:`ByState`): one writer per state,
made when its state first appears; a group's rows are split by state and appended to their
states' writers, so one group is in memory at a time, as for the single files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Optional

import pandas as pd

# (folder of the parts, a part's file name) per format.
PARQUET_PARTS = ("tracts", "part-0.parquet")
CSV_PARTS = ("tracts-csv", "tracts.csv")
GEOJSON_PARTS = ("tracts-geojson", "tracts.geojson")


# A part's name as the manifest lists it (the only names with a "/" of a release). A state's
# GeoParquet rows may be in several files, ``part-<k>.parquet`` (a state too large for one
# publish task is written by several, each a group of its cells); its CSV and GeoJSON are one
# file each.
PART_NAME = re.compile(r"(tracts/state=[0-9]{2}/part-[0-9]+\.parquet|tracts-csv/state=[0-9]{2}/"
                       r"tracts\.csv|tracts-geojson/state=[0-9]{2}/tracts\.geojson)")
_PIECE = re.compile(r"part-([0-9]+)\.parquet$")


def parts_of(files, parts: tuple[str, str]) -> list[str]:
    """The names in ``files`` of one format's parts (``parts``: its folder and file), by state
    then piece (``part-2`` before ``part-10``)."""
    def of_format(name: str) -> bool:
        if not (PART_NAME.fullmatch(name) and name.startswith(parts[0] + "/")):
            return False
        file = name.rsplit("/", 1)[1]
        return bool(_PIECE.fullmatch(file)) if _PIECE.fullmatch(parts[1]) else file == parts[1]

    return sorted(filter(of_format, files), key=_state_then_piece)


def _state_then_piece(name: str) -> tuple[str, int]:
    piece = _PIECE.search(name)
    return name.rsplit("/", 1)[0], int(piece.group(1)) if piece else 0


def piece_name(name: str, piece: int) -> str:
    """A part's file name as the ``piece``-th of its state's: ``part-<piece>.parquet`` for a
    GeoParquet part (the others, one per state, keep their name)."""
    return _PIECE.sub(f"part-{piece}.parquet", name) if _PIECE.search(name) else name


def part_name(parts: tuple[str, str], state: str) -> str:
    """A part's name relative to the release: ``<folder>/state=XX/<file>``."""
    return f"{parts[0]}/state={state}/{parts[1]}"


def states_of(table: pd.DataFrame) -> pd.Series:
    """Each row's state: its GEOID's first two characters (as publish fills ``state``)."""
    return table["geoid"].astype(str).str[:2]


class ByState:
    """A tract file written whole (``single()``'s writer, ``single_name``) when the first
    group's rows are one state's, else one writer per state (``per_state(path)``, ``path``
    the part's, its folder made first; ``parts``: the parts' folder and file name). Every
    group holds every boundary tract, so the first group tells whether the release spans
    several states; ``on_partition(columns)`` runs once when it does. ``partitioned``: given
    when the caller knows (a publish part of some of the states of a release of several
    writes their parts, even when it holds one state)."""

    def __init__(self, root: Path, parts: tuple[str, str], single_name: str,
                 single: Callable[[], object], per_state: Callable[[Path], object],
                 on_partition: Optional[Callable[[list[str]], None]] = None,
                 partitioned: Optional[bool] = None):
        self.root, self.parts, self.single_name = Path(root), parts, single_name
        self.single, self.per_state = single, per_state
        self.on_partition = on_partition
        self.partitioned: Optional[bool] = partitioned
        self.announced = False
        self.writers: dict[str, object] = {}

    def append(self, table: pd.DataFrame) -> None:
        states = states_of(table)
        if not self.announced:
            self.announced = True
            if self.partitioned is None:
                self.partitioned = states.nunique() > 1
            if not self.partitioned:
                self.writers[""] = self.single()
            elif self.on_partition is not None:
                self.on_partition(list(table.columns))
        if not self.partitioned:
            self.writers[""].append(table)
            return
        for state, rows in table.groupby(states, sort=True):
            if state not in self.writers:
                path = self.root / part_name(self.parts, state)
                path.parent.mkdir(parents=True, exist_ok=True)
                self.writers[state] = self.per_state(path)
            self.writers[state].append(rows.reset_index(drop=True))

    def close(self) -> None:
        for writer in self.writers.values():
            if hasattr(writer, "close"):
                writer.close()

    def names(self) -> list[str]:
        """The files written (relative to the release): the single file, or each part."""
        if not self.announced:
            return []
        if not self.partitioned:
            return [self.single_name]
        return [part_name(self.parts, state) for state in sorted(self.writers)]


class CsvPart:
    """One state's ``tracts.csv`` a group at a time (the header with the first); the Table
    Schema is the release's one ``tracts.schema.json`` (every part has the same columns)."""

    def __init__(self, path: Path):
        self.path, self.started = Path(path), False

    def append(self, rows: pd.DataFrame) -> None:
        rows.to_csv(self.path, index=False, na_rep="", mode="a" if self.started else "w",
                    header=not self.started)
        self.started = True


def codebook_lines(folder: Path) -> list[str]:
    """The codebook's section on reading a release of several states (none for one state)."""
    if not (Path(folder) / PARQUET_PARTS[0]).is_dir():
        return []
    several = any(Path(folder).glob(f"{PARQUET_PARTS[0]}/state=*/part-1.parquet"))
    pieces = (["A large state's GeoParquet rows may be in several files, `part-0.parquet`, "
               "`part-1.parquet` ... (each some of its cells): read the state's folder, not "
               "one file, to have all of them.", ""] if several else [])
    return ["## One file per state", "",
            "The tract table is published one file per state (`XX`: the state's FIPS code): "
            "`tracts/state=XX/part-0.parquet` (GeoParquet, each file with its own `geo` "
            "metadata), `tracts-csv/state=XX/tracts.csv` and "
            "`tracts-geojson/state=XX/tracts.geojson`; `tracts.schema.json` describes every "
            "CSV part. Read one state's file alone, or every state as one table (each part "
            "keeps its `state` column, so the folder names are not read as a column):", "",
            "```python", "import geopandas as gpd", "import pandas as pd",
            'tracts = gpd.read_parquet("tracts/", partitioning=None)  # all states',
            'table = pd.read_parquet("tracts/", partitioning=None)  # geometry as WKB bytes',
            "import pyarrow.dataset as ds",
            'dataset = ds.dataset("tracts/", format="parquet")  # filter before reading',
            "```", "", *pieces]
