"""`dpatlas serve` in its own process: it prints its URL, serves, and Ctrl-C stops it cleanly
(exit 0, no traceback, the port free again) even with a browser's keep-alive connection open."""

from __future__ import annotations

import http.client
import re
import signal
import socket
import subprocess
import sys

import pytest

from tests.support.cli import ENV


@pytest.mark.slow                  # the command's imports take ~10-20 s on a busy machine
def test_ctrl_c_stops_the_server_cleanly(tmp_path):
    root = tmp_path / "releases"
    root.mkdir()
    (root / ".dpatlas-root.json").write_text('{"mode": "public"}')
    (root / "feed.json").write_text('{"feed_version": 1, "latest": null, "releases": []}')
    server = subprocess.Popen(
        [sys.executable, "-m", "dpatlas.cli.commands", "serve", str(root), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line = server.stdout.readline()
        match = re.fullmatch(rf"serving {re.escape(str(root.resolve()))} at "
                             r"http://127\.0\.0\.1:(\d+)/ \(Ctrl-C to stop\)\n", line)
        assert match, line
        port = int(match[1])
        browser = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        browser.request("GET", "/feed.json")
        response = browser.getresponse()
        assert response.status == 200 and b"feed_version" in response.read()
        server.send_signal(signal.SIGINT)            # the connection is still open (keep-alive)
        out, err = server.communicate(timeout=30)
    finally:
        server.kill()
    assert server.returncode == 0, err
    assert "Traceback" not in err and '"GET /feed.json HTTP/1.1" 200' in err
    with socket.create_server(("127.0.0.1", port)):  # nothing listens on the port any more
        pass
