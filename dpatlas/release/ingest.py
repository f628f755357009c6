"""Reading the microdata one partition (state) at a time, into the pipeline's own columns.

Output columns: ``row`` (position in the input, for quarantine reports), ``geoid`` (text;
``None`` where the input cell is blank), ``x`` and ``y`` (ranks on the [0, 1] scale, not yet
validated; NaN where missing), ``cell`` (str), and ``person_id`` when the config names one. The
raw input is never modified.

Memory holds one partition, whatever the input's form and the number of cells. A partition
is a state; a state with more than :data:`PARTITION_RECORDS` records and a ``cell`` column is
split into groups of whole cells (greedy over its cells in sorted order, each group within the
bound unless one cell alone exceeds it), keyed ``06-c0``, ``06-c1``, ... in that order: the
same keys on every run of the same input, and never the cells' text (arbitrary) in a key or a
file name. A state within the bound stays one partition keyed by its FIPS code.

- a hive-partitioned Parquet dataset (``.../state=17/part.parquet``) is read one state at a
  time with pyarrow; the partitions and their row counts come from the files' footers, and
  for a state above the bound from its cell column alone, read batch by batch; a split
  partition streams its state's records and keeps only its cells;
- a single CSV or Parquet file is split by the state its GEOIDs name (their first two
  characters): :func:`partitions` streams it once, counting records per state (and cell), and
  :func:`read_partition` streams it again keeping only that partition's records, in blocks
  of a few MiB. Records whose GEOID is not 11 digits (blank, short, malformed) form one more
  partition, ``other``, so the input contract reports them. The key ``all`` still
  reads the whole file at once (small inputs, tests).

A national CSV (5 million records) is thus parsed once per partition: the cost is CPU time
(about 51 streaming passes, one more per split group), not memory.

Column types are strict, because a silent conversion changes who is in which tract:

- GEOIDs must be text. CSV GEOIDs are always read as text (never through a float, where one
  blank cell turns every GEOID into ``17001000100.0``); an integer or float GEOID column is
  refused, since an integer id has lost its leading zero and padding it back would guess.
- Ranks must be numbers (integers are fine). A boolean rank column is refused, and so is a
  text column in Parquet (which stores numbers as numbers); in a CSV, a column is text when
  some value is not a number, and is refused naming those values.
- Person ids must be integers or text: a float id loses digits beyond 2**53, which can merge
  two people (or split one) and so break the one-record-per-person check. CSV person ids and
  cells are read as text, so ``007`` and ``7`` stay two people.

Every such problem raises :class:`InputError` (the command line exits with code 2).
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from dpatlas.core.config import InputConfig
from dpatlas.release.cell_groups import greedy_groups
from dpatlas.core.errors import ReleaseRefused

_EXAMPLES = 5


class InputError(ValueError, ReleaseRefused):
    """The input cannot be read as configured (missing file or column, wrong column type)."""


@dataclass(frozen=True)
class Partition:
    key: str  # state FIPS, "SS-cK" (group K of a large state's cells), "other" (GEOIDs
    # naming no state), or "all" (the whole input)
    rows: int
    cells: tuple[str | None, ...] | None = None  # a split partition's cells, as text (None
    # for a null cell); None: every record of the key


ALL, OTHER = "all", "other"
# Records per partition before a state is split by cells. A partition is read, checked (pandas
# and Great Expectations copies) and staged in one task, two tasks at a time. Measured with 42
# cells (California: 24 M records): one task on a 4 M-record group peaks ~1 GiB above the
# process's 0.3 GiB of code and two at a time took the process to 1.8 GiB, where California
# unsplit took 3.9 GiB alone. 4 M thus keeps validation near 2 GiB whatever the number of
# cells, within the 4 GiB a process may take (issue 22), while every state of a one-cell input
# (the largest 0.6 M records) or a 6-cell one (3.4 M) stays one partition, keyed as before.
# The price is CPU: each group streams its whole state (California in 6 groups: 34 s, 22 s
# unsplit).
PARTITION_RECORDS = 4_000_000
SPLIT_KEY = re.compile(r"([0-9]{2})-c([0-9]+)")  # a split partition: state, group
_STREAM_BLOCK_BYTES = 1 << 20  # CSV bytes per block when streaming a file (pyarrow reads
# ahead some 32 blocks: ~40 MiB in flight, whatever the size of the file)
_STREAM_BATCH_ROWS = 256 * 1024  # Parquet rows per batch when streaming a file


# --- opening and reading --------------------------------------------------------------------


def _text_columns(cfg: InputConfig) -> list[str]:
    """Columns read as text from CSV: identifiers, whose leading zeros and digits matter."""
    c = cfg.columns
    return [name for name in (c.geoid, c.person_id, c.cell) if name]


_UNREADABLE = re.compile(r"(?:Could not open|Could not read schema from) [^']*'([^']+)'")


# pyarrow's "Row #N" counts the file's lines from 1, the header included (when it is known)
_NOT_UTF8 = re.compile(r"(?:Row #([0-9]+): )?CSV conversion error to [a-z]+: invalid UTF8")
_PARQUET_MAGIC = b"PAR1"  # a Parquet file's first and last four bytes


def _not_parquet(name: Path) -> bool:
    """A non-empty file that does not begin as every Parquet file does (a README, a CSV),
    as opposed to a Parquet file cut short (which still begins with the magic bytes)."""
    try:
        with open(name, "rb") as fh:
            head = fh.read(len(_PARQUET_MAGIC))
    except OSError:
        return False
    return bool(head) and head != _PARQUET_MAGIC


def _input_error(cfg: InputConfig, err: Exception) -> InputError:
    """What an operator reads for pyarrow's error: a file that is not a whole CSV or Parquet
    file (empty, truncated, corrupt, not Parquet at all, not UTF-8), named; or column types
    that do not agree."""
    text = str(err).strip()
    unreadable = _UNREADABLE.findall(text)
    name = Path(unreadable[-1]) if unreadable else Path(cfg.path)
    if not_utf8 := _NOT_UTF8.search(text):
        # a Latin-1 (or Windows-1252) export: its accented letters are not UTF-8
        line = f"line {not_utf8[1]} holds" if not_utf8[1] else "it holds"
        return InputError(
            f"input file {name} is not UTF-8 text ({line} bytes that are not UTF-8, as a "
            "Latin-1 or Windows-1252 export has): convert it to UTF-8, "
            f"e.g. `iconv -f latin1 -t utf-8 {name} > converted.csv`, and point input.path at "
            "the converted file (nothing was charged)")
    if unreadable or "Empty CSV file" in text or "magic bytes" in text:
        try:
            empty = name.is_file() and name.stat().st_size == 0
        except OSError:
            empty = False
        if cfg.format == "parquet" and not empty and _not_parquet(name):
            if not Path(cfg.path).is_dir():
                return InputError(f"input file {name} is not a Parquet file: point input.path "
                                  "at the Parquet file, or for a CSV file set input.format: "
                                  "csv (nothing was charged)")
            return InputError(
                f"input folder {cfg.path} holds {_relative(str(name), cfg.path)}, which is not "
                "a Parquet file: every file in the input folder is read as data, so move any "
                "other file (a README, notes, a CSV) out of it (nothing was charged)")
        what = ("is empty (0 bytes)" if empty else
                f"is not a complete {cfg.format} file (truncated or corrupt)")
        return InputError(f"input file {name} {what}: replace it with the complete file "
                          "(nothing was charged)")
    # e.g. a CSV whose first block infers a rank column as numbers and a later row holds
    # text: pyarrow names the column and the row.
    first = text.splitlines()[0] if text else type(err).__name__
    return InputError(f"input {cfg.path} cannot be read with consistent column types: "
                      f"{first}. Ranks must be numbers; GEOIDs and ids text.")


def _dataset(cfg: InputConfig) -> ds.Dataset:
    path = Path(cfg.path)
    if not path.exists():
        raise InputError(f"input not found: {path}")
    try:
        if cfg.format == "csv":
            # Without explicit types pyarrow infers GEOIDs as integers (or floats, if one cell
            # is blank): leading zeros and the text itself are lost before any check sees them.
            convert = pacsv.ConvertOptions(
                column_types={n: pa.string() for n in _text_columns(cfg)})
            return ds.dataset(path, format=ds.CsvFileFormat(convert_options=convert))
        partitioning = "hive" if path.is_dir() else None
        dataset = ds.dataset(path, format="parquet", partitioning=partitioning)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise _input_error(cfg, err) from None
    if path.is_dir() and not dataset.files:
        raise InputError(f"input folder {path} holds no data files (files and folders whose "
                         "names begin with '.' or '_' are not read): point input.path at the "
                         "folder that holds the state=SS folders, or at a single file")
    return dataset


def _to_table(cfg: InputConfig, dataset: ds.Dataset, **kwargs) -> pa.Table:
    try:
        return dataset.to_table(**kwargs)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise _input_error(cfg, err) from None


def _is_hive(cfg: InputConfig, dataset: ds.Dataset) -> bool:
    return (cfg.format == "parquet" and Path(cfg.path).is_dir()
            and "state" in dataset.schema.names)


def _batches(cfg: InputConfig, columns: list[str]):
    """The single input file's record batches, in file order, holding ``columns`` only.

    Streamed (a block at a time) so that memory does not grow with the file. A CSV's column
    types are inferred from its first block, as a whole-file read would do; a later block
    that does not fit raises :class:`InputError` (see :func:`_to_table`).
    """
    path = Path(cfg.path)
    try:
        if cfg.format == "csv":
            convert = pacsv.ConvertOptions(
                column_types={n: pa.string() for n in _text_columns(cfg)},
                include_columns=columns)
            reader = pacsv.open_csv(path, read_options=pacsv.ReadOptions(
                block_size=_STREAM_BLOCK_BYTES), convert_options=convert)
            for batch in reader:
                yield batch
        else:
            yield from pq.ParquetFile(path).iter_batches(batch_size=_STREAM_BATCH_ROWS,
                                                         columns=columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise _input_error(cfg, err) from None


def _state_keys(geoids: pa.Array) -> pa.Array:
    """Per record its partition key: the GEOID's first two characters when it is 11 digits,
    else ``other`` (blank, null, short or malformed GEOIDs: the contract reports them)."""
    if pa.types.is_dictionary(geoids.type):
        geoids = geoids.cast(geoids.type.value_type)
    if pa.types.is_null(geoids.type):
        return pa.array([OTHER] * len(geoids), pa.string())
    prefix = pc.utf8_slice_codeunits(geoids, 0, 2)
    # Only a whole 11-digit GEOID names its state: a 10-digit one (an integer that lost its
    # leading zero, 06001000100 -> 6001000100) would be filed under state 60. RE2: \z is
    # the end of the text.
    is_state = pc.fill_null(pc.match_substring_regex(geoids, r"\A[0-9]{11}\z"), False)
    return pc.if_else(is_state, prefix, pa.scalar(OTHER))


def _cell_text(cells: pa.Array) -> pa.Array:
    """Cells as text (null stays null), whatever their stored type: how partitions name them."""
    if pa.types.is_dictionary(cells.type):
        cells = cells.dictionary_decode()
    return cells if pa.types.is_string(cells.type) else pc.cast(cells, pa.string())


def _in_cells(cells: pa.Array, group: tuple[str | None, ...]) -> pa.Array:
    """Per record whether its cell is one of ``group`` (a null cell matches ``None``)."""
    return pc.is_in(_cell_text(cells), value_set=pa.array(group, pa.string()), skip_nulls=False)


def state_partitions(state: str, cell_counts: dict[str | None, int]) -> list[Partition]:
    """One state as one partition, or, above :data:`PARTITION_RECORDS`, as groups of whole
    cells (:func:`dpatlas.release.cell_groups.greedy_groups`: a group holds one cell at least,
    however large)."""
    groups = greedy_groups(cell_counts, PARTITION_RECORDS)
    if len(groups) < 2:  # within the bound, or one cell (nothing to split)
        return [Partition(state, sum(cell_counts.values()))]
    return [Partition(f"{state}-c{k}", n, cells) for k, (cells, n) in enumerate(groups)]


def _listed(counts: dict[str, dict[str | None, int]]) -> list[Partition]:
    """The partitions of records counted per state (or ``other``) and cell, in key order."""
    return [part for key, cells in sorted(counts.items())
            for part in (state_partitions(key, cells) if key != OTHER
                         else [Partition(key, sum(cells.values()))])]


def _streamed_counts(cfg: InputConfig) -> list[Partition]:
    """One pass over a single file: the number of records per state (and ``other``), and per
    cell when the input has cells (to split large states)."""
    c = cfg.columns
    counts: dict[str, dict[str | None, int]] = {}
    for batch in _batches(cfg, [c.geoid] + ([c.cell] if c.cell else [])):
        keys = _state_keys(batch.column(c.geoid))
        cells = (_cell_text(batch.column(c.cell)) if c.cell
                 else pa.nulls(len(keys), pa.string()))
        table = pa.table({"key": keys, "cell": cells})
        for item in table.group_by(["key", "cell"]).aggregate([("key", "count")]).to_pylist():
            per_cell = counts.setdefault(item["key"], {})
            per_cell[item["cell"]] = per_cell.get(item["cell"], 0) + item["key_count"]
    return _listed(counts)


def _kept(batches, keep, schema_of, columns: list[str]) -> tuple[pa.Table, np.ndarray]:
    """The records of ``batches`` for which ``keep(batch)`` is true, and their positions
    among all the batches' records (in order). Only the kept records are held; with none,
    an empty table of ``columns`` of the input's schema (``schema_of()``)."""
    tables, rows, offset = [], [], 0
    for batch in batches:
        hit = keep(batch)
        positions = np.flatnonzero(hit.to_numpy(zero_copy_only=False))
        if positions.size:
            tables.append(pa.Table.from_batches([batch.filter(hit)]))
            rows.append(positions + offset)
        offset += batch.num_rows
    if not tables:
        empty = pa.Table.from_batches([], schema=schema_of()).select(columns)
        return empty, np.empty(0, np.int64)
    return pa.concat_tables(tables), np.concatenate(rows).astype(np.int64)


