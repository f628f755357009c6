"""Issue 21 item 7: what a release writes to its internal folder is mode 0600 in folders 0700,
whatever the umask; what is published keeps the umask's modes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pandas as pd
import pytest

from dpatlas.core.files import (seal_private, write_bytes_atomic, write_json_atomic,
                                write_parquet_atomic)
from dpatlas.release.draws import DrawLog, draw_once
from dpatlas.release.manifest import input_commitment
from dpatlas.release.run_state import ReleaseLock


@pytest.fixture(params=[0o000, 0o022], ids=["umask000", "umask022"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def modes_under(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): mode(p) for p in [folder, *folder.rglob("*")]}


def test_private_writers_make_0600_files_in_0700_folders(tmp_path, umask):
    frame = pd.DataFrame({"geoid": ["17001000100"], "x": [0.5]})
    internal = tmp_path / "internal" / "r1"
    write_parquet_atomic(frame, internal / "staged" / "input-17.parquet", private=True)
    write_json_atomic(internal / "validation.json", {"partitions": []}, private=True, indent=2)
    write_bytes_atomic(internal / "deep" / "er" / "blob", b"x", private=True)

    found = modes_under(tmp_path / "internal")
    folders = {k: v for k, v in found.items() if (tmp_path / "internal" / k).is_dir()}
    files = {k: v for k, v in found.items() if k not in folders}
    assert set(files) == {"r1/staged/input-17.parquet", "r1/validation.json", "r1/deep/er/blob"}
    assert set(files.values()) == {0o600}, files
    assert set(folders.values()) == {0o700}, folders  # the internal root made here too
    assert pd.read_parquet(internal / "staged" / "input-17.parquet").equals(frame)


def test_a_private_rewrite_narrows_an_existing_file(tmp_path, umask):
    path = tmp_path / "staged" / "input-17.parquet"
    path.parent.mkdir()
    path.write_bytes(b"old")
    os.chmod(path, 0o644)
    write_bytes_atomic(path, b"new", private=True)
    assert mode(path) == 0o600 and path.read_bytes() == b"new"


def test_public_writes_keep_the_umask_modes(tmp_path, umask):
    path = write_bytes_atomic(tmp_path / "releases" / "r1" / "tracts.csv", b"geoid\n")
    assert mode(path) == 0o666 & ~umask
    assert mode(path.parent) == 0o777 & ~umask


def test_a_release_run_state_draws_and_commitment_key_are_private(tmp_path, umask):
    internal = tmp_path / "releases-internal" / "r1"
    with ReleaseLock(internal, "r1"):
        DrawLog.open(internal, "r1", "c" * 64, "i" * 64)
        log = DrawLog(internal)
        out = internal / "selection" / "chunk-0000.parquet"
        draw_once(log, "select", "chunk-0000", out, lambda: pd.DataFrame({"k": [1]}), "seeded")
        input_commitment("i" * 64, internal)

    found = modes_under(internal)
    expected_files = {".lock", "draws.jsonl", "selection/chunk-0000.parquet",
                      "input_commitment.key"}
    assert expected_files <= set(found), sorted(found)
    for name, got in found.items():
        want = 0o700 if (internal / name).is_dir() else 0o600
        assert got == want, (name, oct(got))
    assert len(DrawLog(internal).lines()) == 2  # the append after the header kept working


def test_seal_private_narrows_a_tree_another_library_wrote(tmp_path, umask):
    docs = tmp_path / "data_docs"
    (docs / "static").mkdir(parents=True, mode=0o777)
    (docs / "static" / "index.html").write_text("<html>")
    os.chmod(docs / "static" / "index.html", 0o666)
    seal_private(docs)
    assert modes_under(docs) == {".": 0o700, "static": 0o700, "static/index.html": 0o600}
