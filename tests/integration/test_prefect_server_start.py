"""`dpatlas server start` as documented (issue 33, item 5): the UI is told the API's port,
a port whose last server just stopped is free again at once, a server started in another home
says how releases find it."""

from __future__ import annotations

import socket
import subprocess

import pytest

from dpatlas.cli import prefect_server as P
from tests.support.prefect_server import free_port


def _time_wait_on(port: int) -> None:
    """Leave a connection to ``port`` in TIME-WAIT on the server side, as a stopped server
    leaves its closed connections: the side that closes first keeps the pair for a minute."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(1)
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server closes first: its end goes to TIME-WAIT
    client.recv(1)
    client.close()
    listener.close()


def test_a_port_whose_server_just_stopped_is_free_and_a_listening_one_is_not():
    port = free_port()
    _time_wait_on(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as plain:
        with pytest.raises(OSError):  # what the old check did: "in use" for about a minute
            plain.bind(("127.0.0.1", port))
    assert P._port_free(port)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as live:
        live.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        live.bind(("127.0.0.1", port))
        live.listen(1)
        assert not P._port_free(port)


def test_the_server_is_told_its_port_for_the_ui(tmp_path, monkeypatch):
    started = {}

    class FakeServer:
        pid = 999_999_999

    def fake_popen(argv, **kwargs):
        started.update(argv=argv, env=kwargs["env"])
        return FakeServer()

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    monkeypatch.setattr(P, "_wait_healthy", lambda *a, **k: None)
    port = free_port()
    record, fresh = P.start_server(tmp_path / "home", port, timeout=1)
    assert fresh and record.url == f"http://127.0.0.1:{port}/api"
    assert started["argv"][-2:] == ["--port", str(port)]
    env = started["env"]
    assert env["PREFECT_UI_API_URL"] == record.url
    assert (env["PREFECT_SERVER_API_HOST"], env["PREFECT_SERVER_API_PORT"]) == \
        ("127.0.0.1", str(port))
    assert "PREFECT_API_URL" not in env


@pytest.mark.parametrize("own_home", [False, True])
def test_a_server_in_another_home_says_how_releases_find_it(tmp_path, monkeypatch, own_home):
    """`dpatlas release` looks for the server in $PREFECT_HOME (or the default home): started
    with --home elsewhere, the command prints the one export line releases need."""
    from tests.support.cli import invoke

    default, other = tmp_path / "default-home", tmp_path / "other home"
    home = other if own_home else default
    record = P.ServerRecord(123, "http://127.0.0.1:4321/api", home.resolve())
    monkeypatch.setattr(P, "start_server", lambda *a, **k: (record, True))
    args = ["server", "start", "--port", "4321"] + (["--home", other] if own_home else [])
    res = invoke(*args, env={"PREFECT_HOME": str(default)})
    assert res.exit_code == 0, res.output
    assert "the UI is at http://127.0.0.1:4321" in res.output
    export = f"export PREFECT_HOME='{home.resolve()}'"
    assert (export in res.output) == own_home, res.output


def test_a_release_finds_a_server_started_in_another_home(tmp_path, monkeypatch):
    """Started with --home elsewhere (no PREFECT_HOME exported), the server is what a plain
    `dpatlas release` uses (it started a temporary one); stopped, it is forgotten."""
    monkeypatch.setenv("HOME", str(tmp_path / "user"))  # the default home: ~/.dpatlas-prefect
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)

    class FakeServer:
        pid = 12_345

    monkeypatch.setattr(subprocess, "Popen", lambda argv, **kwargs: FakeServer())
    monkeypatch.setattr(P, "_wait_healthy", lambda *a, **k: None)
    alive = {12_345}
    monkeypatch.setattr(P.ServerRecord, "running", lambda self: self.pid in alive)
    assert P.running_server() is None
    port = free_port()
    record, _ = P.start_server(tmp_path / "elsewhere", port, timeout=1)
    found = P.running_server()
    assert found is not None and found.url == f"http://127.0.0.1:{port}/api"
    assert found.home == (tmp_path / "elsewhere").resolve()

    alive.clear()  # it died: a release starts a temporary server, as before
    assert P.running_server() is None
    alive.add(12_345)
    monkeypatch.setattr(P.os, "killpg", lambda pid, sig: alive.clear())
    P.stop_server(tmp_path / "elsewhere")
    assert not (tmp_path / "user" / ".dpatlas-prefect" / "dpatlas-server-elsewhere.json").exists()
    alive.add(12_345)  # even if its pid ran again, the stopped server is not used
    assert P.running_server() is None
