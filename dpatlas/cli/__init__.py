"""The ``dpatlas`` command line: the typer app (commands.py), its commands by concern
(release_commands.py, evaluation_commands.py, publication_commands.py, ledger_commands.py,
config_commands.py, server_commands.py, feed_commands.py) and what they share (common.py), the
demo (demo.py) and the command's own Prefect server (prefect_server.py).

``dpatlas.cli:app`` stays the console script's entry point. The app is imported on first use
(PEP 562), not with the package: ``python -m dpatlas.cli.commands`` would otherwise find its
module imported twice (runpy warns on stderr)."""


def __getattr__(name: str):
    if name in ("app", "main"):
        from dpatlas.cli import commands

        return getattr(commands, name)
    raise AttributeError(f"module 'dpatlas.cli' has no attribute {name!r}")
