"""Each state's level task reads only the staged partitions that can hold its records (issue
22): the records it gets, and so its estimates under a fixed seed, are those it got reading
every partition."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpatlas.core.config import parse_config
from dpatlas.release.allocate import plan
from dpatlas.release.estimate import split_into_chunks, staged_tracts
from dpatlas.release.levels import estimate_levels, partitions_holding, read_state, states_of
from mechanisms.noise import default_randomness

# Partitions as an input may cut them: one state, two states, a state split over two files,
# a state sharing a file with one it does not border in FIPS order (06 and 17, not 08).
PARTITIONS = {"a": ["01", "02"], "b": ["06", "17"], "c": ["08"], "d": ["17"], "e": ["56"]}


def write_staged(folder: Path) -> list[Path]:
    rng = np.random.default_rng(4)
    paths = []
    for name, states in PARTITIONS.items():
        geoid = [f"{s}{rng.integers(1, 40):03d}{rng.integers(0, 9999):06d}"
                 for s in states for _ in range(400)]
        df = pd.DataFrame({"geoid": geoid, "cell": rng.choice(["f", "m"], len(geoid)),
                           "x": rng.uniform(size=len(geoid)), "y": rng.uniform(size=len(geoid)),
                           "other": 1.0}).sort_values("geoid", kind="stable")
        paths.append(folder / f"input-{name}.parquet")
        df.to_parquet(paths[-1], index=False)
    return paths


def test_a_state_reads_only_the_partitions_that_hold_it_and_gets_the_same_records(tmp_path):
    staged = write_staged(tmp_path)
    geoids, sizes = staged_tracts(staged)
    chunks = split_into_chunks(geoids, 50)
    names = lambda paths: [p.stem[-1] for p in paths]
    assert names(partitions_holding(staged, chunks, "17")) == ["b", "d"]
    assert names(partitions_holding(staged, chunks, "08")) == ["b", "c"]  # 06..17 spans 08
    assert names(partitions_holding(staged, chunks, "01")) == ["a"]
    for state in states_of(sizes["geoid"]):
        mine = partitions_holding(staged, chunks, state)
        assert len(mine) <= 2
        pd.testing.assert_frame_equal(read_state(mine, state), read_state(staged, state),
                                      check_exact=True)


def test_the_estimates_from_the_partitions_of_a_state_are_identical(tmp_path):
    staged = write_staged(tmp_path)
    geoids, _ = staged_tracts(staged)
    chunks = split_into_chunks(geoids, 50)
    budget = plan(parse_config({"input": {"path": "x"}, "boundaries": {"path": "b"},
                                "selection": {"rule": "dp", "threshold": 3.0},
                                "levels": ["tract", "county", "state"]}), 3.0)
    for state in ("17", "06"):
        every = estimate_levels(read_state(staged, state), budget, default_randomness(9), 5)
        mine = estimate_levels(read_state(partitions_holding(staged, chunks, state), state),
                               budget, default_randomness(9), 5)
        assert (every["status"] == "released").any()
        pd.testing.assert_frame_equal(mine, every, check_exact=True)


def test_the_release_flow_runs_its_level_tasks_two_at_a_time():
    """Prefect's default thread pool is unbounded: all 51 states' tasks (and records) at once."""
    from flows.release import LEVEL_WORKERS, release

    assert LEVEL_WORKERS == 2 and release.task_runner._max_workers == LEVEL_WORKERS
