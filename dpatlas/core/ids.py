"""Release ids: one rule, applied to every source of an id before anything is written or charged.

A release id names a folder in the publish root, a folder in the internal root, a ledger row,
a feed entry and an Atom element, so it must be safe in all of them: ASCII letters, digits,
``.``, ``_`` and ``-``, starting with a letter or digit, at most 64 characters, and none of the
names the publish root uses for itself (the feed files, ``latest``, staging folders).
"""

from __future__ import annotations

import re

from dpatlas.core.errors import OperatorError, ReleaseRefused

# Anchored with \A and \Z, and matched whole (fullmatch): ``$`` also matches before a trailing
# newline, so ``latest\n`` passed, was charged and published into a folder ``latest\n``.
MAX_RELEASE_ID_CHARS = 64
RELEASE_ID_PATTERN = r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z"
_ID = re.compile(RELEASE_ID_PATTERN)
# Names the publish root uses itself (compared case-insensitively: some file systems are).
RESERVED_NAMES = frozenset({"latest", "feed", "index", "collection", "catalog", "tiles", "map",
                            "config", "manifest"})
RESERVED_PREFIXES = ("feed.", "latest.", "index.", "collection.", "catalog.")
RESERVED_SUFFIXES = (".json", ".atom", ".xml", ".html", ".tmp", ".lock", ".pmtiles")


class InvalidReleaseId(ValueError, ReleaseRefused):
    """A release id that cannot be used; the message says why and what is allowed."""


def validate_release_id(value: object) -> str:
    """``value`` if it is a usable release id, else :class:`InvalidReleaseId`."""
    if not isinstance(value, str):
        raise InvalidReleaseId(f"a release id must be text, got {type(value).__name__}")
    shown = value if len(value) <= 80 else value[:77] + "..."
    if not _ID.fullmatch(value):
        raise InvalidReleaseId(
            f"invalid release id {shown!r}: use 1 to 64 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit")
    low = value.lower()
    if (low in RESERVED_NAMES or low.startswith(RESERVED_PREFIXES)
            or low.endswith(RESERVED_SUFFIXES)):
        raise InvalidReleaseId(f"invalid release id {shown!r}: the name is reserved by the "
                               "publish root (feed files, latest, staging and page names)")
    return value


MAX_REASON_CHARS = 500


class InvalidReason(ValueError, OperatorError):
    """A free-text reason (withdrawal, cap change) that cannot be stored and shown safely."""


def validate_reason(value: object, what: str = "reason") -> str:
    """``value`` stripped, if it is one non-blank line of printable text (at most 500 chars).

    Reasons end up in the ledger, ``ledger show``, feed.json and feed.atom: a newline would
    forge a line in the ledger listing, and control characters make the Atom feed invalid XML.
    """
    if not isinstance(value, str):
        raise InvalidReason(f"the {what} must be text")
    text = value.strip()
    if not text:
        raise InvalidReason(f"the {what} must not be blank")
    if not text.isprintable():
        raise InvalidReason(f"the {what} must be one line of printable text (no newlines, tabs "
                            "or control characters)")
    if len(text) > MAX_REASON_CHARS:
        raise InvalidReason(f"the {what} is {len(text)} characters; at most {MAX_REASON_CHARS}")
    return text


MAX_DATASET_CHARS = 200


class InvalidDatasetName(ValueError):
    """A ledger dataset name that cannot be stored and shown safely."""


def validate_dataset_name(value: object) -> str:
    """``value`` if it is a usable dataset name: one line of printable text, 1 to 200
    characters, without leading or trailing spaces (a newline would forge a line of ``ledger
    show``; ``il`` and ``il `` would be two datasets with two budgets)."""
    if not isinstance(value, str) or not value:
        raise InvalidDatasetName("the dataset name must be non-empty text")
    if not value.isprintable() or value != value.strip():
        raise InvalidDatasetName(f"invalid dataset name {value!r}: use one line of printable "
                                 "text without leading or trailing spaces")
    if len(value) > MAX_DATASET_CHARS:
        raise InvalidDatasetName(f"the dataset name is {len(value)} characters; at most "
                                 f"{MAX_DATASET_CHARS}")
    return value
