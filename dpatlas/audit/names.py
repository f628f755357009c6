"""The audit's rule for the public ``name`` column (issue 33 item 4): every published name is
recomputed from the row's GEOID and public reference geography, never taken on trust.

Names are Census-style: "Census Tract 12.01; Wake County; North Carolina" (tract),
"Wake County, North Carolina" (county), "North Carolina" (state); a county whose name the
reference does not hold has none, and its tracts' names leave it out. The reference is
public and outside this project: libpysal's bundled Census outlines (``us_income``: the 48
contiguous states' FIPS codes and names; ``sids2``: North Carolina's counties), plus the four
state-equivalents it does not outline. Like the rest of the audit, this module imports
nothing of ours (only the audit's own base and files).
"""

from __future__ import annotations

import functools
import importlib.util
import struct
from pathlib import Path

import pyarrow.parquet as pq

from .base import Mismatch
from .files import readable as _readable

# The public columns before names were published (releases of before issue 33): the manifest's
# public.columns may be this list or the audit's PUBLIC_COLUMNS.
PUBLIC_COLUMNS_BEFORE_NAMES = ("geoid", "state", "county", "cell", "n", "status", "geometry")
NAME_COLUMN = "name"
# State-equivalents libpysal's us48 does not outline (Census names).
_OTHER_STATES = {"02": "Alaska", "11": "District of Columbia", "15": "Hawaii",
                 "72": "Puerto Rico"}
_TABLES = {"tract": "tracts.parquet", "county": "counties.parquet", "state": "states.parquet"}
_MAX_SHOWN = 3


class NamesMismatch(Mismatch):
    """A published name is not the recomputed one, or the reference cannot be read."""


def _dbf_records(path: Path, columns: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The values of ``columns`` in every record of a dBASE table (a shapefile's .dbf), read
    with the standard library: the audit needs no GIS library for names."""
    data = path.read_bytes()
    count, header, size = struct.unpack("<IHH", data[4:12])
    fields, at = {}, 32
    offset = 1  # each record starts with its deletion flag
    while data[at] != 0x0D:
        name = data[at:at + 11].split(b"\0")[0].decode("ascii")
        fields[name] = (offset, data[at + 16])
        offset += data[at + 16]
        at += 32
    out = []
    for k in range(count):
        record = data[header + k * size: header + (k + 1) * size]
        if record[:1] == b"*":
            continue  # deleted
        out.append(tuple(record[o:o + n].decode("latin-1").strip()
                         for o, n in (fields[c] for c in columns)))
    return out


def _example(example: str, file_name: str, columns: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Columns of the table of one of libpysal's bundled examples (found without importing
    libpysal)."""
    spec = importlib.util.find_spec("libpysal")
    if spec is None or not spec.submodule_search_locations:
        raise NamesMismatch("libpysal (its bundled Census outlines are the reference) is "
                            "not installed")
    folder = Path(spec.submodule_search_locations[0]) / "examples" / example
    try:
        return _dbf_records(folder / file_name, columns)
    except (OSError, KeyError, IndexError, struct.error, UnicodeDecodeError) as err:
        raise NamesMismatch(f"libpysal's {example}/{file_name} cannot be read: {err}") from None


@functools.lru_cache(maxsize=1)
def reference_names() -> tuple[dict[str, str], dict[str, str]]:
    """(state name by 2-digit FIPS, county base name by 5-digit FIPS) from the reference."""
    states = _example("us_income", "us48.dbf", ("STATE_FIPS", "STATE_NAME"))
    counties = _example("sids2", "sids2.dbf", ("FIPS", "NAME"))
    return ({**{fips.zfill(2): name for fips, name in states}, **_OTHER_STATES},
            {fips.zfill(5): name for fips, name in counties})


def expected_name(geoid: str, level: str) -> str | None:
    """The name a unit of ``level`` with this GEOID must carry (None: no name)."""
    states, counties = reference_names()
    state = states.get(geoid[:2])
    if state is None:
        return None
    if level == "state":
        return state
    county = counties.get(geoid[:5])
    if level == "county":
        return f"{county} County, {state}" if county else None
    code = geoid[5:11]
    number = code[:4].lstrip("0") or "0"
    if code[4:] != "00":
        number += "." + code[4:]
    return "; ".join([f"Census Tract {number}"] + ([f"{county} County"] if county else [])
                     + [state])


def check(folder: Path, m: dict, readable=lambda path: path) -> str:
    """Every published ``name`` (tracts, counties, states) is its GEOID's Census-style name;
    NamesMismatch if one is not. ``readable``: the audit's guard on the files it reads."""
    problems, checked = name_problems(folder, m.get("files") or {}, readable)
    if problems:
        raise NamesMismatch("; ".join(problems))
    if not checked:
        return "no names published (a release of before issue 33)"
    return (f"{checked} names, each the Census-style name recomputed from its GEOID and public "
            "geography (libpysal's Census outlines)")


def name_problems(folder: Path, files, readable=lambda path: path) -> tuple[list[str], int]:
    """Published names that differ from the recomputed ones, per table that has a ``name``
    column; and how many names were checked."""
    problems, checked = [], 0
    for level, file_name in _TABLES.items():
        if file_name not in files:
            continue
        path = readable(folder / file_name)
        if NAME_COLUMN not in pq.read_schema(path).names:
            continue
        table = pq.read_table(path, columns=["geoid", NAME_COLUMN]).to_pandas()
        wrong = []
        for geoid, name in zip(table["geoid"].astype(str), table[NAME_COLUMN]):
            want = expected_name(geoid, level)
            got = None if name is None or name != name or name == "" else str(name)
            checked += 1
            if got != want:
                wrong.append(f"{geoid}: {got!r}, expected {want!r}")
        if wrong:
            problems.append(f"{file_name}: {len(wrong)} name(s) are not the Census-style "
                            f"name of their GEOID, e.g. {'; '.join(wrong[:_MAX_SHOWN])}")
    return problems, checked


def check_names(folder: Path, m: dict) -> str:
    """(n) Public names recomputed from the GEOIDs and public geography."""
    return check(folder, m, _readable)
