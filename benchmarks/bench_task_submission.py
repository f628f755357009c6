"""What submitting a task run to Dask costs the flow process: prefect-dask's ``DaskTaskRunner``
against the release's ``KeyedDaskTaskRunner`` (flows/keyed_dask.py), side by side in one run.
The keyed runner is run twice: with Prefect's own ``SettingsContext.serialize`` (every Prefect
setting dumped for every task run) and Prefect's own client on the worker (a TLS context built
for every client, two a task run), then as the release runs it: a settings context dumped once
(``serialize_settings_once``) and the worker's clients sharing one TLS context
(``tasks/prefect_client.py``); prefect-dask's runner is run with Prefect's own.

    .venv/bin/python benchmarks/bench_task_submission.py [--tasks 200]

Each runner maps one task over ``--tasks`` inputs on the same one-worker Dask cluster (a
separate process) with the parameters the release's select tasks take: a chunk
(``dpatlas.release.estimate.Chunk``), the default config's budget plan (``BudgetPlan``), the
minimum n, an output URL and a seed. The figure is the flow process's own CPU seconds
(this process: the flow runs here) per task run, from the first submission until every result
is back; the worker process's CPU over the same span is printed beside it. Prefect's API is
``PREFECT_API_URL`` or, unset, Prefect's ephemeral server. Run it alone: each line prints the
load average too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402


def select_like_parameters(tasks: int):
    """What the release's select tasks are given: a chunk each, then the budget plan, the
    minimum n, an output URL and a seed each."""
    from dpatlas.core.config import ReleaseConfig
    from dpatlas.release.allocate import plan
    from dpatlas.release.estimate import Chunk
    from dpatlas.release.thresholds import resolve_threshold

    cfg = ReleaseConfig(input={"path": "/staging/national/input"},
                        boundaries={"path": "/staging/national/tracts.parquet"}, selection={})
    chunks = [Chunk(Path(f"/staging/national/staged/input-{k % 51:02d}.parquet"),
                    f"{k % 51:02d}001000100", f"{k % 51:02d}999000100", f"input-{k:02d}-0")
              for k in range(tasks)]
    outs = [f"file:///staging/national/selections/input-{k:02d}-0.parquet" for k in range(tasks)]
    return chunks, plan(cfg, resolve_threshold(cfg.selection)), cfg.publish.min_n, outs, \
        list(range(tasks))


def _process_cpu() -> float:
    import psutil

    times = psutil.Process().cpu_times()
    return times.user + times.system


def _shared_tls(enabled: bool) -> None:
    from tasks.prefect_client import use_shared_tls

    use_shared_tls(enabled)


def worker_cpu(client) -> float:
    """The worker processes' CPU seconds so far (``client``: a Dask client of the cluster)."""
    return sum(client.run(_process_cpu).values())


def run(runner_class, client, tasks: int, label: str):
    from prefect import flow, task, unmapped

    @task(name="select-like")
    def select_like(chunk, budget, min_n: int, out: str, seed: int) -> str:
        return chunk.name

    chunks, budget, min_n, outs, seeds = select_like_parameters(tasks)

    @flow(name=f"submission-{label}", persist_result=False)
    def submit_all() -> list[str]:
        futures = select_like.map(chunks, unmapped(budget), unmapped(min_n), outs, seeds)
        return [f.result() for f in futures]

    address = client.scheduler.address
    before = worker_cpu(client)
    with measure(f"{label}: {tasks} task runs") as span:
        got = submit_all.with_options(task_runner=runner_class(address=address))()
    span.worker_cpu = worker_cpu(client) - before
    if got != [c.name for c in chunks]:
        raise SystemExit(f"{label}: wrong results {got[:5]}...")
    return span


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    args = parser.parse_args()

    from distributed import Client, LocalCluster
    from prefect.context import SettingsContext
    from prefect_dask import DaskTaskRunner

    from flows.keyed_dask import (PREFECT_SETTINGS_SERIALIZE, KeyedDaskTaskRunner,
                                  serialize_settings_once)

    ways = (("DaskTaskRunner", DaskTaskRunner, PREFECT_SETTINGS_SERIALIZE, False),
            ("KeyedDaskTaskRunner, settings dumped per task run", KeyedDaskTaskRunner,
             PREFECT_SETTINGS_SERIALIZE, False),
            ("KeyedDaskTaskRunner", KeyedDaskTaskRunner, serialize_settings_once, True))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        run(KeyedDaskTaskRunner, client, 5, "warm-up")
        spans = {}
        try:
            for label, runner, serialize, shared_tls in ways:
                SettingsContext.serialize = serialize
                client.run(_shared_tls, shared_tls)  # the workers' Prefect clients
                spans[label] = span = run(runner, client, args.tasks, label)
                print(span.line())
                print(f"  {label}: {1000 * span.cpu_process / args.tasks:.1f} ms of the flow "
                      f"process's CPU per task run; the worker's "
                      f"{1000 * span.worker_cpu / args.tasks:.1f} ms "
                      f"({'one TLS context shared' if shared_tls else 'a TLS context per client'})")
        finally:
            SettingsContext.serialize = serialize_settings_once  # as the release has it
    stock = spans["DaskTaskRunner"].cpu_process
    for label, *_ in ways[1:]:
        print(f"flow CPU per task run, DaskTaskRunner / {label}: "
              f"{stock / max(spans[label].cpu_process, 1e-9):.2f}")
    own = spans[ways[1][0]].worker_cpu
    print(f"worker CPU per task run, a TLS context per client / one shared: "
          f"{own / max(spans['KeyedDaskTaskRunner'].worker_cpu, 1e-9):.2f}")


if __name__ == "__main__":
    main()
