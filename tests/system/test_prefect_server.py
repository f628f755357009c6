"""The persistent local Prefect server (issue 21, item 3): `dpatlas server start`, two releases
that use it, their runs still listed by its API afterwards, the budget automation built from
the deployments it holds, `dpatlas server stop`. One server start for the whole test."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
from tests.support.cli import ENV, run_subprocess
from tests.support.inputs import write_config
from tests.support.prefect_server import free_port

pytestmark = pytest.mark.slow


def _flow_runs(url: str) -> dict:
    from prefect.client.orchestration import get_client

    from deploy.api import use_api

    with use_api(url), get_client(sync_client=True) as client:
        return {run.name: run for run in client.read_flow_runs()}


def _install_automation_over(url: str, config: Path):
    """Register the two deployments of ``config`` and two more (one of the dataset, one of
    another), then build the budget automation on the server; returns it and the ids."""
    from prefect.client.orchestration import get_client

    from deploy.api import use_api
    from deploy.automations import budget_automation_name, dataset_tag, install_budget_automation
    from deploy.serve import build_deployments, release_with_result

    with use_api(url):
        ids = {d.name: d.apply() for d in build_deployments(str(config))}
        ids["extra"] = release_with_result.to_deployment(
            "extra", tags=[dataset_tag("il")]).apply()
        other = release_with_result.to_deployment("other", tags=[dataset_tag("oh")]).apply()
        install_budget_automation("il")
        install_budget_automation("il")  # installed again: replaced, not doubled
        with get_client(sync_client=True) as client:
            autos = client.read_automations_by_name(budget_automation_name("il"))
    return autos, ids, other


def _state_config(tmp_path: Path, tracts: int, counties: int, **more) -> Path:
    """A synthetic state of ``tracts`` tracts and the config releasing it (``more``: more keys)."""
    data = tmp_path / "data"
    write_synthetic(data, ["17"], seed=5, params=StateParams(n_tracts=tracts, counties=counties))
    return write_config(tmp_path / "config.yaml", {
        "input": {"path": str(data / "microdata")},
        "boundaries": {"path": str(data / "tracts.parquet")},
        "selection": {"rule": "dp", "threshold": 3.0},
        "publish": {"root": str(tmp_path / "releases")},
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"}, **more})


def test_run_history_survives_releases_on_the_dpatlas_server(tmp_path):
    config = _state_config(tmp_path, 40, 3, partition_tracts=20,
                           ledger={"url": f"sqlite:///{tmp_path / 'ledger.db'}", "dataset": "il"})
    home = tmp_path / "prefect-home"
    env = {**ENV, "PREFECT_HOME": str(home)}
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"

    started = run_subprocess("server", "start", "--port", port, env=env)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"started: Prefect server at {url}" in started.stdout
        status = run_subprocess("server", "status", env=env)
        assert status.returncode == 0 and "healthy" in status.stdout, status.stdout
        # the UI served at this port calls the API at this port (issue 33: it called 4200)
        import httpx

        ui = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=10).json()
        assert ui["api_url"] == url, ui

        for rid in ("hist-1", "hist-2"):
            res = run_subprocess("release", "-c", config, "--release-id", rid, env=env)
            assert res.returncode == 0, res.stdout + res.stderr
            assert f"Prefect: the dpatlas server at {url} (run history kept in {home})" \
                in res.stderr, res.stderr
        runs = _flow_runs(url)  # after both commands ended: the server kept their runs
        for rid in ("hist-1", "hist-2"):
            assert runs[f"release-{rid}"].state.is_completed()
            assert runs[f"select-estimate-{rid}"].parent_task_run_id is not None

        autos, ids, other = _install_automation_over(url, config)
        [auto] = autos
        assert auto.trigger.match.root == {"dpatlas.budget.over-80-percent": "true",
                                           "dpatlas.dataset": "il"}
        assert sorted(ids) == ["extra", "operator-rerun", "scheduled-release"]
        assert {a.type for a in auto.actions} == {"pause-deployment"}
        assert {a.deployment_id for a in auto.actions} == set(ids.values())
        assert other not in {a.deployment_id for a in auto.actions}
    finally:
        stopped = run_subprocess("server", "stop", env=env)
    assert stopped.returncode == 0 and f"stopped the Prefect server at {url}" in stopped.stdout
    assert run_subprocess("server", "status", env=env).returncode == 1
    assert (home / "prefect.db").is_file()


def test_a_plain_release_runs_on_a_server_started_on_another_port_and_home(tmp_path):
    """Issue 33's done-when: `dpatlas server start --port P --home H`, then a plain `dpatlas
    release` (nothing exported), then the API at port P lists the release's flow runs."""
    import httpx

    config = _state_config(tmp_path, 20, 2)
    # a home of its own for ~/.dpatlas-prefect, where a release looks first
    env = {k: v for k, v in ENV.items() if k != "PREFECT_HOME"}
    env["HOME"] = str(tmp_path / "user")
    (tmp_path / "user").mkdir()
    home, port = tmp_path / "server home", free_port()
    url = f"http://127.0.0.1:{port}/api"
    started = run_subprocess("server", "start", "--port", port, "--home", home, env=env)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        res = run_subprocess("release", "-c", config, "--release-id", "plain-1", env=env)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"Prefect: the dpatlas server at {url}" in res.stderr, res.stderr
        runs = httpx.post(f"{url}/flow_runs/filter", json={"limit": 50}, timeout=30).json()
        names = {run["name"]: run["state"]["type"] for run in runs}
        assert names.get("release-plain-1") == "COMPLETED", names
    finally:
        stopped = run_subprocess("server", "stop", "--home", home, env=env)
    assert stopped.returncode == 0, stopped.stdout
