"""The Dask task runner of a release's subflows: prefect-dask's ``DaskTaskRunner``, with each
task run submitted under a key of its own.

Given no key, ``distributed.Client.submit`` names a call by a hash of everything it is given
(``dask.tokenize``): for a Prefect task run, a closure, the run's parameters and its serialized
context (every Prefect setting). The flow process hashed all that for every task run, about
40 ms of its CPU each (45% of its submitting, in a py-spy profile of a national release with
three cells), and to no end: every task run has an id of its own, so no two calls could share
a result. The key given instead is the task's name and a random UUID.
``benchmarks/bench_task_submission.py`` measures both runners side by side.

Imported only with ``runner: dask`` (importing ``distributed`` costs the local runner time).
"""

from __future__ import annotations

import uuid

from prefect_dask import DaskTaskRunner
from prefect_dask.task_runners import PrefectDaskFuture


def task_key(task) -> str:
    """A fresh Dask key for one run of ``task``: its name and a random UUID."""
    return f"{task.name}-{uuid.uuid4().hex}"


class KeyedDaskTaskRunner(DaskTaskRunner):
    """``DaskTaskRunner`` whose every task run reaches Dask under :func:`task_key`."""

    def submit(self, task, parameters, wait_for=None, dependencies=None):
        if not self._started:
            raise RuntimeError("The task runner must be started before submitting work.")
        future = self.client.submit(
            task, parameters=self._optimize_futures(parameters),
            wait_for=self._optimize_futures(wait_for) if wait_for else None,
            dependencies=dependencies, return_type="state", key=task_key(task))
        return PrefectDaskFuture(wrapped_future=future, task_run_id=future.task_run_id)
