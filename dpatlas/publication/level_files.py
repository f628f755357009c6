"""County and state files of a release (issue 20, item 1): ``counties.*`` and ``states.*``
beside ``tracts.*``, with the tract table's columns for a unit of the level (GEOID of 5 or 2
digits, a ``level`` column), in the same formats: GeoParquet, RFC 7946 GeoJSON, and CSV with
its Frictionless Table Schema. Their geometry is the tract boundaries dissolved by unit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import geopandas as gpd
import numpy as np
import pandas as pd

from mechanisms.estimand import ESTIMAND_ID, TOTAL_ERROR

from dpatlas.core.columns import INTERVAL_COLUMNS, MOE_COLUMNS, SE_COLUMNS, UNCERTAINTY_COLUMNS
from dpatlas.publication import tiles
from dpatlas.publication.geojson import write_geojson_rfc7946
from dpatlas.publication.names import name_field, names_of
from dpatlas.publication.tract_files import (PUBLISHED_DECIMALS, _field, add_standard_errors,
                                             round_released_values)
# Digits of the tract GEOID that name a unit of each level above the tract.
GEOID_DIGITS = {"county": 5, "state": 2}
FILE_STEMS = {"county": "counties", "state": "states"}
UNIT_TEXT = {"county": "County: state and county FIPS code (the tract GEOIDs' first 5 "
                       "characters)",
             "state": "State FIPS code (the tract GEOIDs' first 2 characters)"}


def unit_of(geoids, level: str) -> np.ndarray:
    """The unit of each tract GEOID at ``level`` (its first 5 or 2 digits)."""
    return np.asarray(pd.Series(geoids, dtype=str).str[:GEOID_DIGITS[level]])


def level_files(level: str) -> list[str]:
    """The files of ``level``: GeoParquet, GeoJSON, CSV and the CSV's Table Schema."""
    stem = FILE_STEMS[level]
    return [f"{stem}.parquet", f"{stem}.geojson", f"{stem}.csv", f"{stem}.schema.json"]


def level_columns(level: str, extra: list[str]) -> list[str]:
    where = ["state", "county", "name"] if level == "county" else ["state", "name"]
    return (["geoid", "level", *where, "cell", "n", "mechanism", "status", "reason", "p25",
             "p75", "p25_raw", "p75_raw", "epsilon_spent", "delta_spent"] + extra)


def dissolved_units(boundaries: gpd.GeoDataFrame, level: str) -> gpd.GeoSeries:
    """The geometry of every unit of ``level``: its tracts' boundaries dissolved, by unit."""
    units = boundaries[["geoid", "geometry"]].assign(unit=unit_of(boundaries["geoid"], level))
    merged = units.drop(columns="geoid").dissolve(by="unit", method="coverage")
    bad = ~merged.geometry.is_valid
    if bad.any():  # tracts that are not a clean coverage: the general union
        merged.loc[bad, "geometry"] = (units[units["unit"].isin(merged.index[bad])]
                                       .drop(columns="geoid").dissolve(by="unit")
                                       .geometry)
    return merged.geometry


def assemble_level(results: pd.DataFrame, boundaries: gpd.GeoDataFrame, level: str,
                   cells: list[str]) -> gpd.GeoDataFrame:
    """Every unit of ``level`` in the boundaries, for every cell, with its status (a unit
    without records is suppressed, nothing spent), rounded as the tracts are."""
    geometry = dissolved_units(boundaries, level)
    mine = results[results["level"] == level].drop(columns="level")
    grid = pd.MultiIndex.from_product([geometry.index, cells], names=["geoid", "cell"])
    table = mine.set_index(["geoid", "cell"]).reindex(grid).reset_index()
    missing = table["status"].isna()
    table.loc[missing, ["mechanism", "status", "reason"]] = ["none", "suppressed", "no records"]
    table.loc[missing, ["n", "epsilon_spent", "delta_spent"]] = 0
    table["n"] = table["n"].astype(np.int64)
    table["level"] = level
    table = round_released_values(table)
    table["p25"] = table["p25_raw"].clip(0.0, 1.0)
    table["p75"] = table["p75_raw"].clip(0.0, 1.0)
    table["state"] = table["geoid"].str[:2]
    if level == "county":
        table["county"] = table["geoid"]
    table["name"] = names_of(table["geoid"], level)  # public; empty where not known
    extra = [c for c in UNCERTAINTY_COLUMNS if c in table.columns]
    table = add_standard_errors(table[level_columns(level, extra)])
    return gpd.GeoDataFrame(table, geometry=geometry.loc[table["geoid"]].to_numpy(),
                            crs=boundaries.crs)


def level_table_schema(columns: list[str], level: str, interval_level: float = 0.95,
                       decimals: int = PUBLISHED_DECIMALS) -> dict:
    """The Table Schema of a level's CSV: the tract table's fields, a unit GEOID, ``level``."""
    digits = GEOID_DIGITS[level]
    special = {
        "geoid": {"name": "geoid", "type": "string", "description": UNIT_TEXT[level] + "; text, "
                  "leading zeros kept",
                  "constraints": {"required": True, "pattern": f"^[0-9]{{{digits}}}$",
                                  "minLength": digits, "maxLength": digits}},
        "level": {"name": "level", "type": "string",
                  "description": "Geography level of the row (public)",
                  "constraints": {"required": True, "enum": [level]}},
        "name": name_field(level),
        "n": {"name": "n", "type": "integer", "description": f"Records in the {level} and "
              "cell (public: the sum of its tracts' n)",
              "constraints": {"required": True, "minimum": 0}},
        **{col: {**_field(col, decimals, interval_level),
                 "description": f"Privacy budget {col.split('_')[0]} charged to this "
                                f"{level}'s records in this cell by the {level} steps (the "
                                f"sum of the manifest's levels.{level}.steps in "
                                "budget.steps; 0 where suppressed), not the per-person total"}
           for col in ("epsilon_spent", "delta_spent")},
    }
    return {"fields": [special.get(c) or _unit_field(c, level, decimals, interval_level)
                       for c in columns],
            "primaryKey": ["geoid", "cell"], "missingValues": [""]}


