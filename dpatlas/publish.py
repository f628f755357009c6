"""Publishing a release: map-ready files and the accounting manifest, made visible atomically.

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
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import geopandas as gpd
import numpy as np
import pandas as pd

from .estimate import RESULT_COLUMNS
from .hashing import sha256_file
from .ids import InvalidReleaseId, validate_release_id

PUBLISHED_FILES = ("tracts.parquet", "tracts.geojson", "tracts.csv", "p25_map.png",
                   "config.json")
MANIFEST_FILE = "manifest.json"
TABLE_COLUMNS = ["geoid", "state", "county", "cell", "n", "mechanism", "status", "reason",
                 "p25", "p75", "p25_raw", "p75_raw", "epsilon_spent", "delta_spent"]


class PublishError(RuntimeError):
    """Publishing refused or failed; the message says what to do."""


def assemble(results: pd.DataFrame, boundaries: gpd.GeoDataFrame) -> gpd.GeoDataFrame:
    """Every boundary tract, for every cell, with its status; geometry from the boundaries."""
    cells = sorted(results["cell"].unique()) if len(results) else ["all"]
    grid = pd.MultiIndex.from_product([boundaries["geoid"], cells], names=["geoid", "cell"])
    table = results.set_index(["geoid", "cell"]).reindex(grid).reset_index()
    missing = table["status"].isna()
    table.loc[missing, ["mechanism", "status", "reason"]] = ["none", "suppressed", "no records"]
    table.loc[missing, ["n", "epsilon_spent", "delta_spent"]] = 0
    table["n"] = table["n"].astype(np.int64)
    table["p25"] = table["p25_raw"].clip(0.0, 1.0)
    table["p75"] = table["p75_raw"].clip(0.0, 1.0)
    geo = boundaries.set_index("geoid")
    table["state"] = table["geoid"].str[:2]
    table["county"] = table["geoid"].str[:5]
    extra = [c for c in results.columns if c not in RESULT_COLUMNS]
    table = table[TABLE_COLUMNS + extra]
    return gpd.GeoDataFrame(table, geometry=geo.loc[table["geoid"], "geometry"].to_numpy(),
                            crs=boundaries.crs)


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


def low_reliability(table: pd.DataFrame, max_width: float | None) -> pd.Series:
    """Released tracts whose p25 interval is wider than ``max_width`` (none without intervals)."""
    if max_width is None or "p25_lo" not in table.columns:
        return pd.Series(False, index=table.index)
    width = table["p25_hi"] - table["p25_lo"]
    return (table["status"] == "released") & (width > max_width)


def write_map(table: gpd.GeoDataFrame, path: Path, title: str,
              max_width: float | None = None) -> None:
    """The p25 choropleth; suppressed and failed tracts grey; with intervals, tracts whose
    interval is wider than ``max_width`` hatched as low reliability (in the legend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(7, 8))
    released = table[table["status"] == "released"]
    other = table[table["status"] != "released"]
    if len(other):
        other.plot(ax=ax, color="#dddddd", linewidth=0.1, edgecolor="white")
    if len(released):
        released.plot(ax=ax, column="p25", cmap="RdYlBu", vmin=0.2, vmax=0.6, linewidth=0.1,
                      edgecolor="white", legend=True,
                      legend_kwds={"label": "p25: child rank at parent rank 25 (DP)",
                                   "shrink": 0.6})
    handles = [Patch(facecolor="#dddddd", label="suppressed or failed")]
    weak = table[low_reliability(table, max_width)]
    if len(weak):
        weak.plot(ax=ax, facecolor="none", hatch="////", edgecolor="#555555", linewidth=0.0)
        handles.append(Patch(facecolor="white", edgecolor="#555555", hatch="////",
                             label=f"low reliability: interval wider than {max_width:g}"))
    ax.legend(handles=handles, loc="lower left", fontsize=7, frameon=False)
    ax.set_axis_off()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def release_folder(root: Path, release_id: str) -> Optional[Path]:
    """``<root>/<id>`` if it is a real folder, None if nothing is there.

    A symbolic link (dangling or not) or a non-folder at that name is refused: a release
    folder is only ever made by the rename in :func:`write_release`, and ``exists()`` would
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
    return re.compile(r"^\.staging-" + re.escape(release_id) + r"-\d+$")


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
        stale += [p for p in Path(root).iterdir() if pattern.match(p.name)]
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


def _write_files(staging: Path, table: gpd.GeoDataFrame, config: dict, release_id: str) -> None:
    table.to_parquet(staging / "tracts.parquet", index=False)
    table.to_crs("EPSG:4326").to_file(staging / "tracts.geojson", driver="GeoJSON")
    pd.DataFrame(table.drop(columns="geometry")).to_csv(staging / "tracts.csv", index=False)
    ci = config.get("intervals") or {}
    write_map(table, staging / "p25_map.png",
              f"Release {release_id}: p25 by tract ({int((table.status == 'released').sum())}"
              f" of {len(table)} released)",
              ci.get("low_reliability_width") if ci.get("enabled") else None)
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True,
                                                    default=_json))


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


def write_release(table: gpd.GeoDataFrame, manifest: dict, root: Path, release_id: str, *,
                  config: dict, internal_dir: Optional[Path] = None,
                  check_lease: Optional[Callable[[], None]] = None) -> Path:
    """Write the files and ``config`` (as config.json) into a staging folder outside the
    publish tree, hash them into the manifest, then rename the folder to ``<root>/<id>``.

    ``internal_dir``: the release's internal folder (staging goes there when it shares the
    root's file system). ``check_lease``: called right before the rename; it raises when this
    run no longer holds the release (then nothing becomes visible).
    """
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
        _write_files(staging, table, config, release_id)
        manifest = {**manifest, "files": {f: {"sha256": sha256_file(staging / f),
                                              "bytes": (staging / f).stat().st_size}
                                          for f in PUBLISHED_FILES}}
        (staging / MANIFEST_FILE).write_text(_strict_json(manifest))
        for f in (*PUBLISHED_FILES, MANIFEST_FILE):
            with open(staging / f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(staging)
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


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
