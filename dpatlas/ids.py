"""Release ids: one rule, applied to every source of an id before anything is written or charged.

A release id names a folder in the publish root, a folder in the internal root, a ledger row,
a feed entry and an Atom element, so it must be safe in all of them: ASCII letters, digits,
``.``, ``_`` and ``-``, starting with a letter or digit, at most 64 characters, and none of the
names the publish root uses for itself (the feed files, ``latest``, staging folders).
"""

from __future__ import annotations

import re

RELEASE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_ID = re.compile(RELEASE_ID_PATTERN)
# Names the publish root uses itself (compared case-insensitively: some file systems are).
RESERVED_NAMES = frozenset({"latest", "feed", "index", "collection", "catalog", "tiles", "map",
                            "config", "manifest"})
RESERVED_PREFIXES = ("feed.", "latest.", "index.", "collection.", "catalog.")
RESERVED_SUFFIXES = (".json", ".atom", ".xml", ".html", ".tmp", ".lock", ".pmtiles")


class InvalidReleaseId(ValueError):
    """A release id that cannot be used; the message says why and what is allowed."""


def validate_release_id(value: object) -> str:
    """``value`` if it is a usable release id, else :class:`InvalidReleaseId`."""
    if not isinstance(value, str):
        raise InvalidReleaseId(f"a release id must be text, got {type(value).__name__}")
    shown = value if len(value) <= 80 else value[:77] + "..."
    if not _ID.match(value):
        raise InvalidReleaseId(
            f"invalid release id {shown!r}: use 1 to 64 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit")
    low = value.lower()
    if (low in RESERVED_NAMES or low.startswith(RESERVED_PREFIXES)
            or low.endswith(RESERVED_SUFFIXES)):
        raise InvalidReleaseId(f"invalid release id {shown!r}: the name is reserved by the "
                               "publish root (feed files, latest, staging and page names)")
    return value
