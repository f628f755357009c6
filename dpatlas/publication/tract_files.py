"""Publishing a release: map-ready files and the accounting manifest, made visible atomically.

The files follow their standards (docs/files.md): ``tracts.geojson`` is RFC 7946 (WGS 84,
counter-clockwise exterior rings, no ``crs`` member, at most 6 decimals), ``tracts.csv`` has a
Frictionless Table Schema beside it (``tracts.schema.json``: GEOID an 11-character string), and
the released values are rounded to :data:`PUBLISHED_DECIMALS` decimals (post-processing, stated
in the manifest's ``rounding``).

Files are written into a staging folder *outside* the public tree (under the release's
internal folder when that is on the publish root's file system), checked and hashed, and
moved into ``<root>/<id>`` with one rename, so a reader of the publish root never sees a
half-written release, and a run killed while staging leaves nothing in the public tree.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Optional

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from mechanisms.estimand import (ESTIMAND, ESTIMAND_ID, INTERVAL_MEANING, MOE90_MEANING,
                                 MOE90_Z, SE_CAP, SE_MEANING)

from dpatlas.core.columns import INTERVAL_COLUMNS, MOE_COLUMNS, RESULT_COLUMNS, SE_COLUMNS
from dpatlas.publication.codebook import write_codebook
from dpatlas.publication.datapackage import write_datapackage
from dpatlas.publication.geojson import geojson_geometry, rfc7946_geometries
from dpatlas.publication.names import name_field, names_of
from dpatlas.core.hashing import sha256_file
from dpatlas.core.errors import OperatorError
from dpatlas.core.ids import InvalidReleaseId, validate_release_id

CSV_FILE = "tracts.csv"
CSV_SCHEMA_FILE = "tracts.schema.json"
PUBLISHED_FILES = ("tracts.parquet", "tracts.geojson", CSV_FILE, CSV_SCHEMA_FILE, "p25_map.png",
                   "config.json")
MANIFEST_FILE = "manifest.json"
TABLE_COLUMNS = ["geoid", "state", "county", "name", "cell", "n", "mechanism", "status", "reason",
                 "p25", "p75", "p25_raw", "p75_raw", "epsilon_spent", "delta_spent"]
# Released values are published to 4 decimals (a rank to 1/10,000: far below the noise at any
# budget we publish, and it stops 17 digits of float noise passing for precision).
PUBLISHED_DECIMALS = 4
# A footprint for catalogues (STAC): the union of the tracts, simplified to about 100 m.
FOOTPRINT_TOLERANCE_DEGREES = 1e-3


class PublishError(RuntimeError, OperatorError):
    """Publishing refused or failed; the message says what to do."""


def assemble(results: pd.DataFrame, boundaries: gpd.GeoDataFrame,
             cells: Optional[list[str]] = None) -> gpd.GeoDataFrame:
    """Every boundary tract, for every cell (``cells``, default the results'), with its
    status; geometry from the boundaries; with intervals, their standard errors and margins of
    error. (A publish part of some states is given its group's cells: its states may hold no
    record of one of them.)"""
    if cells is None:
        cells = sorted(results["cell"].unique()) if len(results) else ["all"]
    grid = pd.MultiIndex.from_product([boundaries["geoid"], cells], names=["geoid", "cell"])
    table = results.set_index(["geoid", "cell"]).reindex(grid).reset_index()
    missing = table["status"].isna()
    table.loc[missing, ["mechanism", "status", "reason"]] = ["none", "suppressed", "no records"]
    table.loc[missing, ["n", "epsilon_spent", "delta_spent"]] = 0
    table["n"] = table["n"].astype(np.int64)
    table = round_released_values(table)
    table["p25"] = table["p25_raw"].clip(0.0, 1.0)
    table["p75"] = table["p75_raw"].clip(0.0, 1.0)
    geo = boundaries.set_index("geoid")
    table["state"] = table["geoid"].str[:2]
    table["county"] = table["geoid"].str[:5]
    table["name"] = names_of(table["geoid"], "tract")
    extra = [c for c in results.columns if c not in RESULT_COLUMNS]
    table = add_standard_errors(table[TABLE_COLUMNS + extra])
    return gpd.GeoDataFrame(table, geometry=geo.loc[table["geoid"], "geometry"].to_numpy(),
                            crs=boundaries.crs)


def _point_columns(columns) -> list[str]:
    """Released point values: the primary p25/p75 and every suite estimator's."""
    return [c for c in columns if c in ("p25_raw", "p75_raw")
            or (c.endswith(("_p25", "_p75")) and c not in INTERVAL_COLUMNS)]


def _bound_columns(columns) -> tuple[list[str], list[str]]:
    return ([c for c in INTERVAL_COLUMNS if c.endswith("_lo") and c in columns],
            [c for c in INTERVAL_COLUMNS if c.endswith("_hi") and c in columns])


def round_released_values(table: pd.DataFrame,
                          decimals: int = PUBLISHED_DECIMALS) -> pd.DataFrame:
    """The table with its released values rounded to ``decimals`` decimals.

    Point values are rounded to nearest; interval bounds outwards (lower down, upper up), so
    each published interval contains the computed one and keeps at least its coverage, and a
    bound never crosses the rounded point value. Rounding is post-processing of DP outputs:
    the guarantee is unchanged (Dwork & Roth 2014, Prop. 2.1). Clip to [0, 1] afterwards:
    rounding commutes with clipping to those bounds, so ``p25 == clip(p25_raw)`` holds exactly.
    """
    out = table.copy()
    # "+ 0.0" turns a rounded -0.0 into 0.0, which the CSV would otherwise print as "-0.0".
    for c in _point_columns(out.columns):
        out[c] = out[c].astype(float).round(decimals) + 0.0
    lower, upper = _bound_columns(out.columns)
    for c in lower:
        out[c] = _rounded_outwards(out[c], decimals, up=False)
    for c in upper:
        out[c] = _rounded_outwards(out[c], decimals, up=True)
    return out


def _rounded_outwards(values, decimals: int, up: bool) -> np.ndarray:
    """``values`` rounded up (or down) to ``decimals`` decimals, -0.0 made 0.0: how bounds,
    standard errors and margins of error are published."""
    scale = 10.0 ** decimals
    step = np.ceil if up else np.floor
    return (step(np.asarray(values, dtype=float) * scale) / scale).round(decimals) + 0.0


def add_standard_errors(table: pd.DataFrame,
                        decimals: int = PUBLISHED_DECIMALS) -> pd.DataFrame:
    """The table with its ``p25_se``, ``p75_se`` rounded up and their 90% margins of error
    ``p25_moe90``, ``p75_moe90`` beside them (unchanged without intervals).

    The standard errors come from the interval step (``mechanisms/intervals.py``: estimates
    of the standard deviation of the total error, from DP and public values); rounding up
    keeps them upper estimates. The margin of error is ``MOE90_Z``·se of the *published*
    (rounded) se, rounded up, so anyone can recompute it from the files (``dpatlas audit``
    does). Post-processing of DP outputs: no budget of its own.
    """
    if not all(c in table.columns for c in INTERVAL_COLUMNS):
        return table
    missing = [c for c in SE_COLUMNS if c not in table.columns]
    if missing:
        raise PublishError(f"the estimate table has intervals but no {missing}: it was made "
                           "by an older interval step; rerun the release under a new id")
    out = table.copy()
    for column, moe in zip(SE_COLUMNS, MOE_COLUMNS):
        out[column] = _rounded_outwards(out[column], decimals, up=True)
        out[moe] = margin_of_error_90(out[column], decimals)
    # the margins of error right after the standard errors
    columns = [c for c in out.columns if c not in MOE_COLUMNS]
    at = columns.index(SE_COLUMNS[-1]) + 1
    return out[columns[:at] + MOE_COLUMNS + columns[at:]]


def margin_of_error_90(se: np.ndarray, decimals: int = PUBLISHED_DECIMALS) -> np.ndarray:
    """The 90% margin of error of published standard errors: MOE90_Z·se rounded up."""
    return _rounded_outwards(MOE90_Z * np.asarray(se, dtype=float), decimals, up=True)


def standard_error_maximum() -> float:
    """The largest published standard error: the cap (``mechanisms/estimand.py`` SE_CAP),
    a round number, so rounding up never passes it."""
    return float(SE_CAP)


def rounding_statement(columns, decimals: int = PUBLISHED_DECIMALS) -> dict:
    """What the manifest says about the rounding of the published values (``rounding``)."""
    lower, upper = _bound_columns(columns)
    points = _point_columns(columns)
    model = [c for c in columns if c in _MODEL_TEXT]  # rounded by the small-area stage
    return {
        "decimals": decimals,
        "to_nearest": points + [c for c in ("p25", "p75") if c in columns]
        + [c for c in model if c.endswith(("_model", "_model_z"))],
        "outwards": {"down": lower + [c for c in model if c.endswith("_lo")],
                     "up": upper + [c for c in (*SE_COLUMNS, *MOE_COLUMNS) if c in columns]
                     + [c for c in model if c.endswith(("_hi", "_se"))]},
        "rule": (f"released values rounded to {decimals} decimals before p25/p75 are clipped to "
                 "[0, 1]: point values to nearest (numpy.round: ties of x·10^decimals to even), "
                 "interval bounds outwards so each published "
                 "interval contains the computed one, standard errors (computed from the "
                 "rounded bounds) up. Post-processing of the DP outputs: the "
                 "guarantee is unchanged."),
        "geojson_coordinate_decimals": 7,
    }


def footprint(table: gpd.GeoDataFrame) -> dict:
    """The release's extent for catalogues: WGS 84 ``bbox`` and a simplified union of the
    tracts as an RFC 7946 ``geometry`` (manifest key ``extent``; the STAC item reads it)."""
    geometry = table.to_crs("EPSG:4326").geometry
    geoms = geometry.to_numpy()
    keep = ~geometry.duplicated().to_numpy() & ~shapely.is_empty(geoms)  # by position
    geoms, groups = geoms[keep], union_groups(table)
    if len(geoms) == 0:
        return {"bbox": None, "geometry": None}
    union = tract_union(geoms, None if groups is None else groups[keep])
    simple = union.simplify(FOOTPRINT_TOLERANCE_DEGREES, preserve_topology=True)
    shape = rfc7946_geometries(np.array([simple], dtype=object))[0]
    # The bbox of the tracts themselves, so it holds every published coordinate.
    minx, miny, maxx, maxy = (float(v) for v in shapely.total_bounds(geoms))
    bbox = [np.floor(minx * 1e7) / 1e7, np.floor(miny * 1e7) / 1e7,
            np.ceil(maxx * 1e7) / 1e7, np.ceil(maxy * 1e7) / 1e7]
    return {"bbox": [round(float(v), 7) for v in bbox], "geometry": geojson_geometry(shape)}


def union_groups(table: pd.DataFrame) -> Optional[np.ndarray]:
    """Each row's state (its ``state``, else its GEOID's first two digits), the groups
    :func:`tract_union` unions apart when the whole is not one coverage; None without
    either column."""
    if "state" in table.columns:
        return table["state"].astype(str).to_numpy()
    if "geoid" in table.columns:
        return table["geoid"].astype(str).str[:2].to_numpy()
    return None


def tract_union(geoms: np.ndarray, groups: Optional[np.ndarray] = None):
    """Union of tract polygons: the fast coverage union when the tracts form a valid coverage
    (edges shared vertex for vertex, as TIGER/Line and the synthetic tracts do), else the
    general overlay union (GEOS raises on some such inputs rather than returning a bad union:
    tracts cut from real outlines whose neighbours do not share every vertex).

    ``groups`` (a label per polygon: its state, :func:`union_groups`): when the whole is not
    one coverage, each group is unioned on its own the same way and the groups' unions then
    together. Tracts drawn state by state share no vertices across a state line, so a
    national table is no coverage while each state is: its union took 0.23 CPU-s this way
    against 2.13 by the general union of every tract (74,001 synthetic tracts; the same
    area, no difference between the two)."""
    union = _coverage_union(geoms)
    if union is not None:
        return union
    if groups is not None and len(groups) == len(geoms):
        labels = np.unique(groups)
        if len(labels) > 1:
            pieces = [tract_union(geoms[groups == label]) for label in labels]
            return shapely.union_all(np.array(pieces, dtype=object))
    return shapely.union_all(geoms)


def _coverage_union(geoms: np.ndarray):
    """The coverage union of ``geoms``, or None where they are not a clean coverage."""
    try:
        union = shapely.coverage_union_all(geoms)
    except shapely.errors.GEOSException:
        return None
    if shapely.is_valid(union) and np.isclose(union.area, shapely.area(geoms).sum(), rtol=1e-6):
        return union
    return None


def code_version() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    try:
        pkg = version("dpatlas")
    except PackageNotFoundError:
        pkg = "unknown"
    commit = None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=5)
        commit = out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"package": pkg, "git_commit": commit}


