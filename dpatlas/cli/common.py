"""What every ``dpatlas`` command shares: the consoles (each line whole off a terminal),
rows and JSON output, and how a command fails (an operator's error in one line and exit 2, a
bug in one line naming its traceback's file and exit 1)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

# Messages carry ids, paths and stored text: printed literally, never read as Rich markup
# (`--release-id 'a[/]'` was a MarkupError traceback, a folder `[red]` vanished from a message)
# or emoji codes. Styling is explicit: a Text with a styled lead (see styled).


class _WholeLines(Console):
    """Rich's console, except off a terminal (a pipe, a cron or CI log), where rich would wrap
    and cut every line at 80 columns: there each line is printed whole, and a log message as
    one plain line with its time."""

    def print(self, *objects, **kwargs) -> None:
        if not self.is_terminal:
            kwargs["soft_wrap"] = True
        super().print(*objects, **kwargs)

    def log(self, *objects, **kwargs) -> None:
        if self.is_terminal:
            super().log(*objects, **kwargs)
            return
        super().print(time.strftime("[%H:%M:%S]"), *objects, soft_wrap=True)


console = _WholeLines(markup=False, emoji=False, highlight=False)
# Progress of a command whose stdout is JSON (--json): stdout carries the document alone.
err_console = _WholeLines(stderr=True, markup=False, emoji=False, highlight=False)

JSON_HELP = "Print one JSON document on stdout instead (progress goes to stderr)."


def styled(lead: str, style: str, rest: str) -> Text:
    """``lead`` in ``style``, then ``rest`` as plain text, whatever brackets it holds."""
    return Text.assemble((lead, style), rest)


def print_rows(head, rows) -> None:
    """A table on a terminal; tab-separated lines otherwise, every cell whole (a rich table in
    a pipe is cut to 80 columns: three estimators read `DPExpTheilSe…`)."""
    rows = [tuple(map(str, row)) for row in rows]
    if console.is_terminal:
        table = Table(*head)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    else:
        for row in (tuple(head), *rows):
            typer.echo("\t".join(row))


def emit_json(document) -> None:
    """``document`` as JSON on stdout (NaN and infinities, which JSON lacks, as null)."""
    import json
    import math

    def plain(x):
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        if hasattr(x, "tolist") and not isinstance(x, str):  # numpy scalars and arrays
            return plain(x.tolist())
        if isinstance(x, float) and not math.isfinite(x):
            return None
        return str(x) if isinstance(x, Path) else x

    typer.echo(json.dumps(plain(document), indent=2, default=str))


def records(frame) -> list[dict]:
    """A data frame's rows as dicts of plain values (for --json)."""
    return [dict(zip(map(str, frame.columns), row))
            for row in frame.astype(object).itertuples(index=False, name=None)]


def log_to(as_json: bool):
    """Where a command's progress goes: the console, or stderr when stdout is JSON."""
    return (err_console if as_json else console).log


def fail(message: str, code: int = 2, to: Console | None = None) -> None:
    """Print ``error: message`` (on the console, or ``to``: stderr for a command whose stdout
    is a JSON document) and exit with ``code``."""
    (to or console).print(styled("error:", "bold red", f" {message}"), soft_wrap=True)
    raise typer.Exit(code)


def operator_errors() -> tuple[type[BaseException], ...]:
    """Errors an operator can cause and fix: one line and exit 2, never a traceback.

    Every such error of ours is an OperatorError (dpatlas/core/errors.py); an OSError (a full
    disk, a folder not writable) is the operator's to fix too."""
    from dpatlas.core.errors import OperatorError

    return (OperatorError, OSError)


@contextlib.contextmanager
def guard(log_dir: Path | None = None, to: Console | None = None):
    """Operator errors: their message and exit 2. Anything else is a bug: one line naming a
    file with the traceback, and exit 1. ``to``: where the message goes (see :func:`fail`)."""
    try:
        yield
    except typer.Exit:
        raise
    except operator_errors() as err:
        fail(one_line(err), to=to)
    except Exception as err:  # noqa: BLE001 - a bug must still not print a wall of text
        import tempfile
        import traceback

        folder = log_dir if log_dir and log_dir.is_dir() else Path(tempfile.gettempdir())
        log = folder / f"dpatlas-error-{os.getpid()}.log"
        log.write_text("".join(traceback.format_exception(err)))
        fail(f"internal error ({type(err).__name__}: {one_line(err)}); traceback in {log}", 1,
              to)


def one_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, OSError) and err.filename and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    return text


def config_or_fail(config: Path, to: Console | None = None):
    from dpatlas.core.config import load_config

    with guard(to=to):
        return load_config(config)
