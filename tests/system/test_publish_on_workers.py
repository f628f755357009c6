"""Publishing on the workers (issue 35, item 1): a two-state, two-cell release on a Dask cluster
of separate processes (`dask scheduler`, two `dask worker`) writes its publish parts, its
county and state files and its cell archives in the worker processes, reading their inputs from a file:// staging URL, and
the flow only commits them; the files equal the local runner's, read back part by part."""

from __future__ import annotations

import json
from pathlib import Path

import geopandas as gpd
import pandas as pd
import pytest

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
from dpatlas.publication import release_parts
from tests.support.dask_cluster import dask_processes
from tests.support.inputs import write_model_cells_config
from tests.support.published import data_file_hashes
from tests.support.prefect_server import prefect_server

pytestmark = pytest.mark.slow

STATES = ("17", "18")


def _config(tmp: Path, data: Path, **over) -> Path:
    return write_model_cells_config(tmp, data, "workers", **over)


def test_a_release_publishes_on_the_workers_and_equals_the_local_runners(tmp_path,
                                                                          monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from dpatlas.audit import audit_release
    from flows.release import release

    data = tmp_path / "data"
    write_synthetic(data, list(STATES), seed=5, params=StateParams(n_tracts=20, counties=2),
                    cells=2)
    # 20 tracts x 2 cells a state: a part per state, so the two parts run side by side
    monkeypatch.setattr(release_parts, "PART_ROWS", 40)
    shared = tmp_path / "shared"
    (tmp_path / "prefect").mkdir()
    with prefect_server(tmp_path / "prefect") as url, \
            temporary_settings(updates={PREFECT_API_URL: url}):
        local = release(str(_config(tmp_path / "local", data)), "w1", 5)
        with dask_processes(tmp_path / "cluster", workers=2,
                            env={"PREFECT_API_URL": url, "PREFECT_LOGGING_LEVEL": "INFO"}
                            ) as cluster:
            dask = release(str(_config(tmp_path / "dask", data, runner="dask",
                                       dask_address=cluster.address,
                                       staging_url=f"file://{shared}")), "w1", 5)
            assert all(w.poll() is None for w in cluster.workers)
    assert local.status == dask.status == "published"
    a, b = Path(local.folder), Path(dask.folder)

    # the publish tasks ran in the worker processes, not the flow's
    manifest = json.loads((b / "manifest.json").read_text())
    cells = sorted(manifest["tract_values"]["folders"])
    assert len(cells) == 2
    logs = "".join(log.read_text() for log in cluster.worker_logs)
    for name in [*(f"publish-part-states-{s}" for s in STATES),
                 "cell-tiles-all",  # the tracts' polygons, one archive for every cell
                 "publish-level-county", "publish-level-state", "overview"]:
        assert f"Task run '{name}' - Finished in state Completed()" in logs, logs[-3000:]
    # nothing of the parts is left behind once the release is committed
    assert not (shared / "w1" / "publish").exists()

    # the files equal the local runner's: byte for byte, and read back part by part
    assert data_file_hashes(a) == data_file_hashes(b)
    assert any(n.startswith("tracts/state=18/") for n in data_file_hashes(b))
    read = {k: gpd.read_parquet(f / "tracts", partitioning=None)
               .sort_values(["geoid", "cell"]).reset_index(drop=True) for k, f in (("a", a),
                                                                                   ("b", b))}
    pd.testing.assert_frame_equal(read["a"], read["b"])
    assert len(read["b"]) == 40 * 2 and "p25_model" in read["b"].columns
    for key in ("counts", "small_area", "tract_values", "output_contract", "extent"):
        assert json.loads((a / "manifest.json").read_text())[key] == manifest[key], key
    # the overview maps, drawn on a worker beside the archives, are the local runner's
    maps = sorted(p.name for p in b.glob("p25_map*.png"))
    assert maps and maps == sorted(p.name for p in a.glob("p25_map*.png"))
    assert all((a / m).read_bytes() == (b / m).read_bytes() for m in maps)
    checks = {name: (good, detail) for name, good, detail in audit_release(b).checks}
    assert all(good for good, _ in checks.values()), checks
