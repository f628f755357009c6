"""Scale-out: a multi-state synthetic country, local runner against a two-worker Dask cluster.

Generates 20 states (about 1.5 million records), starts one Prefect server on loopback, then
runs the same release twice as `dpatlas release` subprocesses: with the local runner, and with
`runner: dask` pointed at a local two-worker cluster that this script starts (so it can ask
the workers for their peak memory). Prints wall times and the peak resident memory of the flow
process and of each Dask worker.

    .venv/bin/python benchmarks/bench_scaleout.py [--states 20] [--tracts 1075] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # the Dask workers inherit it

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

# 20 real state FIPS codes
STATES = ["01", "04", "05", "06", "08", "09", "12", "13", "17", "18", "19", "20", "21", "22",
          "24", "25", "26", "27", "28", "29", "36", "39", "42", "48", "53"]


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_release(api_url: str, config: Path, rid: str) -> tuple[float, float]:
    env = {**os.environ, "PREFECT_API_URL": api_url, "PREFECT_LOGGING_LEVEL": "WARNING"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "dpatlas.cli", "release", "-c", str(config),
                             "--release-id", rid], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"release failed:\n{out[-3000:]}")
    return wall, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=20)
    ap.add_argument("--tracts", type=int, default=1075)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="dpatlas-scaleout-"))

    from dpatlas.synth import StateParams, write_synthetic
    from prefect_server import prefect_server

    data = out / "data"
    t0 = time.perf_counter()
    if not (data / "tracts.parquet").exists():
        info = write_synthetic(data, STATES[:args.states], 0,
                               StateParams(n_tracts=args.tracts, counties=40))
        print(f"country: {info['records']:,} records, {info['tracts']:,} tracts, "
              f"{len(info['states'])} states, generated in {time.perf_counter() - t0:.0f} s")

    def config(name: str, **extra) -> Path:
        cfg = {"input": {"path": str(data / "microdata")},
               "boundaries": {"path": str(data / "tracts.parquet")},
               "selection": {"rule": "dp", "threshold": 2.79},
               "publish": {"root": str(out / name / "releases")},
               "ledger": {"url": f"sqlite:///{out / name / 'ledger.db'}",
                          "cap_epsilon": 100.0},
               "partition_tracts": 2000, **extra}
        (out / name).mkdir(parents=True, exist_ok=True)
        path = out / name / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path

    from dask.distributed import Client, LocalCluster

    home = out / "prefect-home"
    home.mkdir(exist_ok=True)
    with prefect_server(home) as api_url:
        wall_local, rss_local = run_release(api_url, config("local"), "local")
        print(f"local runner: {wall_local:.1f} s wall; flow process peak RSS {rss_local:.0f} MiB")
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            wall_dask, rss_flow = run_release(
                api_url, config("dask", runner="dask", dask_address=cluster.scheduler_address),
                "dask")
            workers = client.run(lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        print(f"dask runner (2 local workers): {wall_dask:.1f} s wall; flow process peak RSS "
              f"{rss_flow:.0f} MiB; workers peak RSS "
              + ", ".join(f"{v:.0f} MiB" for v in workers.values()))
        print(f"ratio local/dask wall time: {wall_local / wall_dask:.2f}")


if __name__ == "__main__":
    main()
