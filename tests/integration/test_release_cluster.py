"""One Dask cluster per release (issue 35): flows/cluster.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from prefect.task_runners import ThreadPoolTaskRunner


def _cfg(**over):
    return SimpleNamespace(**{"runner": "dask", "dask_address": None, "dask_workers": 1,
                              **over})


def test_runner_dask_without_an_address_starts_one_local_cluster_closed_on_failure():
    from distributed import Client

    from flows.cluster import release_cluster, release_task_runner

    cfg = _cfg()
    with pytest.raises(RuntimeError, match="a stage failed"):
        with release_cluster(cfg) as address:
            with Client(address, timeout=30) as client:
                assert len(client.scheduler_info()["workers"]) == cfg.dask_workers
            # every subflow connects to this cluster; none starts one of its own
            for _ in range(2):
                runner = release_task_runner(cfg, address)
                assert runner.address == address and not runner.cluster_kwargs
            raise RuntimeError("a stage failed")
    with pytest.raises(OSError):  # closed on the way out, also on failure
        Client(address, timeout=2)


def test_a_given_scheduler_is_used_and_the_local_runner_starts_no_cluster():
    from flows.cluster import release_cluster, release_task_runner

    given = _cfg(dask_address="tcp://10.0.0.5:8786")
    with release_cluster(given) as address:
        assert address == "tcp://10.0.0.5:8786"
        assert release_task_runner(given, address).address == address
    local = _cfg(runner="local")
    with release_cluster(local) as address:
        assert address is None
        runner = release_task_runner(local, address)
        assert isinstance(runner, ThreadPoolTaskRunner) and runner._max_workers == 2


def test_the_release_runner_submits_each_task_run_under_a_key_of_its_own(monkeypatch):
    """flows/keyed_dask.py: task runs reach Dask under the task's name and a fresh UUID, so
    ``distributed.Client.submit`` never hashes their arguments (``dask.tokenize``, the flow's
    cost per task run that this runner removes); results come back as with prefect-dask's."""
    import distributed.client
    from distributed import LocalCluster
    from prefect import flow, task

    from flows.cluster import release_task_runner
    from flows.keyed_dask import KeyedDaskTaskRunner

    def no_hashing(*args, **kwargs):
        raise AssertionError("Client.submit hashed a task run's arguments")

    @task(name="double")
    def double(x: int) -> int:
        return 2 * x

    keys = []

    @flow(persist_result=False)
    def doubled(values: list[int]) -> list[int]:
        futures = double.map(values)
        keys.extend(f.wrapped_future.key for f in futures)
        return [f.result() for f in futures]

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster:
        runner = release_task_runner(_cfg(), cluster.scheduler_address)
        assert isinstance(runner, KeyedDaskTaskRunner)
        monkeypatch.setattr(distributed.client, "tokenize", no_hashing)
        assert doubled.with_options(task_runner=runner)([1, 2, 3]) == [2, 4, 6]
        # the same call again: new keys, not the first run's results
        assert doubled.with_options(task_runner=runner.duplicate())([1, 2, 3]) == [2, 4, 6]
    assert len(keys) == len(set(keys)) == 6
    assert all(k.startswith("double-") and len(k) == len("double-") + 32 for k in keys), keys


