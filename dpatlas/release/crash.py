"""Crash points: named places where the crash-recovery tests stop a release.

Production code calls :func:`crashpoint` at each; with no fault hook installed (always, outside
tests) it does nothing, and nothing here reads the environment. A test injects a fault with
:func:`install_fault_hook` (or ``monkeypatch.setattr(crash, "fault_hook", ...)``), e.g.
:func:`sigkill_at`, the hardest way a release can stop (no cleanup, no finally blocks);
``tests/support/crash_at.py`` runs the command line with one installed, for the tests that need a
process of their own.
"""

from __future__ import annotations

import os
import signal
from typing import Callable, Optional

FaultHook = Callable[[str], None]

fault_hook: Optional[FaultHook] = None  # called with each crash point's name; None: no faults


def crashpoint(name: str) -> None:
    if fault_hook is not None:
        fault_hook(name)


def install_fault_hook(hook: Optional[FaultHook]) -> Optional[FaultHook]:
    """Make ``hook`` the fault hook (None: none); returns the one it replaces."""
    global fault_hook
    previous, fault_hook = fault_hook, hook
    return previous


def sigkill_at(point: str) -> FaultHook:
    """A fault hook that kills this process with SIGKILL at the crash point ``point``."""
    def kill(name: str) -> None:
        if name == point:
            os.kill(os.getpid(), signal.SIGKILL)
    return kill
