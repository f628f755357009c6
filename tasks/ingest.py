from __future__ import annotations

import pandas as pd
from prefect import get_run_logger, task

from dpatlas.core.config import InputConfig
from dpatlas.release.ingest import Partition, partitions, read_partition

from .common import RETRY_IO


@task(name="list-partitions", **RETRY_IO)
def list_partitions(cfg: InputConfig) -> list[Partition]:
    parts = partitions(cfg)
    get_run_logger().info("input %s: %d partition(s), %d rows", cfg.path, len(parts),
                          sum(p.rows for p in parts))
    return parts


def ingest_partition(cfg: InputConfig, key: str,
                     cells: tuple[str | None, ...] | None = None) -> pd.DataFrame:
    """One partition in the pipeline's columns (called inside the ``validate`` task);
    ``cells``: those of a split partition, as listed."""
    df = read_partition(cfg, key, cells)
    get_run_logger().info("partition %s: read %d rows", key, len(df))
    return df
