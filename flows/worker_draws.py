"""Draws made on Dask workers that share only the staging location with the flow
(:mod:`dpatlas.release.staging`): each task writes its draw at a URL and returns its sha256;
the flow records it in the release's draw log before anything reads it, and copies it into
the internal folder checked against that sha256. Used for the chunks' selections and
estimates and the level tasks' county and state estimates."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from dpatlas.core.files import write_bytes_atomic
from dpatlas.release import staging
from dpatlas.release.crash import crashpoint
from dpatlas.release.draws import STAGE_FOLDERS, DrawLog, draw_path, noise_source


class Named(Protocol):
    """A unit of work that draws noise under its name: a chunk, or a level task."""

    name: str


def task_seed(base: Optional[int], stage: int, index: int) -> Optional[int]:
    """Task ``index``'s seed in ``stage``: it depends on the index alone, so the noise a task
    draws does not depend on the order in which the tasks run."""
    return None if base is None else base * 1_000_003 + stage * 10_007 + index


def draw_urls(location: str, stage: str, units: Sequence[Named]) -> list[str]:
    """Where each unit's draw of ``stage`` is written on the workers (and read again: the
    publish parts read the chunks' estimates there)."""
    return [staging.join(location, STAGE_FOLDERS[stage], f"{u.name}.parquet") for u in units]


def draw_on_workers(log: DrawLog, stage: str, units: Sequence[Named], location: str,
                    noise_seed: Optional[int], stage_index: int,
                    submit: Callable) -> list[str]:
    """Each unit's recorded draw of ``stage`` (its URL): reused when recorded, else drawn by
    ``submit(todo, outs, seeds)`` on the workers and recorded here. The draws that succeeded
    are recorded even when another failed, so a resume reuses them."""
    urls = draw_urls(location, stage, units)
    seeds = [task_seed(noise_seed, stage_index, k) for k in range(len(units))]
    todo = [k for k, u in enumerate(units) if log.reuse(stage, u.name) is None]
    if not todo:  # a resume that finds every draw of this stage recorded
        return urls
    futures = submit(todo, [urls[k] for k in todo], [seeds[k] for k in todo])
    futures.wait()
    errors = []
    for k, future in zip(todo, futures):
        try:
            digest = future.result()
        except Exception as err:  # noqa: BLE001 - raised below, after the others are recorded
            errors.append(err)
            continue
        log.record_url(stage, units[k].name, urls[k], digest, noise_source(seeds[k]))
    crashpoint(f"after-staged-{stage}")
    if errors:
        raise errors[0]
    return urls


def copy_recorded(log: DrawLog, stage: str, units: Sequence[Named],
                  internal: Path) -> list[Path]:
    """Each unit's recorded draw of ``stage`` copied into the internal folder for publishing
    (``<internal>/<stage folder>/<name>.parquet``), refused if it differs from the one
    recorded."""
    paths = []
    for unit in units:
        url = log.reuse(stage, unit.name)  # refused if it differs from the one recorded
        local = draw_path(internal, stage, unit.name)
        paths.append(write_bytes_atomic(local, staging.read_bytes(url), private=True))
    return paths
