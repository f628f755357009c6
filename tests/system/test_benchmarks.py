"""The benchmarks still run. They are scripts the README quotes; one of them (the release
benchmark) stopped running unnoticed when the person id became required, because its config
was a copy. Each runs here at a small size and must exit 0 and print its headline figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.paths import REPO

ROOT = REPO  # the checkout


def run_benchmark(script: str, *args: str, cwd: Path, timeout: int = 900) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.parametrize("script, args, expected", [
    ("bench_estimators.py", ["--tracts", "100", "--only", "NoisyStats", "DPExpTheilSen"],
     "headline: DPExpTheilSen (all pairs) + NoisyStats over 100 tracts"),
    ("bench_publish.py", ["--tracts", "100", "--repeats", "1", "--out", "{tmp}"],
     "p25_map.png"),
    ("bench_ddssp.py", ["--tracts", "100", "--reps", "1", "--sequential-sample", "3"],
     "Private-PGM estimation"),
    ("bench_tiles.py", ["--states", "2", "--tracts", "30", "--out", "{tmp}"],
     "2 states: 60 tracts"),
])
def test_quick_benchmarks_run(tmp_path, script, args, expected):
    out = run_benchmark(script, *(a.format(tmp=tmp_path) for a in args), cwd=tmp_path)
    assert expected in out, out[-2000:]


@pytest.mark.slow
def test_release_benchmark_runs_the_demo_config(tmp_path):
    out = run_benchmark("bench_release.py", "--out", str(tmp_path), cwd=tmp_path)
    assert "release wall time:" in out and "outside the estimators" in out, out
    manifest = json.loads((tmp_path / "releases" / "latest" / "manifest.json").read_text())
    assert manifest["counts"]["by_status"]["released"] > 3000  # the demo state, 3,108 tracts


@pytest.mark.slow
def test_national_benchmark_runs_at_a_small_scale(tmp_path):
    out = run_benchmark("bench_national.py", "--work", str(tmp_path), "--scale", "0.01",
                        "--runners", "local", cwd=tmp_path)
    assert "51 states (incl. DC)" in out and "wall time of `dpatlas release`" in out, out
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["country"]["states"] == 51 and results["country"]["tracts"] > 500
    local = results["results"]["local"]
    assert 0 < local["inside"] < local["wall"]  # estimator time is part of the wall time
    assert any(label == "release (flow)" and mib > 0 for label, mib in local["peaks"].values())
    assert {"validate_partition", "publish_release"} <= {s["stage"] for s in local["stages"]}
