"""Crash points for the crash-recovery tests.

``DPATLAS_CRASH_AT=<name>`` makes the process kill itself with SIGKILL when it reaches the
crash point of that name, the hardest way a release can stop (no cleanup, no finally blocks).
Unset in normal use; only the tests set it.
"""

from __future__ import annotations

import os
import signal


def crashpoint(name: str) -> None:
    if os.environ.get("DPATLAS_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