def release_folder(root: Path, release_id: str) -> Optional[Path]:
    """``<root>/<id>`` if it is a real folder, None if nothing is there.

    A symbolic link (dangling or not) or a non-folder at that name is refused: a release
    folder is only ever made by the rename in :func:`stage_release`, and ``exists()`` would
    follow a link and mistake a dangling one for free space.
    """
    final = Path(root) / release_id
    if os.path.islink(final):
        raise PublishError(f"{final} is a symbolic link; a release folder must be a real folder "
                           "made by dpatlas: remove the link or use another release id")
    if not os.path.lexists(final):
        return None
    if not final.is_dir():
        raise PublishError(f"{final} exists and is not a folder: remove it or use another "
                           "release id")
    return final


def verify_release(folder: Path) -> dict:
    """The manifest of a published folder, after checking every file's sha256 and size."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except (OSError, ValueError) as err:
        raise PublishError(f"{folder}: manifest.json cannot be read ({err}); the folder is not "
                           "a complete release") from None
    bad = []
    for name, info in manifest.get("files", {}).items():
        path = folder / name
        if (os.path.islink(path) or not path.is_file()
                or path.stat().st_size != info.get("bytes")
                or sha256_file(path) != info.get("sha256")):
            bad.append(name)
    if bad:
        raise PublishError(f"{folder}: files do not match the manifest: {bad}")
    return manifest


def _same_file_system(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fallback_staging_name(release_id: str) -> re.Pattern:
    return re.compile(r"\.staging-" + re.escape(release_id) + r"-\d+")  # used with fullmatch


def remove_stale_staging(root: Path, internal_dir: Optional[Path], release_id: str) -> list[Path]:
    """Remove staging folders of ``release_id`` left by a killed run; returns what was removed.

    Only names this module makes for this id are touched (``<internal>/staging-<pid>``,
    ``<root>/.staging-<id>-<pid>``); the caller holds the release's lock, so none of them
    belongs to a live run.
    """
    stale = []
    if internal_dir is not None and Path(internal_dir).is_dir():
        stale += [p for p in Path(internal_dir).iterdir() if re.fullmatch(r"staging-\d+", p.name)]
    if Path(root).is_dir():
        pattern = _fallback_staging_name(release_id)
        stale += [p for p in Path(root).iterdir() if pattern.fullmatch(p.name)]
    for p in stale:
        if p.is_symlink() or not p.is_dir():
            p.unlink()
        else:
            shutil.rmtree(p)
    return stale


def staging_folder(root: Path, internal_dir: Optional[Path], release_id: str) -> Path:
    """Where to stage: under the internal folder if it shares the publish root's file system
    (so the final rename is atomic), else a dot-named folder in the root (never in the feed)."""
    pid = os.getpid()
    if internal_dir is not None:
        Path(internal_dir).mkdir(parents=True, exist_ok=True)
        if _same_file_system(Path(internal_dir), Path(root)):
            return Path(internal_dir) / f"staging-{pid}"
    return Path(root) / f".staging-{release_id}-{pid}"


# Threads writing a release's files side by side (tippecanoe runs as a child process while
# Python writes the other files; pyarrow, GEOS and the PNG's rendering release the GIL in
# parts). More would only queue on a machine of a few cores.
PUBLISH_WORKERS = 4


def in_parallel(jobs: list[Callable[[], object]], workers: int = PUBLISH_WORKERS) -> list:
    """Run ``jobs`` in threads; their results in order. The first failure is raised once
    every job already started has stopped and the rest are cancelled, so nothing is still
    writing into the staging folder when the caller removes it."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    pool = ThreadPoolExecutor(max_workers=max(1, min(workers, len(jobs))),
                              thread_name_prefix="publish")
    try:
        futures = [pool.submit(job) for job in jobs]
        wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            pool.shutdown(wait=True, cancel_futures=True)
            raise failed.exception()
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# ------------------------------------------------------------------ CSV and its Table Schema

