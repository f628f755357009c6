"""The ``dpatlas`` command line: the typer app (commands.py), the demo (demo.py) and the
command's own Prefect server (prefect_server.py).

``dpatlas.cli:app`` stays the console script's entry point."""

from dpatlas.cli.commands import app, main

__all__ = ["app", "main"]
