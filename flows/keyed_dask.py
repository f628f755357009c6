"""The Dask task runner of a release's subflows: prefect-dask's ``DaskTaskRunner``, with each
task run submitted under a key of its own.

Given no key, ``distributed.Client.submit`` names a call by a hash of everything it is given
(``dask.tokenize``): for a Prefect task run, a closure, the run's parameters and its serialized
context (every Prefect setting). The flow process hashed all that for every task run, about
40 ms of its CPU each (45% of its submitting, in a py-spy profile of a national release with
three cells), and to no end: every task run has an id of its own, so no two calls could share
a result. The key given instead is the task's name and a random UUID.

prefect-dask also serializes the run's Prefect context for every task run, and most of that is
the settings (``SettingsContext.serialize``, a ``model_dump`` of every Prefect setting: about
18 ms, 80% of the context's serialization in the same profile). The settings do not change
within a flow run: :func:`serialize_settings_once` dumps a settings context once and gives the
same dump again while that context object is the current one.

``benchmarks/bench_task_submission.py`` measures both runners side by side.

Imported only with ``runner: dask`` (importing ``distributed`` costs the local runner time).
"""

from __future__ import annotations

import threading
import uuid

from prefect.context import SettingsContext
from prefect_dask import DaskTaskRunner
from prefect_dask.task_runners import PrefectDaskFuture


def task_key(task) -> str:
    """A fresh Dask key for one run of ``task``: its name and a random UUID."""
    return f"{task.name}-{uuid.uuid4().hex}"


PREFECT_SETTINGS_SERIALIZE = SettingsContext.serialize
_last_settings: list = []  # [(the context object, include_secrets, its dump)]: the last one
_settings_lock = threading.Lock()


def serialize_settings_once(self: SettingsContext, include_secrets: bool = True) -> dict:
    """``SettingsContext.serialize``, remembered for the context object it last dumped.

    A settings context is made whole (``temporary_settings`` and ``use_profile`` make a new
    object; nothing in Prefect or here changes one in place), so the same object gives the
    same dump. The dump is kept with the object itself, not its ``id``, so a new context at a
    freed address is dumped afresh. Callers pickle the dump (prefect-dask sends it to the
    worker) and do not change it."""
    with _settings_lock:
        if _last_settings:
            context, secrets, dump = _last_settings[0]
            if context is self and secrets == include_secrets:
                return dump
        dump = PREFECT_SETTINGS_SERIALIZE(self, include_secrets=include_secrets)
        _last_settings[:] = [(self, include_secrets, dump)]
        return dump


# Installed on import: this module is imported only by a release on the Dask runner.
SettingsContext.serialize = serialize_settings_once


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
