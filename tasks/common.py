"""Shared task settings."""

from prefect.cache_policies import NO_CACHE

# Prefect's API clients share one TLS context per process (every task module imports this
# one, so the Dask workers that run them do too): tasks/prefect_client.py
from . import prefect_client  # noqa: F401

# Inputs are data frames and paths to confidential data: never hash or cache them, and keep
# results in memory only (intermediate data is written to the internal folder explicitly).
# No retries by default: a task that draws noise must never run twice for one charge (a rerun
# of the release resumes it from its persisted draws instead).
TASK_OPTIONS = dict(cache_policy=NO_CACHE, persist_result=False, retries=0)


def _transient_io_error(task, task_run, state) -> bool:
    """Retry only what a retry can fix: an OS-level I/O error that is not a missing file or a
    permission problem (those need the operator). Contract breaks, ledger refusals and bugs
    fail at once, with their message."""
    err = state.result(raise_on_failure=False)
    return (isinstance(err, OSError)
            and not isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError,
                                     NotADirectoryError, FileExistsError)))


# For tasks that draw no noise and are safe to repeat (ingest, validate, write, feed): a
# transient file-system or network-file-system error is retried twice.
RETRY_IO = dict(TASK_OPTIONS, retries=2, retry_delay_seconds=2,
                retry_condition_fn=_transient_io_error)
