"""The levels check (l): county and state tables, their budget steps, columns, table rules,
formats and polygons (each unit the union of its tracts)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from .accounting import _charged, guarantee_from
from .cell_tiles import cell_archive_name, rows_of
from .base import (
    INTERVAL_COLUMNS, LEVEL_DIGITS, LEVEL_STEMS, MAX_GEOJSON_BYTES, MOE90_COLUMNS, Mismatch,
    REL_TOL, SE_COLUMNS, SPEND_COLUMNS, VALUE_COLUMNS, _is_number, close,
)
from .files import _config, _json_object, readable
from .formats import _compare, _csv_rows, _kinds, _table_rows
from .geometry import (
    _reference_by_geoid, dissolve_problems, format_geometry_problems, parquet_geometries,
)
from .tables import (
    _interval_value_problems, _mechanism_and_reason_problems, _standard_error_problems,
)
from .tiles import TILE_OMITTED, TILE_READ_ERRORS, mvt_features, pmtiles_tile_entries


# A county is the tract GEOID's first 5 digits, a state its first 2; each level publishes
# NoisyStats on its units' pooled records, paid by budget steps of its own that compose
# sequentially with the tract's (a person is in one tract, one county and one state): the
# totals check recomposes every step of the budget, so a level step is in the per-person total
# exactly when it is in budget.steps, which this check requires of every level's steps.

LEVEL_MECHANISM = "NoisyStats"
LEVEL_PUBLIC_COLUMNS = ("geoid", "level", "state", "county", "name", "cell", "n", "status",
                        "geometry")


def level_step_names(level: str) -> tuple[str, str]:
    """(estimate step, interval step) of a level, as the pipeline names them."""
    return f"level {level}: {LEVEL_MECHANISM}", f"level {level}: interval"


def level_column_payer(column: str, level: str) -> str | None:
    estimate, interval = level_step_names(level)
    if column in LEVEL_PUBLIC_COLUMNS and (column != "county" or level == "county"):
        return "public"
    if column in VALUE_COLUMNS:
        return estimate
    if column in INTERVAL_COLUMNS or column in SE_COLUMNS or column in MOE90_COLUMNS:
        return interval
    if column in ("mechanism", "reason") or column in SPEND_COLUMNS:
        return "public (the level's one mechanism, the public n and its DP failure)"
    return None


def _level_file_names(level: str) -> list[str]:
    stem = LEVEL_STEMS[level]
    return [f"{stem}.parquet", f"{stem}.geojson", f"{stem}.csv", f"{stem}.schema.json"]


def _tract_n_by_unit(folder: Path, digits: int) -> dict[tuple[str, str], int]:
    """n per (unit, cell) summed over the tracts of tracts.parquet (public values)."""
    t = pq.read_table(readable(folder / "tracts.parquet"),
                  columns=["geoid", "cell", "n"]).to_pydict()
    out: dict[tuple[str, str], int] = {}
    for geoid, cell, n in zip(t["geoid"], t["cell"], t["n"]):
        key = (str(geoid)[:digits], str(cell))
        out[key] = out.get(key, 0) + int(n)
    return out


def _level_step_problems(level: str, sec: dict, steps: dict, m: dict) -> list[str]:
    """The level's steps are the pipeline's, all in the budget (hence in the totals), each
    drawing NoisyStats noise, with the epsilons the section states."""
    estimate, interval = level_step_names(level)
    with_interval = bool(sec.get("interval_epsilon"))
    want = [estimate] + ([interval] if with_interval else [])
    problems = []
    if list(sec.get("steps") or ()) != want:
        problems.append(f"level {level}: steps {sec.get('steps')!r}, expected {want}")
    for name, key in ((estimate, "estimate_epsilon"), (interval, "interval_epsilon")):
        if name not in want:
            continue
        step = steps.get(name)
        if step is None:
            problems.append(f"level {level}: its step {name!r} is not in the budget (so not "
                            "in the per-person total): its values are paid by nothing")
            continue
        alts = sorted(((step.get("noise") or {}).get("alternatives") or {}))
        if alts != [LEVEL_MECHANISM]:
            problems.append(f"level {level}: step {name!r} draws {alts}, not "
                            f"{LEVEL_MECHANISM}'s noise")
        g, param = guarantee_from(step.get("guarantee")), step.get("epsilon_param")
        if not (_is_number(param) and close(float(param), float(sec.get(key, math.nan)))):
            problems.append(f"level {level}: {key} {sec.get(key)!r} is not its step's "
                            f"epsilon_param {param!r}")
        elif g.kind != "pure" or g.epsilon > float(param) * (1 + REL_TOL):
            problems.append(f"level {level}: step {name!r} spends {g.text()}, over its "
                            f"{key} {param!r}")
    spent = math.fsum(float(sec.get(k) or 0.0) for k in ("estimate_epsilon", "interval_epsilon"))
    if not close(spent, float(sec.get("epsilon", math.nan))):
        problems.append(f"level {level}: epsilon {sec.get('epsilon')!r} is not its steps' "
                        f"{spent:.12g}")
    return problems


def _level_steps_charge(sec: dict, steps: dict, m: dict) -> tuple[float, float]:
    """The (ε, δ) the level's own steps (``sec["steps"]``) charge per unit and cell, as the
    totals check charges a step (a step missing from the budget charges nothing here: the
    step check reports it). Versions 2 and 3 stated the per-person total there (issue 33)."""
    if m.get("manifest_version") in (2, 3):  # their rule: a level row stated the total
        return tuple(float(m["budget"][f"{w}_per_tract_and_cell"]) for w in ("epsilon", "delta"))
    conv = float(m["budget"].get("conversion_delta") or 0.0)
    charged = [_charged(guarantee_from(steps[name]["guarantee"]), conv)
               for name in sec.get("steps") or () if name in steps]
    return math.fsum(e for e, _ in charged), math.fsum(d for _, d in charged)


def _level_table_problems(folder: Path, level: str, sec: dict, steps: dict,
                          m: dict) -> list[str]:
    stem, digits = LEVEL_STEMS[level], LEVEL_DIGITS[level]
    df = pq.read_table(readable(folder / f"{stem}.parquet")).to_pandas()
    problems = []
    for column in df.columns:
        payer = level_column_payer(column, level)
        if payer is None:
            problems.append(f"{stem}.parquet: column {column!r} is paid for by no step")
        elif not payer.startswith("public") and payer not in (sec.get("steps") or ()):
            problems.append(f"{stem}.parquet: column {column!r} needs the step {payer!r}, "
                            f"which level {level} does not have")
    declared = {c.strip() for key in (sec.get("published_columns") or {})
                for c in str(key).split(",") if c.strip()}
    if set(df.columns) - declared:
        problems.append(f"{stem}.parquet: columns not in levels.{level}.published_columns: "
                        f"{sorted(set(df.columns) - declared)}")
    missing = sorted({"geoid", "level", "cell", "n", "mechanism", "status", "reason",
                      *SPEND_COLUMNS, *VALUE_COLUMNS} - set(df.columns))
    if missing:
        return problems + [f"{stem}.parquet: columns missing: {missing}"]
    geoid = df["geoid"].astype(str)
    if not geoid.str.fullmatch(f"[0-9]{{{digits}}}").all():
        problems.append(f"{stem}.parquet: GEOIDs not of {digits} digits")
    if not (df["level"].astype(str) == level).all():
        problems.append(f"{stem}.parquet: level is not {level!r} in every row")
    status = df["status"].astype(str)
    released, suppressed = status == "released", status == "suppressed"
    values = df[list(VALUE_COLUMNS)]
    if values[released].isna().any().any() or values[~released].notna().any().any():
        problems.append(f"{stem}.parquet: p25/p75 values are not exactly where released")
    for c in ("p25", "p75"):
        r = df.loc[released]
        if not np.allclose(r[c], r[f"{c}_raw"].clip(0.0, 1.0), rtol=0, atol=0):
            problems.append(f"{stem}.parquet: {c} is not {c}_raw clipped to [0, 1]")
    small = df["n"].astype(int) < int(m["min_n"])
    if (small != suppressed).any():
        problems.append(f"{stem}.parquet: suppression is not 'n < min_n = {m['min_n']}' in "
                        f"{int((small != suppressed).sum())} row(s)")
    mech = df["mechanism"].astype(str)
    if ((mech != LEVEL_MECHANISM) & ~suppressed).any() or (mech[suppressed] != "none").any():
        problems.append(f"{stem}.parquet: mechanism is not {LEVEL_MECHANISM} where a unit ran "
                        "and none where suppressed")
    # A unit's row states what its level's own steps charged its records, not the
    # per-person total (budget.*_per_tract_and_cell, which the tract rows state).
    for col, figure in zip(SPEND_COLUMNS, _level_steps_charge(sec, steps, m)):
        spent = df[col].astype(float)
        if (spent[suppressed] != 0).any() or (~np.isclose(spent[~suppressed], figure,
                                                          rtol=REL_TOL, atol=0)).any():
            problems.append(f"{stem}.parquet: {col} is not 0 where suppressed and "
                            f"{figure:.12g} (the charge of levels.{level}.steps) elsewhere")
    # The reasons as for tracts (no selection rule at a level: its mechanism is fixed).
    problems += [f"{stem}.parquet: {p}"
                 for p in _mechanism_and_reason_problems(df, {**m, "selection": {}})]
    problems += [f"{stem}.parquet: {p}" for p in _interval_value_problems(df, released)]
    problems += [f"{stem}.parquet: {p}" for p in _standard_error_problems(df, m)]
    has_ci = [c for c in INTERVAL_COLUMNS if c in df.columns]
    if bool(has_ci) != bool(sec.get("interval_epsilon")):
        problems.append(f"{stem}.parquet: interval columns {has_ci} but interval_epsilon "
                        f"{sec.get('interval_epsilon')!r}")
    n_by_unit = _tract_n_by_unit(folder, digits)
    got = {(g, str(c)): int(n) for g, c, n in zip(geoid, df["cell"], df["n"])}
    if got != {k: got.get(k, 0) for k in set(got) | set(n_by_unit)} or any(
            n_by_unit.get(k, 0) != v for k, v in got.items()):
        problems.append(f"{stem}.parquet: n per unit and cell is not the sum of its tracts' "
                        "n in tracts.parquet, or a unit is missing")
    counts = sec.get("counts") or {}
    by_status = {str(k): int(v) for k, v in status.value_counts().items()}
    if counts.get("by_status") != by_status or counts.get("rows") != len(df):
        problems.append(f"{stem}.parquet: counts {by_status} ({len(df)} rows) != "
                        f"levels.{level}.counts")
    return problems


def _level_format_problems(folder: Path, level: str, files: set = frozenset(),
                           m: dict | None = None) -> list[str]:
    stem = LEVEL_STEMS[level]
    columns, table = _table_rows(folder, stem)
    kinds = _kinds(folder, stem)
    header, rows = _csv_rows(folder, columns, kinds, stem)
    if header != columns:
        return [f"{stem}.csv has columns {header}, the table {columns}"]
    problems = _compare(f"{stem}.csv", rows, table, columns, exact_columns=True,
                        missing_is_empty=True, reference=f"{stem}.parquet")
    features = _json_object(folder / f"{stem}.geojson", f"{stem}.geojson", Mismatch,
                            MAX_GEOJSON_BYTES).get("features")
    problems += _compare(f"{stem}.geojson", [f.get("properties") or {} for f in features or ()],
                         table, columns, exact_columns=True, reference=f"{stem}.parquet")
    reference, unequal = _reference_by_geoid(f"{stem}.parquet",
                                             *parquet_geometries(folder / f"{stem}.parquet"))
    problems += unequal + dissolve_problems(folder, level, reference) + format_geometry_problems(
        stem, reference, f"{stem}.parquet", features=features or [])
    if f"{stem}.pmtiles" in files:
        problems += _level_tiles_problems(folder, stem, table, columns, reference)
    else:  # several cells: an archive per cell, each holding that cell's rows
        archives, found = _level_cell_archives(level, stem, table, files, m or {})
        problems += found
        for name, cell in archives.items():
            problems += _level_tiles_problems(folder, stem, rows_of(table, cell), columns,
                                              reference, name)
    return problems


def _level_cell_archives(level: str, stem: str, table: dict, files: set,
                         m: dict) -> tuple[dict[str, str], list[str]]:
    """A level's archives of each cell ({name: cell}, the names derived from the table's cells,
    not the manifest's) and the problems: a cell without its archive, one listed of no cell,
    a manifest ``level_cell_tiles`` naming others. None when no archive of the level is
    listed (a release published without tiles, or before issue 35)."""
    expected = {cell_archive_name(c, stem): c for c in sorted({str(k[1]) for k in table})}
    listed = {n for n in files if n.startswith(f"{stem}-") and n.endswith(".pmtiles")}
    if not listed:
        return {}, []
    problems = [f"cell {cell!r} has no {level} archive {name} in the manifest's files"
                for name, cell in expected.items() if name not in listed]
    problems += [f"{name} is listed but is the {level} archive of no cell of {stem}.parquet"
                 for name in sorted(listed - set(expected))]
    said = (m.get("level_cell_tiles") or {}).get(level)
    if said != {c: n for n, c in expected.items()}:
        problems.append(f"the manifest's level_cell_tiles.{level} {said} is not each cell's "
                        f"archive { {c: n for n, c in expected.items()} }")
    return {n: c for n, c in expected.items() if n in listed}, problems


def _level_tiles_problems(folder: Path, stem: str, table: dict, columns: list[str],
                          reference: dict, name: str | None = None) -> list[str]:
    """The level's vector tiles (layer ``stem``; ``name``: the archive, ``<stem>.pmtiles``
    unless it is a cell's) at their lowest zoom hold its table's values (a web map's county
    or state colours are the published ones) and polygons."""
    name = name or f"{stem}.pmtiles"
    try:
        header, entries = pmtiles_tile_entries(folder / name)
        rows = [f for _, _, t in entries for f in mvt_features(t, stem)]
        shapes = format_geometry_problems(stem, reference, f"{stem}.parquet",
                                          tiles=(header, entries), layer=stem)
    except TILE_READ_ERRORS as err:
        return [f"{name} cannot be read: {type(err).__name__} {err}"]
    if not rows:
        return [f"{name} has no {stem} at its lowest zoom"]
    return _compare(name, rows, table, columns, exact_columns=False, complete=False,
                    reference=f"{stem}.parquet", omitted=TILE_OMITTED) + shapes


def check_levels(folder: Path, m: dict) -> str:
    """County and state tables: every level's steps are in the budget (so in the per-person
    total the totals check recomposes), its files listed and hashed, every column public or
    paid by its own step, values, suppression, spend, intervals and standard errors as for
    tracts, n the sum of its tracts' n, and its CSV, GeoJSON and vector tiles (when
    published) hold its table's values. No level file may be published without a level."""
    levels = m.get("levels") or {}
    if not isinstance(levels, dict):
        raise Mismatch(f"levels {levels!r} is not a mapping")
    steps = {s.get("step"): s for s in m["budget"]["steps"]}
    files = set(m.get("files") or {})
    problems = []
    unknown = sorted(set(levels) - set(LEVEL_DIGITS))
    if unknown:
        problems.append(f"unknown levels {unknown}; known: {sorted(LEVEL_DIGITS)}")
    for level in LEVEL_DIGITS:
        names = _level_file_names(level)
        if level not in levels:
            stem = LEVEL_STEMS[level]
            stray = sorted(files & {*names, f"{stem}.pmtiles"}) + sorted(
                n for n in files if n.startswith(f"{stem}-") and n.endswith(".pmtiles"))
            if stray:
                problems.append(f"{stray} published without a {level} level (paid by no step)")
            continue
        sec = levels[level]
        problems += _level_step_problems(level, sec, steps, m)
        absent = [f for f in names if f not in files]
        if absent:
            problems.append(f"level {level}: files {absent} are not listed in files")
            continue
        try:
            problems += _level_table_problems(folder, level, sec, steps, m)
            problems += _level_format_problems(folder, level, files, m)
        except Mismatch as err:
            problems.append(str(err))
        except Exception as err:  # noqa: BLE001 - any reader error is a finding
            problems.append(f"level {level}: its files cannot be read: {err}")
    cfg = _config(folder)
    cfg_levels = cfg.get("levels") or ["tract"]
    if sorted(cfg_levels) != sorted(["tract", *levels]):
        problems.append(f"config.json levels {cfg_levels} != the manifest's tract + "
                        f"{sorted(levels)}")
    shares = cfg.get("level_shares") or {}
    available = float(m["budget"]["epsilon_available"])
    for level, sec in levels.items():
        if level in shares and not close(float(shares[level]) * available,
                                         float(sec.get("epsilon", math.nan))):
            problems.append(f"level {level}: epsilon {sec.get('epsilon')!r} is not config's "
                            f"level_shares.{level} {shares[level]!r} x {available!r}")
    if problems:
        raise Mismatch("; ".join(problems))
    if not levels:
        return "tracts only: no county or state level, no level file"
    return (f"{', '.join(sorted(levels))}: steps in the per-person total, every column paid "
            "or public, values, suppression, spend, intervals and n agree; CSV, GeoJSON "
            "(and tiles, where published) hold the tables' values and polygons, each unit's "
            "polygon the union of its tracts'")
