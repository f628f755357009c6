"""``dpatlas withdraw``, ``purge``, ``audit`` and ``serve``: what happens to releases once
published (commands.py registers them)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dpatlas.cli.common import config_or_fail, console, fail, guard, one_line, print_rows


def withdraw(release_id: str,
             config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
             reason: str = typer.Option(..., help="Why, for the feed and the ledger."),
             ) -> None:
    """Withdraw a published release: it stays in the feed, marked withdrawn; its budget stays spent."""
    from dpatlas.core.ids import validate_reason, validate_release_id
    from dpatlas.ledger.existing import open_existing_ledger
    from dpatlas.publication.withdraw import withdraw_everywhere

    cfg = config_or_fail(config)
    with guard():
        validate_release_id(release_id)
        why = validate_reason(reason)
        result = withdraw_everywhere(open_existing_ledger(cfg.ledger.url, write=True),
                                     cfg.publish.root, release_id, why)
    console.print(result.get("message", f"withdrew {release_id}: {why}"), highlight=False,
                  markup=False)


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

    cfg = config_or_fail(config)
    days = cfg.publish.internal_retention_days if older_than is None else older_than
    if days is not None and days < 0:
        fail(f"--older-than {days}: give 0 or more days")
    if days is None:
        console.print("publish.internal_retention_days is null: internal files are kept "
                      "forever; nothing removed (give --older-than DAYS to purge)")
        return
    with guard():
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
    print_rows(head, rows)
    gone = [i for i in items if i.removed]
    verb = "would remove" if dry_run else "removed"
    typer.echo(f"{verb} {sum(len(i.files) for i in gone)} file(s), "
               f"{sum(i.size for i in gone)} bytes, of {len(gone)} release(s) published at "
               f"least {days} day(s) ago; kept {len(items) - len(gone)} release(s)")


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
            fail("give a publish root folder or --config")
        root = config_or_fail(config).publish.root
    if not Path(root).is_dir():
        fail(f"{root} is not a folder")
    with guard():
        try:
            run_server(Path(root), port)
        except ServeError as err:
            fail(one_line(err))
