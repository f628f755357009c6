"""A local release whose draws and publish parts run in the compute pool's worker processes
(dpatlas.release.compute_pool) publishes what the flow's threads publish: the same draws from
the same seed, the same files byte for byte, and it passes the audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic
from dpatlas.publication import release_parts
from dpatlas.release import compute_pool as CP
from tests.support.inputs import write_model_cells_config
from tests.support.published import DATA_FILES, data_file_hashes
from tests.support.prefect_server import prefect_server

STATES = ("17", "18")


def _config(tmp: Path, data: Path, **over) -> Path:
    return write_model_cells_config(tmp, data, "pool", **over)


def _data_files(folder: Path) -> dict[str, str]:
    """The data files and the overview maps, by sha256."""
    return data_file_hashes(folder, DATA_FILES + ("p25_map",))


@pytest.fixture(scope="module")
def two_states(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("pool-data")
    write_synthetic(data, list(STATES), seed=5, params=StateParams(n_tracts=20, counties=2),
                    cells=2)
    return data


def test_the_compute_pool_publishes_what_the_threads_publish(tmp_path, two_states,
                                                             monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    import tasks.draws
    import tasks.publish
    from dpatlas.audit import audit_release
    from dpatlas.release.draws import DrawLog
    from flows.release import release

    monkeypatch.setattr(release_parts, "PART_ROWS", 40)  # a part per state, side by side
    monkeypatch.setattr(CP, "MIN_RECORDS", 0)  # this small input in processes too
    in_workers = []

    def recorded(module):
        real = module.compute

        def compute(fn, *args):
            in_workers.append((fn.__name__, CP._active is not None))
            return real(fn, *args)
        monkeypatch.setattr(module, "compute", compute)

    for module in (tasks.draws, tasks.publish):  # the drawing tasks compute through draws
        recorded(module)
    (tmp_path / "prefect").mkdir()
    with prefect_server(tmp_path / "prefect") as url, \
            temporary_settings(updates={PREFECT_API_URL: url}):
        pooled = release(str(_config(tmp_path / "pooled", two_states)), "p1", 5)
        order = [name for name, _ in in_workers]
        used = sorted(set(in_workers))
        in_workers.clear()
        threads = release(str(_config(tmp_path / "threads", two_states, local_processes=0)),
                          "p1", 5)
    assert pooled.status == threads.status == "published"
    # every kind of work went to the workers in the first release, none in the second
    assert used == [(name, True) for name in sorted(
        ["draw_estimates", "draw_levels", "draw_selection", "write_level_part",
         "write_overview", "write_part"])]
    assert in_workers and all(not active for _, active in in_workers)
    # a process for each of the two parts: the levels wait for both (flows/release.py)
    assert order.count("write_part") == 2 and order.count("write_level_part") >= 1
    assert max(i for i, n in enumerate(order) if n == "write_part") < min(
        i for i, n in enumerate(order) if n == "write_level_part"), order
    assert CP._active is None

    a, b = Path(pooled.folder), Path(threads.folder)
    assert sorted(DrawLog(tmp_path / "pooled" / "internal" / "p1").draws()) == sorted(
        DrawLog(tmp_path / "threads" / "internal" / "p1").draws())
    files = _data_files(a)
    assert any(n.startswith("tracts/state=18/") for n in files)
    assert any(n.startswith("p25_map") for n in files)
    assert files == _data_files(b)
    manifests = [json.loads((f / "manifest.json").read_text()) for f in (a, b)]
    for key in ("counts", "small_area", "tract_values", "output_contract", "extent", "budget"):
        assert manifests[0][key] == manifests[1][key], key
    checks = {name: (good, detail) for name, good, detail in audit_release(a).checks}
    assert all(good for good, _ in checks.values()), checks
