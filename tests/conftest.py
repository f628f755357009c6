"""Fixtures shared by every tier (tests/unit, tests/integration, tests/system). Helpers are
plain modules in tests/support/, imported by name (``from tests.support.inputs import ...``)."""

import pytest

from mechanisms.noise import SeededRandomness


@pytest.fixture
def rand():
    return SeededRandomness(20261121)


def pytest_sessionfinish(session, exitstatus):
    """Stop Prefect's ephemeral API servers while the output streams are still open.

    Prefect stops them at interpreter exit, after pytest has closed its captured streams, so
    the "Stopping temporary server" log line then failed with "Logging error ... closed file"
    at the end of every run that used one."""
    try:
        from prefect.server.api.server import SubprocessASGIServer
    except ImportError:  # pragma: no cover - prefect is a dependency
        return
    for server in list(SubprocessASGIServer._instances.values()):
        server.stop()
