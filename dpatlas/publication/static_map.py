"""The static maps of a release (issue 33, item 2): ``p25_map.png`` draws what the web map opens
on (the model-based p25 where the release has a model, else the direct one), titled with which;
beside it ``p25_map_direct.png`` when that default is the model. On both, and in the web map,
a value is marked unreliable when its interval spans more than one colour class
(:func:`dpatlas.publication.colours.spans_classes`); on the model map, tracts coloured by a model
value without a published direct are dotted and tracts where the model may not apply are
outlined, as the web map marks them.

The drawing itself is :func:`dpatlas.publication.png_map.write_map` (which imports this
module, so this one imports nothing of it); this module says what each map shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from dpatlas.publication import colours

MAP_FILE = "p25_map.png"
DIRECT_MAP_FILE = "p25_map_direct.png"
ESTIMATES = ("model", "direct")
# What each map's title and legend call its values.
ESTIMATE_WORDS = {"model": "model-based", "direct": "direct"}
MAP_TITLES = {MAP_FILE: "Map of p25 as the web map opens (model-based where the release has "
                        "a model, else direct)",
              DIRECT_MAP_FILE: "Map of p25: direct estimates"}
MAP_DESCRIPTIONS = {
    MAP_FILE: "Map of p25 by tract as the web map opens on it: the model-based estimates "
              "(p25_model) where the release has them, else the direct ones (p25); the "
              "title says which",
    DIRECT_MAP_FILE: "Map of p25 by tract: the direct estimates (p25), beside p25_map.png's "
                     "model-based ones",
}


def shown_column(estimate: str) -> str:
    """The column a map of ``estimate`` ("model" or "direct") colours by."""
    return "p25_model" if estimate == "model" else "p25"


def default_estimate(table: pd.DataFrame) -> str:
    """What the web map opens on, hence ``p25_map.png`` draws: the model where the table has a
    model value, else the direct."""
    column = shown_column("model")
    if column in table.columns and np.isfinite(table[column].to_numpy(dtype=float)).any():
        return "model"
    return "direct"


def has_value(table: pd.DataFrame, estimate: str) -> np.ndarray:
    """Which rows a map of ``estimate`` colours: released with a direct value, or with a model
    value (whatever their status)."""
    column = shown_column(estimate)
    if column not in table.columns:
        return np.zeros(len(table), dtype=bool)
    value = np.isfinite(table[column].to_numpy(dtype=float))
    if estimate == "direct":
        value &= table["status"].to_numpy() == "released"
    return value


def low_reliability(table: pd.DataFrame, estimate: str = "direct") -> pd.Series:
    """Coloured rows whose interval of the shown value spans more than one colour class (none
    without intervals)."""
    column = shown_column(estimate)
    lo, hi = f"{column}_lo", f"{column}_hi"
    if lo not in table.columns or hi not in table.columns:
        return pd.Series(False, index=table.index)
    spans = colours.spans_classes(table[lo].to_numpy(dtype=float),
                                  table[hi].to_numpy(dtype=float))
    return pd.Series(has_value(table, estimate) & spans, index=table.index)


def model_only(table: pd.DataFrame) -> np.ndarray:
    """Rows the model map colours though no direct value was published (suppressed, failed)."""
    return has_value(table, "model") & ~has_value(table, "direct")


def model_flagged(table: pd.DataFrame) -> np.ndarray:
    """Rows where the model may not apply: |p25_model_z| above the web map's limit."""
    from dpatlas.publication.webmap import MODEL_Z_LIMIT

    if "p25_model_z" not in table.columns:
        return np.zeros(len(table), dtype=bool)
    z = np.abs(table["p25_model_z"].to_numpy(dtype=float))
    return np.isfinite(z) & (z > MODEL_Z_LIMIT)


def flag_label() -> str:
    from dpatlas.publication.webmap import MODEL_Z_LIMIT

    return f"model may not apply here (|p25_model_z| > {MODEL_Z_LIMIT:g}): read the direct value"


MODEL_ONLY_HATCH = ".."


def model_marks(table, coloured: np.ndarray) -> list[tuple[np.ndarray, bool, dict, object]]:
    """What a model map marks among the ``coloured`` rows: the model-only tracts dotted, the
    flagged ones outlined. Each mark: its rows, whether to merge them into one shape (a
    pattern is drawn once), its matplotlib style and its legend handle."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    marks = []
    only = coloured & model_only(table)
    if only.any():
        marks.append((only, True, {"facecolor": "none", "hatch": MODEL_ONLY_HATCH,
                                   "edgecolor": colours.MODEL_ONLY_DOTS, "linewidth": 0.0},
                      Patch(facecolor="white", edgecolor=colours.MODEL_ONLY_DOTS,
                            hatch=MODEL_ONLY_HATCH, label=colours.MODEL_ONLY_LABEL)))
    flagged = coloured & model_flagged(table)
    if flagged.any():
        marks.append((flagged, False, {"facecolor": "none", "linewidth": 1.5,
                                       "edgecolor": colours.MODEL_FLAG_OUTLINE},
                      Line2D([], [], color=colours.MODEL_FLAG_OUTLINE, linewidth=1.5,
                             label=flag_label())))
    return marks


def estimate_title(title: str, estimate: str) -> str:
    """``title`` (the overview's lines) with what the map shows: "p25 by tract" becomes
    "p25 (model-based) by tract" or "p25 (direct) by tract"."""
    return title.replace("p25 by tract", f"p25 ({ESTIMATE_WORDS[estimate]}) by tract", 1)


def write_overview_maps(table, folder: Path, title: str, intervals: bool,
                        draw: Callable) -> list[str]:
    """Write ``p25_map.png`` for the web map's default and, when that is the model,
    ``p25_map_direct.png``; returns the further files written beside ``p25_map.png`` (for the
    manifest). ``title``: the overview's title (png_map.overview_title); ``intervals``:
    whether the direct values carry intervals to mark; ``draw``: the drawing function
    (png_map.write_map, called positionally: ``(table, path, title, intervals[,
    estimate])``)."""
    folder = Path(folder)
    if default_estimate(table) == "direct":
        draw(table, folder / MAP_FILE, estimate_title(title, "direct"), intervals)
        return []
    # the model's intervals are there whether or not the direct ones are
    draw(table, folder / MAP_FILE, estimate_title(title, "model"), True, "model")
    draw(table, folder / DIRECT_MAP_FILE, estimate_title(title, "direct"), intervals)
    return [DIRECT_MAP_FILE]


def codebook_lines(folder: Path) -> list[str]:
    """The codebook's section on the static maps staged in ``folder`` (none: no lines)."""
    maps = [name for name in (MAP_FILE, DIRECT_MAP_FILE) if (Path(folder) / name).is_file()]
    if not maps:
        return []
    lines = ["## Maps", ""]
    lines += [f"- `{name}`: {MAP_DESCRIPTIONS[name]}." for name in maps]
    lines += [f"- Hatched ({colours.LOW_RELIABILITY_LABEL}): the value's interval has its "
              "ends in different colour classes, so its colour could as well be another's; "
              "the same rule for direct and model values, and on the web map.",
              f"- On the model-based map, dotted: {colours.MODEL_ONLY_LABEL}; outlined: "
              f"{flag_label()}.", ""]
    return lines