# Frictionless Table Schema (https://specs.frictionlessdata.io/table-schema/): one field per
# column, in order, typed, described and constrained; readers take GEOIDs as text from it.
_RANK = {"minimum": 0, "maximum": 1}
# One estimand for every value, interval and standard error, direct and model-based alike
# (mechanisms/estimand.py): every such column's description carries ESTIMAND_ID, which
# ``dpatlas audit`` checks.
_ESTIMAND = f"Estimand (direct and model-based values alike): the {ESTIMAND}."
# A tract row's spend is the whole per-person charge of its cell: counties' and states'
# rows state only their own steps (level_files.level_spend_text).
_TRACT_SPENT_TEXT = ("Privacy budget {0} charged to this tract's records in this cell: every "
                     "budget step summed (the tract's and, where the release publishes "
                     "counties or states, their steps too: each person is in one tract, "
                     "county and state); the manifest's budget.{0}_per_tract_and_cell; 0 "
                     "where suppressed")
_FIELDS: dict[str, tuple[str, str, dict]] = {
    "geoid": ("string", "Census tract GEOID: 2-digit state, 3-digit county and 6-digit tract "
              "FIPS codes; text, leading zeros kept",
              {"required": True, "pattern": r"^[0-9]{11}$", "minLength": 11, "maxLength": 11}),
    "state": ("string", "State FIPS code (the GEOID's first 2 characters)",
              {"required": True, "pattern": r"^[0-9]{2}$"}),
    "county": ("string", "State and county FIPS code (the GEOID's first 5 characters)",
               {"required": True, "pattern": r"^[0-9]{5}$"}),
    "cell": ("string", "Population cell the row describes (e.g. all, or a cohort)",
             {"required": True}),
    "n": ("integer", "Records in the tract and cell (public)", {"required": True, "minimum": 0}),
    "mechanism": ("string", "Estimator that produced p25/p75 (none when suppressed)",
                  {"required": True}),
    "status": ("string", "released (values present), suppressed (too few records, nothing "
               "spent) or failed (budget spent, no value)",
               {"required": True, "enum": ["released", "suppressed", "failed"]}),
    "reason": ("string", "Why the tract was suppressed or failed; empty when released", {}),
    "p25": ("number", "Predicted child income rank at parent rank 0.25 (DP), p25_raw clipped "
            "to [0, 1]; empty unless released", _RANK),
    "p75": ("number", "Predicted child income rank at parent rank 0.75 (DP), p75_raw clipped "
            "to [0, 1]; empty unless released", _RANK),
    "p25_raw": ("number", "The DP release of p25 before clipping (may lie outside [0, 1])", {}),
    "p75_raw": ("number", "The DP release of p75 before clipping (may lie outside [0, 1])", {}),
    "epsilon_spent": ("number", _TRACT_SPENT_TEXT.format("epsilon"),
                      {"required": True, "minimum": 0}),
    "delta_spent": ("number", _TRACT_SPENT_TEXT.format("delta"),
                    {"required": True, "minimum": 0, "maximum": 1}),
}
_INTERVAL_TEXT = {"lo": "lower", "hi": "upper"}
# The small-area model's columns (dpatlas/publication/model_estimates.py).
_MODEL = ("model-based (Fay–Herriot) estimate from published values only, of the "
          f"{ESTIMAND_ID} (the estimand of p25 and p75); shrinks towards neighbours and the "
          "county; see docs/small-area.md")
