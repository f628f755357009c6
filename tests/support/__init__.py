"""Helpers for the tests: plain modules, imported as ``tests.support.<name>``."""
