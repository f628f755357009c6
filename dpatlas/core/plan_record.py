"""The budget plan as a release records it at its charge: canonical JSON, its sha256, and what
changed between two plans (issue 31).

A resumed release must draw under the plan it was charged for: the draw log's header and the
ledger both keep the plan (``dpatlas.release.plan_record`` builds it from the BudgetPlan), and a
resume whose plan differs is refused with :class:`PlanChanged`, naming what changed.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from dpatlas.core.errors import ReleaseRefused

__all__ = ["PlanChanged", "canonical_plan", "describe_changes", "plan_changes", "plan_sha256"]

SHOWN_CHANGES = 8  # the differences a refusal names (the rest are counted)


class PlanChanged(ValueError, ReleaseRefused):
    """A resumed release's budget plan differs from the one it was charged (and drew) under:
    its draws would compose to more than the ledger charged and the manifest states."""

    def __init__(self, message: str, changes: list[str]):
        super().__init__(message)
        self.changes = changes


def _plain(value: Any) -> Any:
    """JSON-ready: tuples as lists, non-finite floats as text (JSON has no infinity)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a numpy scalar
        return _plain(value.item())
    return value


def canonical_plan(plan: dict) -> str:
    """The plan as canonical JSON: sorted keys, no spaces, floats by their shortest repr."""
    return json.dumps(_plain(plan), sort_keys=True, separators=(",", ":"), allow_nan=False)


def plan_sha256(plan: dict) -> str:
    return hashlib.sha256(canonical_plan(plan).encode()).hexdigest()


_ABSENT = object()
_SHOWN_CHARS = 60  # a removed or added section is shown this long


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(none)"
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


def _diff(old: Any, new: Any, path: str, out: list[tuple[str, Any, Any]]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            where = f"{path}/{key}" if path else str(key)
            _diff(old.get(key, _ABSENT), new.get(key, _ABSENT), where, out)
    elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            _diff(a, b, f"{path}[{i}]", out)
    elif old is _ABSENT or new is _ABSENT or old != new:
        out.append((path, old, new))


def plan_changes(old: dict, new: dict) -> list[str]:
    """Every difference, e.g. ``levels/county/epsilon: 0.31 → 0.45`` (a section only one plan
    has is named whole): the shallowest first (a step's budget before the noise parameters
    derived from it), then by path."""
    found: list[tuple[str, Any, Any]] = []
    _diff(_plain(old), _plain(new), "", found)
    found.sort(key=lambda d: (d[0].count("/") + d[0].count("["), d[0]))
    return [f"{path or '(the plan)'}: {_shown(a)} → {_shown(b)}" for path, a, b in found]


def describe_changes(changes: list[str], limit: int = SHOWN_CHANGES) -> str:
    """The first ``limit`` changes, '; '-separated, and how many more."""
    shown = "; ".join(changes[:limit])
    more = len(changes) - limit
    return shown + (f"; and {more} more difference(s)" if more > 0 else "")
