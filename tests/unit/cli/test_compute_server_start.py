"""``dpatlas release`` starts the server the compute processes are forked from before it
imports the flow (dpatlas.release.compute_pool), for a release that will start them only."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dpatlas.cli import release_commands
from dpatlas.core.config import load_config
from dpatlas.release import compute_pool
from dpatlas.release.ingest import parquet_records


def _config(tmp_path, input_name: str, **settings):
    lines = [f"input: {{path: {input_name}, format: "
             f"{'csv' if input_name.endswith('.csv') else 'parquet'}}}",
             "boundaries: {path: b.parquet}", "privacy: {epsilon_per_tract: 1.0}",
             "selection: {rule: dp, threshold: 3.0}",
             *(f"{key}: {value}" for key, value in settings.items())]
    (tmp_path / "config.yaml").write_text("\n".join(lines) + "\n")
    return load_config(tmp_path / "config.yaml")


def _records(n: int) -> pd.DataFrame:
    return pd.DataFrame({"geoid": ["17031000100"] * n, "x": 0.5, "y": 0.5})


@pytest.fixture
def started(monkeypatch):
    calls = []
    monkeypatch.setattr(compute_pool, "start_server", lambda: calls.append("started"))
    monkeypatch.setattr(compute_pool, "MIN_RECORDS", 10)
    return calls


def test_the_parquet_footers_count_the_records_and_a_csv_is_not_read(tmp_path):
    _records(12).to_parquet(tmp_path / "one.parquet")
    for state, n in (("17", 5), ("18", 9)):
        (tmp_path / "hive" / f"state={state}").mkdir(parents=True)
        _records(n).to_parquet(tmp_path / "hive" / f"state={state}" / "part-0.parquet")
    _records(12).to_csv(tmp_path / "in.csv", index=False)
    assert parquet_records(_config(tmp_path, "one.parquet").input) == 12
    assert parquet_records(_config(tmp_path, "hive").input) == 14
    # every footer read is recorded: the flow's listing of the same files reads none again
    from dpatlas.release import ingest
    recorded = {Path(path).name if "hive" not in path else Path(path).parent.name: rows
                for (path, _, _), rows in ingest._FOOTER_ROWS.items()
                if path.startswith(str(tmp_path))}
    assert recorded == {"one.parquet": 12, "state=17": 5, "state=18": 9}
    assert parquet_records(_config(tmp_path, "in.csv").input) is None
    # a missing input is the flow's to report, with its own message
    assert parquet_records(_config(tmp_path, "missing.parquet").input) is None


def test_the_server_starts_for_a_large_local_release_only(tmp_path, started):
    _records(12).to_parquet(tmp_path / "large.parquet")
    _records(9).to_parquet(tmp_path / "small.parquet")
    _records(12).to_csv(tmp_path / "large.csv", index=False)
    release_commands._start_compute_server(_config(tmp_path, "large.parquet"), "r1")
    assert started == ["started"]
    for cfg in (_config(tmp_path, "small.parquet"),  # under MIN_RECORDS: the flow's threads
                _config(tmp_path, "large.parquet", runner="dask"),
                _config(tmp_path, "large.parquet", local_processes=0),
                _config(tmp_path, "large.csv"),  # counted by the flow, which starts it then
                _config(tmp_path, "missing.parquet")):
        release_commands._start_compute_server(cfg, "r1")
    # a published release's rerun publishes nothing and opens no pool
    published = _config(tmp_path, "large.parquet")
    (published.publish.root / "r0").mkdir(parents=True)
    release_commands._start_compute_server(published, "r0")
    assert started == ["started"]
