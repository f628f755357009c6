"""Staging by URL (dpatlas.release.staging): what Dask workers on other machines read and write.

``file://`` is the test's shared folder; fsspec's ``memory://`` stands in for object storage
(the code path s3:// and gs:// take)."""

from __future__ import annotations

import hashlib
import pickle
import stat
from pathlib import Path

import pandas as pd
import pytest

from dpatlas.core.config import parse_config
from dpatlas.release import staging
from dpatlas.release.allocate import plan
from dpatlas.release.draws import DrawLog, PersistedDrawChanged
from dpatlas.release.estimate import read_chunk, split_into_chunks, stage_chunks, staged_tracts


def _partition(folder: Path, tracts: int, rows_per_tract: int = 3) -> Path:
    geoids = [f"17{i:09d}" for i in range(tracts)]
    df = pd.DataFrame({"geoid": [g for g in geoids for _ in range(rows_per_tract)],
                       "x": 0.5, "y": 0.25, "cell": "all"})
    path = folder / "input-17.parquet"
    df.to_parquet(path, index=False)
    return path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_file_url_staging_is_private_and_read_by_geoid_range(tmp_path):
    path = _partition(tmp_path, 10)
    location = staging.release_location(f"file://{tmp_path / 'shared'}", "r1")
    urls = staging.stage_files([path], location)
    staged = tmp_path / "shared" / "r1" / "staged" / "input-17.parquet"
    assert urls == {path: f"file://{staged}"}
    assert staged.read_bytes() == path.read_bytes()
    assert _mode(staged) == 0o600
    assert _mode(staged.parent) == 0o700 and _mode(tmp_path / "shared" / "r1") == 0o700
    geoids, _ = staged_tracts([path])
    chunks = stage_chunks(split_into_chunks(geoids, 4), urls)
    assert [c.staged for c in chunks] == [f"file://{staged}"] * 3
    rows = read_chunk(chunks[1])
    assert sorted(rows["geoid"].unique()) == [f"17{i:09d}" for i in range(4, 8)]
    assert len(rows) == 12


def test_object_storage_url_round_trip(tmp_path):
    """A non-file URL goes through fsspec: written whole, its sha256 returned, read filtered."""
    path = _partition(tmp_path, 6)
    location = staging.release_location("memory://bucket/prefix", "r2")
    urls = staging.stage_files([path], location)
    assert urls[path] == "memory://bucket/prefix/r2/staged/input-17.parquet"
    geoids, _ = staged_tracts([path])
    (first, second) = stage_chunks(split_into_chunks(geoids, 3), urls)
    assert sorted(read_chunk(second)["geoid"].unique()) == [f"17{i:09d}" for i in range(3, 6)]
    frame = pd.DataFrame({"geoid": ["a", "b"], "value": [1.0, 2.0]})
    out = staging.join(location, "selection", "input-17-0.parquet")
    digest = staging.write_parquet(frame, out)
    assert digest == hashlib.sha256(staging.read_bytes(out)).hexdigest()
    pd.testing.assert_frame_equal(staging.read_parquet(out), frame)


def test_what_crosses_the_scheduler_does_not_grow_with_the_chunk(tmp_path):
    """A staged task's parameters (chunk, budget, min_n, out URL, seed) pickle to a few KiB,
    the same for 10 tracts as for 5,000: the rows are read by the worker from the URL."""
    budget = plan(parse_config({"input": {"path": "in.parquet"},
                                "boundaries": {"path": "tracts.parquet"},
                                "selection": {"rule": "dp", "threshold": 3.0}},
                               base=Path("/tmp")), 3.0)
    sizes = []
    for tracts in (10, 5000):
        folder = tmp_path / str(tracts)
        folder.mkdir()
        path = _partition(folder, tracts)
        urls = staging.stage_files([path], f"file://{folder / 'shared'}")
        (chunk,) = stage_chunks(split_into_chunks(staged_tracts([path])[0], tracts), urls)
        out = staging.join(f"file://{folder / 'shared'}", "selection", f"{chunk.name}.parquet")
        sizes.append(len(pickle.dumps((chunk, budget, 20, out, 12345))))
    assert sizes[1] - sizes[0] < 100  # only the longer folder name differs
    assert sizes[1] < 16 * 1024


def test_a_draw_recorded_by_url_is_reused_and_a_changed_one_refused(tmp_path):
    DrawLog.open(tmp_path / "internal", "r3", "c" * 64, "i" * 64)
    log = DrawLog(tmp_path / "internal")
    url = f"file://{tmp_path / 'shared' / 'selection' / 'input-17-0.parquet'}"
    digest = staging.write_parquet(pd.DataFrame({"geoid": ["a"]}), url)
    assert log.reuse("select", "input-17-0") is None
    log.record_url("select", "input-17-0", url, digest, "seeded 1 (test only)")
    assert log.reuse("select", "input-17-0") == url
    staging.write_parquet(pd.DataFrame({"geoid": ["b"]}), url)
    with pytest.raises(PersistedDrawChanged, match="differs from the one recorded"):
        log.reuse("select", "input-17-0")
    Path(url[len("file://"):]).unlink()
    with pytest.raises(PersistedDrawChanged, match="is missing"):
        log.reuse("select", "input-17-0")


def test_a_staged_copy_in_object_storage_is_listed_then_removed():
    """What ``dpatlas purge`` does to a release's staged copy under an object-storage URL."""
    root = "memory://bucket/purge/r3"
    staging.write_bytes(f"{root}/staged/input-17.parquet", b"rows")
    staging.write_bytes(f"{root}/results/input-17-0.parquet", b"draw")
    assert staging.list_files(f"{root}/staged") == {
        "memory:///bucket/purge/r3/staged/input-17.parquet": 4}
    staging.remove_tree(f"{root}/staged")
    assert staging.list_files(f"{root}/staged") == {}
    assert staging.read_bytes(f"{root}/results/input-17-0.parquet") == b"draw"
    staging.remove_tree(f"{root}/staged")  # absent: nothing to do
