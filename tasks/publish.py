from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import pandas as pd
from prefect import get_run_logger, task

from data_contracts import validate_published
from dpatlas.allocate import BudgetPlan
from dpatlas.config import ReleaseConfig
from dpatlas.manifest import build_manifest
from dpatlas.publish import PublishError, assemble, verify_release, write_release

from .common import TASK_OPTIONS


@task(name="publish", **TASK_OPTIONS)
def publish_release(cfg: ReleaseConfig, release_id: str, result_files: list[Path],
                    boundaries: gpd.GeoDataFrame, budget: BudgetPlan, input_sha256: str,
                    random_source: str, started: str, internal: Path,
                    ledger_entry: dict) -> Path:
    final = cfg.publish.root / release_id
    if final.exists():
        # A crash after the folder became visible: it is complete (one rename), check it.
        verify_release(final)
        get_run_logger().info("release %s is already in place at %s; checked", release_id, final)
        return final
    results = pd.concat([pd.read_parquet(p) for p in result_files], ignore_index=True)
    table = assemble(results, boundaries)
    check = validate_published(pd.DataFrame(table.drop(columns="geometry")),
                               boundary_geoids=list(boundaries["geoid"]),
                               docs_dir=internal / "data_docs" / "published")
    if not check.success:
        raise PublishError("the release table breaks its output contract; nothing was "
                           f"published:\n{check.summary()}")
    manifest = build_manifest(cfg, release_id, budget, table, input_sha256, random_source,
                              started)
    manifest["output_contract"] = {"suite": check.suite, "success": True}
    manifest["ledger_entry"] = ledger_entry
    folder = write_release(table, manifest, cfg.publish.root, release_id)
    get_run_logger().info("published release %s at %s (%s)", release_id, folder,
                          manifest["counts"]["by_status"])
    return folder
