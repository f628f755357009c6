"""Prefect flows."""