def test_the_settings_are_dumped_once_per_settings_context_and_each_task_run_gets_its_flows():
    """flows/keyed_dask.py: ``SettingsContext.serialize`` dumps a context object once and
    gives that dump again (prefect-dask serializes the context for every task run); a new
    context (``temporary_settings``) is dumped afresh, and each task run on the cluster sees
    the settings of the flow that submitted it."""
    from distributed import LocalCluster
    from prefect import flow, task
    from prefect.context import SettingsContext
    from prefect.settings import (PREFECT_API_REQUEST_TIMEOUT, get_current_settings,
                                  temporary_settings)

    import flows.keyed_dask as keyed
    from flows.cluster import release_task_runner

    dumps = []
    original = keyed.PREFECT_SETTINGS_SERIALIZE  # Prefect's own

    def counted(context, include_secrets=True):
        dumps.append(context)
        return original(context, include_secrets=include_secrets)

    @task(name="timeout")
    def timeout(_: int) -> float:
        return get_current_settings().api.request_timeout

    @flow(persist_result=False)
    def timeouts(n: int) -> list[float]:
        return [f.result() for f in timeout.map(range(n))]

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=None) as cluster:
        runner = release_task_runner(_cfg(), cluster.scheduler_address)
        try:
            keyed.PREFECT_SETTINGS_SERIALIZE = counted
            keyed._last_settings.clear()
            seen = {}
            for seconds in (61.0, 62.0):
                with temporary_settings({PREFECT_API_REQUEST_TIMEOUT: seconds}):
                    before = len(dumps)
                    seen[seconds] = timeouts.with_options(task_runner=runner.duplicate())(8)
                    # eight task runs (and the flow's own start): one dump of this context
                    assert len({id(c) for c in dumps[before:]}) == len(dumps[before:]) >= 1
        finally:
            keyed.PREFECT_SETTINGS_SERIALIZE = original
            keyed._last_settings.clear()
    assert seen == {61.0: [61.0] * 8, 62.0: [62.0] * 8}
    assert len(dumps) < 16

    # the memo gives Prefect's own dump, and a second context is not given the first's
    first = SettingsContext.get()
    assert SettingsContext.serialize is keyed.serialize_settings_once
    assert first.serialize() is first.serialize()
    assert first.serialize() == original(first)
    with temporary_settings({PREFECT_API_REQUEST_TIMEOUT: 63.0}):
        second = SettingsContext.get()
        assert second is not first
        assert second.serialize()["settings"]["api"]["request_timeout"] == 63.0
    # (a dump holds the settings that were set: the first context may not set the timeout)
    assert first.serialize()["settings"].get("api", {}).get("request_timeout") != 63.0


def test_prefect_clients_share_one_tls_context_per_setting_and_keep_a_given_verify(monkeypatch):
    """tasks/prefect_client.py: a sync Prefect client is given the TLS context Prefect would
    build (CA file verified, or unverified with PREFECT_API_TLS_INSECURE_SKIP_VERIFY), built
    once per process and per setting; a ``verify`` the caller sets is kept; Prefect's own
    ``__init__`` builds a context for every client."""
    import ssl

    import certifi
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.settings import (PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY,
                                  temporary_settings)

    from tasks import prefect_client

    built = []
    create = ssl.create_default_context

    def counted(*args, **kwargs):
        built.append(kwargs.get("cafile"))
        return create(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    monkeypatch.setattr(prefect_client, "_contexts", {})
    assert SyncPrefectClient.__init__ is prefect_client._init_with_shared_tls
    clients = [SyncPrefectClient("http://127.0.0.1:1/api") for _ in range(3)]
    # one context for three clients, with Prefect's CA file (its setting, else certifi's)
    assert built == [PREFECT_API_SSL_CERT_FILE.value() or certifi.where()]
    first = prefect_client.with_shared_tls(None)["verify"]
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    with temporary_settings({PREFECT_API_TLS_INSECURE_SKIP_VERIFY: True}):
        insecure = prefect_client.with_shared_tls({})["verify"]
        assert insecure is not first and insecure.verify_mode == ssl.CERT_NONE
        assert not insecure.check_hostname
    assert prefect_client.with_shared_tls({"verify": False, "timeout": 5}) == {
        "verify": False, "timeout": 5}
    assert len(built) == 2
    for client in clients:
        client._client.close()

    # Prefect's own: a context per client
    prefect_client.use_shared_tls(False)
    try:
        SyncPrefectClient("http://127.0.0.1:1/api")._client.close()
        SyncPrefectClient("http://127.0.0.1:1/api")._client.close()
    finally:
        prefect_client.use_shared_tls(True)
    assert len(built) == 4


def test_a_subflow_called_without_heartbeat_starts_no_heartbeat_thread_of_its_own():
    """flows/cluster.py: the release's subflows run without Prefect's heartbeat thread (whose
    join costs each run's end up to a second); the calling flow keeps its own."""
    from prefect import flow
    from prefect.settings import get_current_settings

    from flows.cluster import subflow_without_heartbeat

    @flow(persist_result=False)
    def child() -> object:
        return get_current_settings().flows.heartbeat_frequency

    @flow(persist_result=False)
    def parent() -> tuple:
        own = get_current_settings().flows.heartbeat_frequency
        with subflow_without_heartbeat():
            quiet = child()
        return own, quiet, child(), get_current_settings().flows.heartbeat_frequency

    own, quiet, plain, after = parent()
    assert quiet is None
    assert own == plain == after and own is not None  # Prefect's default (180 s) elsewhere
