"""Shared by every layer: the config, ids, atomic files, hashes, column names and the operator-error
base."""
