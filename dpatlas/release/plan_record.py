"""What a release records of its budget plan at the charge (draw log header and ledger), and
of the code that made it (issue 31).

The plan record holds everything of the :class:`~dpatlas.release.allocate.BudgetPlan` that
reaches a draw: the budgets (per tract, the primary budget, the interval's, the suite's and
each level's), the selection rule with its threshold and bands, and every step as the manifest
states it (ε, δ parameters, its guarantee with ε, δ or ρ, and per alternative each noise step's
mechanism, parameters, sensitivity and its derivation). A resume compares it whole
(``dpatlas.core.plan_record``). The code version is recorded beside it, never compared: a
release may be finished by any version that draws under the same plan.

Beside the plan, the *draw layout*: how the release's noise draws are grouped into tasks. Each
draw is recorded under its task's name (``state-06-c0``), so which records a name covers is
part of what was drawn; it follows from the input and config (both compared) and from the code
that groups them (:mod:`dpatlas.release.cell_groups`, the chunking of
``dpatlas.release.estimate``, :func:`~dpatlas.release.levels.level_tasks`). A version that
groups them otherwise would find other names, or the same names over other records, and draw
some records' noise again: the layout is recorded and compared too (``DrawLog.settle_plan``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import Sequence

from dpatlas.core.plan_record import plan_sha256
from dpatlas.publication.tract_files import code_version
from dpatlas.release.allocate import BudgetPlan
from dpatlas.release.estimate import Chunk
from dpatlas.release.levels import LevelTask

__all__ = ["DRAW_LAYOUT_VERSION", "PLAN_RECORD_VERSION", "budget_plan_record", "draw_layout",
           "plan_entry", "running_code"]

PLAN_RECORD_VERSION = 1
DRAW_LAYOUT_VERSION = 1
# The packages whose source makes a release's draws (hashed for the code version).
_SOURCE_PACKAGES = ("dpatlas", "mechanisms", "tasks", "flows")


def budget_plan_record(budget: BudgetPlan) -> dict:
    """The plan as plain data (canonicalised by dpatlas.core.plan_record)."""
    eps, delta = budget.charged()
    return {
        "plan_record_version": PLAN_RECORD_VERSION,
        "epsilon_per_tract": budget.epsilon_per_tract,
        "delta_per_tract": budget.delta_per_tract,
        "charged_per_tract_and_cell": {"epsilon": eps, "delta": delta},
        "rule": dataclasses.asdict(budget.rule),
        "primary_epsilon": budget.primary_epsilon,
        "suite": {s.estimator: {"epsilon": s.epsilon, "delta": s.delta} for s in budget.suite},
        "conversion_delta": budget.conversion_delta,
        "interval_epsilon": budget.interval_epsilon,
        "interval_level": budget.interval_level,
        "levels": {lp.level: {"epsilon": lp.epsilon, "estimate_epsilon": lp.estimate_epsilon,
                              "interval_epsilon": lp.interval_epsilon}
                   for lp in budget.levels},
        # by name, so a changed step is named by the refusal (not by its position)
        "steps": {s.name: {k: v for k, v in s.as_dict().items() if k != "step"}
                  for s in budget.steps},
    }


@functools.lru_cache(maxsize=1)
def _source_sha256() -> str:
    """sha256 of the installed source of the packages that draw (sorted relative names and
    contents of their .py files): tells versions apart where git is not available."""
    import importlib

    h = hashlib.sha256()
    for name in _SOURCE_PACKAGES:
        root = Path(importlib.import_module(name).__file__).resolve().parent
        for f in sorted(root.rglob("*.py")):
            h.update(f"{name}/{f.relative_to(root)}".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def running_code() -> dict:
    """The running code: the package version, the git commit of its checkout (None when not
    run from one) and the sha256 of its installed source (always)."""
    return {**code_version(), "source_sha256": _source_sha256()}


def plan_entry(budget: BudgetPlan) -> dict:
    """What the charge records: the plan, its sha256 and the running code's version."""
    record = budget_plan_record(budget)
    return {"plan": record, "plan_sha256": plan_sha256(record), "code_version": running_code()}


def draw_layout(chunks: Sequence[Chunk], levels: Sequence[LevelTask]) -> dict:
    """The release's draw tasks in order (in test mode a task's seed is its index): per
    chunk (its selection and its estimates) its name, GEOID range and cells (None: all of its
    tracts' cells); per level task its name, state and cells. The staged file a chunk reads
    is left out: where the records lie is not what was drawn."""
    return {"draw_layout_version": DRAW_LAYOUT_VERSION,
            "chunks": [[c.name, c.first_geoid, c.last_geoid,
                        None if c.cells is None else list(c.cells)] for c in chunks],
            "levels": [[u.name, u.state, None if u.cells is None else list(u.cells)]
                       for u in levels]}
