"""Validation results in the operator's words: the input's own column names and the fix.

The pipeline works on its own columns (``geoid``, ``x``, ``y``, ``cell``, ``person_id``) and
the input contract is written in them; an operator knows only the names in their file, which
``input.columns`` maps (e.g. ``child_rank: kid_rank`` is our ``y``). Whatever an operator reads
about a validation (the refusal, the offline report, the quarantine file) goes through here,
so it names ``kid_rank``, never ``y``, and says how to fix what failed.
"""

from __future__ import annotations

import re

import pandas as pd

_RANKS = ("x", "y")


def user_name(column: str | None, columns: dict[str, str] | None) -> str | None:
    """The input's name for one of the pipeline's columns (itself when not mapped)."""
    return (columns or {}).get(column, column) if column else column


def in_user_words(expectation: dict, columns: dict[str, str] | None) -> dict:
    """An expectation's outcome (``column``, ``details``, ...) naming the input's column.

    The contract's descriptions start with the column ("y is never null", "column y is
    present", "column 'y' is missing"): that leading name is replaced, nothing else, so values
    the details quote are left as they are."""
    column = expectation.get("column")
    name = user_name(column, columns)
    if not column or name == column:
        return dict(expectation)
    details = re.sub(rf"^(column '?)?{re.escape(column)}\b",
                     lambda m: (m.group(1) or "") + name, str(expectation.get("details", "")),
                     count=1)
    return {**expectation, "column": name, "details": details}


def fix_for(expectation: str, column: str | None, columns: dict[str, str] | None) -> str:
    """How an operator fixes one failed expectation of the input contract."""
    name = user_name(column, columns)
    if expectation == "expect_column_to_exist":
        return (f"the input has no column for '{name}': map your column names under "
                "input.columns in the config")
    if column in _RANKS and expectation == "expect_column_values_to_be_between":
        return (f"ranks ('{name}') must lie in [0, 1]: rescale them (percentiles on [0, 100]: "
                "set input.rank_scale: percentile), or set validation.policy: clip (clip them "
                "to [0, 1]) or drop (quarantine those rows)")
    if column in _RANKS:
        return (f"'{name}' must hold a number on every row: fix those rows, or set "
                "validation.policy: drop (quarantine them)")
    if column == "geoid":
        return (f"'{name}' must hold 11-digit tract GEOIDs as text on every row: fix those "
                "rows, or set validation.policy: drop (quarantine them)")
    if column:
        return (f"'{name}' must be set (not blank) on every row: fix those rows, or set "
                "validation.policy: drop (quarantine them)")
    return ("fix the input, or set validation.policy to 'clip' (ranks) or 'drop' (rows) in "
            "the config")


def fixes(failures: list[dict], columns: dict[str, str] | None,
          policy: str = "fail") -> list[str]:
    """The fixes for failed expectations (``expectation``, ``column``, ``count``), each once,
    in order. Under policy drop, rows that failed were left out, not refused: said so."""
    found = [DROPPED if policy == "drop" and f.get("count") else
             fix_for(f["expectation"], f.get("column"), columns) for f in failures]
    return list(dict.fromkeys(found))


DROPPED = ("validation.policy drop left these rows out of the release (they are in the "
           "quarantine file); to keep them, fix them in the input")


def quarantine_frame(rows: pd.DataFrame, columns: dict[str, str] | None) -> pd.DataFrame:
    """Quarantined rows under the input's column names; ``row`` (the row in the input) and
    columns of the quarantine's own (``staged_file``, ``kept``) stay, a column the pipeline
    made up (``cell`` "all" when the input has none) is left out."""
    if not columns:
        return rows
    made_up = [c for c in _PIPELINE if c in rows.columns and c not in columns]
    return rows.drop(columns=made_up).rename(columns=columns)


_PIPELINE = ("geoid", "x", "y", "cell", "person_id")  # ingest's columns, as it names them
