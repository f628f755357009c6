"""The release's validation report: static HTML that works offline, beside the GX Data Docs.

Great Expectations' own Data Docs site (``internal/data_docs``) draws its run list with scripts
and styles it loads from public CDNs: on a machine without internet (where confidential input
is usually processed) its index is empty, every page waits on failed requests, and it shows
"Data asset: None" and a newsletter footer. This report is written from the same validation
results, by us, as plain HTML with its style inline and no script, so it needs nothing but the
files themselves (``file://`` works):

- ``internal/validation_report/index.html``: every validation run of the release (each input
  partition's check, the output checks) with its suite, data asset, outcome, counts and
  failing expectations;
- ``internal/validation_report/runs/<run id>.html``: one run, every expectation met or not;
- ``internal/validation_report/runs/<run id>.json``: the run's record the pages are made from.

Rendering GX's results ourselves rather than vendoring the site's CDN files is what survives
a GX upgrade: the site's templates and the scripts they link change between GX releases (each
upgrade would need its files re-pinned and its pages re-pointed), whereas the report reads
only the fields of the validation result :mod:`data_contracts` already reads to decide a
release (expectation type, column, success, unexpected count).

The files quote input values (unexpected values of failed expectations): they are private,
0600 in 0700 folders, like everything in the internal folder.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from dpatlas.core.files import now_utc, write_bytes_atomic, write_json_atomic
from dpatlas.release.validation_words import in_user_words

if TYPE_CHECKING:  # Great Expectations is imported when something is validated, not before
    from data_contracts import ContractResult

REPORT_DIR = "validation_report"
RUNS_DIR = "runs"
GX_SITE = "../data_docs/index.html"  # relative to the report's index

_STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 75em;
       padding: 0 1em; color: #1b1b1b; }
h1 { font-size: 1.4em; margin-bottom: .2em; } h2 { font-size: 1.1em; margin-top: 1.5em; }
table { border-collapse: collapse; width: 100%; margin-top: .8em; }
th, td { border: 1px solid #c8c8c8; padding: .35em .55em; text-align: left;
         vertical-align: top; }
th { background: #eef1f4; } td.count { text-align: right; font-variant-numeric: tabular-nums; }
.passed { color: #1a6b2f; font-weight: 600; } .failed { color: #b00020; font-weight: 600; }
ul { margin: 0; padding-left: 1.2em; } code { font-size: .92em; }
p.note { color: #555; font-size: .9em; } td.when { white-space: nowrap; }
"""


def report_dir(internal: Path) -> Path:
    return Path(internal) / REPORT_DIR


def report_index(internal: Path) -> Path:
    """The report's index page (what a person opens)."""
    return report_dir(internal).resolve() / "index.html"


def record_run(internal: Path, run_name: str, asset: str, result: "ContractResult",
               columns: dict[str, str] | None = None, quarantine: Path | None = None,
               fixes: list[str] | None = None) -> Path:
    """Record one validation run of the release and rewrite the report; returns its index.

    ``asset``: what was validated, in words a person recognises (the input partition and its
    file, or the table about to be published). ``columns`` maps the pipeline's column names to
    the input's (the report names the input's); ``quarantine``: the file (in ``internal``)
    the offending rows go to, and ``fixes``: how to fix what failed, both shown with it."""
    checked_at = now_utc("microseconds")
    run_id = f"{re.sub(r'[^0-9T]', '', checked_at[:26])}-{_safe(run_name)}"
    record = {
        "run_id": run_id, "run_name": run_name, "checked_at": checked_at,
        "release": Path(internal).name, "suite": result.stored_suite or result.suite,
        "asset": asset, "success": bool(result.success),
        "evaluated": len(result.outcomes),
        "met": sum(o.success for o in result.outcomes),
        "expectations": [in_user_words(asdict(o), columns) for o in result.outcomes],
        # relative to the release's internal folder: the pages link it from where they are
        "quarantine_file": (Path(quarantine).resolve().relative_to(Path(internal).resolve())
                            .as_posix() if quarantine else None),
        "quarantine_path": str(Path(quarantine).resolve()) if quarantine else None,
        "fixes": list(fixes or []),
    }
    write_json_atomic(report_dir(internal) / RUNS_DIR / f"{run_id}.json", record,
                      private=True, indent=1)
    # A run's page depends on that run alone: write the new one and the index, not every
    # earlier page again (51 partitions would rewrite 1,326 pages).
    _write_page(report_dir(internal) / RUNS_DIR / f"{run_id}.html", _run_page(record))
    return _write_index(internal, load_runs(internal))


def load_runs(internal: Path) -> list[dict]:
    """Every recorded run of the release, oldest first."""
    folder = report_dir(internal) / RUNS_DIR
    runs = [json.loads(p.read_text()) for p in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(runs, key=lambda r: r["checked_at"])


def write_report(internal: Path) -> Path:
    """(Re)write every page from the recorded runs; returns the index."""
    runs = load_runs(internal)
    for run in runs:
        _write_page(report_dir(internal) / RUNS_DIR / f"{run['run_id']}.html", _run_page(run))
    return _write_index(internal, runs)


def _write_index(internal: Path, runs: list[dict]) -> Path:
    index = report_dir(internal) / "index.html"
    _write_page(index, _index_page(Path(internal).name, runs))
    return index.resolve()


# ----------------------------------------------------------------------------------- pages


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:80]