_MODEL_TEXT = {
    **{f"{q}_model": f"{q}: {_MODEL}. Rounded to {{decimals}} decimals; empty where the "
       "model was not fitted (manifest small_area.fits)" for q in ("p25", "p75")},
    **{f"{q}_model_{end}": f"{word.capitalize()} bound of the 95% interval of {q}_model: "
       f"{_MODEL}. Rounded {way} to {{decimals}} decimals"
       for q in ("p25", "p75")
       for end, word, way in (("lo", "lower", "down"), ("hi", "upper", "up"))},
    **{f"{q}_model_se": f"Root mean squared error of {q}_model: {_MODEL}. Rounded up to "
       "{decimals} decimals" for q in ("p25", "p75")},
    **{f"{q}_model_z": f"Check of the direct {q} against the model without it: ({q} minus the "
       "model's prediction from the neighbours, county and n alone) divided by the square root "
       "of its variance (the direct's noise variance + the model's tract variance + the "
       "prediction's variance); about standard normal where the model applies. |z| > 2.58: "
       "the model may not apply to this tract (read the direct value). Empty where there is "
       "no direct. Rounded to {decimals} decimals" for q in ("p25", "p75")},
}


def _standard_error_text(column: str, decimals: int) -> str:
    value = column[:-len("_se")]
    return (f"{value}'s {SE_MEANING}. Drawn for by the interval step (mechanisms/intervals.py, "
            f"its own budget), rounded up to {decimals} decimals; empty unless released; at "
            f"most {standard_error_maximum()}. {value} ± 1.645·{column} is the "
            f"90% margin ({value}_moe90 where published). " + _ESTIMAND)


