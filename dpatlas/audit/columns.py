"""The columns check (u): every column public or paid for by its step, interval and SE
columns with their step, and (version 4) every value column declaring the one estimand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq

from .accounting import guarantee_from
from .base import (
    ESTIMAND_ID, INTERVAL_COLUMNS, INTERVAL_STEP, MODEL_COLUMNS, MODEL_PAYER, MOE90_COLUMNS,
    Mismatch, PRIMARY_STEP, PUBLIC_COLUMNS, REL_TOL, SELECTION_STEP, SE_COLUMNS, SPEND_COLUMNS,
    VALUE_COLUMNS, close,
)
from .files import readable


def _suite_step(column: str) -> str | None:
    for end in ("_p25", "_p75"):
        if column.endswith(end) and column[:-len(end)] not in ("", "p25", "p75"):
            return f"suite: {column[:-len(end)]}"
    return None


def column_payer(column: str, m: dict) -> str | None:
    """What pays for a published column: 'public', a budget step's name, or a derivation
    from paid or public values; None if nothing does."""
    if column in PUBLIC_COLUMNS:
        return "public"
    if column in MODEL_COLUMNS:
        return MODEL_PAYER
    if column in VALUE_COLUMNS:
        return PRIMARY_STEP
    if column in INTERVAL_COLUMNS or column in SE_COLUMNS or column in MOE90_COLUMNS:
        return INTERVAL_STEP
    if column == "mechanism":
        return SELECTION_STEP if m["selection"]["rule"] == "dp" else "public (the rule and n)"
    if column == "reason":
        return "public (an enumerated reason)"
    if column in SPEND_COLUMNS:
        return "public (the budget, by status)"
    return _suite_step(column)


def check_columns(folder: Path, m: dict) -> str:
    """Every published column is paid for: public ones only from PUBLIC_COLUMNS; values by
    their budget step (interval columns by the interval step, whose epsilon the manifest's
    intervals section states)."""
    try:
        columns = pq.read_schema(readable(folder / "tracts.parquet")).names
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    steps = {s.get("step"): s for s in m["budget"]["steps"]}
    problems = []
    for column in columns:
        payer = column_payer(column, m)
        if payer is None:
            problems.append(f"{column!r} is paid for by no step (only {', '.join(PUBLIC_COLUMNS)} "
                            "may be public)")
        elif not payer.startswith(("public", MODEL_PAYER)) and payer not in steps:
            problems.append(f"{column!r} needs the budget step {payer!r}, which the budget "
                            "does not have")
    for key, text in m["published_columns"].items():
        declared = [c.strip() for c in str(key).split(",") if c.strip()]
        if isinstance(text, str) and text.strip().lower() == "public":
            extra = [c for c in declared if c not in PUBLIC_COLUMNS]
            if extra:
                problems.append(f"published_columns declares {extra} public; only "
                                f"{', '.join(PUBLIC_COLUMNS)} may be")
    problems += _interval_problems(m, columns, steps)
    problems += _model_column_problems(m, columns)
    declared = _estimand_declaration_problems(folder, m, columns)
    problems += declared
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{len(columns)} columns, each public or paid for by its budget step"
            + ("" if m.get("manifest_version") in (2, 3) else
               f"; every value, interval, SE and model column declares the {ESTIMAND_ID}"))


def _model_column_problems(m: dict, columns: list[str]) -> list[str]:
    """The model columns: all or none, exactly with the ``small_area`` section, declared in
    published_columns as post-processing (they have no budget step of their own)."""
    has = [c for c in MODEL_COLUMNS if c in columns]
    if not has:
        return ["a small_area section without the model columns"] if m.get("small_area") else []
    problems = []
    if len(has) != len(MODEL_COLUMNS):
        problems.append(f"model columns {has} without the rest of {list(MODEL_COLUMNS)}")
    if not isinstance(m.get("small_area"), dict):
        problems.append("model columns without the manifest's small_area section")
    declared = {c.strip(): text for key, text in m["published_columns"].items()
                for c in str(key).split(",")}
    for column in has:
        text = declared.get(column)
        if not (isinstance(text, str) and "post-processing" in text):
            problems.append(f"{column!r} is not declared in published_columns as "
                            "post-processing of published columns")
    return problems


def _estimand_columns(columns) -> list[str]:
    """The published columns that must declare the one estimand: the values, their intervals,
    standard errors and margins of error, and the model's estimates with theirs (a model
    diagnostic, such as a standardised difference, estimates nothing)."""
    model = [c for c in columns if c.startswith(("p25_model", "p75_model"))
             and c.endswith(("_model", "_lo", "_hi", "_se"))]
    return [c for c in columns if c in ("p25", "p75", *INTERVAL_COLUMNS, *SE_COLUMNS,
                                        *MOE90_COLUMNS)] + model


def _estimand_declaration_problems(folder: Path, m: dict, columns: list[str]) -> list[str]:
    """From manifest version 4: each value, interval, SE, margin and model column declares the
    one estimand (ESTIMAND_ID) where the release declares its columns, its manifest
    ``published_columns`` entry and, where published, its ``tracts.schema.json`` field."""
    if m.get("manifest_version") in (2, 3):
        return []  # published before the one estimand: they state the estimand per mechanism
    wanted = _estimand_columns(columns)
    declared = {c.strip(): text for key, text in m["published_columns"].items()
                for c in str(key).split(",")}
    problems = [f"{c!r} is not declared with the {ESTIMAND_ID} in published_columns"
                for c in wanted if ESTIMAND_ID not in str(declared.get(c, ""))]
    if "tracts.schema.json" in (m.get("files") or {}):
        try:
            schema = json.loads(readable(folder / "tracts.schema.json").read_text())
            fields = {f.get("name"): f.get("description") for f in schema["fields"]}
        except Exception as err:  # noqa: BLE001 - any reader error is a finding
            return problems + [f"tracts.schema.json cannot be read: {err}"]
        problems += [f"{c!r} is not declared with the {ESTIMAND_ID} in tracts.schema.json"
                     for c in wanted if ESTIMAND_ID not in str(fields.get(c, ""))]
    return problems


def _interval_problems(m: dict, columns: list[str], steps: dict) -> list[str]:
    has_columns = [c for c in INTERVAL_COLUMNS if c in columns]
    section, step = m["intervals"], steps.get(INTERVAL_STEP)
    if not has_columns and step is None and section is None:
        return []
    problems = []
    if has_columns and len(has_columns) != len(INTERVAL_COLUMNS):
        problems.append(f"interval columns {has_columns} without the rest of "
                        f"{list(INTERVAL_COLUMNS)}")
    problems += _standard_error_column_problems(m, columns, bool(has_columns))
    if not has_columns:
        problems.append("the interval step or section is there but no interval column is")
    if not isinstance(section, dict):
        problems.append("interval columns without the manifest's intervals section")
        return problems
    if step is None:
        return problems  # reported above, as a column without its step
    eps = section.get("epsilon")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not close(
            float(eps), float(step.get("epsilon_param", math.nan))):
        problems.append(f"intervals.epsilon {eps!r} is not the interval step's "
                        f"{step.get('epsilon_param')!r}")
    else:
        g = guarantee_from(step.get("guarantee"))
        if g.kind != "pure" or g.epsilon > float(eps) * (1 + REL_TOL):
            problems.append(f"intervals.epsilon {eps!r} is below its step's {g.text()}")
    level = section.get("level")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        problems.append(f"intervals.level {level!r} is not in (0, 1)")
    return problems


def _standard_error_column_problems(m: dict, columns: list[str], intervals: bool) -> list[str]:
    """p25_se, p75_se: present exactly with the intervals, and declared in published_columns as
    post-processing of the interval step (they have no budget of their own)."""
    has = [c for c in SE_COLUMNS if c in columns]
    # Version 2 manifests predate the standard errors: their releases are audited as published.
    required = m.get("manifest_version") != 2
    margins = [c for c in MOE90_COLUMNS if c in columns]
    if margins and len(has) != len(SE_COLUMNS):
        return [f"margins of error {margins} without the standard errors {list(SE_COLUMNS)}"]
    if intervals and len(has) != len(SE_COLUMNS) and (required or has):
        return [f"interval columns without their standard errors {list(SE_COLUMNS)}"]
    if has and not intervals:
        return [f"standard errors {has} without the interval columns they are computed from"]
    problems = []
    for key, text in m["published_columns"].items():
        declared = {c.strip() for c in str(key).split(",")}
        if declared & {*has, *margins} and not (isinstance(text, str) and "post-processing" in text
                                        and f"'{INTERVAL_STEP}'" in text):
            problems.append(f"published_columns {key!r} must state them as post-processing of "
                            f"the step '{INTERVAL_STEP}'")
    return problems
