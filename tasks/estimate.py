from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from dpatlas.release import staging
from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.crash import crashpoint
from dpatlas.release.draws import DrawLog
from dpatlas.release.estimate import Chunk, draw_estimates, draw_selection
from dpatlas.release.task_groups import group_label

from .common import TASK_OPTIONS
from .draws import draw_computed

# These tasks draw noise: never retried (TASK_OPTIONS). A rerun of the release resumes from
# the draws its log records instead (dpatlas.release.draws: each draw is made once).


def _group_run_name() -> str:
    from prefect.runtime import task_run

    return "select-estimate-" + group_label([c.name for c in task_run.parameters["chunks"]])


@task(name="select-estimate", task_run_name=_group_run_name, **TASK_OPTIONS)
def select_and_estimate_chunks(chunks: list[Chunk], budget: BudgetPlan, min_n: int,
                               internal: Path, draws: DrawLog,
                               seeds: list[tuple[int | None, int | None]]) -> list[Path]:
    """Each chunk in turn: its selection, then its estimates (``seeds``: each chunk's
    selection and estimate seeds). One task run for a run of consecutive chunks
    (:mod:`dpatlas.release.task_groups`); each chunk draws once under its own name."""
    log = get_run_logger()
    paths = []
    for chunk, (select_seed, estimate_seed) in zip(chunks, seeds):
        selection = select_chunk(chunk, budget, min_n, internal, draws, select_seed, log)
        paths.append(estimate_chunk(chunk, selection, budget, min_n, internal, draws,
                                    estimate_seed, log))
    return paths


def select_chunk(chunk: Chunk, budget: BudgetPlan, min_n: int, internal: Path,
                 draws: DrawLog, seed: int | None, log) -> Path:
    """Choose the mechanism per tract. The dp rule's noise is persisted and recorded before
    anything uses it; a resumed release reuses the recorded draw instead of drawing again."""
    path, sel = draw_computed(draws, "select", chunk.name, internal, seed, log,
                             draw_selection, chunk, budget, seed, min_n)
    if sel is not None:
        log.info("%s: selected %s", chunk.name, sel["mechanism"].value_counts().to_dict())
        crashpoint(f"after-select-{chunk.name}")
    return path


def estimate_chunk(chunk: Chunk, selection: Path, budget: BudgetPlan, min_n: int,
                   internal: Path, draws: DrawLog, seed: int | None, log) -> Path:
    """Estimate each tract-cell with its selected mechanism, from the recorded selection;
    persisted and recorded once, like the selection."""
    path, res = draw_computed(draws, "estimate", chunk.name, internal, seed, log,
                              draw_estimates, chunk, selection, budget, seed, min_n)
    if res is not None:
        log.info("%s: %d tract-cells, %s", chunk.name, len(res),
                 res["status"].value_counts().to_dict())
        crashpoint(f"after-estimate-{chunk.name}")
    return path


# Drawn on a Dask worker, into the staging location (dpatlas.release.staging): the task
# persists its draw at ``out`` (a URL) and returns only the sha256 of what it wrote; the flow
# records the draw in its log before any later stage is given it (flows/release.py).


@task(name="select", task_run_name="select-{chunk.name}", **TASK_OPTIONS)
def select_staged(chunk: Chunk, budget: BudgetPlan, min_n: int, out: str,
                  seed: int | None = None) -> str:
    """The selection of one chunk, read from and written to the staging URL."""
    sel = draw_selection(chunk, budget, seed, min_n)
    get_run_logger().info("%s: selected %s", chunk.name,
                          sel["mechanism"].value_counts().to_dict())
    return staging.write_parquet(sel, out)


@task(name="estimate", task_run_name="estimate-{chunk.name}", **TASK_OPTIONS)
def estimate_staged(chunk: Chunk, selection: str, budget: BudgetPlan, min_n: int, out: str,
                    seed: int | None = None) -> str:
    """The estimates of one chunk from its recorded selection, both at the staging URL."""
    res = draw_estimates(chunk, selection, budget, seed, min_n)
    get_run_logger().info("%s: %d tract-cells, %s", chunk.name, len(res),
                          res["status"].value_counts().to_dict())
    return staging.write_parquet(res, out)