def _streamed_partition(cfg: InputConfig, state: str, columns: list[str],
                        cells: tuple[str | None, ...] | None = None
                        ) -> tuple[pa.Table, np.ndarray]:
    """One state's records of a single file (only ``cells``' when given), streamed, and their
    positions in the file."""
    def keep(batch: pa.RecordBatch) -> pa.Array:
        hit = pc.equal(_state_keys(batch.column(cfg.columns.geoid)), state)
        return hit if cells is None else pc.and_(hit, _in_cells(batch.column(cfg.columns.cell),
                                                                cells))

    return _kept(_batches(cfg, columns), keep, lambda: _dataset(cfg).schema, columns)


def _hive_counts(dataset: ds.Dataset) -> dict[str, int]:
    """Rows per state of a hive-partitioned dataset, from the Parquet footers (no data read)."""
    counts: dict[str, int] = {}
    for fragment in dataset.get_fragments():
        state = ds.get_partition_keys(fragment.partition_expression).get("state")
        key = str(state).zfill(2)
        counts[key] = counts.get(key, 0) + _footer_rows(fragment)
    return counts


# Rows per Parquet file, by (path, size, modification time): every partition read needs the
# rows of the states before it (its records' positions count from the dataset's start), so
# without it each of a national input's 51 reads opened all 51 footers again, 2,601 in all
# (1.3 s of the flow's time when validating on its threads). A file changed since is another
# key, read again.
_FOOTER_ROWS: dict[tuple[str, int, int], int] = {}


