"""The release flow: the stages of release.md, one Prefect task per stage and partition.

ingest → validate (all partitions, before any noise) → allocate → select → estimate → publish

Selection needs the budget plan (the dp rule spends part of each tract's budget), so
allocation runs before selection. Every partition's selection draw and estimates are written
to the internal folder before the next stage reads them.
"""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional

import pandas as pd
from prefect import flow, get_run_logger

from dpatlas.config import load_config
from dpatlas.ingest import input_fingerprint
from dpatlas.publish import now_utc
from tasks.allocate import allocate_budget
from tasks.estimate import estimate_chunk, select_chunk
from tasks.ingest import ingest_partition, list_partitions
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


@flow(name="dpatlas-release", log_prints=True)
def release(config_path: str, release_id: Optional[str] = None,
            noise_seed: Optional[int] = None) -> str:
    """Run a full release; returns the published folder.

    ``noise_seed`` makes the noise repeatable (tests only; a seeded release is marked so in
    its manifest). Without it noise comes from the operating system's CSPRNG.
    """
    log = get_run_logger()
    started = now_utc()
    cfg = load_config(Path(config_path))
    rid = release_id or cfg.release_id or new_release_id()
    internal = cfg.publish.internal / rid
    if (cfg.publish.root / rid).exists():
        raise FileExistsError(f"release {rid} is already published at {cfg.publish.root / rid}")
    log.info("release %s: config %s, publish root %s", rid, config_path, cfg.publish.root)

    # 1-2. Ingest and validate every partition before any noise is drawn.
    parts = list_partitions(cfg.input)
    staged, reports, geoids = [], [], {}
    for i, part in enumerate(parts):
        df = ingest_partition(cfg.input, part.key)
        path, report = validate_partition(df, cfg.validation.policy, part.key, internal)
        staged.append(path)
        reports.append(report)
        geoids[path] = sorted(pd.read_parquet(path, columns=["geoid"])["geoid"].unique())
        _progress("ingest + validate", i + 1, len(parts))
    internal.mkdir(parents=True, exist_ok=True)
    (internal / "validation.json").write_text(json.dumps(reports, indent=2, default=str))
    boundaries = check_boundaries(cfg.boundaries.path, cfg.boundaries.geoid_column,
                                  {g for gs in geoids.values() for g in gs})

    # 3-4. Allocate the budget, then select a mechanism per tract (chunks of tracts).
    budget = allocate_budget(cfg)
    chunks = [(path, gs[i:i + cfg.partition_tracts], f"{Path(path).stem}-{i // cfg.partition_tracts}")
              for path, gs in geoids.items() for i in range(0, len(gs), cfg.partition_tracts)]
    selections = []
    for k, (path, gs, name) in enumerate(chunks):
        selections.append(select_chunk(path, gs, budget, cfg.publish.min_n,
                                       internal / "selection" / f"{name}.parquet", name,
                                       _seed(noise_seed, 1, k)))
        _progress("select", k + 1, len(chunks))

    # 5. Estimate with the selected mechanism (and the suite, by profile).
    results = []
    for k, ((path, gs, name), sel) in enumerate(zip(chunks, selections)):
        results.append(estimate_chunk(path, gs, sel, budget, cfg.publish.min_n,
                                      internal / "results" / f"{name}.parquet", name,
                                      _seed(noise_seed, 2, k)))
        _progress("estimate", k + 1, len(chunks))

    # 6. Publish the map-ready files and the manifest, atomically.
    source = "os.urandom" if noise_seed is None else f"seeded PCG64 ({noise_seed}): NOT FOR RELEASE"
    folder = publish_release(cfg, rid, results, boundaries, budget, input_fingerprint(cfg.input),
                             source, started, internal)
    _progress("publish", 1, 1)
    return str(folder)
