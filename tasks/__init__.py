"""Filled in by the release-flow issue."""
