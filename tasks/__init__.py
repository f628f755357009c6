"""Prefect tasks: thin wrappers around the plain functions of the release stages."""
