"""Prefect deployments of the release flow: serve them (``python -m deploy.serve``) and
trigger an operator rerun through the Prefect API (``deploy.trigger.trigger_release``).

See deploy/README.md for the commands.
"""
