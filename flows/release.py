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
from dpatlas.ids import validate_release_id
from dpatlas.ingest import input_fingerprint
from dpatlas.ledger import Ledger
from dpatlas.preflight import check_before_writing, check_feasible, mark_root
from dpatlas.publish import now_utc, sha256_file
from dpatlas.state import ReleaseLock, check_same_input
from tasks.allocate import allocate_budget
from tasks.estimate import estimate_chunk, select_chunk
from tasks.ingest import ingest_partition, list_partitions
from tasks.ledger import LEASE_SECONDS, charge_release, charges
from tasks.publish import publish_release
from tasks.validate import (bound_contributions, check_boundaries, check_change_limit,
                            validate_partition)

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

    ``noise_seed`` makes the noise repeatable: tests only, refused unless the config's
    ``publish.mode`` is ``test`` (a test root, whose manifests say NOT FOR RELEASE). Without it
    noise comes from the operating system's CSPRNG.
    """
    log = get_run_logger()
    cfg = load_config(Path(config_path))
    rid = validate_release_id(release_id or cfg.release_id or new_release_id())
    check_before_writing(cfg, rid, noise_seed)  # before anything is written
    root, internal = cfg.publish.root, cfg.publish.internal / rid
    ledger = Ledger(cfg.ledger.url)
    # The lease owner is this host and internal folder: the local lock below makes it unique
    # on this host, so a crashed run resumes at once here, while another host (another
    # owner) must wait for the lease to expire.
    owner = f"{socket.gethostname()}:{Path(os.path.realpath(internal))}"
    with ReleaseLock(internal, rid):
        done = ledger.release(rid)
        if done and done["status"] == "published":
            update_feed(root, rid)  # idempotent: completes a feed update a crash interrupted
            log.info("release %s is already published at %s: nothing new, nothing charged",
                     rid, root / rid)
            return str(root / rid)
        if os.path.lexists(root / rid) and not done:
            raise FileExistsError(f"{root / rid} exists but the ledger at "
                                  f"{ledger.url} has no release {rid}: is this the right "
                                  "ledger?")
        config_sha, input_sha = fingerprint(cfg), input_fingerprint(cfg.input)
        check_same_input(internal, input_sha, config_sha)
        state = json.loads((internal / "state.json").read_text())
        started = state.setdefault("started", now_utc())
        (internal / "state.json").write_text(json.dumps(state))
        log.info("release %s: config %s, publish root %s", rid, config_path, root)

        # 1-2. Ingest and validate every partition, then the checks that span partitions,
        # all before any noise is drawn or any budget charged.
        parts = list_partitions(cfg.input)
        reports, staged = [], []
        for i, part in enumerate(parts):
            df = ingest_partition(cfg.input, part.key)
            path, report = validate_partition(df, cfg.validation.policy, part.key, internal)
            reports.append(report)
            staged.append(Path(path))
            _progress("ingest + validate", i + 1, len(parts))
        check_change_limit(reports, cfg.validation.max_changed_share)
        contributions = None
        if cfg.input.columns.person_id:
            contributions = bound_contributions(staged, cfg.validation.contributions, internal)
        (internal / "validation.json").write_text(json.dumps(
            {"partitions": reports, "contributions": contributions}, indent=2, default=str))
        geoids, sizes = _staged_tracts(staged)
        boundaries = check_boundaries(cfg.boundaries.path, cfg.boundaries.geoid_column,
                                      set(sizes["geoid"]))

        # 3. Allocate the budget; check the release can complete; charge the ledger (refused
        # over the cap) and take the release's lease, before any noise.
        budget = allocate_budget(cfg)
        check_feasible(cfg, budget, sizes)
        cells = sorted(sizes["cell"].unique())
        charge_release(cfg.ledger, rid, budget, cells, config_sha, owner)
        with ledger.leased(rid, owner, LEASE_SECONDS) as lease:
            crashpoint("after-ledger-charge")

            # 4-5. Select a mechanism per tract, then estimate, chunk by chunk.
            step = cfg.partition_tracts
            chunks = [(str(path), gs[i:i + step], f"{Path(path).stem}-{i // step}")
                      for path, gs in geoids.items() for i in range(0, len(gs), step)]
            stage = select_and_estimate.with_options(task_runner=chunk_task_runner(cfg))
            results = [Path(p) for p in stage(chunks, budget, cfg.publish.min_n,
                                              str(internal), noise_seed)]

            # 6. Publish the map-ready files and the manifest (atomically, under the lease),
            # complete the ledger entry, then show the release in the feed.
            source = ("os.urandom" if noise_seed is None
                      else "seeded (test only, NOT FOR RELEASE)")
            charged = charges(budget, cells)
            entry = {"dataset": cfg.ledger.dataset, "release_id": rid,
                     "charges": len(charged),
                     "epsilon": sum(c.epsilon for c in charged),
                     "delta": sum(c.delta for c in charged)}
            facts = {"person_id_checked": contributions is not None,
                     "person_id_column": cfg.input.columns.person_id,
                     "contributions_policy": cfg.validation.contributions,
                     "validation_policy": cfg.validation.policy}
            mark_root(cfg)
            folder = publish_release(cfg, rid, results, boundaries, budget, input_sha, source,
                                     started, internal, entry, facts, lease.check)
            crashpoint("after-publish")
            lease.check()
            ledger.complete_release(rid, sha256_file(folder / "manifest.json"), owner)
            crashpoint("after-ledger-complete")
        update_feed(root, rid)
        _progress("publish", 1, 1)
        return str(folder)


def _staged_tracts(staged: list[Path]) -> tuple[dict[str, list[str]], pd.DataFrame]:
    """Per staged partition its sorted tract GEOIDs, and n per (geoid, cell) over all of them.

    Read after contribution bounding, which may have rewritten staged files."""
    geoids, frames = {}, []
    for path in staged:
        cols = pd.read_parquet(path, columns=["geoid", "cell"])
        geoids[str(path)] = sorted(cols["geoid"].unique())
        frames.append(cols.groupby(["geoid", "cell"]).size().rename("n").reset_index())
    sizes = (pd.concat(frames, ignore_index=True) if frames
             else pd.DataFrame({"geoid": [], "cell": [], "n": []}))
    return geoids, sizes
