"""What a publish root is, and which of its files may be served (`dpatlas serve`).

A publish root is the folder a release publishes to: the first release writes its marker
(``.dpatlas-root.json``) there, and the feed (``feed.json``). Below it are only what publishing
writes: the release folders, each with a ``manifest.json`` listing its files, the feed, the
STAC catalogue and the web map. It holds nothing confidential: no internal folder (staged
microdata, the draw log, the input commitment's key), no ledger, no input data.

The server refuses to start on a folder that is not one (the demo folder, the parent of
``releases/``, served the staged microdata and the key), and, as a second line, answers only
files of a published type, and a data file (Parquet, CSV: the formats of person-level rows)
only if a release folder's manifest lists it.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path

from dpatlas.core.errors import OperatorError

ROOT_MARKER = ".dpatlas-root.json"
# The feed's names (dpatlas.publication.feed; importing it here would make a cycle, through
# the web map and this server; a test checks they agree).
FEED_FILE, MANIFEST, LOCK_NAME, TMP_PREFIX = ("feed.json", "manifest.json", ".feed.lock",
                                              ".feed-tmp-")
# What a publish root serves: pages, scripts, styles, metadata, tiles, images, licences.
PUBLISHED_SUFFIXES = frozenset({".html", ".htm", ".js", ".mjs", ".css", ".json", ".geojson",
                                ".atom", ".pmtiles", ".parquet", ".csv", ".png", ".svg", ".txt",
                                ".ico", ".woff", ".woff2", ".md"})  # .md: README.md codebook
# Formats person-level rows come in (the input, the staged partitions): served only as a file
# a release's manifest lists.
DATA_SUFFIXES = frozenset({".parquet", ".csv"})
# Files of the internal folder that are never published, whatever folder they are found in.
INTERNAL_FILES = frozenset({"draws.jsonl", "input_commitment.key", "validation.json"})
# A database (a ledger put in the root by mistake holds every release's charges and the
# owner's paths) is never served, whatever else its name says.
DATABASE_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".db-journal", ".db-wal", ".db-shm",
                     "-journal", "-wal", "-shm")
_SHOWN = 3  # offending files named in a refusal


class NotAPublishRoot(RuntimeError, OperatorError):
    """`dpatlas serve` was given a folder that is not a publish root; nothing was served."""


def is_publish_root(folder: Path) -> bool:
    """A release has published to ``folder`` (its marker or its feed is there)."""
    return (folder / ROOT_MARKER).is_file() or (folder / FEED_FILE).is_file()


def check_publish_root(root: Path) -> None:
    """Refuse a ``root`` a release did not publish to, or one holding anything confidential
    (:func:`unpublished_reason` of any file below it), naming the publish root to serve
    instead when one is below or above it."""
    root = Path(os.path.realpath(root))
    if not is_publish_root(root):
        instead = _publish_roots_near(root)
        hint = (f": serve the publish root {instead[0]} instead" if len(instead) == 1 else
                f": serve one of the publish roots {', '.join(map(str, instead))} instead"
                if instead else ": serve the folder a config's publish.root names, after a "
                "release has published to it (or give --config)")
        raise NotAPublishRoot(f"{root} is not a publish root (no {FEED_FILE} or {ROOT_MARKER}, "
                              f"which a release writes there){hint}; nothing was served")
    found = [f"{rel} ({why})" for rel, why in _unpublished_files(root)]
    if found:
        more = f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else ""
        raise NotAPublishRoot(
            f"the publish root {root} holds files that are never published: "
            f"{'; '.join(found[:_SHOWN])}{more}. Everything below a served folder is public: "
            "move them out of the publish root (internal files belong in publish.internal_root, "
            "the ledger and the input outside it); nothing was served")


def unpublished_reason(root: Path, relative: str) -> str | None:
    """Why the file at ``relative`` (a real path below ``root``, '/'-separated) is not a
    published file; None if it may be served."""
    parts = relative.split("/")
    name = parts[-1]
    suffix = Path(name).suffix.lower()
    if name in INTERNAL_FILES or suffix == ".key":
        return "an internal file of a release"
    if name.lower().endswith(DATABASE_SUFFIXES):
        return "a database"
    if suffix not in PUBLISHED_SUFFIXES:
        return f"not a published file type ({suffix or 'no suffix'})"
    if suffix in DATA_SUFFIXES and (len(parts) < 2 or "/".join(parts[1:])
                                    not in _manifest_files(Path(root) / parts[0] / MANIFEST)):
        return "a data file no release manifest lists (input or staged rows?)"
    return None


def _unpublished_files(root: Path) -> list[tuple[str, str]]:
    """Every file below ``root`` (links not followed: the server never serves outside the
    root) that is not a published one, with the reason."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            if path.is_symlink():
                continue
            relative = path.relative_to(root).as_posix()
            why = unpublished_reason(root, relative)
            if why is not None and name != LOCK_NAME and not name.startswith(TMP_PREFIX):
                found.append((relative, why))
    return found


def _publish_roots_near(folder: Path) -> list[Path]:
    """Publish roots just below ``folder`` (the demo folder holds ``releases/``) or above it
    (a release folder inside its root)."""
    below = []
    try:
        below = sorted(p for p in folder.iterdir()
                       if p.is_dir() and not p.is_symlink() and is_publish_root(p))
    except OSError:
        pass
    above = [p for p in folder.parents if is_publish_root(p)][:1]
    return below + above


def _manifest_files(manifest: Path) -> frozenset[str]:
    """The files a release manifest lists (empty: no manifest, or not one)."""
    try:
        stat = manifest.stat()
    except OSError:
        return frozenset()
    return _listed(str(manifest), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=256)
def _listed(manifest: str, _mtime_ns: int, _size: int) -> frozenset[str]:
    # keyed by the manifest's time and size too: a rewritten manifest is read again
    try:
        files = json.loads(Path(manifest).read_bytes()).get("files")
    except (OSError, ValueError, AttributeError):
        return frozenset()
    return frozenset(f for f in files if isinstance(f, str)) if isinstance(files, dict) \
        else frozenset()