def _moe90_text(column: str, decimals: int) -> str:
    value = column[:-len("_moe90")]
    return (f"{value}'s {MOE90_MEANING}: 1.645 x {value}_se "
            f"rounded up to {decimals} decimals, the ± of {value} on the map; empty where "
            f"{value}_se is. " + _ESTIMAND)


def _field(column: str, decimals: int, level: float = 0.95) -> dict:
    rounded = f"; rounded to {decimals} decimals"
    if column == "name":
        return name_field("tract")
    if column in _FIELDS:
        kind, text, constraints = _FIELDS[column]
        if column in ("p25", "p75", "p25_raw", "p75_raw"):
            text += rounded
        if column in ("p25", "p75"):
            text += ". " + _ESTIMAND
    elif column in INTERVAL_COLUMNS:
        value, side = column.split("_")
        kind, constraints = "number", dict(_RANK)
        text = (f"{_INTERVAL_TEXT[side].capitalize()} bound of the {level:.0%} "
                f"{INTERVAL_MEANING}, for {value} (DP), rounded "
                f"{'down' if side == 'lo' else 'up'} to {decimals} decimals; empty unless "
                "released. " + _ESTIMAND)
    elif column in SE_COLUMNS:
        kind, text = "number", _standard_error_text(column, decimals)
        constraints = {"minimum": 0, "maximum": standard_error_maximum()}
    elif column in MOE_COLUMNS:
        kind, text = "number", _moe90_text(column, decimals)
        constraints = {"minimum": 0, "maximum": float(margin_of_error_90(SE_CAP, decimals))}
    elif column in _MODEL_TEXT:
        kind, text = "number", _MODEL_TEXT[column].format(decimals=decimals)
        constraints = ({"minimum": 0} if column.endswith("_se") else {}
                       if column.endswith("_z") else dict(_RANK))
    elif column.endswith(("_p25", "_p75")):
        name, value = column.rsplit("_", 1)
        kind, constraints = "number", {}
        text = f"{value} by the estimator {name} (DP, its own budget step){rounded}"
    else:
        raise PublishError(f"column {column!r} has no Table Schema description: add it to "
                           "dpatlas/publication/tract_files.py _FIELDS before publishing it")
    field = {"name": column, "type": kind, "description": text}
    if constraints:
        field["constraints"] = dict(constraints)
    return field


