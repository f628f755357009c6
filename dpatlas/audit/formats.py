"""The formats check (f): tracts.csv, tracts.geojson and tracts.pmtiles hold tracts.parquet's
values and polygons."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from .base import FLOAT_ATOL, MAX_GEOJSON_BYTES, Mismatch
from .cell_tiles import (VALUES_FOLDER, VALUES_KEY, rows_of, tract_archives, values_apart,
                         values_document_name, values_folder_name)
from .files import _json_object, readable
from .geometry import _reference_by_geoid, format_geometry_problems, parquet_geometries
from .tiles import TILE_OMITTED, TILE_READ_ERRORS, mvt_features, pmtiles_tile_entries


def _same_value(a, b, *, missing_is_empty: bool = False) -> bool:
    def blank(v):
        return v is None or (isinstance(v, float) and math.isnan(v)) or (
            missing_is_empty and v == "")
    if blank(a) or blank(b):
        return blank(a) and blank(b)
    if isinstance(a, (bool, np.bool_)) or isinstance(b, (bool, np.bool_)):
        return bool(a) == bool(b) and type(a) is type(b)
    if isinstance(a, (int, float, np.integer, np.floating)) and isinstance(
            b, (int, float, np.integer, np.floating)):
        return math.isclose(float(a), float(b), rel_tol=0, abs_tol=FLOAT_ATOL)
    return str(a) == str(b) and type(a) is type(b)


def _table_rows(folder: Path, stem: str = "tracts"
                ) -> tuple[list[str], dict[tuple[str, str], dict]]:
    table = pq.read_table(readable(folder / f"{stem}.parquet"))
    columns = [c for c in table.column_names if c != "geometry"]
    rows = table.select(columns).to_pylist()
    return columns, {(r["geoid"], r["cell"]): r for r in rows}


def _csv_rows(folder: Path, columns: list[str], kinds: dict,
              stem: str = "tracts") -> tuple[list[str], list[dict]]:
    import csv

    with open(readable(folder / f"{stem}.csv"), newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        rows = []
        for cells in reader:
            row = {}
            for name, text in zip(header, cells):
                kind = kinds.get(name)
                if text == "" and kind != "string":
                    row[name] = None
                elif kind == "integer":
                    row[name] = int(text)
                elif kind == "number":
                    row[name] = float(text)
                else:
                    row[name] = text
            rows.append(row)
    return header, rows


def _kinds(folder: Path, stem: str = "tracts") -> dict[str, str]:
    import pyarrow as pa

    kinds = {}
    for f in pq.read_schema(readable(folder / f"{stem}.parquet")):
        kinds[f.name] = ("integer" if pa.types.is_integer(f.type) else "number"
                         if pa.types.is_floating(f.type) else "string")
    return kinds


def _compare(fmt: str, rows: list[dict], table: dict, columns: list[str], *,
             exact_columns: bool, missing_is_empty: bool = False,
             complete: bool = True, reference: str = "tracts.parquet",
             omitted: frozenset = frozenset()) -> list[str]:
    """``rows`` of format ``fmt`` against the table's; ``omitted``: columns a row may leave
    out altogether (the tiles', :data:`~dpatlas.audit.tiles.TILE_OMITTED`)."""
    problems, seen, differing = [], set(), {}
    for row in rows:
        key = (row.get("geoid"), row.get("cell"))
        ref = table.get(key)
        if ref is None:
            problems.append(f"{fmt} has a row {key} the table has not")
            continue
        seen.add(key)
        extra = sorted(set(row) - set(columns))
        if extra:
            problems.append(f"{fmt} has columns the table has not: {extra}")
            break
        for c in columns:
            if c not in row and c in omitted:
                continue
            if c not in row and not exact_columns:
                got = None  # tippecanoe omits attributes whose value is null
            elif c not in row:
                problems.append(f"{fmt} lacks column {c!r}")
                return problems
            else:
                got = row[c]
            if not _same_value(ref[c], got, missing_is_empty=missing_is_empty):
                # a dict keyed by row: vector tiles repeat a feature in every tile it crosses
                differing.setdefault(c, {})[key] = key[0]
    for c, geoids in differing.items():
        problems.append(f"{fmt}: {c} differs from {reference} in {len(geoids)} row(s), "
                        f"e.g. {next(iter(geoids.values()))}")
    if complete and len(seen) != len(table):
        problems.append(f"{fmt} has {len(seen)} of the table's {len(table)} rows")
    return problems


def _polygon_archive_problems(name: str, rows: list[dict], table: dict) -> list[str]:
    """The archive of polygons: each feature carries a GEOID of the table and nothing else."""
    problems, geoids = [], {k[0] for k in table}
    extra = sorted({k for r in rows for k in r} - {"geoid"})
    if extra:
        problems.append(f"{name} carries properties {extra}: its features are the tracts' "
                        "polygons with the GEOID alone (the values are the documents')")
    unknown = sorted({r.get("geoid") for r in rows} - geoids, key=str)
    if unknown:
        problems.append(f"{name} has {len(unknown)} GEOID(s) the table has not, e.g. "
                        f"{unknown[0]!r}")
    return problems


def _state_of(row: dict) -> str:
    return str(row["state"]) if row.get("state") is not None else str(row["geoid"])[:2]


def values_document_problems(folder: Path, m: dict, table: dict,
                             columns: list[str]) -> list[str]:
    """Each (cell, state) of the table has its values document, listed in the manifest's
    files, holding exactly its rows' values (every column but the omitted ones, the cell and
    the state, which its head says); no other document is listed; the manifest's
    ``tract_values`` names each cell's folder."""
    wanted: dict[str, dict] = {}
    for key, row in table.items():
        name = values_document_name(str(key[1]), _state_of(row))
        wanted.setdefault(name, {})[key] = row
    listed = set(m.get("files") or {})
    problems = [f"{name} (the values of {len(rows)} row(s)) is not in the manifest's files"
                for name, rows in sorted(wanted.items()) if name not in listed]
    problems += [f"{name} is listed but holds the values of no cell and state of the table"
                 for name in sorted(listed) if str(name).startswith(VALUES_FOLDER + "/")
                 and name not in wanted]
    cells = sorted({str(k[1]) for k in table})
    expected_columns = ["geoid", *(c for c in columns if c not in TILE_OMITTED
                                   and c not in ("geoid", "cell", "state"))]
    said = m.get(VALUES_KEY)
    entry = {"columns": expected_columns,
             "folders": {c: values_folder_name(c) for c in cells}}
    if said != entry:
        problems.append(f"the manifest's {VALUES_KEY} {said!r} is not the documents' columns "
                        f"and each cell's folder {entry}")
    for name, rows_wanted in sorted(wanted.items()):
        if name not in listed:
            continue
        try:
            doc = _json_object(folder / name, name, Mismatch, MAX_GEOJSON_BYTES)
            cell, state = next(iter(rows_wanted))[1], _state_of(next(iter(rows_wanted.values())))
            if doc.get("cell") != str(cell) or doc.get("state") != state:
                problems.append(f"{name} says cell {doc.get('cell')!r}, state "
                                f"{doc.get('state')!r}: it is cell {cell!r}, state {state!r}'s")
                continue
            if doc.get("columns") != expected_columns:
                problems.append(f"{name} has columns {doc.get('columns')}, expected "
                                f"{expected_columns}")
                continue
            rows = [{**dict(zip(expected_columns, r)), "cell": cell,
                     **({"state": state} if "state" in columns else {})}
                    for r in doc.get("rows") or ()]
            if any(len(r) != len(expected_columns) for r in doc.get("rows") or ()):
                problems.append(f"{name} has a row of another length than its columns")
                continue
            problems += _compare(name, rows, rows_wanted, columns, exact_columns=True,
                                 omitted=TILE_OMITTED)
        except (Mismatch, AttributeError, TypeError, ValueError) as err:
            problems.append(f"{name} cannot be read: {err}")
    return problems


def check_formats(folder: Path, m: dict) -> str:
    """Every format holds the table's values: CSV and GeoJSON row for row, the PMTiles
    archive's features (at its lowest zoom) attribute for attribute; and the table's polygons:
    the GeoJSON's within its coordinate precision, the tiles' within their grid's tolerance
    (:func:`format_geometry_problems`)."""
    try:
        columns, table = _table_rows(folder)
        kinds = _kinds(folder)
        reference, problems = _reference_by_geoid(
            "tracts.parquet", *parquet_geometries(folder / "tracts.parquet"))
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    try:
        header, rows = _csv_rows(folder, columns, kinds)
        if header != columns:
            problems.append(f"tracts.csv has columns {header}, the table {columns}")
        else:
            problems += _compare("tracts.csv", rows, table, columns, exact_columns=True,
                                 missing_is_empty=True)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        problems.append(f"tracts.csv cannot be read: {err}")
    try:
        features = _json_object(folder / "tracts.geojson", "tracts.geojson", Mismatch,
                                MAX_GEOJSON_BYTES).get("features")
        rows = [f.get("properties") or {} for f in features or ()]
        problems += _compare("tracts.geojson", rows, table, columns, exact_columns=True)
        problems += format_geometry_problems("tracts", reference, "tracts.parquet",
                                             features=features or [])
    except (Mismatch, AttributeError, TypeError) as err:
        problems.append(f"tracts.geojson cannot be read: {err}")
    archives, archive_problems = tract_archives(folder, m, {str(k[1]) for k in table})
    problems += archive_problems
    n_tiles, n_shown = 0, 0
    if values_apart(folder, m):
        problems += values_document_problems(folder, m, table, columns)
    for archive in archives:  # each archive against the rows of its cell (all: tracts.pmtiles)
        name, rows_wanted = archive.name, rows_of(table, archive.cell)
        try:
            header, entries = pmtiles_tile_entries(folder / name)
            n_tiles += len(entries)
            rows = [f for _, _, t in entries for f in mvt_features(t)]
            if archive.polygons_only:  # the GEOID alone: the values are the documents'
                problems += _polygon_archive_problems(name, rows, table)
                problems += format_geometry_problems(archive.stem, reference,
                                                     "tracts.parquet", tiles=(header, entries),
                                                     layer="tracts")
                n_shown += len({r.get("geoid") for r in rows})
                if not rows:
                    problems.append(f"{name} has no features at its lowest zoom")
                continue
            problems += _compare(name, rows, rows_wanted, columns, exact_columns=False,
                                 complete=False, omitted=TILE_OMITTED)
            problems += format_geometry_problems(archive.stem, reference, "tracts.parquet",
                                                 tiles=(header, entries), layer="tracts")
            shown = {(r.get("geoid"), r.get("cell")) for r in rows}
            n_shown += len(shown & set(rows_wanted))
            if not shown:
                problems.append(f"{name} has no features at its lowest zoom")
        except TILE_READ_ERRORS as err:
            problems.append(f"{name} cannot be read: {type(err).__name__} {err}")
    tiles_named = ", ".join(a.name for a in archives) or "tracts.pmtiles"
    if problems:
        raise Mismatch("; ".join(problems))
    if any(a.polygons_only for a in archives):
        return (f"tracts.csv, tracts.geojson and the tract values documents hold the values of "
                f"tracts.parquet ({len(table):,} rows, {len(columns)} columns); "
                f"{tiles_named} holds the polygons of {n_shown:,} of its tracts at its lowest "
                f"zoom ({n_tiles} tile(s)), each with its GEOID alone; the GeoJSON's and the "
                "tiles' polygons are the table's (within tolerance)")
    # Tiles may leave out a polygon too small to draw at the lowest zoom (tippecanoe's tiny
    # polygon reduction), so the rows shown are counted, not required.
    return (f"tracts.csv and tracts.geojson hold the values of tracts.parquet ({len(table):,} "
            f"rows, {len(columns)} columns), and so do the {n_shown:,} rows {tiles_named} "
            f"show at its lowest zoom ({n_tiles} tile(s)); the GeoJSON's and the tiles' "
            "polygons are the table's (within tolerance)")