def _footer_rows(fragment: ds.ParquetFileFragment) -> int:
    """``fragment.count_rows()``, read once per process for a file unchanged since."""
    try:
        stat = os.stat(fragment.path)
    except OSError:  # not a local file: read each time
        return fragment.count_rows()
    key = (fragment.path, stat.st_size, stat.st_mtime_ns)
    rows = _FOOTER_ROWS.get(key)
    if rows is None:
        rows = _FOOTER_ROWS[key] = fragment.count_rows()
    return rows


def _hive_state(dataset: ds.Dataset, state: str) -> ds.Expression:
    """The filter for one state's records of a hive dataset (its ``state`` text or integer)."""
    if pa.types.is_integer(dataset.schema.field("state").type):
        return ds.field("state") == int(state)
    return ds.field("state").cast(pa.string()) == state


def _hive_batches(dataset: ds.Dataset, state: str, columns: list[str]):
    """One state's record batches of a hive dataset, in order, with one batch and one file
    of read-ahead: reading a 4 M-record group of a 24 M-record state took 0.86 GiB of pyarrow
    memory with the defaults (16 batches, 4 files), 0.61 GiB so (0.28 GiB of it the group)."""
    return dataset.to_batches(columns=columns, filter=_hive_state(dataset, state),
                              batch_size=_STREAM_BATCH_ROWS, batch_readahead=1,
                              fragment_readahead=1)