def table_schema(columns, decimals: int = PUBLISHED_DECIMALS, level: float = 0.95) -> dict:
    """The Frictionless Table Schema of ``tracts.csv`` with these columns (``level``: the
    intervals' level, which bounds the standard errors)."""
    return {
        "fields": [_field(c, decimals, level) for c in columns],
        "primaryKey": ["geoid", "cell"],
        "missingValues": [""],
    }


def write_table_schema(columns: list[str], folder: Path, interval_level: float = 0.95) -> Path:
    """``tracts.schema.json``: the Table Schema of ``tracts.csv`` with these columns."""
    schema_path = Path(folder) / CSV_SCHEMA_FILE
    schema_path.write_text(json.dumps(table_schema(columns, level=interval_level), indent=2)
                           + "\n")
    return schema_path


def write_csv_with_schema(table: pd.DataFrame, folder: Path,
                          interval_level: float = 0.95) -> tuple[Path, Path]:
    """``tracts.csv`` and, beside it, its Table Schema ``tracts.schema.json``."""
    csv_path = Path(folder) / CSV_FILE
    table.to_csv(csv_path, index=False, na_rep="")
    return csv_path, write_table_schema(list(table.columns), folder, interval_level)


_PANDAS_TYPES = {"string": "string", "integer": "Int64", "number": "float64",
                 "boolean": "boolean"}


