"""Tract files partitioned by state (issue 35, item 2): a release spanning several states
publishes ``tracts/state=XX/part-<k>.parquet`` (one or more), ``tracts-csv/state=XX/tracts.csv``
and ``tracts-geojson/state=XX/tracts.geojson`` per state instead of the three single files.

The files check hashes every part like any file (:func:`is_part`, :func:`unlisted_parts`);
:func:`check_parts` checks that each state has its three parts, that every row of a part is of
its state, and that the parts' GeoParquet metadata agree (version, primary column, encoding,
CRS). Every other check then reads the parts as the single files they replace: a private
folder (:func:`joined_view`) holds the other files (hard links) and the parts joined, and a
manifest listing them so; the parts' hashes were checked against the real manifest first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from .base import MANIFEST, Mismatch
from .files import _sha256, readable
from .part_names import KINDS, is_part, is_values_document, listed_parts, piece_numbers

def check_parts(folder: Path, m: dict) -> str:
    parts = listed_parts(m)
    if not parts:
        return "no state parts: the tract files are single files"
    problems, geo_seen = [], None
    if len(parts) < 2:
        problems.append(f"the tract files are parted for one state only ({sorted(parts)})")
    for name in ("tracts.parquet", "tracts.csv", "tracts.geojson"):
        if name in (m.get("files") or {}):
            problems.append(f"{name} is listed beside the state parts")
    rows = 0
    for state, files in sorted(parts.items()):
        missing = sorted({single for _, _, single in KINDS} - set(files))
        if missing:
            problems.append(f"state {state} has no part of {', '.join(missing)}")
        pieces = piece_numbers(files.get("tracts.parquet", []))
        if pieces != list(range(len(pieces))):
            problems.append(f"state {state}'s GeoParquet parts are numbered {pieces}, not "
                            "0, 1, ... without a gap")
        for part in files.get("tracts.parquet", []):
            try:
                table = pq.read_table(readable(folder / part), columns=["geoid", "state"])
                geo = json.loads((table.schema.metadata or {}).get(b"geo", b"null"))
            except (OSError, ValueError, pa.ArrowException) as err:
                problems.append(f"{part} cannot be read: {err}")
                continue
            rows += table.num_rows
            others = {str(g)[:2] for g in table.column("geoid").unique().to_pylist()} | {
                str(s) for s in table.column("state").unique().to_pylist()}
            if others - {state}:
                problems.append(f"{part} holds rows of states "
                                f"{sorted(others - {state})}")
            if not isinstance(geo, dict):
                problems.append(f"{part} has no GeoParquet metadata")
                continue
            agreed = _collection_keys(geo)
            if geo_seen is None:
                geo_seen = agreed
            elif agreed != geo_seen:
                problems.append(f"{part}: its GeoParquet metadata (version, "
                                "columns, encoding, CRS) differ from the other parts'")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{len(parts)} states' parts (parquet, csv, geojson), {rows:,} rows, each of its "
            "state, GeoParquet metadata alike")


def _collection_keys(geo: dict) -> dict:
    """What every part must share: all but each column's ``bbox`` (a part's own extent)."""
    columns = {name: {k: v for k, v in col.items() if k != "bbox"}
               for name, col in (geo.get("columns") or {}).items()}
    return {"version": geo.get("version"), "primary_column": geo.get("primary_column"),
            "columns": columns}


@contextlib.contextmanager
def joined_view(folder: Path, m: dict):
    """(folder, manifest) the content checks read: the release itself when it has no parts;
    else a private folder with the other listed files (hard links, copies across file
    systems) and each kind of part joined into its single file, and the manifest listing
    those (their hashes are the joined files'; the parts' were checked by the files check)."""
    parts = listed_parts(m)
    if not parts:
        yield folder, m
        return
    view = Path(tempfile.mkdtemp(prefix="dpatlas-audit-parts-"))
    try:
        files = {name: info for name, info in m["files"].items() if not is_part(name)}
        for name in files:
            if (folder / name).is_file() and ("/" not in name or is_values_document(name)):
                (view / name).parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(folder / name, view / name)
                except OSError:
                    shutil.copyfile(folder / name, view / name)
        by_kind = {single: [readable(folder / name) for s in sorted(parts)
                            for name in parts[s].get(single, [])] for _, _, single in KINDS}
        _join_parquet(by_kind["tracts.parquet"], view / "tracts.parquet")
        _join_csv(by_kind["tracts.csv"], view / "tracts.csv")
        _join_geojson(by_kind["tracts.geojson"], view / "tracts.geojson")
        for _, _, name in KINDS:
            if (view / name).exists():
                files[name] = {"sha256": _sha256(view / name),
                               "bytes": (view / name).stat().st_size}
        (view / MANIFEST).write_text(json.dumps({**m, "files": files}))
        yield view, {**m, "files": files}
    finally:
        shutil.rmtree(view, ignore_errors=True)


def _join_parquet(paths: list[Path], out: Path) -> None:
    if not paths:
        return
    tables = [pq.read_table(p) for p in paths]
    joined = pa.concat_tables(tables, promote_options="permissive")
    geo = json.loads(tables[0].schema.metadata[b"geo"])
    for name, col in geo.get("columns", {}).items():
        boxes = [json.loads(t.schema.metadata[b"geo"])["columns"][name].get("bbox")
                 for t in tables]
        if all(boxes):
            col["bbox"] = [min(b[0] for b in boxes), min(b[1] for b in boxes),
                           max(b[2] for b in boxes), max(b[3] for b in boxes)]
    metadata = {**tables[0].schema.metadata, b"geo": json.dumps(geo).encode()}
    pq.write_table(joined.replace_schema_metadata(metadata), out)


def _join_csv(paths: list[Path], out: Path) -> None:
    with open(out, "wb") as joined:
        for i, path in enumerate(paths):
            with open(path, "rb") as fh:
                header = fh.readline()
                if i == 0:
                    joined.write(header)
                shutil.copyfileobj(fh, joined)


def _join_geojson(paths: list[Path], out: Path) -> None:
    if not paths:
        return
    collections = [json.loads(p.read_bytes()) for p in paths]
    joined = {**collections[0], "features": [f for c in collections for f in c["features"]]}
    boxes = [c.get("bbox") for c in collections]
    if all(boxes):
        joined["bbox"] = [min(b[0] for b in boxes), min(b[1] for b in boxes),
                          max(b[2] for b in boxes), max(b[3] for b in boxes)]
    out.write_text(json.dumps(joined))
