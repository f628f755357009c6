"""Deployments end to end: a real Prefect server, `python -m deploy.serve`, an operator rerun.

The slow test starts ``prefect server start`` and ``python -m deploy.serve`` as subprocesses
(each in its own process group, always killed), registers both deployments, checks the cron
schedule, triggers ``operator-rerun`` through the API with :func:`trigger_release` and waits
for the published manifest. The quick tests check the deployments' definitions and the
errors that tell an operator what to start, without a server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

import pytest
import yaml

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402
from tests.support.paths import REPO

ROOT = REPO  # the checkout
VENV_BIN = Path(sys.executable).parent
CRON = "0 3 1 * *"


# --- helpers ----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp: Path, data: Path, **over) -> Path:
    from tests.support.inputs import set_test_cap

    cfg = {
        "input": {"path": str(data / "microdata"), "columns": {"person_id": "person_id"}},
        "boundaries": {"path": str(data / "tracts.parquet")},
        "selection": {"rule": "dp", "threshold": 3.0},
        "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
        "schedule": {"cron": CRON},
        **over,
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    set_test_cap(path)
    return path


class Proc:
    """A subprocess in its own session (process group), its output in a log file."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path,
                 cwd: Path = ROOT):
        self.name, self.log = name, log
        self._out = open(log, "wb")
        self.p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=self._out,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True)

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the whole group, SIGKILL after ``grace`` seconds."""
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.p.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.p.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the group may outlive its leader (flow-run subprocesses): make sure it is gone
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._out.close()

    def tail(self, lines: int = 150) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError as err:
            return f"(no log: {err})"
        return "\n".join(text[-lines:])


def wait_until(check: Callable[[], object], timeout: float, what: str,
               procs: tuple[Proc, ...] = (), interval: float = 1.0):
    """Poll ``check`` until it returns something truthy; fail if a process dies or time runs
    out (the last exception ``check`` raised is in the message)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise AssertionError(f"{p.name} exited ({p.p.returncode}) while waiting for "
                                     f"{what}")
        try:
            value = check()
            if value:
                return value
        except Exception as err:  # noqa: BLE001 - not there yet; keep the latest reason
            last = err
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def health(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=5) as r:
        return r.read().strip() == b"true"


def base_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k not in ("PYTEST_CURRENT_TEST",)}
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return env


def run_artifacts(url: str, flow_run_id: str) -> dict:
    """The flow run's artifacts by key (the latest of each)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from deploy.api import use_api

    with use_api(url), get_client(sync_client=True) as client:
        found = client.read_artifacts(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[flow_run_id])))
    return {a.key: a for a in sorted(found, key=lambda a: a.created)}


def release_events(url: str, name: str, release_id: str) -> list:
    """Events named ``name`` about release ``release_id`` (the resource dpatlas.release.ID)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    from deploy.api import use_api

    with use_api(url), get_client(sync_client=True) as client:
        page = client.read_events(EventFilter(
            event=EventNameFilter(name=[name]),
            resource=EventResourceFilter(id=[f"dpatlas.release.{release_id}"])), limit=50)
    return page.events


# --- quick tests: definitions and operator errors, no server -----------------------------------

def test_prefect_yaml_declares_both_deployments():
    """`prefect deploy --all` registers the same two deployments as `deploy.serve`, with
    parameters the flow accepts and an entrypoint that loads."""
    from prefect.flows import load_flow_from_entrypoint

    from deploy.serve import OPERATOR, SCHEDULED

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    assert set(deployments) == {SCHEDULED, OPERATOR}
    for d in deployments.values():
        flow = load_flow_from_entrypoint(str(ROOT / d["entrypoint"]))
        assert flow.name == "dpatlas-release" and flow.persist_result is True
        assert set(d["parameters"]) <= set(flow.parameters.properties)
        assert d["work_pool"]["job_variables"]["env"]["PREFECT_TASKS_DEFAULT_PERSIST_RESULT"] \
            == "false"
        assert d["concurrency_limit"] == 1
    assert deployments[SCHEDULED]["schedules"][0]["cron"] == "{{ $DPATLAS_CRON }}"
    assert deployments[OPERATOR]["schedules"] == []
    assert deployments[OPERATOR]["parameters"]["release_id"] is None