def read_csv_with_schema(csv_path: Path, schema_path: Path | None = None) -> pd.DataFrame:
    """Read a published CSV through its Table Schema: each column with the schema's type
    (strings stay text, so GEOIDs keep their leading zeros) and its constraints checked.

    Raises :class:`PublishError` naming every column that breaks its schema.
    """
    csv_path = Path(csv_path)
    schema_path = Path(schema_path or csv_path.with_name(CSV_SCHEMA_FILE))
    try:
        schema = json.loads(schema_path.read_text())
        fields = schema["fields"]
        dtypes = {f["name"]: _PANDAS_TYPES[f.get("type", "string")] for f in fields}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PublishError(f"{schema_path}: not a usable Table Schema ({err})") from None
    df = pd.read_csv(csv_path, dtype=dtypes, keep_default_na=False,
                     na_values=schema.get("missingValues", [""]))
    names = [f["name"] for f in fields]
    if list(df.columns) != names:
        raise PublishError(f"{csv_path}: columns {list(df.columns)} differ from the schema's "
                           f"{names}")
    problems = [p for f in fields for p in _constraint_problems(df[f["name"]], f)]
    key = schema.get("primaryKey")
    if key and df.duplicated(subset=key).any():
        problems.append(f"primary key {key} repeats in {int(df.duplicated(subset=key).sum())} "
                        "row(s)")
    if problems:
        raise PublishError(f"{csv_path} breaks its schema: " + "; ".join(problems))
    return df


