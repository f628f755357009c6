"""The ledger's checks of the values it is given (ids, reasons, numbers, caps): every refusal
is a :class:`LedgerError` (or one of its subclasses)."""

from __future__ import annotations

import getpass
import math
import socket

from dpatlas.core.ids import (InvalidDatasetName, InvalidReason, InvalidReleaseId,
                              validate_dataset_name, validate_reason, validate_release_id)
from dpatlas.ledger.errors import InvalidLedgerId, InvalidLedgerReason, LedgerError
from dpatlas.ledger.formatting import fmt

DEFAULT_LEASE_SECONDS = 60.0
MAX_LEASE_SECONDS = 86400.0


def finite_number(x, name: str, lo: float = 0.0, hi: float = math.inf) -> float:
    if isinstance(x, bool):
        raise LedgerError(f"{name} must be a number, got {x!r}")
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise LedgerError(f"{name} must be a number, got {x!r}") from None
    if not math.isfinite(v) or v < lo or v > hi:
        raise LedgerError(f"{name} must be finite and in [{fmt(lo)}, {fmt(hi)}], got {x!r}")
    return v


def nonempty_text(x, name: str) -> str:
    if not isinstance(x, str) or not x.strip():
        raise LedgerError(f"{name} must be a non-empty string, got {x!r}")
    return x


def checked_dataset(value) -> str:
    try:
        return validate_dataset_name(value)
    except InvalidDatasetName as e:
        raise LedgerError(str(e)) from None


def check_cap(dataset: str, cap_epsilon: float, cap_delta: float) -> tuple[str, float, float]:
    """A cap's dataset, epsilon and delta, checked before any ledger is opened or created:
    epsilon finite and >= 0, delta in [0, 1) (a delta of 1 guarantees nothing)."""
    name = checked_dataset(dataset)
    eps = finite_number(cap_epsilon, "the cap's epsilon")
    delta = finite_number(cap_delta, "the cap's delta", hi=1.0)
    if delta >= 1.0:
        raise LedgerError(f"the cap's delta must be below 1 (a delta of 1 allows anything), "
                          f"got {cap_delta!r}")
    return name, eps, delta


def checked_release_id(value) -> str:
    try:
        return validate_release_id(value)
    except InvalidReleaseId as e:
        raise InvalidLedgerId(str(e)) from None


def checked_reason(value, what: str) -> str:
    try:
        return validate_reason(value, what)
    except InvalidReason as e:
        raise InvalidLedgerReason(str(e)) from None


def checked_lease_seconds(value) -> float:
    v = finite_number(value, "lease_seconds", hi=MAX_LEASE_SECONDS)
    if v <= 0:
        raise LedgerError(f"lease_seconds must be positive, got {value!r}")
    return v


def default_actor() -> str:
    """host:user of this process, the default actor of a cap change."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (a container without a passwd entry): the uid will do
        import os
        user = f"uid {os.getuid()}"
    return f"{socket.gethostname()}:{user}"