def _write_page(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"), private=True)


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _code(name) -> str:
    """An identifier in code type that may wrap after its underscores (a long suite name
    would otherwise widen its column past the page)."""
    return "<code>" + _e(name).replace("_", "_<wbr>") + "</code>"


def _document(title: str, body: Iterable[str]) -> str:
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>", f"<style>{_STYLE}</style>", "</head>", "<body>",
        *body,
        '<p class="note">Internal: these pages quote input values. Written by dpatlas from '
        "the release's Great Expectations validation results; they need no network.</p>",
        "</body>", "</html>", ""])


def _flag(success: bool) -> str:
    return "true" if success else "false"


def _outcome(success: bool) -> str:
    return ('<span class="passed">passed</span>' if success
            else '<span class="failed">failed</span>')


def _on(expectation: dict) -> str:
    column = expectation.get("column")
    return f" on <code>{_e(column)}</code>" if column else ""


def _failing_list(run: dict) -> str:
    failing = [e for e in run["expectations"] if not e["success"]]
    if not failing:
        return "none"
    items = "".join(
        f"<li>{_code(e['expectation'])}{_on(e)}"
        + (f": {e['unexpected_count']:,} value(s)" if e.get("unexpected_count") else "")
        + "</li>" for e in failing)
    return f"<ul>{items}</ul>" + _where_and_fix(run, "../")


def _where_and_fix(run: dict, up: str) -> str:
    """Where a failed run's offending rows are and how to fix it (``up``: from the page to the
    release's internal folder). Runs recorded before these fields show neither."""
    parts = []
    if run.get("quarantine_file"):
        parts.append(f'<p class="quarantine">Offending rows: <a href="{_e(up)}'
                     f'{_e(run["quarantine_file"])}"><code>{_e(run["quarantine_path"])}</code>'
                     "</a> (Parquet; <code>row</code> is the row in the input)</p>")
    parts += [f'<p class="fix">Fix: {_e(fix)}</p>' for fix in run.get("fixes") or []]
    return "".join(parts)


def _index_page(release: str, runs: list[dict]) -> str:
    failed = sum(not r["success"] for r in runs)
    rows = [
        f'<tr class="run" data-run="{_e(r["run_name"])}" data-success="{_flag(r["success"])}">'
        f'<td><a href="{RUNS_DIR}/{_e(r["run_id"])}.html">{_e(r["run_name"])}</a></td>'
        f'<td class="when">{_e(r["checked_at"][:19].replace("T", " "))} UTC</td>'
        f"<td>{_code(r['suite'])}</td><td>{_e(r['asset'])}</td>"
        f"<td>{_outcome(r['success'])}</td>"
        f'<td class="count">{r["met"]} of {r["evaluated"]}</td>'
        f"<td>{_failing_list(r)}</td></tr>" for r in runs]
    return _document(f"Validation report, release {release}", [
        f"<h1>Validation report, release <code>{_e(release)}</code></h1>",
        f'<p id="summary">{len(runs)} validation run(s): {len(runs) - failed} passed, '
        f"{failed} failed.</p>",
        "<table><thead><tr><th>Run</th><th>Checked at</th><th>Suite</th><th>Data asset</th>"
        "<th>Outcome</th><th>Expectations met</th><th>Failing expectations</th></tr></thead>",
        "<tbody>", *rows, "</tbody></table>",
        f'<p class="note">Great Expectations\' own Data Docs site for this release is '
        f'<a href="{GX_SITE}">data_docs/index.html</a>; it loads its scripts and styles from '
        "public CDNs, so without internet its run list is empty.</p>"])


def _run_page(run: dict) -> str:
    rows = [
        f'<tr class="expectation" data-success="{_flag(e["success"])}">'
        f"<td><code>{_e(e['expectation'])}</code></td>"
        f"<td>{'<code>' + _e(e['column']) + '</code>' if e.get('column') else ''}</td>"
        f"<td>{_outcome(e['success'])}</td>"
        f'<td class="count">{"" if e.get("unexpected_count") is None else e["unexpected_count"]}'
        f"</td><td>{_e(e['details'])}</td></tr>" for e in run["expectations"]]
    return _document(f"Validation run {run['run_name']}, release {run['release']}", [
        '<p><a href="../index.html">All validation runs of the release</a></p>',
        f"<h1>Validation run <code>{_e(run['run_name'])}</code></h1>",
        "<table><tbody>",
        f"<tr><th>Release</th><td><code>{_e(run['release'])}</code></td></tr>",
        f'<tr><th>Data asset</th><td id="asset">{_e(run["asset"])}</td></tr>',
        f"<tr><th>Suite</th><td><code>{_e(run['suite'])}</code></td></tr>",
        f"<tr><th>Checked at</th><td>{_e(run['checked_at'])}</td></tr>",
        f'<tr><th>Outcome</th><td id="outcome">{_outcome(run["success"])}: {run["met"]} of '
        f"{run['evaluated']} expectations met</td></tr>",
        "</tbody></table>",
        _where_and_fix(run, "../../"),
        "<h2>Expectations</h2>",
        "<table><thead><tr><th>Expectation</th><th>Column</th><th>Outcome</th>"
        "<th>Unexpected values</th><th>Details</th></tr></thead>",
        "<tbody>", *rows, "</tbody></table>"])
