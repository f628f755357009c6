"""Operator defects O1, O2, O6b and O6c of issue 31: what may be served, where staged copies
may go, the feed's indexes rebuilt from the release folders and the ledger, and a demo that
never overwrites an operator's folder. Each test reproduces the defect as it was found."""

from __future__ import annotations

import http.client
import json
import shutil
from pathlib import Path

import pytest

from dpatlas.publication import serve as S

from tests.support.cli import invoke as cli  # in-process, a dead Prefect URL (NO_SERVER)
from tests.integration.test_operator_defects_cli import one_line

RID = "r1"
PUBLISHED = b"PAR1 published tract values"
STAGED = b"PAR1 person-level rows"
KEY = b"secret commitment key"


def _demo_like(folder: Path) -> Path:
    """A folder laid out as `dpatlas demo` leaves it: the input under data/, the publish root
    releases/ (one release, its manifest listing its files), the internal folder beside it."""
    root = folder / "releases"
    (root / RID).mkdir(parents=True)
    (root / RID / "tracts.parquet").write_bytes(PUBLISHED)
    (root / RID / "index.html").write_text("<title>release</title>")
    (root / RID / "manifest.json").write_text(json.dumps(
        {"release_id": RID, "files": {"tracts.parquet": {"sha256": "0" * 64},
                                      "index.html": {"sha256": "0" * 64}}}))
    (root / ".dpatlas-root.json").write_text('{"mode": "public"}')
    (root / "feed.json").write_text('{"feed_version": 1, "latest": null, "releases": []}')
    (root / ".feed.lock").write_text("")
    internal = folder / "releases-internal" / RID
    (internal / "staged").mkdir(parents=True)
    (internal / "staged" / "input-37.parquet").write_bytes(STAGED)
    (internal / "input_commitment.key").write_bytes(KEY)
    (folder / "data" / "microdata" / "state=37").mkdir(parents=True)
    (folder / "data" / "microdata" / "state=37" / "part-0.parquet").write_bytes(STAGED)
    return root


@pytest.fixture
def no_serving(monkeypatch):
    """`dpatlas serve` returns at once instead of serving (were it not refused, a test would
    otherwise wait for ever); the list says whether it got as far as serving."""
    served = []
    monkeypatch.setattr(S.ThreadingServer, "serve_forever",
                        lambda self, *a, **k: served.append(self.server_address))
    return served


# --- O1: serve only a publish root, and in it only published files ----------------------------


def test_o1_serve_refuses_the_demo_folder_and_names_its_publish_root(tmp_path, no_serving):
    root = _demo_like(tmp_path)
    message = one_line(cli("serve", tmp_path, "--port", "0"))
    assert "not a publish root" in message and f"serve the publish root {root}" in message
    assert no_serving == []
    res = cli("serve", root, "--port", "0")                    # the root itself is served
    assert res.exit_code == 0, res.output
    assert len(no_serving) == 1


@pytest.mark.parametrize("copied", ["staged/input-37.parquet", "input_commitment.key",
                                    "microdata/state=37/part-0.parquet", "ledger.db"])
def test_o1_serve_refuses_a_publish_root_holding_internal_files(tmp_path, no_serving, copied):
    root = _demo_like(tmp_path)
    (root / copied).parent.mkdir(parents=True, exist_ok=True)
    (root / copied).write_bytes(STAGED)
    message = one_line(cli("serve", root, "--port", "0"))
    assert copied in message and "never published" in message
    assert no_serving == []


def _get(server, path):
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response.status, body


def test_o1_served_root_answers_only_published_files(tmp_path):
    """Files copied into a root after the server started are refused request by request: a
    staged partition, the key, a Parquet file no manifest lists; the published ones are not."""
    root = _demo_like(tmp_path)
    server, _ = S.serve_in_thread(root)
    try:
        shutil.copytree(tmp_path / "releases-internal" / RID / "staged", root / RID / "staged")
        shutil.copy(tmp_path / "releases-internal" / RID / "input_commitment.key", root / RID)
        (root / "input.parquet").write_bytes(STAGED)
        (root / RID / "draws.jsonl").write_text("{}")
        for path in (f"/{RID}/staged/input-37.parquet", f"/{RID}/input_commitment.key",
                     "/input.parquet", f"/{RID}/draws.jsonl", "/.feed.lock"):
            status, body = _get(server, path)
            assert status == 404 and STAGED not in body and KEY not in body, path
        assert _get(server, f"/{RID}/tracts.parquet") == (200, PUBLISHED)
        assert _get(server, "/feed.json")[0] == 200
        assert _get(server, f"/{RID}/")[0] == 200             # the release's page
    finally:
        server.shutdown()
        server.server_close()
