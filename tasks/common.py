"""Shared task settings."""

from prefect.cache_policies import NO_CACHE

# Inputs are data frames and paths to confidential data: never hash or cache them, and keep
# results in memory only (intermediate data is written to the internal folder explicitly).
TASK_OPTIONS = dict(cache_policy=NO_CACHE, persist_result=False, retries=0)
