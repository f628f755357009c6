"""The ``dpatlas`` command."""

from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Differentially private per-tract mobility release (dpatlas).")
# Messages carry ids, paths and stored text: printed literally, never read as Rich markup
# (`--release-id 'a[/]'` was a MarkupError traceback, a folder `[red]` vanished from a message)
# or emoji codes. Styling is explicit: a Text with a styled lead (see _styled).


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


def _styled(lead: str, style: str, rest: str) -> Text:
    """``lead`` in ``style``, then ``rest`` as plain text, whatever brackets it holds."""
    return Text.assemble((lead, style), rest)


def _print_rows(head, rows) -> None:
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


def _emit_json(document) -> None:
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


def _records(frame) -> list[dict]:
    """A data frame's rows as dicts of plain values (for --json)."""
    return [dict(zip(map(str, frame.columns), row))
            for row in frame.astype(object).itertuples(index=False, name=None)]


def _log_to(as_json: bool):
    """Where a command's progress goes: the console, or stderr when stdout is JSON."""
    return (err_console if as_json else console).log


@app.command()
def estimators(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the registered estimators, their guarantee at epsilon = 1 and their noise sampler."""
    import mechanisms as M

    head = ("name", "guarantee at eps=1", "publishable", "noise sampler", "what it is")
    rows = [(name, est.guarantee(1.0).describe(),
             "yes" if est.publishable else "no: " + est.not_publishable_reason,
             est.sampler, est.summary) for name, est in M.REGISTRY.items()]
    if as_json:
        _emit_json([{"name": name, "guarantee_at_epsilon_1": g,
                     "publishable": M.REGISTRY[name].publishable,
                     "not_publishable_reason": None if p == "yes" else p.removeprefix("no: "),
                     "noise_sampler": sampler, "summary": summary}
                    for name, g, p, sampler, summary in rows])
        return
    _print_rows(head, rows)


from dpatlas.cli.server_commands import server_app  # noqa: E402 - beside its `add_typer`

app.add_typer(server_app, name="server")
from dpatlas.cli.feed_commands import feed_app  # noqa: E402 - beside its `add_typer`

app.add_typer(feed_app, name="feed")

config_app = typer.Typer(help="Release configuration.")
app.add_typer(config_app, name="config")


@config_app.command("example")
def config_example() -> None:
    """Print a documented example configuration."""
    from dpatlas.core.config import EXAMPLE

    typer.echo(EXAMPLE, nl=False)


@config_app.command("check")
def config_check(path: Path) -> None:
    """Validate a configuration and every file a release would read; print what it resolves to
    (without secrets), then every problem at once: exit 2 if a release would be refused."""
    import json

    from dpatlas.core.config import load_config
    from dpatlas.ledger import redact_url

    with _guard():
        cfg = load_config(path)
        resolved = json.loads(cfg.model_dump_json())
        resolved["ledger"]["url"] = redact_url(cfg.ledger.url)
        console.print_json(json.dumps(resolved))
        found, problems = _check_config_files(cfg)
    for line in found:
        console.print(_styled("ok", "green", f" {line}"), soft_wrap=True)
    if problems:
        _fail(f"a release with {path} would be refused ({len(problems)} problem"
              f"{'s' if len(problems) != 1 else ''}):\n" + "\n".join(f"  - {p}" for p in problems))


def _check_config_files(cfg) -> tuple[list[str], list[str]]:
    """Open every file the release reads: what was found, and every reason a release would be
    refused (all of them, not the first only)."""
    from dpatlas.ledger import Ledger
    from dpatlas.release.boundaries import load_boundaries
    from dpatlas.release.contributions import require_person_unit
    from dpatlas.release.ingest import partitions
    from dpatlas.release.preflight import check_paths, refusals_before_ingest
    from dpatlas.release.thresholds import resolve_threshold

    problems = refusals_before_ingest(cfg)  # what a release refuses before reading any data
    found = []
    _check_schedule(cfg, found, problems)
    if _attempt(lambda: check_paths(cfg) or True, problems):
        found.append("paths: publish root, internal folder and input are separate; the "
                     "ledger is outside the publish root")
    unit = _attempt(lambda: require_person_unit(cfg), problems)
    if unit:
        found.append(_person_unit_line(cfg, unit))
    if Path(cfg.input.path).exists():
        parts = _attempt(lambda: partitions(cfg.input), problems, report=True)
        if parts is not None:
            found.append(f"input {cfg.input.path}: {len(parts)} partition(s), "
                         f"{sum(p.rows for p in parts):,} rows, columns present")
    if Path(cfg.boundaries.path).exists():
        b = _attempt(lambda: load_boundaries(cfg.boundaries.path, cfg.boundaries.geoid_column),
                     problems, report=True)
        if b is not None:
            found.append(f"boundaries {cfg.boundaries.path}: {len(b):,} tracts, CRS {b.crs}")
    if cfg.selection.rule != "fixed":
        threshold = _attempt(lambda: resolve_threshold(cfg.selection), problems)
        if threshold is not None:
            found.append(f"selection threshold: {threshold:.6g}")
    cap = _attempt(lambda: _ledger_cap(Ledger, cfg), problems)
    if cap:
        found.append(f"ledger {cap[0]}: dataset {cfg.ledger.dataset} has the lifetime cap "
                     f"eps={cap[1][0]:g} delta={cap[1][1]:g}")
    return found, problems


def _person_unit_line(cfg, unit: dict) -> str:
    """What config check says of the one-record-per-person claim: it reads no record, so it
    says who checks it (the release, over the person id column) or that nobody does; never
    "verified" (issue 31 O12: it said so for duplicates and for a missing input)."""
    if unit["status"] != "verified":
        return (f"{unit['claim']}: an unverified assumption "
                "(privacy.assume_one_record_per_person: true), which nothing checks")
    return (f"{unit['claim']}: not read here; each release checks it before its charge, over "
            f"person id column '{cfg.input.columns.person_id}' across all partitions "
            f"(validation.contributions: {cfg.validation.contributions})")


def _check_schedule(cfg, found: list[str], problems: list[str]) -> None:
    """The schedule as `python -m deploy.serve` registers it: refused by the same check."""
    from deploy.schedule import cron_schedule

    if cfg.schedule.cron and _attempt(lambda: cron_schedule(cfg.schedule), problems,
                                      report=True) is not None:
        found.append(f"schedule: {cfg.schedule.cron!r} in {cfg.schedule.timezone}")


def _ledger_cap(ledger_class, cfg):
    """The ledger's URL (redacted) and the dataset's cap (None: no cap)."""
    with ledger_class(cfg.ledger.url, create=False) as ledger:
        cap = ledger.cap(cfg.ledger.dataset)
        return (ledger.url, cap) if cap is not None else None


def _attempt(check, problems: list[str], report: bool = False):
    """``check()``'s result, or None on an operator error: added to ``problems`` if
    ``report`` (a check of data), else already among them (a check before ingest)."""
    # a ValueError too, but only where refusals_before_ingest has reported it already (an
    # unreadable threshold file)
    try:
        return check()
    except (_operator_errors() if report else (*_operator_errors(), ValueError)) as err:
        if report:
            problems.append(_one_line(err))
        return None


def _fail(message: str, code: int = 2, to: Console | None = None) -> None:
    """Print ``error: message`` (on the console, or ``to``: stderr for a command whose stdout
    is a JSON document) and exit with ``code``."""
    (to or console).print(_styled("error:", "bold red", f" {message}"), soft_wrap=True)
    raise typer.Exit(code)


def _operator_errors() -> tuple[type[BaseException], ...]:
    """Errors an operator can cause and fix: one line and exit 2, never a traceback.

    Every such error of ours is an OperatorError (dpatlas/core/errors.py); an OSError (a full
    disk, a folder not writable) is the operator's to fix too."""
    from dpatlas.core.errors import OperatorError

    return (OperatorError, OSError)


@contextlib.contextmanager
def _guard(log_dir: Path | None = None, to: Console | None = None):
    """Operator errors: their message and exit 2. Anything else is a bug: one line naming a
    file with the traceback, and exit 1. ``to``: where the message goes (see :func:`_fail`)."""
    try:
        yield
    except typer.Exit:
        raise
    except _operator_errors() as err:
        _fail(_one_line(err), to=to)
    except Exception as err:  # noqa: BLE001 - a bug must still not print a wall of text
        import tempfile
        import traceback

        folder = log_dir if log_dir and log_dir.is_dir() else Path(tempfile.gettempdir())
        log = folder / f"dpatlas-error-{os.getpid()}.log"
        log.write_text("".join(traceback.format_exception(err)))
        _fail(f"internal error ({type(err).__name__}: {_one_line(err)}); traceback in {log}", 1,
              to)


def _quiet_operator_tracebacks() -> None:
    """Prefect logs a failed flow run with its traceback on the console; for an operator error
    the one-line message is the whole story (the run's logs on the server keep the rest). So is
    its Prefect server refusing connections: the run then stops with the message that the
    server went away (dpatlas/cli/api_watch.py)."""
    import logging

    import httpx

    errors = (*_operator_errors(), httpx.ConnectError)

    class _NoOperatorTraceback(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.exc_info and isinstance(record.exc_info[1], errors):
                record.exc_info, record.exc_text = None, None
            return True

    for handler in logging.getLogger().handlers + logging.getLogger("prefect").handlers:
        if not any(isinstance(f, _NoOperatorTraceback) for f in handler.filters):
            handler.addFilter(_NoOperatorTraceback())


def _one_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, OSError) and err.filename and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    return text


@app.command()
def synth(out: Path = typer.Option(Path("data"), help="Output folder."),
          states: str = typer.Option("37", help="Comma-separated state FIPS codes (37: North "
                                     "Carolina, whose real counties hold the tracts)."),
          tracts: int = typer.Option(3108, help="Tracts per state."),
          seed: int = typer.Option(0, help="Seed (state i uses seed + i)."),
          cells: Optional[int] = typer.Option(
              None, min=1, help="Every person gets one record in each of N cells "
              "(outcome-1 ... outcome-N, column 'cell'; cells share people, so they compose "
              "sequentially). Default: no cell column."),
          ) -> None:
    """Write an Opportunity-Insights-like synthetic state (or several) and its tract boundaries."""
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    fips = _synth_states(states)
    _at_least(("--tracts", tracts, 1), ("--seed", seed, 0))
    with _guard(), console.status("generating synthetic microdata and boundaries"):
        info = write_synthetic(out, fips, seed, StateParams(n_tracts=tracts), cells=cells)
    in_cells = f" ({len(info['cells'])} cells)" if info["cells"] else ""
    console.print(f"{info['records']:,} records{in_cells} in {info['tracts']:,} tracts of "
                  f"{len(info['states'])} state(s): microdata {info['microdata']}, "
                  f"boundaries {info['boundaries']}")


def _at_least(*checks: tuple[str, int, int]) -> None:
    """Each (option, value, lowest allowed): one line and exit 2 for the first value below
    its lowest (a count of 0 or a negative seed was a traceback deep in numpy)."""
    for option, value, low in checks:
        if value < low:
            _fail(f"{option} {value}: give {low} or more")


def _known_scenarios(names, known: tuple[str, ...]) -> None:
    """Refuse scenario names that are not ``known`` (before anything is written)."""
    unknown = [s for s in names if s not in known]
    if unknown:
        _fail(f"unknown scenario(s) {unknown}; known: {', '.join(known)}")


def _output_folder(out: Path) -> None:
    """Create ``out`` before the work whose results go there (minutes of it, for an
    evaluation), so an unwritable place is one line and exit 2 at once."""
    with _guard():
        out.mkdir(parents=True, exist_ok=True)


def _synth_states(text: str) -> list[str]:
    """``--states``: distinct two-digit state FIPS codes, or one line saying what is wrong."""
    from dpatlas.core.places import STATE_FIPS

    fips = [s.strip() for s in text.split(",") if s.strip()]
    if not fips:
        _fail(f"--states {text!r}: give one or more state FIPS codes, e.g. 37 or 17,37")
    unknown = [s for s in fips if s not in STATE_FIPS]
    if unknown:
        _fail(f"--states: not state FIPS codes: {', '.join(unknown)} (two digits, e.g. 37 for "
              f"North Carolina; known: {', '.join(sorted(STATE_FIPS))})")
    twice = sorted({s for s in fips if fips.count(s) > 1})
    if twice:
        _fail(f"--states names {', '.join(twice)} more than once: give each state once")
    return fips


def run_release(config: Path, release_id: str | None, noise_seed: int | None = None):
    """Run the release flow; returns its :class:`~dpatlas.release.outcome.ReleaseOutcome`. One-line
    errors and exit 2 on operator errors.

    The command's own Prefect server (dpatlas/cli/prefect_server.py: it dies with the command) is
    started first, and everything that can be checked without the data is checked, and the
    flow imported, while it starts; an operator error stops it at once. No task runs before
    those checks pass.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from dpatlas.cli.api_watch import watching_api
    from dpatlas.cli.prefect_server import prefect_api

    with prefect_api() as api:
        with _guard():
            cfg, rid = _checked_release(config, release_id, noise_seed)
        with _guard(cfg.publish.internal / "logs"):
            from flows.release import release as release_flow

            _quiet_operator_tracebacks()
            api.ready()  # a configured API that does not answer: exit 2, before any data
            typer.echo(f"Prefect: {api.used}", err=True)
            try:
                with watching_api(api.url, lambda s: _prefect_gone(api.url, s, config, rid)):
                    return release_flow(str(config), rid, noise_seed)
            except OSError as err:
                if err.errno not in (*_DISK_FULL, *_NOT_WRITABLE):
                    raise
                _fail(_disk_full_message(err, cfg, config, rid))


def _prefect_gone(url: str, seconds: float, config: Path, rid: str) -> None:
    """The Prefect server went away during the run (dpatlas/cli/api_watch.py): say so, and
    what finishes the release, then stop this process as a crash would (the release is made
    to survive one; the Prefect client would only retry for minutes, then fail)."""
    import sys

    message = (f"the Prefect server at {url} went away during release {rid} (it has refused "
               f"connections for {seconds:.0f} s: stopped or killed), so this run stopped. "
               "Whatever the release charged is kept and is never charged again: start the "
               "server again (`dpatlas server start`), or leave it stopped (a release then "
               f"uses a temporary one), and run `dpatlas release -c {config} --release-id "
               f"{rid}` to finish it")
    with contextlib.suppress(Exception):
        console.print(_styled("error:", "bold red", f" {message}"), soft_wrap=True)
        console.file.flush()
        sys.stderr.flush()
    os._exit(2)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# A folder of the run not writable (e.g. a read-only internal folder): its error may name no
# file (`[Errno 30] Read-only file system`), so the message names where the run writes.
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def _stage_of(err: BaseException) -> str | None:
    """The release stage (a module of the ``tasks`` package, and its function) in which
    ``err`` was raised, from its traceback; None if it was raised outside the stages."""
    import tasks

    stages = Path(tasks.__file__).resolve().parent
    found, tb = None, err.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        path = Path(code.co_filename)
        if path.parent == stages and path.stem not in ("__init__", "common"):
            found = f"the {path.stem} stage ({code.co_name})"
        tb = tb.tb_next
    return found


def _disk_full_message(err: OSError, cfg, config: Path, rid: str) -> str:
    """A full disk, or a folder not writable, during a run: where, in which stage, and that
    a rerun finishes it (a bare `[Errno 28]` or `[Errno 30]` said neither)."""
    where = (str(err.filename) if err.filename else
             f"under the internal folder {cfg.publish.internal / rid} or the publish root "
             f"{cfg.publish.root}")
    fix = "free space there" if err.errno in _DISK_FULL else "make it writable by this user"
    return (f"{err.strerror or err} in {_stage_of(err) or 'the release run'} of release {rid}, "
            f"writing {where}: {fix}, then run `dpatlas release -c {config} "
            f"--release-id {rid}` again (or `dpatlas rerun {rid}`); it finishes the release "
            "without charging it again or redrawing noise already drawn")


def _checked_release(config: Path, release_id: str | None, noise_seed: int | None):
    """The config and the release id (chosen here when neither names one, so that the run is
    named after it from the start), after the checks that need no data."""
    from dpatlas.core.config import load_config
    from dpatlas.core.ids import validate_release_id
    from dpatlas.release.preflight import check_before_ingest, check_before_writing

    cfg = load_config(config)
    # `--release-id ''` is an id given (and refused below), not a request for a fresh one
    rid = release_id if release_id is not None else cfg.release_id
    if rid is None:
        from flows.release import new_release_id
        rid = new_release_id()
    check_before_writing(cfg, validate_release_id(rid), noise_seed)
    # every refusal that needs no data (the cap, the files, the thresholds), all at once;
    # a check of the Prefect API, which needs no data either, belongs beside these
    check_before_ingest(cfg, rid)
    return cfg, rid


@app.command()
def release(config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
            release_id: str = typer.Option(None, help="Release id (default: from config or new)."),
            noise_seed: int = typer.Option(None, hidden=True,
                                           help="Tests only: repeatable noise, NOT FOR RELEASE."),
            ) -> None:
    """Run (or resume) a release: ingest, validate, allocate, select, estimate, publish.

    Rerunning a published release id publishes nothing new and charges nothing; rerunning an
    interrupted one resumes it without drawing fresh noise for work already drawn.
    """
    _report(run_release(config, release_id, noise_seed))


def _report(outcome) -> None:
    """Print a run's :class:`~dpatlas.release.outcome.ReleaseOutcome` for a person."""
    head, *rest = outcome.summary_lines()
    # soft_wrap: long paths stay whole on one line (copyable), whatever the terminal width
    console.print(_styled("published", "bold green", head[len("published"):])
                  if outcome.charged else head, soft_wrap=True)
    for line in rest:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


@app.command()
def demo(out: Path = typer.Option(Path("demo"), help="Folder for data, config and releases."),
         release_id: str = typer.Option(None, help="Release id (default: a new one)."),
         profile: str = typer.Option("primary", help="primary | full-suite"),
         ) -> None:
    """Generate the default synthetic state and publish a full release of it."""
    from dpatlas.cli.demo import (check_demo_arguments, claim_demo_folder, demo_data_current,
                                  ensure_demo_cap,
                                  generate_demo_data, write_demo_config)

    data = out / "data"
    with _guard():  # e.g. an unwritable --out: one line and exit 2, as for every operator error
        check_demo_arguments(release_id, profile)  # before anything is written
        claim_demo_folder(out)  # never an operator's folder: refused before anything is written
        if not demo_data_current(data):
            with console.status("generating the default synthetic state (North Carolina)"):
                info = generate_demo_data(data)
            console.print(f"synthetic state: {info['records']:,} records in "
                          f"{info['tracts']:,} tracts -> {data}")
        config = write_demo_config(out, profile)
        done = ensure_demo_cap(config)
    if done:
        console.print(done)
    _report(run_release(config, release_id))


ledger_app = typer.Typer(help="The privacy budget ledger.")
app.add_typer(ledger_app, name="ledger")


def _config_or_fail(config: Path, to: Console | None = None):
    from dpatlas.core.config import load_config

    with _guard(to=to):
        return load_config(config)


@ledger_app.command("show")
def ledger_show(config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
                as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
                ) -> None:
    """Print each dataset's lifetime cap (and its history), what is spent and left, per release.
    Reads only: it never writes to the ledger."""
    from dpatlas.ledger import Ledger

    # With --json, stdout is the document alone: an error is text on stderr (and exit 2).
    to = err_console if as_json else None
    cfg = _config_or_fail(config, to)
    with _guard(to=to):
        with Ledger(cfg.ledger.url, create=False) as ledger:
            if as_json:
                _emit_json(ledger.summary())
                return
            console.print(ledger.summary_text(), highlight=False, markup=False)


@ledger_app.command("set-cap")
def ledger_set_cap(
        dataset: str = typer.Option(..., help="The dataset (population) whose cap this is."),
        epsilon: float = typer.Option(..., help="Lifetime epsilon per person."),
        delta: Optional[float] = typer.Option(
            None, help="Lifetime delta per person (default: the cap's current delta; a "
            "dataset's first cap needs it, 0 for pure DP only)."),
        reason: str = typer.Option(..., help="Why: recorded with the time in the ledger."),
        config: Path = typer.Option(..., "--config", "-c", help="Config naming the ledger."),
        force: bool = typer.Option(False, "--force", help="Allow a cap below what is already "
                                   "spent (no release can then be charged until it is raised)."),
) -> None:
    """Set a dataset's lifetime privacy-budget cap: the ledger's, recorded with time and reason."""
    from dpatlas.core.ids import validate_reason
    from dpatlas.ledger import Ledger, check_cap

    cfg = _config_or_fail(config)
    with _guard():
        # every value checked before the ledger is opened to write: opening may create it
        dataset, epsilon, given = check_cap(dataset, epsilon, 0.0 if delta is None else delta)
        why = validate_reason(reason)
        if delta is None:  # the delta cap stays what it is (it silently became 0)
            with Ledger(cfg.ledger.url, create=False) as reading:
                current = reading.cap(dataset)
            if current is None:
                _fail(f"dataset {dataset} has no cap in the ledger at {reading.url} yet: give "
                      "its lifetime --delta too (0 for pure DP only: no release with a delta "
                      "could be charged)")
            given = current[1]  # the ledger's own, checked when it was set
        delta = given
        ledger = Ledger(cfg.ledger.url)
        before = ledger.cap(dataset)
        ledger.set_cap(dataset, epsilon, delta, reason=why, force=force)
        spent = ledger.spent(dataset)
    was = "none" if before is None else f"eps={before[0]:g} delta={before[1]:g}"
    console.print(f"dataset {dataset}: lifetime cap eps={epsilon:g} delta={delta:g} (was {was}); "
                  f"reason: {why}", soft_wrap=True)
    if spent["epsilon"] > epsilon or spent["delta"] > delta:
        console.print(f"recorded with --force: the cap is below what is already spent "
                      f"(eps={spent['epsilon']:g} delta={spent['delta']:g}): no "
                      f"release of dataset {dataset} can be charged until the cap is raised "
                      "(spent budget is never refunded)", soft_wrap=True)


@app.command()
def withdraw(release_id: str,
             config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
             reason: str = typer.Option(..., help="Why, for the feed and the ledger."),
             ) -> None:
    """Withdraw a published release: it stays in the feed, marked withdrawn; its budget stays spent."""
    from dpatlas.core.ids import validate_reason, validate_release_id
    from dpatlas.ledger.existing import open_existing_ledger
    from dpatlas.publication.withdraw import withdraw_everywhere

    cfg = _config_or_fail(config)
    with _guard():
        validate_release_id(release_id)
        why = validate_reason(reason)
        result = withdraw_everywhere(open_existing_ledger(cfg.ledger.url, write=True),
                                     cfg.publish.root, release_id, why)
    console.print(result.get("message", f"withdrew {release_id}: {why}"), highlight=False,
                  markup=False)


@app.command()
def purge(config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
          older_than: Optional[int] = typer.Option(
              None, "--older-than", metavar="DAYS", help="Purge releases published at least "
              "DAYS days ago (default: the config's publish.internal_retention_days)."),
          dry_run: bool = typer.Option(False, "--dry-run", help="List, remove nothing."),
          ) -> None:
    """Remove the person-level internal files (staged input, quarantined rows, the staged copy
    under staging_url) of releases the ledger lists as published or withdrawn, after the
    retention; unfinished ones are kept."""
    from dpatlas.ledger.existing import open_existing_ledger
    from dpatlas.release.retention import plan_purge
    from dpatlas.release.retention import purge as remove

    cfg = _config_or_fail(config)
    days = cfg.publish.internal_retention_days if older_than is None else older_than
    if days is not None and days < 0:
        _fail(f"--older-than {days}: give 0 or more days")
    if days is None:
        console.print("publish.internal_retention_days is null: internal files are kept "
                      "forever; nothing removed (give --older-than DAYS to purge)")
        return
    with _guard():
        items = plan_purge(cfg.publish.internal, open_existing_ledger(cfg.ledger.url), days,
                           staging_url=cfg.staging_url)
        if not dry_run:
            remove(items)
    _print_purge(items, days, dry_run)


def _print_purge(items, days: int, dry_run: bool) -> None:
    """A table on a terminal, tab-separated lines otherwise; then the total."""
    head = ("release", "status", "age (days)", "files", "bytes", "action")
    rows = [(i.release_id, i.status, "" if i.age_days is None else f"{i.age_days:.1f}",
             str(len(i.files)), str(i.size),
             ("would remove" if dry_run else "removed") if i.removed
             else f"kept: {i.kept_because}") for i in items]
    _print_rows(head, rows)
    gone = [i for i in items if i.removed]
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{verb} {sum(len(i.files) for i in gone)} file(s), "
               f"{sum(i.size for i in gone)} bytes, of {len(gone)} release(s) published at "
               f"least {days} day(s) ago; kept {len(items) - len(gone)} release(s)")