def _hive_cell_counts(cfg: InputConfig, dataset: ds.Dataset, state: str
                      ) -> dict[str | None, int]:
    """Records per cell of one state of a hive dataset: its cell column alone, in batches."""
    counts: dict[str | None, int] = {}
    for batch in _hive_batches(dataset, state, [cfg.columns.cell]):
        for item in pc.value_counts(_cell_text(batch.column(0))).to_pylist():
            counts[item["values"]] = counts.get(item["values"], 0) + item["counts"]
    return counts


def _hive_partitions(cfg: InputConfig, dataset: ds.Dataset) -> list[Partition]:
    """The partitions of a hive dataset: its states from the footers; only a state above the
    bound (and with cells) has its cells counted, to split it."""
    counts: dict[str, dict[str | None, int]] = {}
    for state, n in _hive_counts(dataset).items():
        counts[state] = ({None: n} if n <= PARTITION_RECORDS or not cfg.columns.cell
                         else _hive_cell_counts(cfg, dataset, state))
    return _listed(counts)


# --- column checks --------------------------------------------------------------------------


def _kind(dtype: pa.DataType) -> str:
    """What a column holds, in the words an operator reads: integer, float, text, ..."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_boolean(dtype):
        return "boolean"
    if pa.types.is_integer(dtype):
        return "integer"
    if pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "float"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or (
            hasattr(pa.types, "is_string_view") and pa.types.is_string_view(dtype)):
        return "text"
    if pa.types.is_null(dtype):
        return "null"  # every value missing; the contract reports them
    return str(dtype)


def _check_columns(cfg: InputConfig, names: list[str]) -> None:
    c = cfg.columns
    needed = [c.geoid, c.parent_rank, c.child_rank] + [v for v in (c.person_id, c.cell) if v]
    missing = [n for n in needed if n not in names]
    if missing:
        raise InputError(f"input {cfg.path} lacks column(s) {missing}; it has {names}. "
                         "Map your column names under input.columns in the config.")


def _check_types(cfg: InputConfig, schema: pa.Schema) -> None:
    """Refuse column types that cannot be read without guessing (see the module docstring)."""
    c = cfg.columns
    geoid = _kind(schema.field(c.geoid).type)
    if geoid in ("integer", "float"):
        raise InputError(
            f"input {cfg.path}: GEOID column '{c.geoid}' is stored as {geoid} numbers; GEOIDs "
            "must be 11-character text (an integer id loses its leading zero, e.g. Alabama's "
            "01001020100 becomes 1001020100, and padding it back would guess). Store the "
            "column as text.")
    if geoid not in ("text", "null"):
        raise InputError(f"input {cfg.path}: GEOID column '{c.geoid}' has type {geoid}; "
                         "GEOIDs must be 11-character text.")
    for role, name in (("parent_rank", c.parent_rank), ("child_rank", c.child_rank)):
        kind = _kind(schema.field(name).type)
        if kind == "boolean":
            raise InputError(f"input {cfg.path}: {role} is boolean (column '{name}'); ranks "
                             "must be numbers on [0, 1] (or [0, 100] with input.rank_scale: "
                             "percentile).")
        if kind not in ("integer", "float", "text", "null"):
            raise InputError(f"input {cfg.path}: {role} column '{name}' has type {kind}; "
                             "ranks must be numbers.")
        if kind == "text" and cfg.format == "parquet":
            # Parquet stores a number's type with it: text there was written as text, and
            # reading it as numbers would guess (decimal commas, "5e-1", padding).
            raise InputError(f"input {cfg.path}: {role} column '{name}' is stored as text; "
                             "ranks must be stored as numbers (float or integer) in Parquet.")
    if c.person_id:
        kind = _kind(schema.field(c.person_id).type)
        if kind not in ("integer", "text", "null"):
            raise InputError(
                f"input {cfg.path}: person id column '{c.person_id}' has type {kind}; person "
                "ids must be integers or text (a float id loses digits beyond 2**53, which "
                "can merge two people).")


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    return column


def _examples(values, rows) -> str:
    shown = ", ".join(repr(v) for v in list(values)[:_EXAMPLES])
    at = ", ".join(str(r) for r in list(rows)[:_EXAMPLES])
    return f"e.g. {shown} (input rows {at}, counting from 0)"


def _blank(text: pd.Series) -> np.ndarray:
    """Missing, empty or whitespace-only values of an object column."""
    missing = text.isna().to_numpy()
    stripped = text.where(~missing, "").astype(str).str.strip()
    return missing | (stripped == "").to_numpy()


def _geoids(column: pa.ChunkedArray) -> pd.api.extensions.ExtensionArray:
    """GEOIDs as text, missing where blank (so the contract reports them as blank): pandas
    text kept in pyarrow, as the frame holds it, never a Python object per record on the way
    (4 M GEOIDs as objects add 0.25 GiB to the peak of a partition's read)."""
    text = _decoded(column)
    if pa.types.is_null(text.type):
        text = text.cast(pa.string())
    blank = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(text), ""), True)
    return pc.if_else(blank, pa.scalar(None, text.type), text).to_pandas().array


