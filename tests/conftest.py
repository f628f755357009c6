"""Fixtures shared by every tier (tests/unit, tests/integration, tests/system). Helpers are
plain modules in tests/support/, imported by name (``from tests.support.inputs import ...``)."""

import pytest

from mechanisms.noise import SeededRandomness


@pytest.fixture
def rand():
    return SeededRandomness(20261121)
