"""``dpatlas release``, ``demo``, ``synthesize`` and ``rerun``: running a release, with the
command's own Prefect server, and saying what it did (commands.py registers them)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Optional

import typer

from dpatlas.cli.common import (config_or_fail, console, fail, guard, one_line, operator_errors,
                                styled)


def _quiet_operator_tracebacks() -> None:
    """Prefect logs a failed flow run with its traceback on the console; for an operator error
    the one-line message is the whole story (the run's logs on the server keep the rest). So is
    its Prefect server refusing connections: the run then stops with the message that the
    server went away (dpatlas/cli/api_watch.py)."""
    import logging

    import httpx

    errors = (*operator_errors(), httpx.ConnectError)

    class _NoOperatorTraceback(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.exc_info and isinstance(record.exc_info[1], errors):
                record.exc_info, record.exc_text = None, None
            return True

    for handler in logging.getLogger().handlers + logging.getLogger("prefect").handlers:
        if not any(isinstance(f, _NoOperatorTraceback) for f in handler.filters):
            handler.addFilter(_NoOperatorTraceback())


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
        with guard():
            cfg, rid = _checked_release(config, release_id, noise_seed)
        _start_compute_server(cfg, rid)
        with guard(cfg.publish.internal / "logs"):
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
                fail(_disk_full_message(err, cfg, config, rid))


def _start_compute_server(cfg, rid: str) -> None:
    """The server the local runner's compute processes are forked from
    (dpatlas.release.compute_pool), started before the flow is imported: it imports what they
    run beside this process's own imports and the run's start, not while the flow validates
    the input. Only for a release that will start them: by its records as its Parquet footers
    count them (a CSV input's server starts with the flow, once the flow has counted them),
    and not one published already (its rerun starts none)."""
    from dpatlas.release.compute_pool import pool_processes, start_server
    from dpatlas.release.ingest import parquet_records

    if os.path.lexists(cfg.publish.root / rid):
        return
    records = parquet_records(cfg.input)  # pool_processes says whether the runner uses them
    if records is not None and pool_processes(cfg, records):
        start_server()


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
        console.print(styled("error:", "bold red", f" {message}"), soft_wrap=True)
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
    console.print(styled("published", "bold green", head[len("published"):])
                  if outcome.charged else head, soft_wrap=True)
    for line in rest:
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def demo(out: Path = typer.Option(Path("demo"), help="Folder for data, config and releases."),
         release_id: str = typer.Option(None, help="Release id (default: a new one)."),
         profile: str = typer.Option("primary", help="primary | full-suite"),
         ) -> None:
    """Generate the default synthetic state and publish a full release of it."""
    from dpatlas.cli.demo import (check_demo_arguments, claim_demo_folder, demo_data_current,
                                  ensure_demo_cap,
                                  generate_demo_data, write_demo_config)

    data = out / "data"
    with guard():  # e.g. an unwritable --out: one line and exit 2, as for every operator error
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

    config_or_fail(config)  # one line and exit 2 on a bad config, before anything else
    with guard(), Progress(console=console, transient=True) as bar:
        task = bar.add_task("synthesize", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        try:
            folder = synthesize_release(config, release_id, epsilon, out, delta=delta,
                                        synthetic_id=synthetic_id, progress=progress)
        except SynthesizeError as err:
            fail(one_line(err))
    console.print(f"synthetic microdata for {release_id}: {folder}", highlight=False,
                  markup=False, soft_wrap=True)


def rerun(release_id: str,
          config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
          timeout: float = typer.Option(3600, help="Seconds to wait for the run."),
          ) -> None:
    """Trigger the operator deployment for RELEASE_ID on the Prefect server (PREFECT_API_URL).

    A published id is a no-op; an interrupted one resumes; a new id is a fresh, charged release.
    """
    from deploy.trigger import trigger_release

    from dpatlas.core.ids import validate_release_id

    cfg = config_or_fail(config)
    with guard():
        validate_release_id(release_id)
        try:
            run = trigger_release(str(config.resolve()), release_id, timeout)
        except RuntimeError as err:  # Prefect API unavailable, deployment not served
            fail(one_line(err))
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

    with guard():
        return Ledger(cfg.ledger.url, create=False).release(release_id)


def _charge_status(cfg, release_id: str) -> str:
    """Whether the ledger holds a charge for ``release_id`` (read only)."""
    entry = _ledger_entry(cfg, release_id)
    if entry is None:
        return f"nothing was charged: the ledger has no release {release_id}"
    return (f"the ledger holds release {release_id} as {entry['status']} (charged: epsilon "
            f"{entry.get('epsilon', 0):.4g}); a rerun of the same id resumes it without a new "
            "charge")
