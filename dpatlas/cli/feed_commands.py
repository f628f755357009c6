"""``dpatlas feed rebuild``: the publish root's indexes written again from the truth. Kept
apart from commands.py, which only registers it.

A release or a withdrawal rebuilds a missing or corrupt feed by itself; this command is for a
feed that reads well but lists too little (e.g. one an earlier version wrote again with the
newest release only, after feed.json had been deleted)."""

from __future__ import annotations

from pathlib import Path

import typer

feed_app = typer.Typer(help="The publish root's feed (feed.json, feed.atom, the STAC catalogue).")


@feed_app.command("rebuild")
def rebuild(config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
            ) -> None:
    """Rewrite feed.json, feed.atom, the STAC catalogue and `latest` from the release folders
    in the config's publish root (each checked against its manifest) and its ledger: every
    release the ledger holds as published or withdrawn, withdrawn ones as withdrawn."""
    from dpatlas.core.config import load_config
    from dpatlas.core.errors import OperatorError
    from dpatlas.ledger.existing import open_existing_ledger
    from dpatlas.publication.feed import rebuild_feed

    try:
        cfg = load_config(config)
        # a mistyped ledger URL is refused: read as an empty ledger it listed no release
        with open_existing_ledger(cfg.ledger.url) as ledger:
            done = rebuild_feed(cfg.publish.root, ledger.release)
    except (OperatorError, OSError) as err:
        typer.echo(f"error: {err}")
        raise typer.Exit(2)
    typer.echo(f"rebuilt the feed at {cfg.publish.root}: {len(done['releases'])} release(s) "
               f"({', '.join(done['releases']) or 'none'}; withdrawn: "
               f"{', '.join(done['withdrawn']) or 'none'}), {len(done['synthetic'])} synthetic")
    for rid, why in done["skipped"].items():
        typer.echo(f"  not listed: {rid}: {why}")