def _unit_field(column: str, level: str, decimals: int, interval_level: float) -> dict:
    """The tract table's field, its description speaking of the level's unit."""
    field = _field(column, decimals, interval_level)
    text = field["description"]
    for tract_words, unit_words in (("the tract's", f"the {level}'s"),
                                    ("this tract", f"this {level}"),
                                    ("the tract was", f"the {level} was")):
        text = text.replace(tract_words, unit_words)
    return {**field, "description": text}


def write_level_files(table: gpd.GeoDataFrame, folder: Path, level: str,
                      interval_level: float = 0.95,
                      tile_text: Callable[[str], tiles.TileText] | None = None,
                      with_tiles: bool = True, per_cell: bool | None = None) -> list[str]:
    """The four files of ``level`` in ``folder`` and its vector tiles (the web map's layer of
    the level, ``counties.pmtiles`` or ``states.pmtiles``); their names. ``tile_text``: the
    archive's metadata text for a layer name (``tiles.release_tile_text`` of the release).
    ``with_tiles`` False: no archive (a release of several cells builds one per cell).
    ``per_cell``: whether the release has several cells, when ``table`` is a piece of the
    level's that may hold one cell (the GeoJSON's feature ids are the whole file's)."""
    parquet, geojson, csv, schema = level_files(level)
    folder = Path(folder)
    table.to_parquet(folder / parquet, index=False)
    write_geojson_rfc7946(table, folder / geojson, per_cell=per_cell)
    layer = tiles.LEVEL_TILES[level].layer
    archive = [tiles.build_level_tiles(folder / geojson, folder, level,
                                       tile_text(layer) if tile_text else None)
               ] if with_tiles else []
    plain = pd.DataFrame(table.drop(columns="geometry"))
    plain.to_csv(folder / csv, index=False, na_rep="")
    (folder / schema).write_text(json.dumps(
        level_table_schema(list(plain.columns), level, interval_level), indent=2) + "\n")
    return [*level_files(level), *archive]


def level_spend_text(level: str, steps: list[str]) -> str:
    """What a level row's epsilon_spent / delta_spent are: its own steps' charge, not the
    per-person total of budget.epsilon_per_tract_and_cell (which the tract rows state)."""
    return (f"the budget charged to this {level}'s records in this cell by the {level} steps "
            f"({' + '.join(repr(s) for s in steps)}: the sum of their charges in "
            f"budget.steps); 0 where suppressed. Each person's total over the tract, county "
            f"and state steps is budget.epsilon_per_tract_and_cell")


def level_published_columns(level: str, estimate_step: str, interval_step: str | None,
                            interval_level: float) -> dict:
    """What pays for each column of a level's table (manifest ``levels.<level>``)."""
    out = {
        "geoid, level, state" + (", county" if level == "county" else "")
        + ", name, cell, n, status, geometry": "public",
        "p25, p75": "display values: p25_raw, p75_raw clipped to [0, 1] (post-processing)",
        "p25_raw, p75_raw": f"the step '{estimate_step}' (NoisyStats on the {level}'s pooled "
                            f"records), rounded to {PUBLISHED_DECIMALS} decimals",
        "mechanism, reason": "NoisyStats where it ran; reason a function of the public n and "
                             "the DP outputs (failure: noisy nvar <= 0)",
        "epsilon_spent, delta_spent": level_spend_text(level, [estimate_step]
                                                       + ([interval_step] if interval_step
                                                          else [])),
    }
    if interval_step:
        error = TOTAL_ERROR.replace("the tract's", f"the {level}'s")
        out[", ".join(INTERVAL_COLUMNS)] = (
            f"the step '{interval_step}': {interval_level:.0%} confidence intervals for the "
            f"{level}'s expected outcome (the {ESTIMAND_ID} of the {level}'s pooled records), "
            f"covering the {error} (mechanisms/intervals.py)")
        out[", ".join(SE_COLUMNS)] = (f"post-processing of the step '{interval_step}' (no "
                                     f"budget of its own): the estimated standard deviation "
                                     f"of the value's {error}, rounded up")
        out[", ".join(MOE_COLUMNS)] = (f"post-processing of the step '{interval_step}' (no "
                                      "budget of its own): 90% margins of error, 1.645 x the "
                                      "standard error rounded up")
    return out


def write_all_levels(level_tables: dict, folder: Path, interval_level: float = 0.95,
                     tile_text: Callable[[str], tiles.TileText] | None = None) -> list[str]:
    """Every level's files in ``folder`` (``level_tables``: level -> table); their names."""
    return [name for level, table in level_tables.items()
            for name in write_level_files(table, folder, level, interval_level, tile_text)]
