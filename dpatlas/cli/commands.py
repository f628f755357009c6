"""The ``dpatlas`` command: the typer app, and every command registered on it, in the order
``dpatlas --help`` lists them. The commands live by concern: release_commands.py,
evaluation_commands.py, publication_commands.py, ledger_commands.py, config_commands.py,
server_commands.py and feed_commands.py; what they share is in common.py."""

from __future__ import annotations

from dpatlas.core.memory import freeze_heap_at_exit, limit_malloc_arenas

# before anything starts a thread: glibc fixes the arena limit once threads have made eight
limit_malloc_arenas()
freeze_heap_at_exit()  # a release's process exits in 0.1 s, not 1.1 (dpatlas.core.memory)

import typer  # noqa: E402

from dpatlas.cli import (evaluation_commands as evaluation, publication_commands as publication,
                         release_commands as release)
from dpatlas.cli.config_commands import config_app
from dpatlas.cli.feed_commands import feed_app
from dpatlas.cli.ledger_commands import ledger_app
from dpatlas.cli.server_commands import server_app

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="Differentially private per-tract mobility release (dpatlas).")

# In the order `dpatlas --help` lists them (a name is its function's, with dashes).
COMMANDS = (evaluation.estimators, evaluation.synth, release.release, release.demo,
            publication.withdraw, publication.purge, publication.audit, publication.serve,
            release.synthesize, release.rerun, evaluation.calibrate, evaluation.evaluate,
            evaluation.evaluate_rule, evaluation.evaluate_intervals,
            evaluation.evaluate_small_area)
for command in COMMANDS:
    app.command()(command)

app.add_typer(server_app, name="server")
app.add_typer(feed_app, name="feed")
app.add_typer(config_app, name="config")
app.add_typer(ledger_app, name="ledger")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
