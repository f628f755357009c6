"""The ``dpatlas`` command, driven the two ways the tests need.

In-process (typer's CliRunner on ``dpatlas.cli.commands.app``) where the exit code and the
message are the whole story: an argument or config error, a refusal before any charge. In a
subprocess where the process boundary is what is tested: a signal, a crash point, the
interpreter's own exit code or traceback, a run against a real Prefect server.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import traceback

from typer.testing import CliRunner

import flows.release  # noqa: F401  (Prefect sets up its logging now, not inside a CliRunner
from dpatlas.cli.commands import app  # whose captured streams are closed when it returns)

# The subprocess's environment: no Prefect server inherited (a release starts its own).
ENV = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180", "COLUMNS": "200"}
ENV.pop("PREFECT_API_URL", None)

# In-process: a command refused before its Prefect server is needed must not need one; a dead
# URL proves it (a command that did reach Prefect fails on it).
NO_SERVER = {"PREFECT_API_URL": "http://127.0.0.1:9/api", "COLUMNS": "200"}
# In-process, a release that reaches its flow: no URL (a dead one is refused before the flow,
# exit 2), so the command starts its own temporary server.
OWN_SERVER = {"PREFECT_API_URL": None, "COLUMNS": "200"}


def run_subprocess(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``python -m dpatlas.cli.commands ARGS`` in a child process."""
    return subprocess.run([sys.executable, "-m", "dpatlas.cli.commands", *map(str, args)],
                          capture_output=True, text=True, env=env or ENV, cwd=cwd, timeout=600)


def invoke(*args, env=None):
    """The command in this process; typer's Result (exit_code, output, exception)."""
    return CliRunner().invoke(app, [str(a) for a in args], env=env or NO_SERVER)


def run_in_process(*args, cwd=None, env=None) -> subprocess.CompletedProcess:
    """The command in this process, answered like :func:`run_subprocess` (returncode, stdout,
    stderr), so one assertion reads the same for both. An exception that escaped the command
    is written to stderr as its traceback, as the interpreter would."""
    with contextlib.chdir(cwd) if cwd is not None else contextlib.nullcontext():
        res = invoke(*args, env=env)
    stderr = res.stderr
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        stderr += "".join(traceback.format_exception(res.exception))
    return subprocess.CompletedProcess(list(args), res.exit_code, res.stdout, stderr)


def refusal_block(res) -> str:
    """An operator refusal's text: exit 2, no traceback, exactly one `error:` line, said last
    (only indented lines after it, e.g. one per offending key); returns it and what follows."""
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    errors = [i for i, ln in enumerate(lines) if ln.startswith("error:")]
    assert len(errors) == 1, res.stdout
    assert all(ln.startswith(" ") for ln in lines[errors[0] + 1:]), res.stdout
    return "\n".join(lines[errors[0]:])


def stand_in_release(monkeypatch, flow) -> None:
    """``dpatlas release`` in this process with ``flow(config, rid, seed)`` as its flow, a
    stand-in Prefect API (watched, at a dead URL: the flow ends long before it counts as gone)
    and no pre-flight checks: for what the command says about an error the flow raises."""
    import flows.release
    import dpatlas.cli.prefect_server as ps
    from dpatlas.core.config import load_config

    class Api:
        used = "a stand-in Prefect API"  # the command names the API it used
        url = "http://127.0.0.1:9/api"

        def ready(self):
            pass

    monkeypatch.setattr(ps, "prefect_api", lambda *a, **k: contextlib.nullcontext(Api()))
    monkeypatch.setattr("dpatlas.cli.release_commands._checked_release",
                        lambda c, rid, seed: (load_config(c), rid))
    monkeypatch.setattr(flows.release, "release", flow)


def stand_in_config(tmp_path):
    """A config whose input is never read (the flow is a stand-in): releases in
    ``tmp_path/out``, the ledger ``tmp_path/l.db``."""
    from tests.support.inputs import write_config

    return write_config(tmp_path / "c.yaml", {
        "input": {"path": "x"}, "boundaries": {"path": "y"},
        "selection": {"rule": "public", "threshold": 3},
        "publish": {"root": str(tmp_path / "out")},
        "ledger": {"url": f"sqlite:///{tmp_path}/l.db"}})