@app.command()
def audit(folder: Path = typer.Argument(..., help="A published release folder."),
          ledger: Optional[str] = typer.Option(None, "--ledger", help="The ledger's URL: "
                                               "checks the charge, the published manifest and "
                                               "the cap."),
          boundaries: Optional[Path] = typer.Option(None, "--boundaries", help="The boundary "
                                                    "file the release was made from: checks one "
                                                    "row per tract and cell."),
          allow_test: bool = typer.Option(False, "--allow-test", help="Accept a test release "
                                          "(exit 0 instead of 3)."),
          as_json: bool = typer.Option(False, "--json", help="Print one JSON document (the "
                                       "verdict, the exit code, every check); same exit codes."),
          ) -> None:
    """Check a release from its own files: the manifest's schema, hashes, every step's
    guarantee recomputed from its noise parameters and derived sensitivities, the per-person
    total, every published column paid for, every format the same; exit 0 / 1 (a check failed)
    / 2 (unreadable) / 3 (a test release, without --allow-test)."""
    from dpatlas.audit.run import main as audit_main

    raise typer.Exit(audit_main(folder, allow_test=allow_test, ledger=ledger,
                                boundaries=boundaries, as_json=as_json))


@app.command()
def serve(root: Optional[Path] = typer.Argument(None, help="Publish root (default: the config's "
                                                "publish.root)."),
          config: Optional[Path] = typer.Option(None, "--config", "-c",
                                                help="Release configuration."),
          port: int = typer.Option(8000, help="Port (127.0.0.1 only)."),
          ) -> None:
    """Serve a publish root locally with HTTP range requests (the web map reads its vector
    tiles by range): open the printed URL for the map over the feed."""
    from dpatlas.publication.serve import ServeError, serve as run_server

    if root is None:
        if config is None:
            _fail("give a publish root folder or --config")
        root = _config_or_fail(config).publish.root
    if not Path(root).is_dir():
        _fail(f"{root} is not a folder")
    with _guard():
        try:
            run_server(Path(root), port)
        except ServeError as err:
            _fail(_one_line(err))


