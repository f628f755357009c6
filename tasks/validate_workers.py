"""The validation tasks run on the release's Dask workers (``runner: dask``,
flows/validation.py). The partition's task has the local runner's task's name,
``validate_partition`` (in its own module), so a run's stages read the same whichever runner
ran it (benchmarks/bench_national.py groups task runs by function name)."""

from __future__ import annotations

from prefect import get_run_logger, task

from dpatlas.core.config import InputConfig
from dpatlas.release.contribution_buckets import repeated_in_bucket
from dpatlas.release.validate import input_column_names
from dpatlas.release.validate_parts import ValidatedPart, validate_part

from .common import RETRY_IO
from .ingest import ingest_partition


@task(name="validate", task_run_name="validate-{key}", **RETRY_IO)
def validate_partition(cfg: InputConfig, policy: str, key: str, internal: str, where: str,
                       docs_index: str, hash_ids: bool,
                       cells: tuple[str | None, ...] | None = None) -> ValidatedPart:
    """One partition read, checked in a GX project of its own and staged at ``where``, on
    a worker (:func:`dpatlas.release.validate_parts.validate_part`); the flow records it."""
    part = validate_part(ingest_partition(cfg, key, cells), policy, key, internal, where,
                         docs_index, input_column_names(cfg.columns), hash_ids)
    if part.report is not None:
        get_run_logger().info("partition %s: %d rows valid, %d quarantined, %d clipped, "
                              "%d dropped", key, part.report["rows_out"],
                              part.report["quarantined"], part.report["clipped"],
                              part.report["dropped"])
    return part


@task(name="contribution-bucket", task_run_name="contribution-bucket-{bucket}", **RETRY_IO)
def find_repeated(bucket: int, folders: list[str]) -> dict:
    """The records with a repeated (person, cell) hash in one bucket of every partition."""
    return repeated_in_bucket(bucket, folders)
