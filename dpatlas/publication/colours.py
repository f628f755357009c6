"""The one colour scale of a release's maps: the PNG map (``p25_map.png``, drawn by
:func:`dpatlas.publication.png_map.write_map`) and the web map (``legend.json``, written by
:mod:`dpatlas.publication.webmap` into each release and read by its ``app.js``).

Both read :data:`BREAKS` and :data:`CLASS_COLOURS` from here, so a published value has the
same class and colour on both maps, and both legends state the same class breaks.
"""

from __future__ import annotations

import bisect

import numpy as np

# Class breaks for p25 and p75 (child income rank, [0, 1]); one scale for both so that the
# switch compares like with like. Class i holds values in [BREAKS[i-1], BREAKS[i]), as
# MapLibre's ``step`` expression and ``bisect_right`` put a break into the class above it.
BREAKS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
# ColorBrewer RdYlBu, 8 classes (Brewer & Harrower, colorbrewer2.org): diverging about the
# middle break 0.5, marked colour-blind safe there; low ranks red, high ranks blue.
PALETTE = "ColorBrewer RdYlBu, 8 classes"
CLASS_COLOURS = ("#d73027", "#f46d43", "#fdae61", "#fee090",
                 "#e0f3f8", "#abd9e9", "#74add1", "#4575b4")
STATUS_COLOURS = {"suppressed": "#bdbdbd", "failed": "#525252"}
STATUS_LABELS = {"suppressed": "suppressed (too few records; nothing spent)",
                 "failed": "failed (budget spent, no value)"}
# Units whose interval [lo, hi] of the shown value spans more than one colour class (its ends
# fall in different classes: the colour could as well be another) are hatched with this colour
# over their class colour, direct and model values alike (issue 33; a fixed width hatched no
# model value although its interval spans 3-4 classes).
LOW_RELIABILITY_HATCH = "#252525"
LOW_RELIABILITY_LABEL = "low reliability: interval spans more than one colour class"
# Model mode: tracts coloured by a model value where no direct value was published (suppressed:
# too few records; failed) are dotted; tracts where the model may not apply (|z| above the
# limit) are outlined.
MODEL_ONLY_DOTS = "#000000"
MODEL_ONLY_LABEL = ("model value only: no direct value published (suppressed: too few "
                    "records, or failed)")
MODEL_FLAG_OUTLINE = "#c51b7d"
NO_DATA_BACKGROUND = "#f7f7f7"
VALUES = ("p25", "p75")


def class_index(value: float) -> int:
    """The class of a published value: ``bisect_right`` matches MapLibre's ``step``."""
    return bisect.bisect_right(BREAKS, value)


def spans_classes(lo, hi) -> np.ndarray:
    """Whether each interval [lo, hi] spans more than one colour class (its ends in different
    classes, as :func:`class_index` puts them); False where an end is missing."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    breaks = np.asarray(BREAKS)
    both = np.isfinite(lo) & np.isfinite(hi)
    return both & (np.searchsorted(breaks, np.where(both, lo, 0.0), side="right")
                   != np.searchsorted(breaks, np.where(both, hi, 0.0), side="right"))


def class_colour(value: float) -> str:
    """The legend colour of a released unit with published value ``value``."""
    return CLASS_COLOURS[class_index(value)]


def class_labels() -> list[str]:
    """Legend labels, one per class: "< 0.20", "0.20 – 0.30", ..., "≥ 0.80"."""
    inner = [f"{lo:.2f} – {hi:.2f}" for lo, hi in zip(BREAKS, BREAKS[1:])]
    return [f"< {BREAKS[0]:.2f}", *inner, f"≥ {BREAKS[-1]:.2f}"]


def legend() -> dict:
    """The scale as the web map reads it (its ``legend.json``)."""
    return {
        "palette": PALETTE,
        "values": list(VALUES),
        "breaks": list(BREAKS),
        "classes": [{"label": label, "colour": colour}
                    for label, colour in zip(class_labels(), CLASS_COLOURS)],
        "status": {status: {"colour": STATUS_COLOURS[status], "label": STATUS_LABELS[status]}
                   for status in ("suppressed", "failed")},
        "low_reliability": {"colour": LOW_RELIABILITY_HATCH, "label": LOW_RELIABILITY_LABEL},
        "model_only": {"colour": MODEL_ONLY_DOTS, "label": MODEL_ONLY_LABEL},
        "model_flag": {"colour": MODEL_FLAG_OUTLINE},
        "background": NO_DATA_BACKGROUND,
    }