def test_the_docs_name_prefect_yamls_work_pool_and_variables():
    """deploy/README's Python example named a pool "dpatlas-pool" where prefect.yaml declares
    "dpatlas", and prefect.yaml's header left out DPATLAS_HOME, which its pull step needs
    (issue 33): every pool the docs name is prefect.yaml's, every variable it reads is in its
    header."""
    import re

    text = (ROOT / "prefect.yaml").read_text()
    pool = yaml.safe_load(text)["definitions"]["work_pool"]["name"]
    readme = (ROOT / "deploy" / "README.md").read_text()
    named = set(re.findall(r'work_pool_name="([^"]+)"', readme))
    named |= set(re.findall(r"work-pool create (\w[\w-]*)", readme + text))
    named |= set(re.findall(r"worker start --pool (\w[\w-]*)", readme + text))
    assert named == {pool}
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    used = set(re.findall(r"\$(DPATLAS_[A-Z_]+)", text.split("name:", 1)[1]))
    assert used and {v for v in used if f"export {v}=" not in header
                     and f" {v}=" not in header} == set()


def test_automations_file_matches_the_events_the_flow_emits():
    """deploy/automations.yaml is what `prefect automation create --from-file` accepts (its
    own model), and triggers on the names and labels dpatlas/release/events.py emits. (The
    budget automation is built by deploy/automations.py, which names every deployment of the
    dataset: tests/integration/test_prefect_operations.py, tests/system/test_prefect_server.py.)"""
    from prefect.events.schemas.automations import AutomationCore

    from dpatlas.release.events import FAILED

    spec = yaml.safe_load((ROOT / "deploy" / "automations.yaml").read_text())
    autos = {a["name"]: AutomationCore.model_validate(a) for a in spec["automations"]}
    assert autos["dpatlas-release-failed"].trigger.expect == {FAILED}


def test_build_deployments(tmp_path):
    from deploy.serve import build_deployments

    data = tmp_path / "data"
    data.mkdir()
    cfg = write_config(tmp_path, data, schedule={"cron": CRON, "timezone": "America/Chicago"})
    scheduled, operator = build_deployments(str(cfg))
    assert (scheduled.name, operator.name) == ("scheduled-release", "operator-rerun")
    assert scheduled.flow_name == operator.flow_name == "dpatlas-release"
    assert scheduled.parameters == {"config_path": str(cfg.resolve())}
    assert operator.parameters == {"config_path": str(cfg.resolve()), "release_id": None}
    [s] = scheduled.schedules
    assert (s.schedule.cron, s.schedule.timezone) == (CRON, "America/Chicago")
    assert operator.schedules == []
    assert scheduled.entrypoint.endswith("deploy/serve.py:release_with_result")

    # No cron: the scheduled deployment exists without a schedule (clearing an old one).
    cfg = write_config(tmp_path, data, schedule={"cron": None})
    scheduled, _ = build_deployments(str(cfg))
    assert scheduled.schedules == []


def test_build_deployments_rejects_bad_schedule(tmp_path):
    from deploy.serve import build_deployments
    from dpatlas.core.config import ConfigError

    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(ConfigError, match="schedule.cron"):
        build_deployments(str(write_config(tmp_path, data, schedule={"cron": "every day"})))
    with pytest.raises(ConfigError, match="schedule.timezone"):
        build_deployments(str(write_config(tmp_path, data,
                                           schedule={"cron": CRON, "timezone": "Mars/Base"})))


