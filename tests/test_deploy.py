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

from dpatlas.synth import StateParams, write_synthetic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
CRON = "0 3 1 * *"


# --- helpers ----------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp: Path, data: Path, **over) -> Path:
    from conftest import set_test_cap

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


# --- quick tests: definitions and operator errors, no server -----------------------------------

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
    from dpatlas.config import ConfigError

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
        assert out["state"] == "COMPLETED", out
        folder = Path(cfg.parent / "releases" / rid)
        assert out["result"] == str(folder)
        assert (folder / "manifest.json").is_file()
        # ... read back from the flow's persisted result (JSON, in the serving side's storage),
        # not only inferred from the release id
        stored = [f.read_text() for f in (tmp_path / "serve-home" / "storage").iterdir()]
        assert json.dumps(str(folder)) in stored
        with use_api(url), get_client(sync_client=True) as client:
            run = client.read_flow_run(out["flow_run_id"])
        assert run.state.is_completed()
        assert run.deployment_id == op.id
        assert run.parameters["release_id"] == rid

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
