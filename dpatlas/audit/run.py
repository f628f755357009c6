"""The ordered list of checks, the anchors, and the entry points: :func:`audit_release` and
:func:`main` (what ``dpatlas audit`` calls)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Callable

from .accounting import check_totals
from .anchors import check_boundaries, check_ledger
from .base import AuditReport, AuditUnreadable, MANIFEST, Mismatch, RANDOM_BITS, _synthetic
from .columns import check_columns
from .files import _json_object, _reading_limited_to, check_config, check_files, check_mode
from .formats import check_formats
from .levels import check_levels
from .names import check_names
from .noise import check_noise, check_relations
from .parts import check_parts, joined_view
from .paths import check_no_machine_paths
from .schema import check_public, check_schema
from .sensitivities import check_sensitivities
from .small_area import check_small_area
from .tables import check_synthetic_table, check_table


SYNTHETIC_CHECKS: list[tuple[str, Callable[[Path, dict], str]]] = []  # filled below


CHECKS: list[tuple[str, Callable[[Path, dict], str]]] = [
    ("schema", check_schema),
    ("public", check_public),
    ("files", check_files),
    ("config", check_config),
    ("mode", check_mode),
    ("machine paths", check_no_machine_paths),
    ("parts", check_parts),
    ("relations", check_relations),
    ("sensitivities", check_sensitivities),
    ("noise", check_noise),
    ("totals", check_totals),
    ("columns", check_columns),
    ("table", check_table),
    ("formats", check_formats),
    ("levels", check_levels),
    ("small_area", check_small_area),
    ("names", check_names),
]
RELEASE_ONLY = ("public", "config", "columns", "table", "formats", "levels", "small_area",
                "names")
SYNTHETIC_CHECKS[:] = [(name, fn) for name, fn in CHECKS if name not in RELEASE_ONLY]
SYNTHETIC_CHECKS.append(("synthetic rows", check_synthetic_table))
# Checks against something outside the folder, run only when given (ANCHORS: the option).
ANCHORS = {"boundaries": "--boundaries FILE", "ledger": "--ledger URL"}
ANCHOR_CHECKS: dict[str, Callable[[Path, dict, object], str]] = {
    "boundaries": check_boundaries, "ledger": check_ledger}
ANCHOR_SKIPPED = {
    "boundaries": "not done (no --boundaries FILE): rows deleted from the release cannot be "
                  "detected from its own files",
    "ledger": "not done (no --ledger URL): the charge and the cap are checked only against "
              "the ledger"}


# Checks of the folder's own files, run on the parts themselves; the rest read them joined.
ON_THE_PARTS = ("schema", "public", "files", "machine paths", "parts")


def _joined(report: AuditReport, folder: Path, m: dict, stack: contextlib.ExitStack):
    """(folder, manifest) with the parts joined (audit/parts.py), removed when ``stack``
    closes; the folder itself when they cannot be joined (a failed parts check says why), so
    the other checks still run and report."""
    try:
        return stack.enter_context(joined_view(folder, m))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
        report.checks.append(("parts", False, f"the parts cannot be joined: "
                              f"{type(err).__name__} {err}"))
    return folder, m


def load_manifest(folder: Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise AuditUnreadable(f"{folder} is not a folder")
    return _json_object(folder / MANIFEST, str(folder / MANIFEST), AuditUnreadable)


def _malformed(err: Exception) -> str:
    return f"manifest or config malformed: {type(err).__name__} {str(err)[:300]}"


def _run(report: AuditReport, name: str, fn, *args) -> None:
    try:
        report.checks.append((name, True, fn(*args)))
    except Mismatch as err:
        report.checks.append((name, False, str(err)))
    except RecursionError:
        report.checks.append((name, False, "nested too deeply to check"))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError,
            ZeroDivisionError) as err:
        report.checks.append((name, False, _malformed(err)))


def is_test_release(m: dict) -> bool:
    """A test release: mode test, or noise from seeded bits (never a release to trust)."""
    bits = (m.get("noise_sampler") or {}).get("random_bits") \
        if isinstance(m.get("noise_sampler"), dict) else None
    return m.get("mode") != "public" or bits != RANDOM_BITS[0]


def audit_release(folder: Path, *, ledger: str | None = None,
                  boundaries: Path | str | None = None) -> AuditReport:
    """Run every check on a release folder (AuditUnreadable if there is no readable manifest,
    or an anchor given (``ledger``, ``boundaries``) cannot be read).

    The table and noise checks run even when the files check fails, so one report names every
    problem; a malformed manifest (a key missing, a wrong type) fails the check that reads it.
    Anchors not given are listed in ``report.skipped``.
    """
    folder = Path(folder)
    m = load_manifest(folder)
    anchors = {"boundaries": Path(boundaries) if boundaries is not None else None,
               "ledger": ledger}
    if anchors["boundaries"] is not None and not anchors["boundaries"].exists():
        raise AuditUnreadable(f"--boundaries {anchors['boundaries']}: no such file")
    if anchors["boundaries"] is not None and not (anchors["boundaries"].is_file()
                                                  or anchors["boundaries"].is_dir()):
        raise AuditUnreadable(f"--boundaries {anchors['boundaries']}: not a file or folder "
                              "(a FIFO, socket or device is not read)")
    report = AuditReport(folder, test=is_test_release(m))
    with contextlib.ExitStack() as stack:
        # the content checks read a state-parted release's parts joined (audit/parts.py)
        with _reading_limited_to(folder, m):
            view, view_m = _joined(report, folder, m, stack)
        stack.enter_context(_reading_limited_to(view, view_m))
        for name, fn in (SYNTHETIC_CHECKS if _synthetic(m) else CHECKS):
            with _reading_limited_to(folder, m) if name in ON_THE_PARTS \
                    else contextlib.nullcontext():
                _run(report, name, fn, *((folder, m) if name in ON_THE_PARTS
                                         else (view, view_m)))
        for name, fn in ANCHOR_CHECKS.items():
            if anchors[name] is None:
                report.skipped.append((name, ANCHOR_SKIPPED[name]))
            elif name == "boundaries" and _synthetic(m):
                report.skipped.append((name, "not done: a synthetic folder has no tract table"))
            else:
                _run(report, name, fn, view, view_m, anchors[name])
    report.ok = all(good for _, good, _ in report.checks)
    return report


def main(folder, out=None, *, allow_test: bool = False, ledger: str | None = None,
         boundaries: Path | str | None = None, as_json: bool = False) -> int:
    """Print one line per check; 0 if all pass, 1 if any fails, 2 if the folder (or an anchor)
    is unreadable, 3 if every check passed but the release is a test release (seeded noise or
    mode test) and ``allow_test`` is not set. ``as_json``: one JSON document instead (the
    verdict, the exit code, every check), for a script."""
    out = out or sys.stdout
    try:
        report = audit_release(Path(folder), ledger=ledger, boundaries=boundaries)
    except AuditUnreadable as err:
        return _say(out, as_json, folder, 2, f"unreadable: {_one_line(str(err))}")
    except RecursionError:
        return _say(out, as_json, folder, 2, f"unreadable: {folder}: nested too deeply to audit")
    passed = f"{sum(g for _, g, _ in report.checks)} of {len(report.checks)} checks passed " \
             f"for {report.folder}"
    if not report.ok:
        return _say(out, as_json, folder, 1, f"FAILED: {passed}", report)
    if report.test and not allow_test:
        return _say(out, as_json, folder, 3, f"TEST: {passed}, but it is a test release (mode "
                    "test or seeded noise), not a release to trust; --allow-test accepts it",
                    report)
    return _say(out, as_json, folder, 0, f"PASSED: {passed}" + (
        " (a test release, accepted by --allow-test)" if report.test else ""), report)


def _say(out, as_json: bool, folder, code: int, verdict: str,
         report: AuditReport | None = None) -> int:
    """The audit's lines and its verdict, or all of it as one JSON document; ``code``."""
    if as_json:
        print(json.dumps({
            "folder": str(folder), "exit_code": code, "verdict": verdict,
            "test_release": bool(report and report.test),
            "checks": [{"name": n, "ok": bool(g), "detail": d}
                       for n, g, d in (report.checks if report else [])],
            "skipped": [{"name": n, "why": w} for n, w in (report.skipped if report else [])],
        }, indent=2, default=str), file=out)
        return code
    for line in report.lines() if report else []:
        print(line, file=out)
    print(verdict, file=out)
    return code


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 500 else line[:497] + "..."


def _arguments(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser(prog="audit.py", description="Audit a dpatlas release "
                                     "folder from its own files.")
    parser.add_argument("folder")
    parser.add_argument("--ledger", help="the ledger's database URL (checks the charge, the "
                        "published manifest and the cap)")
    parser.add_argument("--boundaries", help="the boundary file the release was made from "
                        "(checks one row per tract and cell)")
    parser.add_argument("--allow-test", action="store_true",
                        help="accept a test release (exit 0 instead of 3)")
    return parser.parse_args(argv)