def _ranks(cfg: InputConfig, role: str, name: str, column: pa.ChunkedArray,
           rows: np.ndarray) -> np.ndarray:
    """Rank values as float64 on the input's scale; NaN where missing."""
    column = _decoded(column)
    if _kind(column.type) != "text":  # numbers (checked by _check_types) or all missing
        return column.cast(pa.float64()).to_pandas().to_numpy(dtype=float, na_value=np.nan)
    text = column.to_pandas().astype(object)
    numbers = pd.to_numeric(text, errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    not_numbers = ~_blank(text) & np.isnan(numbers)
    if not_numbers.any():
        raise InputError(
            f"input {cfg.path}: {role} column '{name}' holds text that is not a number in "
            f"{int(not_numbers.sum())} row(s), {_examples(text[not_numbers], rows[not_numbers])}; "
            "ranks must be numbers.")
    return numbers


def _person_ids(column: pa.ChunkedArray) -> pd.Series | np.ndarray:
    """Integer ids as a nullable integer column (a null must not turn ids into floats)."""
    column = _decoded(column)
    if pa.types.is_integer(column.type):
        wide = pa.uint64() if column.type == pa.uint64() else pa.int64()
        dtype = pd.UInt64Dtype() if wide == pa.uint64() else pd.Int64Dtype()
        return column.cast(wide).to_pandas(types_mapper={wide: dtype}.get).array
    return column.to_pandas().array  # text: pandas text, kept in pyarrow (see _geoids)


# --- the public functions -------------------------------------------------------------------


def parquet_records(cfg: InputConfig) -> int | None:
    """The input's records as its Parquet footers count them, reading no record (to size work
    before the input is listed), through :func:`_footer_rows`: the listing that follows takes
    them from its record, not from the files again. None for a CSV input, which only a pass
    over it counts, or an input that cannot be read (:func:`partitions` says why)."""
    if cfg.format == "csv":
        return None
    try:
        return sum(_footer_rows(fragment) for fragment in _dataset(cfg).get_fragments())
    except (InputError, OSError, pa.ArrowException):
        return None


def partitions(cfg: InputConfig) -> list[Partition]:
    """The partitions of the input (states, in order), with their row counts."""
    dataset = _dataset(cfg)
    if Path(cfg.path).is_dir() and not _is_hive(cfg, dataset):
        raise InputError(
            f"input folder {cfg.path} is not partitioned by state: a folder input is a Parquet "
            "dataset with one folder per state, named state=SS by its FIPS code (e.g. "
            "state=06/part-0.parquet); for a single CSV or Parquet file, point input.path at "
            "the file")
    _check_columns(cfg, dataset.schema.names)
    _check_types(cfg, dataset.schema)
    if _is_hive(cfg, dataset):
        _check_fragments(cfg, dataset)
        try:
            return _hive_partitions(cfg, dataset)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise _input_error(cfg, err) from None
    return _streamed_counts(cfg)


def _check_fragments(cfg: InputConfig, dataset: ds.Dataset) -> None:
    """Every file of a partitioned dataset on its own: readable, its columns and their types.

    The dataset reads every file with the first file's schema, casting silently: person ids
    stored as integers in one partition and as text in another would all become text, so
    ``7`` and ``007`` would count as two people while the manifest says "verified" (and an
    integer GEOID in a later file would be cast to text without its leading zero). Person ids
    are compared as one type, so every partition must store them as that type."""
    id_kinds: dict[str, list[str]] = {}
    for fragment in dataset.get_fragments():
        try:
            schema = fragment.physical_schema
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            raise _input_error(cfg, err) from None
        _check_columns(cfg, schema.names)
        _check_types(cfg, schema)
        if cfg.columns.person_id:
            kind = _kind(schema.field(cfg.columns.person_id).type)
            if kind != "null":
                id_kinds.setdefault(kind, []).append(_relative(fragment.path, cfg.path))
    if len(id_kinds) > 1:
        held = "; ".join(f"{kind} in {', '.join(files[:_EXAMPLES])}"
                         + (f" (and {len(files) - _EXAMPLES} more)"
                            if len(files) > _EXAMPLES else "")
                         for kind, files in sorted(id_kinds.items()))
        raise InputError(
            f"input {cfg.path}: person id column '{cfg.columns.person_id}' is stored as "
            f"{held}; person ids are compared across partitions as one type (as text, 007 "
            "and 7 would be two people), so store them as one type in every partition")


def _relative(path: str, root: Path) -> str:
    try:
        return str(Path(path).relative_to(Path(root)))
    except ValueError:
        return str(path)


def read_partition(cfg: InputConfig, key: str,
                   cells: tuple[str | None, ...] | None = None) -> pd.DataFrame:
    """One partition's records in the pipeline's columns (``key`` from :func:`partitions`,
    or ``all`` for the whole input). A split partition's ``cells`` are those its listing
    names; without them they are listed again (one more counting pass over a single file)."""
    dataset = _dataset(cfg)
    _check_types(cfg, dataset.schema)
    c = cfg.columns
    cols = [c.geoid, c.parent_rank, c.child_rank] + [v for v in (c.person_id, c.cell) if v]
    split = SPLIT_KEY.fullmatch(key)
    state = split.group(1) if split else key
    if not split:
        cells = None  # every record of the state (or of ``other``, or ``all``)
    elif cells is None:
        cells = _listed_cells(cfg, key)
    if key == ALL:
        table = _to_table(cfg, dataset, columns=cols)
        rows = np.arange(table.num_rows, dtype=np.int64)
    elif _is_hive(cfg, dataset):
        # Row positions count from the start of the whole dataset, in partition order, so a
        # quarantine report can point at the offending input rows.
        offset = sum(n for k, n in _hive_counts(dataset).items() if k < state)
        if cells is None:
            table = _to_table(cfg, dataset, columns=cols, filter=_hive_state(dataset, state))
            rows = np.arange(offset, offset + table.num_rows, dtype=np.int64)
        else:  # the state streamed, keeping only this group's cells
            table, rows = _hive_cells(cfg, dataset, state, cols, cells)
            rows += offset
        _check_hive_state(cfg, dataset, state, table.column(c.geoid))
    else:
        table, rows = _streamed_partition(cfg, state, cols, cells)  # positions in the file
    return _pipeline_frame(cfg, table, rows)


def _check_hive_state(cfg: InputConfig, dataset: ds.Dataset, state: str,
                      geoids: pa.ChunkedArray) -> None:
    """Every record of folder ``state=SS`` has a GEOID of state SS (or a malformed one, which
    the contract reports). A tract whose records lie in two state folders would be validated,
    charged and estimated as two tracts, and could never be published (issue 31)."""
    if pa.types.is_dictionary(geoids.type):
        geoids = geoids.cast(geoids.type.value_type)
    if pa.types.is_null(geoids.type):
        return
    # A GEOID that starts with the folder's state is not another state's: only the others
    # (few or none) go through the 11-digit pattern (on a whole national input that pattern
    # was 0.5 s of the flow's time)
    others = pc.filter(geoids, pc.invert(pc.fill_null(pc.starts_with(geoids, state), True)))
    if len(others) == 0:
        return
    keys = _state_keys(others)
    elsewhere = pc.and_(pc.not_equal(keys, state), pc.not_equal(keys, OTHER))
    if pc.any(elsewhere).as_py():
        raise _misfiled(cfg, dataset, state)


def _misfiled(cfg: InputConfig, dataset: ds.Dataset, state: str) -> InputError:
    """The refusal for records of another state in folder ``state=SS``: the files holding
    them, with their first rows (counting from 0 in each file) and GEOIDs. Read again file by
    file, only once such a record was found."""
    files, total = [], 0
    for fragment in dataset.get_fragments(filter=_hive_state(dataset, state)):
        # only the first rows are kept: a whole state's file may be in the wrong folder
        count, rows, shown, offset = 0, [], [], 0
        for batch in fragment.to_batches(columns=[cfg.columns.geoid],
                                         batch_size=_STREAM_BATCH_ROWS):
            keys = _state_keys(batch.column(0))
            hit = pc.and_(pc.not_equal(keys, state), pc.not_equal(keys, OTHER))
            positions = np.flatnonzero(hit.to_numpy(zero_copy_only=False))
            count += positions.size
            rows += (positions[:_EXAMPLES] + offset).tolist()
            shown += batch.column(0).take(positions[:_EXAMPLES]).to_pylist()
            offset += batch.num_rows
        if count:
            total += count
            geoids = ", ".join(list(dict.fromkeys(map(repr, shown)))[:_EXAMPLES])
            files.append(f"{_relative(fragment.path, cfg.path)}, {count} record(s) at "
                         f"rows {', '.join(map(str, rows[:_EXAMPLES]))} of the file (counting "
                         f"from 0), e.g. GEOID {geoids}")
    listed = "; ".join(files[:_EXAMPLES]) + (f"; and {len(files) - _EXAMPLES} more file(s)"
                                             if len(files) > _EXAMPLES else "")
    return InputError(
        f"input {cfg.path}: {total} record(s) in folder state={state} have a GEOID of another "
        f"state (column '{cfg.columns.geoid}'): {listed}. A record belongs to the state its "
        "GEOID names (its first two digits), and a tract filed under two states cannot be "
        "released: move these records to their state's folder.")


def _hive_cells(cfg: InputConfig, dataset: ds.Dataset, state: str, columns: list[str],
                cells: tuple[str | None, ...]) -> tuple[pa.Table, np.ndarray]:
    """The records of ``cells`` in one state of a hive dataset and their positions in the
    state, streamed batch by batch (memory follows the group, not the state)."""
    try:
        return _kept(_hive_batches(dataset, state, columns),
                     lambda b: _in_cells(b.column(cfg.columns.cell), cells),
                     lambda: dataset.schema, columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise _input_error(cfg, err) from None


def _listed_cells(cfg: InputConfig, key: str) -> tuple[str | None, ...]:
    """The cells of split partition ``key``, as :func:`partitions` lists them."""
    for part in partitions(cfg):
        if part.key == key:
            return part.cells
    raise InputError(f"input {cfg.path} has no partition {key} (its partitions are listed "
                     "again: did the input change?)")


def _pipeline_frame(cfg: InputConfig, table: pa.Table, rows: np.ndarray) -> pd.DataFrame:
    c = cfg.columns
    scale = 100.0 if cfg.rank_scale == "percentile" else 1.0
    df = pd.DataFrame({
        "row": rows,
        "geoid": _geoids(table.column(c.geoid)),
        "x": _ranks(cfg, "parent_rank", c.parent_rank, table.column(c.parent_rank), rows) / scale,
        "y": _ranks(cfg, "child_rank", c.child_rank, table.column(c.child_rank), rows) / scale,
        "cell": _cell_labels(table.column(c.cell)) if c.cell else "all",
    })
    if c.person_id:
        df["person_id"] = _person_ids(table.column(c.person_id))
    return df


def _cell_labels(column: pa.ChunkedArray) -> pd.api.extensions.ExtensionArray:
    """Cells as pandas text (as ``astype(str)`` writes them), kept in pyarrow: not a Python
    object per record (0.25 GiB per 4 M records at the peak of a partition's read)."""
    return _decoded(column).to_pandas().astype(str).array


def input_fingerprint(cfg: InputConfig) -> str:
    """sha256 over the input files' names, sizes and contents (streamed)."""
    path = Path(cfg.path)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