def test_trigger_without_server_says_how_to_start_it(tmp_path, monkeypatch):
    from deploy.trigger import PrefectAPIUnavailable, trigger_release

    data = tmp_path / "data"
    data.mkdir()
    cfg = write_config(tmp_path, data)
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{free_port()}/api")
    with pytest.raises(PrefectAPIUnavailable, match="prefect server start"):
        trigger_release(str(cfg), "r1", timeout=5)


# --- the end-to-end test -----------------------------------------------------------------------

@pytest.mark.slow
def test_serve_and_operator_rerun(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import DeploymentStatus

    from deploy.api import use_api
    from deploy.trigger import DeploymentNotRegistered, DeploymentNotServed, trigger_release

    t0 = time.monotonic()
    data = tmp_path / "data"
    write_synthetic(data, ["17"], seed=5, params=StateParams(n_tracts=40, counties=3))
    cfg = write_config(tmp_path, data).resolve()
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    rid = "deploy-rerun-1"

    server = serve = None
    procs: list[Proc] = []
    try:
        # 1. A real Prefect server (PREFECT_API_URL unset for it).
        server = Proc("prefect server",
                      [str(VENV_BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                       "--port", str(port)],
                      base_env(tmp_path / "server-home"), tmp_path / "server.log")
        procs.append(server)
        wait_until(lambda: health(port), 150, "the server's /api/health", (server,))
        print(f"server healthy after {time.monotonic() - t0:.1f}s")

        monkeypatch.setenv("PREFECT_API_URL", url)  # restored by monkeypatch afterwards
        with pytest.raises(DeploymentNotRegistered, match="python -m deploy.serve"):
            trigger_release(str(cfg), rid, timeout=5)

        # 2. Serve both deployments.
        env = base_env(tmp_path / "serve-home")
        env.update(PREFECT_API_URL=url, PREFECT_RUNNER_POLL_FREQUENCY="2")
        serve = Proc("deploy.serve", [sys.executable, "-m", "deploy.serve", "--config", str(cfg)],
                     env, tmp_path / "serve.log")
        procs.append(serve)

        def registered():
            with use_api(url), get_client(sync_client=True) as client:
                deps = {n: client.read_deployment_by_name(f"dpatlas-release/{n}")
                        for n in ("scheduled-release", "operator-rerun")}
            op = deps["operator-rerun"]
            return deps if op.status == DeploymentStatus.READY and not op.paused else None

        deps = wait_until(registered, 120, "both deployments registered and served",
                          (server, serve))
        print(f"deployments served after {time.monotonic() - t0:.1f}s")
        sched, op = deps["scheduled-release"], deps["operator-rerun"]
        assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in sched.schedules] == \
            [(CRON, "UTC", True)]
        assert sched.parameters == {"config_path": str(cfg)}
        assert op.schedules == []
        assert op.parameters == {"config_path": str(cfg), "release_id": None}

        # 3. An operator rerun through the API, executed by the serve process.
        out = trigger_release(str(cfg), rid, timeout=240)
        print(f"flow run finished after {time.monotonic() - t0:.1f}s: {out}")
        assert out.state == "COMPLETED", out
        assert out.flow_run_name == f"release-{rid}"  # named by the flow, from the release id
        folder = Path(cfg.parent / "releases" / rid)
        # the typed result, read back from the flow's persisted result (JSON, in the serving
        # side's storage), not inferred from the release id
        assert out.outcome is not None and out.outcome.status == "published"
        assert Path(out.outcome) == folder and (folder / "manifest.json").is_file()
        assert out.outcome.budget.spent_epsilon == pytest.approx(1.0)
        stored = [f.read_text() for f in (tmp_path / "serve-home" / "storage").iterdir()]
        assert any("dpatlas.release.outcome.ReleaseOutcome" in text and rid in text for text in stored)
        with use_api(url), get_client(sync_client=True) as client:
            run = client.read_flow_run(out.flow_run_id)
        assert run.state.is_completed()
        assert run.deployment_id == op.id
        assert run.parameters["release_id"] == rid

        # ... its summary and per-mechanism table are artifacts of the run, and it emitted
        # `dpatlas.release.published` with the deployment as a related resource
        artifacts = run_artifacts(url, out.flow_run_id)
        assert artifacts["dpatlas-release-summary"].type == "markdown"
        summary = artifacts["dpatlas-release-summary"].data
        assert f"# Release {rid}" in summary and "spent 1 of 10" in summary
        assert "manifest.json" in summary and "Published by this run" in summary
        table = artifacts["dpatlas-release-mechanisms"]
        assert table.type == "table"
        rows = json.loads(table.data) if isinstance(table.data, str) else table.data
        assert sum(r["tract-cells"] for r in rows) == sum(out.outcome.by_mechanism.values())
        (published,) = wait_until(lambda: release_events(url, "dpatlas.release.published", rid),
                                  60, "the published event", (server, serve))
        assert published.resource["dpatlas.budget.over-80-percent"] == "false"
        assert published.payload["share_spent"] == pytest.approx(0.1)
        assert f"prefect.deployment.{op.id}" in {r.id for r in published.related}

        # 3b. `dpatlas rerun` of the published id: a human summary, nothing charged
        cli = subprocess.run([str(VENV_BIN / "dpatlas"), "rerun", rid, "-c", str(cfg),
                              "--timeout", "240"], cwd=ROOT, env={**env, "COLUMNS": "200"},
                             capture_output=True, text=True, timeout=300)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        said = " ".join(cli.stdout.split())
        assert f"release {rid} was already published" in said, said
        assert "nothing new published, nothing charged" in said

        # 3c. A release over the cap is refused before any noise: a failed run, the
        # `dpatlas.release.refused` event, and the command line says nothing was charged
        from dpatlas.core.config import load_config
        from dpatlas.ledger import Ledger

        ledger_cfg = load_config(cfg).ledger
        Ledger(ledger_cfg.url).set_cap(ledger_cfg.dataset, 1.5, 1e-5,
                                       reason="test: leave less than one release")
        cli = subprocess.run([str(VENV_BIN / "dpatlas"), "rerun", "over-cap", "-c", str(cfg),
                              "--timeout", "240"], cwd=ROOT, env={**env, "COLUMNS": "200"},
                             capture_output=True, text=True, timeout=300)
        assert cli.returncode == 1, cli.stdout + cli.stderr
        said = " ".join(cli.stdout.split())
        assert "nothing was published by this run" in said, said
        assert "nothing was charged: the ledger has no release over-cap" in said, said
        (refused,) = wait_until(lambda: release_events(url, "dpatlas.release.refused",
                                                       "over-cap"),
                                60, "the refused event", (server, serve))
        assert "cap" in refused.payload["message"]

        # 4. Once serving stops, a trigger is refused instead of queueing a run. A graceful
        # stop pauses the deployment at once; one that had to be killed (a loaded machine:
        # seen in CI with an evaluation running beside it) is marked NOT_READY by the server
        # about a minute after its last poll. Wait for either, then trigger.
        serve.stop()

        def not_served():
            with use_api(url), get_client(sync_client=True) as client:
                d = client.read_deployment_by_name("dpatlas-release/operator-rerun")
            return d.paused or d.status != DeploymentStatus.READY

        wait_until(not_served, 150, "the operator deployment paused or not ready", (server,))
        with pytest.raises(DeploymentNotServed, match="python -m deploy.serve"):
            trigger_release(str(cfg), "deploy-rerun-2", timeout=5)
        print(f"done after {time.monotonic() - t0:.1f}s")
    except BaseException:
        for p in procs:
            print(f"\n===== {p.name} log ({p.log}) =====\n{p.tail()}")
        raise
    finally:
        for p in procs:
            p.stop()
