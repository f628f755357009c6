"""The ``dpatlas`` command line."""
