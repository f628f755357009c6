"""Publishing a release: map-ready files and the accounting manifest, made visible atomically.

Files are written into a staging folder beside the release folder and moved into place with
one rename once they are complete and checked, so a reader never sees a half-written release.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd

from .estimate import RESULT_COLUMNS
from .hashing import sha256_file

PUBLISHED_FILES = ("tracts.parquet", "tracts.geojson", "tracts.csv", "p25_map.png")
TABLE_COLUMNS = ["geoid", "state", "county", "cell", "n", "mechanism", "status", "reason",
                 "p25", "p75", "p25_raw", "p75_raw", "epsilon_spent", "delta_spent"]


class PublishError(RuntimeError):
    pass


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


def write_map(table: gpd.GeoDataFrame, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax.set_axis_off()
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def verify_release(folder: Path) -> dict:
    """The manifest of a published folder, after checking every file against its sha256."""
    manifest = json.loads((folder / "manifest.json").read_text())
    bad = [f for f, info in manifest["files"].items()
           if not (folder / f).exists() or sha256_file(folder / f) != info["sha256"]]
    if bad:
        raise PublishError(f"{folder}: files do not match the manifest: {bad}")
    return manifest


def write_release(table: gpd.GeoDataFrame, manifest: dict, root: Path, release_id: str) -> Path:
    """Write the files into a staging folder, hash them, then rename it into place."""
    final = root / release_id
    if final.exists():
        raise PublishError(f"release {release_id} is already published at {final}")
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".staging-{release_id}-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        table.to_parquet(staging / "tracts.parquet", index=False)
        table.to_crs("EPSG:4326").to_file(staging / "tracts.geojson", driver="GeoJSON")
        pd.DataFrame(table.drop(columns="geometry")).to_csv(staging / "tracts.csv", index=False)
        write_map(table, staging / "p25_map.png",
                  f"Release {release_id}: p25 by tract ({int((table.status == 'released').sum())}"
                  f" of {len(table)} released)")
        manifest = {**manifest, "files": {f: {"sha256": sha256_file(staging / f),
                                              "bytes": (staging / f).stat().st_size}
                                          for f in PUBLISHED_FILES}}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, default=_json))
        os.replace(staging, final)  # atomic on one filesystem: all or nothing
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final


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
