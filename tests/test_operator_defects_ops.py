"""Operator defects of issue 17 (D3, D4, D5, D7, D8, D10, D13, D14, D16) and person ids of
mixed types: each test reproduces the defect as the reviewer found it."""

from __future__ import annotations

import errno
import http.client
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dpatlas import serve as S
from dpatlas.config import load_config
from dpatlas.ingest import InputError, partitions, read_partition
from dpatlas.preflight import PreflightError, check_before_writing

from conftest import write_config
from test_inputs import input_config, one_state_file, state_records, write_states


# --- serve: D3, D4 (second line), D10 ----------------------------------------------------------


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "root"
    (root / "r1").mkdir(parents=True)
    data = bytes(range(256)) * 8
    (root / "r1" / "tracts.pmtiles").write_bytes(data)
    (root / "index.html").write_text("<!doctype html><title>root</title>")
    internal = tmp_path / "internal" / "data_docs"      # e.g. the internal Data Docs site
    internal.mkdir(parents=True)
    (internal / "index.html").write_text("<title>validation results: confidential</title>")
    os.symlink(internal, root / "evil_dir")
    os.symlink("r1", root / "latest")                   # the feed's own link stays usable
    ledger = sqlite3.connect(root / "ledger.db")        # a ledger someone put in the root
    ledger.execute("create table t (path text)")
    ledger.execute("insert into t values ('/home/owner/secret')")
    ledger.commit()
    ledger.close()
    (root / "copy.bin").write_bytes((root / "ledger.db").read_bytes())  # renamed database
    server, _ = S.serve_in_thread(root)
    host, port = server.server_address[:2]
    yield (lambda: http.client.HTTPConnection(host, port, timeout=10)), data
    server.shutdown()
    server.server_close()


def _get(connect, path, headers=None):
    conn = connect()
    conn.request("GET", path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


def test_d3_serve_does_not_follow_a_linked_folder_out_of_the_root(served):
    connect, data = served
    for path in ("/evil_dir/", "/evil_dir/index.html", "/evil_dir"):
        response, body = _get(connect, path)
        assert response.status == 404, path
        assert b"confidential" not in body
    response, body = _get(connect, "/latest/tracts.pmtiles")
    assert response.status == 200 and body == data


def test_d4_serve_never_sends_a_database(served):
    connect, _ = served
    for path in ("/ledger.db", "/copy.bin"):
        response, body = _get(connect, path)
        assert response.status == 404, path
        assert b"/home/owner" not in body and b"SQLite format" not in body


def test_d10_serve_answers_a_huge_range_and_a_nul_in_the_path(served):
    connect, data = served
    huge = "9" * 4300
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": f"bytes={huge}-"})
    assert response.status == 416 and body == b""
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": f"bytes=0-{huge}"})
    assert response.status == 206 and body == data
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": f"bytes=-{huge}"})
    assert response.status == 206 and body == data
    for path in ("/r1/tracts.pmtiles%00", "/%00/", "/r1%00/tracts.pmtiles"):
        response, _ = _get(connect, path)
        assert response.status in (400, 404), path
    # the server is still up and well
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": "bytes=0-3"})
    assert response.status == 206 and body == data[:4]


def test_d10_parse_range_never_converts_thousands_of_digits():
    with pytest.raises(S.Unsatisfiable):
        S.parse_range("bytes=" + "1" * 5000 + "-", 100)
    assert S.parse_range("bytes=5-" + "1" * 5000, 100) == (5, 99)
    assert S.parse_range("bytes=-" + "1" * 5000, 100) == (0, 99)
    assert S.parse_range("bytes=" + "0" * 5000 + "7-9", 100) == (7, 9)


# --- D4: a ledger inside the publish root ------------------------------------------------------


def _release_config(tmp: Path, **over) -> Path:
    data = tmp / "data"
    data.mkdir(exist_ok=True)
    cfg = {"input": {"path": str(data / "microdata")},
           "boundaries": {"path": str(data / "tracts.parquet")},
           "selection": {"rule": "fixed"},
           "publish": {"root": str(tmp / "releases")},
           "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"}}
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    path = tmp / "config.yaml"
    cfg.setdefault("input", {}).setdefault("columns", {})["person_id"] = "person_id"
    cfg["publish"].setdefault("mode", "test")
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize("where", ["releases/ledger.db", "releases/sub/ledger.db"])
def test_d4_a_ledger_inside_the_publish_root_is_refused_before_anything(tmp_path, where):
    (tmp_path / "releases").mkdir()
    config = _release_config(tmp_path, ledger={"url": f"sqlite:///{tmp_path / where}"})
    cfg = load_config(config)
    with pytest.raises(PreflightError, match="ledger .* inside the publish root"):
        check_before_writing(cfg, "r1", None)
    assert not (tmp_path / where).exists()


def test_d4_a_ledger_outside_the_publish_root_passes(tmp_path):
    cfg = load_config(_release_config(tmp_path))
    check_before_writing(cfg, "r1", None)


# --- D5: synthesize --out inside a published release ------------------------------------------


def test_d5_synthesize_out_inside_a_published_release_is_refused(tmp_path):
    from dpatlas.synthesize import SynthesizeError, plan_synthetic

    config = _release_config(tmp_path)
    release = tmp_path / "releases" / "r1"
    release.mkdir(parents=True)
    (release / "manifest.json").write_text("{}")
    os.symlink("r1", tmp_path / "releases" / "latest")
    for out in (release / "sub", tmp_path / "releases" / "latest" / "sub", release / "a" / "b"):
        if out.parent != release:
            out.parent.mkdir(parents=True, exist_ok=True)
        with pytest.raises(SynthesizeError, match="inside the published folder"):
            plan_synthetic(config, "r1", 1.0, out=out)
        assert not out.exists()
    internal = tmp_path / "releases-internal"
    internal.mkdir()
    with pytest.raises(SynthesizeError, match="overlaps the internal folder"):
        plan_synthetic(config, "r1", 1.0, out=internal / "x")
    assert not (internal / "x").exists()
