"""The release's watch of its Prefect API (dpatlas/cli/api_watch.py): what a poll answers, and
what it costs (it runs every 2 s for the whole release)."""

from __future__ import annotations

import http.server
import socket
import ssl
import threading

import pytest

from dpatlas.cli.api_watch import server_refuses


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def health_server():
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/api"
    server.shutdown()
    server.server_close()


def test_a_refused_server_is_refused_and_a_live_one_is_not(health_server):
    assert server_refuses(f"http://127.0.0.1:{_closed_port()}/api", timeout=1.0)
    assert not server_refuses(health_server, timeout=1.0)


def test_polls_load_the_ca_bundle_once_not_every_poll(monkeypatch, health_server):
    """A client per poll loaded the CA bundle each time (~20 ms of CPU every 2 s of a release:
    docs/measurements/national-cost.md); the TLS context is built once."""
    loads = []
    original = ssl.SSLContext.load_verify_locations

    def counting(self, *args, **kwargs):
        loads.append(args or kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    for _ in range(3):
        assert not server_refuses(health_server, timeout=1.0)
    assert len(loads) <= 1
