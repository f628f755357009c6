"""The release flow's structure (issue 19, item 4): pre-charge refusals are one `preflight`
task run, visible in Prefect; chunks fan out with `.map` without changing a seeded release's
bytes; faults are injected by tests, never read from the environment by production code."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402

from conftest import write_config  # noqa: E402

# sha256 of the data files of the seeded release below, recorded on the code before the flow
# was restructured (commit a65d230): seeded noise, one draw per chunk and stage, so any change
# in which draw feeds which tract, or in their order, changes these bytes.
SEEDED_RELEASE_SHA256 = {
    "tracts.csv": "5c1343a215d08482d93ba37b61db101cf35824ab76d2d9ae4b7de1ead0aee25b",
    "tracts.geojson": "eca1c3f05cb2b6a7936836276dc6ca66e3f19a05c2f69cca0cceaad451f686f0",
    "tracts.parquet": "0031ddf4a5ef9ec28df790e8abea606afc2f4ed4183501f133da3747eafe658b",
}


@pytest.fixture(scope="module", autouse=True)
def prefect_server():
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture(scope="module")
def small_state(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("state")
    write_synthetic(out, ["17"], seed=5, params=StateParams(n_tracts=90, counties=3))
    return out


def make_config(tmp: Path, data: Path, **over) -> Path:
    cfg = {"input": {"path": str(data / "microdata")},
           "boundaries": {"path": str(data / "tracts.parquet")},
           "privacy": {"epsilon_per_tract": 1.0},
           "selection": {"rule": "dp", "threshold": 3.0},
           "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
           "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"},
           "partition_tracts": 30}
    return write_config(tmp / "config.yaml", cfg, **over)


def test_a_seeded_release_is_byte_identical_to_the_one_before_the_restructuring(small_state,
                                                                               tmp_path):
    from flows.release import release

    folder = Path(release(str(make_config(tmp_path, small_state)), "r1", 11).folder)
    got = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
           for name in SEEDED_RELEASE_SHA256}
    assert got == SEEDED_RELEASE_SHA256
