"""Prefect as operators run it (issue 21, item 3), without a Prefect server: which API a
release uses, an unreachable one as an operator error, the budget automation's definition,
the dataset tag on every deployment, and `dpatlas rerun`'s advice for the serve and the worker
setups. tests/system/test_prefect_server.py runs the persistent server itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402
from tests.support.cli import run_in_process  # noqa: E402
from tests.support.inputs import write_config  # noqa: E402
from tests.support.paths import REPO  # noqa: E402
from tests.support.prefect_server import free_port  # noqa: E402


@pytest.fixture(scope="module")
def small_state(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=5, params=StateParams(n_tracts=30, counties=3))
    return out


def make_config(tmp: Path, data: Path) -> Path:
    return write_config(tmp / "config.yaml", {
        "input": {"path": str(data / "microdata")},
        "boundaries": {"path": str(data / "tracts.parquet")},
        "selection": {"rule": "dp", "threshold": 3.0},
        "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
        "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"},
        "schedule": {"cron": "0 3 1 * *"}})


# --- item 6: an unreachable API is the operator's to fix --------------------------------------

def test_a_dead_prefect_api_url_is_an_operator_error_naming_it_before_ingest(small_state,
                                                                            tmp_path):
    url = f"http://127.0.0.1:{free_port()}/api"
    config = make_config(tmp_path, small_state)
    res = run_in_process("release", "-c", config, "--release-id", "dead-api",
                         env={"PREFECT_API_URL": url, "COLUMNS": "200"})
    said = " ".join(res.stdout.split())
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"error: the Prefect API at {url} (PREFECT_API_URL) does not answer" in said, said
    assert "internal error" not in said and "Traceback" not in res.stderr
    assert not (tmp_path / "internal").exists()  # checked before ingest: nothing staged
    assert not (tmp_path / "releases" / "dead-api").exists()


# --- item 1: which server a release uses ------------------------------------------------------

def test_a_release_uses_the_recorded_server_while_it_runs_else_a_temporary_one(tmp_path,
                                                                              monkeypatch):
    from dpatlas.cli import prefect_server as PS

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    record = tmp_path / "dpatlas-server.json"
    url = f"http://127.0.0.1:{free_port()}/api"

    # recorded and its process alive (a stand-in for `prefect server`): used, and checked
    # before the first call
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "prefect",
                              "server"])
    try:
        record.write_text(json.dumps({"pid": alive.pid, "url": url, "port": 0}))
        with PS.prefect_api() as api:
            assert api.url == url and os.environ["PREFECT_API_URL"] == url
            assert api.used == f"the dpatlas server at {url} (run history kept in {tmp_path})"
            with pytest.raises(PS.PrefectAPIUnreachable,
                               match=f"the Prefect API at {url} .*`dpatlas server stop`"):
                api.ready()
        assert "PREFECT_API_URL" not in os.environ
    finally:
        alive.kill()
        alive.wait()

    # a recorded pid that now runs another program (after a reboot): not the server
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record.write_text(json.dumps({"pid": other.pid, "url": url, "port": 0}))
        assert not PS.read_server_record().running()
    finally:
        other.kill()
        other.wait()

    # recorded, but its process is gone: a temporary server, and the command says so
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    record.write_text(json.dumps({"pid": dead.pid, "url": url, "port": 0}))
    with PS.prefect_api() as api:
        assert api.url != url
        assert api.used.startswith(f"a temporary Prefect server at {api.url}: its run history "
                                   "ends with this command (`dpatlas server start` keeps it)")


# --- item 4: the budget automation pauses every deployment of the dataset ---------------------

def test_the_budget_automation_pauses_every_deployment_of_its_dataset():
    from prefect.events.actions import PauseDeployment
    from prefect.events.schemas.automations import AutomationCore

    from deploy.automations import budget_automation
    from dpatlas.release.events import BUDGET_LABEL, DATASET_LABEL, PUBLISHED

    ids = [uuid.uuid4() for _ in range(3)]
    built = budget_automation("il", ids)
    # what the server receives, read back as Prefect's own model
    auto = AutomationCore.model_validate_json(built.model_dump_json())
    assert auto.trigger.expect == {PUBLISHED}
    assert auto.trigger.match.root == {BUDGET_LABEL: "true", DATASET_LABEL: "il"}
    assert all(isinstance(a, PauseDeployment) and a.source == "selected" for a in auto.actions)
    assert [a.deployment_id for a in auto.actions] == ids
    with pytest.raises(ValueError, match="no deployment of dataset il"):
        budget_automation("il", [])


def test_every_deployment_carries_its_dataset_tag(small_state, tmp_path):
    from deploy.automations import dataset_tag
    from deploy.serve import build_deployments

    assert dataset_tag("il") == "dpatlas-dataset:il"
    for deployment in build_deployments(str(make_config(tmp_path, small_state))):
        assert dataset_tag("il") in deployment.tags
    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    for deployment in spec["deployments"]:
        assert dataset_tag("{{ $DPATLAS_DATASET }}") in deployment["tags"]


def test_the_example_automations_are_prefects_model_and_name_no_single_pause():
    """The YAML keeps the failed-release hook; the budget pause is built (it names ids)."""
    from prefect.events.schemas.automations import AutomationCore

    spec = yaml.safe_load((REPO / "deploy" / "automations.yaml").read_text())
    autos = [AutomationCore.model_validate(a) for a in spec["automations"]]
    assert [a.type for auto in autos for a in auto.actions] == ["do-nothing"]


# --- item 5: `dpatlas rerun`'s advice for both setups -----------------------------------------

def _deployment(pool, paused, status="READY"):
    from prefect.client.schemas.objects import DeploymentStatus

    return SimpleNamespace(work_pool_name=pool, paused=paused,
                           status=DeploymentStatus(status))


@pytest.mark.parametrize("pool, paused, status, says, never", [
    # serve setup, paused: the serve process stopped, or the automation: both ways said
    (None, True, "READY",
     ["python -m deploy.serve --config /c/r.yaml", "serving resumes its deployments",
      "dpatlas ledger show -c /c/r.yaml", "python -m deploy.automations resume --config "
      "/c/r.yaml"], ["prefect worker start"]),
    (None, False, "NOT_READY",
     ["status NOT_READY", "python -m deploy.serve --config /c/r.yaml"],
     ["prefect worker start", "deploy.automations resume"]),
    # worker setup: paused only by the automation or by hand; a missing worker
    ("dpatlas", True, "READY",
     ["paused, by the budget automation or by hand", "dpatlas ledger show -c /c/r.yaml",
      "python -m deploy.automations resume --config /c/r.yaml"],
     ["deploy.serve", "prefect worker start"]),
    ("dpatlas", False, "NOT_READY",
     ["no worker of work pool dpatlas", "prefect worker start --pool dpatlas"],
     ["deploy.serve", "deploy.automations resume"]),
])
def test_rerun_advice_fits_the_setup(pool, paused, status, says, never):
    from deploy.trigger import not_served_advice

    advice = not_served_advice(_deployment(pool, paused, status), Path("/c/r.yaml"))
    for text in says:
        assert text in advice, advice
    for text in never:
        assert text not in advice, advice
    assert "prefect deployment resume`" not in advice.replace("no `prefect deployment resume`",
                                                              "")
