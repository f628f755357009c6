"""The release flow: the stages of release.md, one Prefect task per stage and partition.

ingest → validate (every partition, before any noise) → allocate → charge the ledger →
select → estimate (chunks of tracts, on the configured task runner) → publish → feed

Selection needs the budget plan (the dp rule spends part of each tract's budget), so
allocation runs before selection. The ledger is charged before any noise is drawn, and every
chunk's selection draw and estimates are persisted before the next stage reads them, so a
release that crashed resumes without drawing fresh noise for work already drawn; a completed
release id reruns as a no-op.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from dpatlas.config import ReleaseConfig, fingerprint, load_config
from dpatlas.crash import crashpoint
from dpatlas.feed import update_feed
from dpatlas.ingest import input_fingerprint
from dpatlas.ledger import Ledger
from dpatlas.publish import now_utc, sha256_file
from dpatlas.state import ReleaseLock, check_same_input
from tasks.allocate import allocate_budget
from tasks.estimate import estimate_chunk, select_chunk
from tasks.ingest import ingest_partition, list_partitions
from tasks.ledger import charge_release, charges
from tasks.publish import publish_release
from tasks.validate import check_boundaries, validate_partition

# A terminal progress callback (stage, done, total), set by the command line; flows run in the
# same process, and a callable cannot be a flow parameter.
PROGRESS: Optional[Callable[[str, int, int], None]] = None


def _progress(stage: str, done: int, total: int) -> None:
    if PROGRESS is not None:
        PROGRESS(stage, done, total)


def new_release_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def _seed(base: Optional[int], stage: int, index: int) -> Optional[int]:
    return None if base is None else base * 1_000_003 + stage * 10_007 + index


def chunk_task_runner(cfg: ReleaseConfig):
    """Local threads, or Dask (prefect-dask): a given scheduler, or a local cluster."""
    if cfg.runner == "dask":
        from prefect_dask import DaskTaskRunner

        if cfg.dask_address:
            return DaskTaskRunner(address=cfg.dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.dask_workers,
                                              "threads_per_worker": 1, "processes": True})
    return ThreadPoolTaskRunner(max_workers=2)


@flow(name="dpatlas-select-estimate", persist_result=False)
def select_and_estimate(chunks: list[tuple[str, list[str], str]], budget, min_n: int,
                        internal: str, noise_seed: Optional[int] = None) -> list[str]:
    """Selection then estimation for every chunk, as futures on the flow's task runner."""
    internal = Path(internal)
    selections = [select_chunk.submit(Path(path), gs, budget, min_n,
                                      internal / "selection" / f"{name}.parquet", name,
                                      _seed(noise_seed, 1, k))
                  for k, (path, gs, name) in enumerate(chunks)]
    estimates = [estimate_chunk.submit(Path(path), gs, sel, budget, min_n,
                                       internal / "results" / f"{name}.parquet", name,
                                       _seed(noise_seed, 2, k))
                 for k, ((path, gs, name), sel) in enumerate(zip(chunks, selections))]
    done = []
    for k, fut in enumerate(estimates):
        done.append(str(fut.result()))
        _progress("select + estimate", k + 1, len(estimates))
    return done


@flow(name="dpatlas-release", log_prints=True)
def release(config_path: str, release_id: Optional[str] = None,
            noise_seed: Optional[int] = None) -> str:
    """Run (or resume) a release; returns the published folder.

    ``noise_seed`` makes the noise repeatable (tests only; such a release is marked NOT FOR
    RELEASE in its manifest). Without it noise comes from the operating system's CSPRNG.
    """
    log = get_run_logger()
    cfg = load_config(Path(config_path))
    rid = release_id or cfg.release_id or new_release_id()
    root, internal = cfg.publish.root, cfg.publish.internal / rid
    ledger = Ledger(cfg.ledger.url)
    with ReleaseLock(internal, rid):
        done = ledger.release(rid)
        if done and done["status"] == "published":
            update_feed(root, rid)  # idempotent: completes a feed update a crash interrupted
            log.info("release %s is already published at %s: nothing new, nothing charged",
                     rid, root / rid)
            return str(root / rid)
        if (root / rid).exists() and not done:
            raise FileExistsError(f"{root / rid} exists but the ledger at {cfg.ledger.url} has "
                                  f"no release {rid}: is this the right ledger?")
        config_sha, input_sha = fingerprint(cfg), input_fingerprint(cfg.input)
        check_same_input(internal, input_sha, config_sha)
        state = json.loads((internal / "state.json").read_text())
        started = state.setdefault("started", now_utc())
        (internal / "state.json").write_text(json.dumps(state))
        log.info("release %s: config %s, publish root %s", rid, config_path, root)

        # 1-2. Ingest and validate every partition before any noise is drawn.
        parts = list_partitions(cfg.input)
        reports, geoids, cells = [], {}, set()
        for i, part in enumerate(parts):
            df = ingest_partition(cfg.input, part.key)
            path, report = validate_partition(df, cfg.validation.policy, part.key, internal)
            reports.append(report)
            staged = pd.read_parquet(path, columns=["geoid", "cell"])
            geoids[str(path)] = sorted(staged["geoid"].unique())
            cells |= set(staged["cell"].unique())
            _progress("ingest + validate", i + 1, len(parts))
        (internal / "validation.json").write_text(json.dumps(reports, indent=2, default=str))
        boundaries = check_boundaries(cfg.boundaries.path, cfg.boundaries.geoid_column,
                                      {g for gs in geoids.values() for g in gs})

        # 3. Allocate the budget; charge the ledger (refused over the cap) before any noise.
        budget = allocate_budget(cfg)
        owner = f"{socket.gethostname()}:{os.getpid()}"
        charge_release(cfg.ledger, rid, budget, sorted(cells), config_sha, owner)
        crashpoint("after-ledger-charge")

        # 4-5. Select a mechanism per tract, then estimate, chunk by chunk.
        step = cfg.partition_tracts
        chunks = [(path, gs[i:i + step], f"{Path(path).stem}-{i // step}")
                  for path, gs in geoids.items() for i in range(0, len(gs), step)]
        stage = select_and_estimate.with_options(task_runner=chunk_task_runner(cfg))
        results = [Path(p) for p in stage(chunks, budget, cfg.publish.min_n, str(internal),
                                          noise_seed)]

        # 6. Publish the map-ready files and the manifest (atomically), complete the ledger
        # entry, then show the release in the feed.
        source = ("os.urandom" if noise_seed is None
                  else f"seeded PCG64 ({noise_seed}): NOT FOR RELEASE")
        charged = charges(budget, sorted(cells))
        entry = {"ledger": _redact(cfg.ledger.url), "dataset": cfg.ledger.dataset,
                 "release_id": rid, "charges": len(charged),
                 "epsilon": sum(c.epsilon for c in charged),
                 "delta": sum(c.delta for c in charged)}
        folder = publish_release(cfg, rid, results, boundaries, budget, input_sha, source,
                                 started, internal, entry)
        crashpoint("after-publish")
        ledger.complete_release(rid, sha256_file(folder / "manifest.json"))
        crashpoint("after-ledger-complete")
        update_feed(root, rid)
        _progress("publish", 1, 1)
        return str(folder)


def _redact(url: str) -> str:
    """A database URL without its password, for the public manifest."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - never let a display detail fail a release
        return "(unparseable url)"