def _constraint_problems(column: pd.Series, field: dict) -> list[str]:
    c, name, out = field.get("constraints", {}), field["name"], []
    present = column.dropna()
    if c.get("required") and column.isna().any():
        out.append(f"{name}: {int(column.isna().sum())} missing value(s)")
    if "pattern" in c and not present.str.fullmatch(c["pattern"]).all():
        out.append(f"{name}: values not matching {c['pattern']}")
    if "minLength" in c and (present.str.len() < c["minLength"]).any():
        out.append(f"{name}: values shorter than {c['minLength']}")
    if "maxLength" in c and (present.str.len() > c["maxLength"]).any():
        out.append(f"{name}: values longer than {c['maxLength']}")
    if "enum" in c and not present.isin(c["enum"]).all():
        out.append(f"{name}: values outside {c['enum']}")
    if "minimum" in c and (present < c["minimum"]).any():
        out.append(f"{name}: values below {c['minimum']}")
    if "maximum" in c and (present > c["maximum"]).any():
        out.append(f"{name}: values above {c['maximum']}")
    return out


def _move_into_place(staging: Path, final: Path, root: Path, release_id: str) -> None:
    """One rename of the complete staging folder to ``final``.

    Two mount points of one file system share ``st_dev`` but refuse a rename between them
    (EXDEV); then the folder is copied to a dot-named staging folder in the root first.
    """
    try:
        os.replace(staging, final)  # atomic on one file system: all or nothing
        return
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
    fallback = root / f".staging-{release_id}-{os.getpid()}"
    try:
        shutil.copytree(staging, fallback)
        _fsync_dir(fallback)
        os.replace(fallback, final)
    except BaseException:
        shutil.rmtree(fallback, ignore_errors=True)
        raise
    shutil.rmtree(staging, ignore_errors=True)


def stage_release(root: Path, release_id: str, stage: Callable[[Path], tuple[list[str], dict]],
                  *, config: dict, internal_dir: Optional[Path] = None,
                  check_lease: Optional[Callable[[], None]] = None) -> Path:
    """Make a staging folder outside the publish tree, let ``stage`` write the release's
    files into it (it returns their names and the manifest without ``files``), add the data
    package, hash every file into the manifest, then rename the folder to ``<root>/<id>``.
    Nothing is visible unless all of it succeeded: on any error the staging folder is
    removed; ``check_lease`` (called right before the rename) raises when this run no longer
    holds the release. ``internal_dir``: the release's internal folder (staging goes there
    when it shares the root's file system)."""
    try:
        validate_release_id(release_id)
    except InvalidReleaseId as err:
        raise PublishError(str(err)) from None
    root = Path(root)
    if release_folder(root, release_id) is not None:
        raise PublishError(f"release {release_id} is already published at {root / release_id}")
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(root, internal_dir, release_id)
    staging = staging_folder(root, internal_dir, release_id)
    staging.mkdir()
    try:
        files, manifest = stage(staging)
        files.append(write_codebook(staging, release_id, config))  # README.md, hashed too
        files.append(write_datapackage(staging, files, release_id, config))
        manifest = {**manifest,
                    "files": {f: {"sha256": sha256_file(staging / f),
                                  "bytes": (staging / f).stat().st_size}
                              for f in files}}
        (staging / MANIFEST_FILE).write_text(_strict_json(manifest))
        for f in (*files, MANIFEST_FILE):
            with open(staging / f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(staging)
        # The page's libraries are the root's (../_lib/), there before the page is visible.
        from dpatlas.publication.webmap import write_shared_library
        write_shared_library(root)
        if check_lease is not None:
            check_lease()
        final = root / release_id
        if release_folder(root, release_id) is not None:
            raise PublishError(f"release {release_id} appeared at {final} while this run was "
                               "staging it: another run published it; nothing was replaced")
        _move_into_place(staging, final, root, release_id)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


def _strict_json(manifest: dict) -> str:
    """The manifest as standard JSON: a NaN or infinity (which strict parsers reject) is a
    bug upstream, so it stops the publication instead of reaching auditors."""
    try:
        return json.dumps(manifest, indent=2, default=_json, allow_nan=False)
    except ValueError as err:
        raise PublishError(f"the manifest holds a NaN or infinity ({err}; a bug): nothing "
                           "was published") from None


def _json(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj)}")