@app.command()
def synthesize(
        config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
        release_id: str = typer.Option(..., "--release-id", help="A published release."),
        epsilon: float = typer.Option(..., help="Budget per tract and cell for the synthetic "
                                      "data (its own charge in the ledger)."),
        delta: Optional[float] = typer.Option(None, help="Delta (default: privacy.delta)."),
        out: Optional[Path] = typer.Option(None, help="Output folder (default: <publish root>/"
                                           "<synthetic id>)."),
        synthetic_id: Optional[str] = typer.Option(
            None, help="Ledger id of the synthetic data (default: <release id>-synthetic, "
            "shortened with a hash for a long release id)."),
) -> None:
    """Write DP synthetic microdata (GEOID, x, y per person-like row) for a published release
    from BinAgg's bin summaries (Lin et al., Alg. 3), charged as its own ledger entry."""
    from rich.progress import Progress

    from dpatlas.release.synthetic_data import SynthesizeError, synthesize_release

    _config_or_fail(config)  # one line and exit 2 on a bad config, before anything else
    with _guard(), Progress(console=console, transient=True) as bar:
        task = bar.add_task("synthesize", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        try:
            folder = synthesize_release(config, release_id, epsilon, out, delta=delta,
                                        synthetic_id=synthetic_id, progress=progress)
        except SynthesizeError as err:
            _fail(_one_line(err))
    console.print(f"synthetic microdata for {release_id}: {folder}", highlight=False,
                  markup=False, soft_wrap=True)


@app.command()
def rerun(release_id: str,
          config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
          timeout: float = typer.Option(3600, help="Seconds to wait for the run."),
          ) -> None:
    """Trigger the operator deployment for RELEASE_ID on the Prefect server (PREFECT_API_URL).

    A published id is a no-op; an interrupted one resumes; a new id is a fresh, charged release.
    """
    from deploy.trigger import trigger_release

    from dpatlas.core.ids import validate_release_id

    cfg = _config_or_fail(config)
    with _guard():
        validate_release_id(release_id)
        try:
            run = trigger_release(str(config.resolve()), release_id, timeout)
        except RuntimeError as err:  # Prefect API unavailable, deployment not served
            _fail(_one_line(err))
    console.print(f"flow run {run.flow_run_name} ({run.flow_run_id}): {run.state}",
                  highlight=False, markup=False, soft_wrap=True)
    if run.outcome is not None:
        _report(run.outcome)
        return
    if run.state == "COMPLETED":
        console.print("the run completed but its result could not be read; see its summary "
                      "artifact in the Prefect UI", highlight=False, markup=False)
        return
    if run.state not in _FINAL_RUN_STATES:
        _still_going(run, cfg, config, release_id, timeout)
    console.print("nothing was published by this run"
                  + (f": {run.message}" if run.message else ""), highlight=False, markup=False,
                  soft_wrap=True)
    console.print("  " + _charge_status(cfg, release_id), highlight=False, markup=False,
                  soft_wrap=True)
    raise typer.Exit(1)


# Prefect's final state types; any other (SCHEDULED, PENDING, RUNNING, PAUSED, CANCELLING, or
# none read) means the wait ended before the run did.
_FINAL_RUN_STATES = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def _still_going(run, cfg, config: Path, release_id: str, timeout: float) -> None:
    """The wait timed out with the run not finished: it goes on in the serving process and
    may still publish and charge (it said "nothing was published / nothing was charged")."""
    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    ui = f" ({api.removesuffix('/api')}/runs/flow-run/{run.flow_run_id})" if api else ""
    console.print(f"still {run.state or 'not started'} after {timeout:g} s of waiting: the run "
                  f"goes on in the process serving the deployment and may still publish and "
                  f"charge release {release_id}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"  follow it in the Prefect UI{ui}, or with `prefect flow-run inspect "
                  f"{run.flow_run_id}`; `dpatlas ledger show -c {config}` shows its charge",
                  highlight=False, markup=False, soft_wrap=True)
    entry = _ledger_entry(cfg, release_id)
    console.print("  so far " + ("the ledger holds no charge for it" if entry is None else
                                 f"the ledger holds it as {entry['status']} (charged: epsilon "
                                 f"{entry.get('epsilon', 0):.4g})"),
                  highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(1)


def _ledger_entry(cfg, release_id: str) -> dict | None:
    from dpatlas.ledger import Ledger

    with _guard():
        return Ledger(cfg.ledger.url, create=False).release(release_id)


def _charge_status(cfg, release_id: str) -> str:
    """Whether the ledger holds a charge for ``release_id`` (read only)."""
    entry = _ledger_entry(cfg, release_id)
    if entry is None:
        return f"nothing was charged: the ledger has no release {release_id}"
    return (f"the ledger holds release {release_id} as {entry['status']} (charged: epsilon "
            f"{entry.get('epsilon', 0):.4g}); a rerun of the same id resumes it without a new "
            "charge")


@app.command()
def calibrate(out: Path = typer.Option(Path("thresholds.yaml"), help="Where to write."),
              tracts: int = typer.Option(1000, help="Tracts per synthetic calibration state."),
              reps: int = typer.Option(50, help="Runs per tract."),
              banded: bool = typer.Option(True, help="Also calibrate the banded rule on the "
                                                     "stress scenarios (about 10 minutes)."),
              ) -> None:
    """Calibrate the selection thresholds on synthetic states (never on release data)."""
    from dpatlas.evaluation.calibrate import calibrate as run, write_thresholds

    result = run(tracts=tracts, reps=reps, progress=lambda m: console.log(m))
    if banded:
        from dpatlas.evaluation.rule_stress import calibrate as calibrate_banded

        result["rules"]["banded"] = calibrate_banded(progress=lambda m: console.log(m))
    write_thresholds(result, out)
    for rule, r in result["rules"].items():
        console.print(f"{rule} rule: threshold {r['threshold']:.4g} on {r['indicator']}")
    if banded:
        for entry in result["rules"]["banded"]["schedule"]:
            console.print(f"banded rule at epsilon {entry['epsilon']:g}: " + ", ".join(
                f"{b['choice']} below n = {b['n_below']}" for b in entry["bands"]))
    console.print(f"wrote {out}")


@app.command()
def evaluate(out: Path = typer.Option(Path("evaluation"), help="Output folder."),
             reps: int = typer.Option(100, help="Runs per tract and mechanism."),
             seed: int = typer.Option(0, help="Seed of the synthetic state and of the noise."),
             epsilon: list[float] = typer.Option([1.0, 8.0], help="Per-tract budgets."),
             mechanism: list[str] = typer.Option([], help="Mechanisms (default: all DP + MOS)."),
             tracts: int = typer.Option(3108, help="Tracts in the synthetic state."),
             rule: bool = typer.Option(True, help="Add the calibrated dp selection rule as a row."),
             scenario: list[str] = typer.Option([], help="Stress scenario(s) of dpatlas/evaluation/stress.py,"
                                                " or 'all' (default: the demo generator)."),
             as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
             ) -> None:
    """Rebuild the paper's comparison on an Illinois-sized synthetic state: table and plots."""
    from dpatlas.evaluation.evaluate import DEFAULT_MECHANISMS, evaluate as run, write_report
    from dpatlas.evaluation.synthetic_input import StateParams

    from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_threshold
    from dpatlas.core.config import SelectionConfig
    from dpatlas.release.selection import Rule, RuleEstimate

    _at_least(("--reps", reps, 1), ("--seed", seed, 0), ("--tracts", tracts, 1))
    if scenario:
        from dpatlas.evaluation.stress import SCENARIOS

        _known_scenarios(scenario, (*SCENARIOS, "all"))
    _output_folder(out)
    mechs = tuple(mechanism) or DEFAULT_MECHANISMS
    extra = {}
    if rule:
        threshold = resolve_threshold(SelectionConfig(rule="dp", threshold_file=DEFAULT_THRESHOLDS))
        extra["SelectionRule(dp)"] = RuleEstimate(Rule("dp", threshold, 0.1))
    if scenario:
        _evaluate_scenarios(scenario, out, reps, seed, tuple(epsilon), mechs, tracts, extra,
                            as_json)
        return
    t0 = time.perf_counter()
    result = run(mechs, tuple(epsilon), reps, seed, StateParams(n_tracts=tracts),
                 progress=_log_to(as_json), extra_rows=extra)
    paths = write_report(result, out)
    thr = result.crossover.get("threshold")
    if as_json:
        _emit_json({"summary": _records(result.summary), "crossover_threshold": thr,
                    "files": paths})
        return
    _print_rows(("mechanism", "epsilon", "tracts", "share below SE", "median ratio",
                 "failure rate"),
                [(r.mechanism, f"{r.epsilon:g}", r.tracts, f"{r.share_below_se:.3f}",
                  f"{r.median_ratio:.3f}", f"{r.mean_failure_rate:.3f}")
                 for r in result.summary.itertuples()])
    console.print(f"NoisyStats/DPExpTheilSen crossover in n*eps*var(x): "
                  f"{'not found' if thr is None else f'{thr:.3g}'}")
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def _evaluate_scenarios(names: list[str], out: Path, reps: int, seed: int, epsilons: tuple,
                       mechs: tuple, tracts: int, extra: dict, as_json: bool = False) -> None:
    """``dpatlas evaluate --scenario``: one report per stress scenario, one summary of all."""
    from dpatlas.evaluation.evaluate import (SCENARIO_ESTIMAND, evaluate_scenario, scenario_summary,
                                             write_scenario_reports)
    from dpatlas.evaluation.stress import SCENARIOS

    t0 = time.perf_counter()
    log = _log_to(as_json)
    if not as_json:
        console.print(f"errors measured against {SCENARIO_ESTIMAND}", soft_wrap=True)
    results = {name: evaluate_scenario(name, tracts, mechs, epsilons, reps, seed,
                                       progress=lambda m, _s=name: log(f"{_s}: {m}"),
                                       extra_rows=extra)
               for name in (SCENARIOS if "all" in names else dict.fromkeys(names))}
    paths = write_scenario_reports(results, out)
    summary = scenario_summary(results)
    if as_json:
        _emit_json({"estimand": SCENARIO_ESTIMAND, "summary": _records(summary),
                    "files": paths})
        return
    _print_rows(("scenario", "mechanism", "epsilon", "tracts", "share below SE",
                 "median ratio", "failure rate"),
                [(r.scenario, r.mechanism, f"{r.epsilon:g}", r.tracts,
                  f"{r.share_below_se:.3f}", f"{r.median_ratio:.3f}",
                  f"{r.mean_failure_rate:.3f}") for r in summary.itertuples()])
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


@app.command("evaluate-rule")
def evaluate_rule(
        out: Path = typer.Option(Path("evaluation-rule"), help="Output folder."),
        scenario: list[str] = typer.Option([], help="Stress scenario(s) (default: all)."),
        epsilon: list[float] = typer.Option([1.0, 8.0], help="Per-tract budgets."),
        tracts: int = typer.Option(3108, help="Tracts per scenario state."),
        large_tracts: int = typer.Option(300, help="Tracts of the 'large' scenario."),
        reps: int = typer.Option(50, help="Runs per tract."),
        seed: int = typer.Option(0, help="Scenario seed (the calibration's are 101, 102)."),
        thresholds: Path = typer.Option(None, help="Calibration file (default: the shipped)."),
        census: bool = typer.Option(False, "--census", help="Score against the tract's own "
                                    "least-squares line (the census reading) instead of its "
                                    "expected outcome."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The banded selection rule against both fixed mechanisms (and today's dp rule), per
    stress scenario, epsilon and tract-size quintile, against the tract's expected outcome
    (docs/selection.md)."""
    from dpatlas.release.thresholds import DEFAULT_THRESHOLDS, resolve_schedule, resolve_threshold
    from dpatlas.core.config import SelectionConfig
    from dpatlas.evaluation.rule_stress import CALIBRATION_SEEDS, evaluate as run, to_markdown
    from dpatlas.release.selection import Rule
    from dpatlas.evaluation.stress import SCENARIOS

    t0 = time.perf_counter()
    _at_least(("--reps", reps, 1), ("--seed", seed, 0), ("--tracts", tracts, 1),
              ("--large-tracts", large_tracts, 1))
    _known_scenarios(scenario, SCENARIOS)
    if seed in CALIBRATION_SEEDS:
        _fail(f"seed {seed} is a calibration seed: evaluate on another")
    with _guard():
        path = thresholds or DEFAULT_THRESHOLDS
        try:
            banded = SelectionConfig(rule="banded", threshold_file=path)
            rule = Rule("banded", resolve_threshold(banded), 0.1,
                        schedule=resolve_schedule(banded))
            dp = resolve_threshold(SelectionConfig(rule="dp", threshold_file=path))
        except (FileNotFoundError, ValueError) as err:
            _fail(str(err))
        out.mkdir(parents=True, exist_ok=True)  # before the work, not after it
        table = run(rule, dp, seed, tuple(epsilon), tuple(scenario) or SCENARIOS, tracts,
                    large_tracts, reps, progress=_log_to(as_json), census=census)
        table.to_csv(out / "rule.csv", index=False)
        (out / "rule.md").write_text(to_markdown(table))
    if as_json:
        _emit_json({"rows": _records(table), "files": [out / "rule.csv", out / "rule.md"]})
        return
    console.print(to_markdown(table))
    console.print(f"wrote {out / 'rule.csv'}, {out / 'rule.md'} in "
                  f"{time.perf_counter() - t0:.0f}s")


@app.command("evaluate-intervals")
def evaluate_intervals(
        out: Path = typer.Option(Path("evaluation-intervals"), help="Output folder."),
        reps: int = typer.Option(100, help="Runs per tract."),
        tracts: int = typer.Option(3108, help="Tracts in the synthetic state."),
        seed: int = typer.Option(21, help="Synthetic state seed (never the demo's 0)."),
        epsilon: list[float] = typer.Option([1.0, 8.0], help="Per-tract budgets."),
        share: float = typer.Option(0.25, help="Share of each tract's budget for the interval."),
        level: float = typer.Option(0.95, help="Confidence level."),
        scenario: list[str] = typer.Option(["demo"], help="Scenario(s) of dpatlas/evaluation/stress.py, "
                                           "or 'all'."),
        reliable_width: float = typer.Option(0.5, help="Widest interval the map shows as "
                                             "reliable (the config's low_reliability_width)."),
        census: bool = typer.Option(False, "--census", help="Score against the census reading "
                                    "(each row's line of the tract's own records) instead of "
                                    "the tract's expected outcome."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Coverage and width of the DP confidence intervals per scenario, mechanism and epsilon,
    against the tract's expected outcome: overall, by tract-size and interval-width quintile,
    in the extreme deciles and among the reliable ones; calibration of the standard errors."""
    from dpatlas.evaluation.interval_eval import evaluate_intervals as run, write_interval_report
    from dpatlas.evaluation.stress import SCENARIOS

    t0 = time.perf_counter()
    _at_least(("--reps", reps, 1), ("--seed", seed, 0), ("--tracts", tracts, 1))
    scenarios = SCENARIOS if "all" in scenario else tuple(scenario)
    with _guard():
        try:
            summary, per_tract, edges = run(tracts, reps, seed, tuple(epsilon), share, level,
                                            progress=_log_to(as_json),
                                            scenarios=scenarios, reliable_width=reliable_width,
                                            estimand="census" if census else "expected")
        except ValueError as err:
            _fail(str(err))
        paths = write_interval_report(summary, per_tract, edges, out)
    if as_json:
        _emit_json({"summary": _records(summary), "size_quintile_edges": edges,
                    "files": paths})
        return
    cols = ("coverage", "worst Q", "worst W", "extreme deciles", "SE cover", "worst SE Q",
            "median width", "width<=0.2", "width<=0.5", "reliable", "[0,1] share")
    for name, e in edges.items():
        console.print(f"{name}: tract-size quintiles up to n = {e}")
    _print_rows(("scenario", "mechanism", "epsilon", *cols, "reliable intervals"),
                [(r["scenario"], r["mechanism"], f"{r['epsilon']:g}",
                  *(f"{r[c]:.3f}" for c in cols), r["reliable intervals"])
                 for _, r in summary.iterrows()])
    console.print("worst Q, worst W: the lowest coverage over the tract-size and the "
                  "interval-width quintiles (each quintile in summary.md); SE cover: share of "
                  "value ± 1.96·se covering (worst SE Q: by size quintile)")
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


@app.command("evaluate-small-area")
def evaluate_small_area(
        out: Path = typer.Option(Path("evaluation-small-area"), help="Output folder."),
        seed: list[int] = typer.Option([201, 202, 203, 204, 205],
                                       help="Synthetic state seeds (never the demo's 0; "
                                       "101-103 were used for tuning)."),
        epsilon: list[float] = typer.Option([1.0, 8.0], help="ε per person, all levels."),
        split: list[str] = typer.Option(["0.66/0.31/0.03", "0.7/0.27/0.03", "0.7/0.2/0.1",
                                         "0.8/0.15/0.05", "0.9/0.08/0.02"],
                                        help="tract/county/state shares of ε; the first is "
                                        "the one the targets are checked under (0.66/0.31/0.03, "
                                        "the release's default)."),
        tracts: Optional[int] = typer.Option(None, help="Tracts per state (default 3,108)."),
        quick: bool = typer.Option(False, help="One seed, ε = 1, one split, 400 tracts."),
        stress: bool = typer.Option(False, help="Instead: the model on data it was not "
                                    "designed for (skewed, heteroskedastic, outliers, censored, "
                                    "narrow x, small and large tracts, other spatial "
                                    "parameters), seeds 201-203 unless --seed, first split; "
                                    "writes stress.csv and stress.md."),
        scenario: list[str] = typer.Option([], "--scenario",
                                           help="Instead: the model's stress scenarios "
                                           "(issue 32) by name, or 'all': coverage overall, "
                                           "worst size quintile, extreme deciles, median p25 "
                                           "width of two releases, corr/RMSE, flagged share of "
                                           "planted outliers; report seeds 401-403 unless "
                                           "--seed (calibration seeds: 301, 302), first split; "
                                           "writes scenarios.csv and scenarios.md."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """The small-area model (Fay–Herriot on published values) against the generator's truth:
    RMSE, correlation, interval coverage, two releases' agreement, county error; a figure."""
    from dpatlas.evaluation.small_area_eval import (evaluate_small_area as run, summarise,
                                                    target_check, write_report)

    t0 = time.perf_counter()
    _at_least(*(("--seed", s, 0) for s in seed), ("--tracts", 1 if tracts is None else tracts, 1))
    if stress:
        _evaluate_small_area_stress(out, seed, epsilon, split[0], tracts, quick, t0, as_json)
        return
    if scenario:
        _evaluate_small_area_scenarios(out, scenario, seed, epsilon, split[0], tracts, quick,
                                       t0, as_json)
        return
    if quick:
        seed, epsilon, split, tracts = seed[:1], [1.0], split[:1], tracts or 400
    try:
        splits = {s: tuple(float(v) for v in s.split("/")) for s in split}
    except ValueError:
        _fail(f"--split takes tract/county/state shares such as 0.8/0.15/0.05, got {split}")
    bad = [s for s, v in splits.items() if len(v) != 3 or abs(sum(v) - 1) > 1e-9
           or min(v) <= 0]
    if bad:
        _fail(f"--split: three positive shares summing to 1, got {bad}")
    _output_folder(out)
    with _guard():
        rows, shown = run(tuple(seed), tuple(epsilon), splits, tracts,
                          progress=_log_to(as_json))
        paths = write_report(rows, shown, out, split[0])
    targets = target_check(summarise(rows), split[0])
    if as_json:
        _emit_json({"split": split[0], "seeds": list(seed), "targets": _records(targets),
                    "files": paths})
        return
    console.print(f"targets at epsilon 1, split {split[0]}, seeds {list(seed)}:")
    _print_rows(("metric", "value", "target", "met"),
                [(r["metric"], f"{r['value']:.4f}", r["target"], r["met"])
                 for _, r in targets.iterrows()])
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def _evaluate_small_area_scenarios(out: Path, names: list[str], seed: list[int],
                                   epsilon: list[float], split: str, tracts: Optional[int],
                                   quick: bool, t0: float, as_json: bool) -> None:
    from dpatlas.evaluation import small_area_scenarios as sc

    names = list(sc.SCENARIOS) if "all" in names else names
    unknown = [n for n in names if n not in sc.SCENARIOS]
    if unknown:
        _fail(f"--scenario: unknown {unknown}; choose from all, {', '.join(sc.SCENARIOS)}")
    seeds = sc.REPORT_SEEDS if seed == [201, 202, 203, 204, 205] else tuple(seed)
    if quick:
        seeds, epsilon, tracts = seeds[:1], [1.0], tracts or 400
    _output_folder(out)
    with _guard():
        rows = sc.evaluate_scenarios(names, seeds, tuple(epsilon), split, tracts or 3108,
                                     progress=_log_to(as_json))
        paths = sc.write_scenarios(rows, Path(out), split)
    summary = sc.scenario_summary(rows)
    if as_json:
        _emit_json({"split": split, "seeds": list(seeds), "summary": _records(summary),
                    "files": paths})
        return
    cols = ("coverage", "coverage, worst size quintile", "coverage, lowest decile",
            "coverage, highest decile", "median p25 width", "median p25 width, second release",
            "p25 model corr", "p25 model RMSE", "flagged, planted outliers")
    console.print(f"seeds {list(seeds)} (calibration seeds: {list(sc.CALIBRATION_SEEDS)}), "
                  f"split {split}; means over seeds:")
    _print_rows(("seeds", "epsilon", "scenario", "cov", "worst Q", "low D", "high D", "width",
                 "width 2", "corr", "RMSE", "flagged"),
                [(r["seeds"], f"{r['epsilon']:g}", r["scenario"],
                  *(f"{r[c]:.3f}" for c in cols)) for _, r in summary.iterrows()])
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def _evaluate_small_area_stress(out: Path, seed: list[int], epsilon: list[float], split: str,
                                tracts: Optional[int], quick: bool, t0: float,
                                as_json: bool) -> None:
    from dpatlas.evaluation.small_area_stress import SCENARIOS, evaluate_stress, write_stress

    seeds = (201, 202, 203) if seed == [201, 202, 203, 204, 205] else tuple(seed)
    scenarios = SCENARIOS
    if quick:
        seeds, epsilon, tracts, scenarios = seeds[:1], [1.0], tracts or 400, SCENARIOS[:2]
    _output_folder(out)
    with _guard():
        rows = evaluate_stress(scenarios, seeds, tuple(epsilon), split, tracts,
                               progress=_log_to(as_json))
        paths = write_stress(rows, Path(out), split)
    if as_json:
        from dpatlas.evaluation.small_area_stress import stress_summary
        _emit_json({"split": split, "seeds": list(seeds),
                    "summary": _records(stress_summary(rows)), "files": paths})
        return
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
