"""``python -m dpatlas.cli``: the ``dpatlas`` command."""

from dpatlas.cli.commands import main

main()
