"""``dpatlas server start|stop|status``: the persistent local Prefect server
(dpatlas/cli/prefect_server.py). Kept apart from commands.py, which only registers it."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import typer

from dpatlas.core.errors import OperatorError

server_app = typer.Typer(help="A persistent local Prefect server: run history that survives "
                         "releases (`dpatlas release` uses it while it runs).")

_HOME_HELP = ("The server's home: its database, pid and log files (default: $PREFECT_HOME, "
              "else ~/.dpatlas-prefect).")


def _say(line: str) -> None:
    typer.echo(line)


def _error(message: str) -> None:
    typer.echo(f"error: {message}")
    raise typer.Exit(2)


def _one_line(err: BaseException) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, OSError) and err.filename and str(err.filename) not in text:
        text = f"{text}: {err.filename}"
    return " ".join(text.split())


# What a server command can meet that the operator fixes: one line and exit 2.
_SERVER_ERRORS = (OperatorError, OSError)


@server_app.command("start")
def start(home: Optional[Path] = typer.Option(None, help=_HOME_HELP),
          port: int = typer.Option(4200, help="Port on 127.0.0.1."),
          timeout: float = typer.Option(180, help="Seconds to wait for its health check."),
          ) -> None:
    """Start `prefect server start` in the background (on 127.0.0.1) and wait until it answers."""
    from dpatlas.cli.prefect_server import server_home, start_server

    if not 0 < port < 65536:
        _error(f"--port {port}: give a port from 1 to 65535")
    if not timeout > 0:
        _error(f"--timeout {timeout:g}: give a number of seconds above 0")
    try:
        record, started = start_server(home, port, timeout)
    except _SERVER_ERRORS as err:
        _error(_one_line(err))
    _say(f"{'started' if started else 'already running'}: Prefect server at {record.url} "
         f"(pid {record.pid})")
    _say(f"  home {record.home} (database {record.database}), log {record.log}")
    _say(f"  the UI is at {record.url.removesuffix('/api')}")
    _say("  `dpatlas release` uses it while it runs")
    if record.home != server_home(None):  # found by releases through a pointer in the default
        # home; `dpatlas server status|stop` and Prefect's own commands need the home exported
        _say("  for `dpatlas server status|stop` without --home, export its home:")
        _say(f"  export PREFECT_HOME={shlex.quote(str(record.home))}")


@server_app.command("stop")
def stop(home: Optional[Path] = typer.Option(None, help=_HOME_HELP),
         force: bool = typer.Option(False, "--force", help="Stop it even while flow runs (a "
                                    "release) are in progress on it."),
         ) -> None:
    """Stop the server `dpatlas server start` started (its database stays in the home);
    refused while a flow run is in progress on it, unless --force."""
    from dpatlas.cli.prefect_server import (read_server_record, runs_in_progress, server_home,
                                            stop_server)

    try:
        record = read_server_record(home, strict=True)
        was_running = record is not None and record.running()
        running = runs_in_progress(record) if was_running else None
        if running and not force:
            shown = ", ".join(running[:5]) + (f" and {len(running) - 5} more"
                                              if len(running) > 5 else "")
            _error(f"{len(running)} flow run(s) are in progress on the Prefect server at "
                   f"{record.url} ({shown}): stopping it stops them (a release stops; its "
                   "charge is kept and a rerun of its id finishes it). Wait for them to "
                   "finish, or add --force")
        record = stop_server(home)
    except _SERVER_ERRORS as err:
        _error(_one_line(err))
    if record is None:
        _say(f"no dpatlas server recorded in {server_home(home)}: nothing to stop")
        return
    if not was_running:
        _say(f"the Prefect server recorded in {record.home} (pid {record.pid}) was not running "
             f"(see its log {record.log}): its record is removed")
        return
    _say(f"stopped the Prefect server at {record.url} (pid {record.pid}); its history stays "
         f"in {record.database}")


@server_app.command("status")
def status(home: Optional[Path] = typer.Option(None, help=_HOME_HELP)) -> None:
    """Say whether the server runs and answers, with its URL; exit 0 if it does, else 1."""
    from dpatlas.cli.prefect_server import read_server_record, server_health, server_home

    try:
        record = read_server_record(home, strict=True)
    except _SERVER_ERRORS as err:
        _error(_one_line(err))
    if record is None:
        _say(f"not running: no dpatlas server recorded in {server_home(home)} "
             "(`dpatlas server start`); a release uses a temporary server")
        raise typer.Exit(1)
    problem = server_health(record)
    if problem is None:
        _say(f"running: Prefect server at {record.url} (pid {record.pid}), healthy")
        _say(f"  home {record.home} (database {record.database}), log {record.log}")
        return
    _say(f"not healthy: {problem}")
    raise typer.Exit(1)
