"""The reader of the calibration file (thresholds.yaml): the selection threshold and the banded
rule's schedule a release config names. Split from the calibration runs
(dpatlas/evaluation/calibrate.py, which writes the file) so the release path never imports the
evaluation code or the synthetic-input generator."""

from __future__ import annotations

from pathlib import Path

import yaml

from dpatlas.core.config import SHIPPED_THRESHOLDS, SelectionConfig

DEFAULT_THRESHOLDS = SHIPPED_THRESHOLDS


_FIX_THRESHOLD_FILE = (f"leave selection.threshold_file out to use the calibration shipped "
                       f"with dpatlas ({SHIPPED_THRESHOLDS}), or write one with "
                       "`dpatlas calibrate --out FILE`")


def _calibration_file(sel: SelectionConfig) -> tuple[Path, dict]:
    """The calibration file the config names, parsed (an empty file reads as {})."""
    path = Path(sel.threshold_file)
    if not path.is_file():
        raise FileNotFoundError(f"selection.threshold_file not found: {path} "
                                f"({_FIX_THRESHOLD_FILE})")
    return path, yaml.safe_load(path.read_text()) or {}


def resolve_threshold(sel: SelectionConfig) -> float | None:
    """The threshold a config names, directly or through a calibration file."""
    if sel.rule == "fixed":
        return None
    if sel.threshold is not None:
        return float(sel.threshold)
    path, data = _calibration_file(sel)
    try:
        return float(data["rules"][sel.rule]["threshold"])
    except (KeyError, TypeError):
        raise ValueError(f"{path} has no threshold for rule '{sel.rule}' "
                         f"({_FIX_THRESHOLD_FILE})") from None


def resolve_schedule(sel: SelectionConfig):
    """The banded rule's bands per ε, from the calibration file (``rules.banded``)."""
    from dpatlas.release.selection import schedule_from

    path, data = _calibration_file(sel)
    try:
        return schedule_from(data["rules"]["banded"])
    except (KeyError, TypeError):
        raise ValueError(f"{path} has no bands for rule 'banded' "
                         f"({_FIX_THRESHOLD_FILE})") from None
