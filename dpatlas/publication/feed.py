"""The map-publication feed at the publish root: which releases exist, and which one is latest.

Layout of the publish root::

    <root>/<release_id>/          one folder per release (made visible by tract_files.stage_release)
    <root>/feed.json              every release in the feed, newest first (JSON Feed 1.1: json_feed.py)
    <root>/feed.atom              the same as an Atom 1.0 feed
    <root>/latest.json            {"release_id": ..., "manifest": "<id>/manifest.json"}
    <root>/latest -> <id>         relative symlink to the latest release folder
    <root>/collection.json        STAC Collection of the releases (dpatlas.publication.stac)
    <root>/catalog/<id>.json      one STAC Item per release in the feed
    <root>/.feed.lock             flock(2) lock file serialising the updaters

Readers never take the lock. Every feed file is written to a temporary file in the root,
fsync'd, and moved over the old one with ``os.replace`` (an atomic rename), so a reader
polling at any moment sees either the old or the new complete file, never a partial one.

Invariants kept for readers:

* a release enters the feed only after its folder is visible and every file listed in its
  manifest has been checked against the manifest's sha256 and size;
* the STAC catalogue is written (only the documents whose bytes change) right before
  feed.json, from the same list: a release is in the catalogue from when it enters the feed,
  and a withdrawal shows there no later than in feed.json;
* ``latest.json`` / ``latest`` always name a release that is listed in ``feed.json``: on
  ``update_feed`` the feed is written before the pointer, on ``withdraw`` the pointer is moved
  (to a release that was already listed) before the feed marks the old one withdrawn;
* the feed never scans the root: a release folder that is not in the feed (e.g. a crash between
  the folder rename and the feed update) is added only by ``update_feed`` for that id (or, as
  withdrawn, by ``withdraw(..., list_unlisted=True)``), after its files are verified;
* release ids are checked with :func:`dpatlas.core.ids.validate_release_id` and reasons with
  :func:`dpatlas.core.ids.validate_reason`; feed.atom is well-formed XML whatever feed.json holds
  (characters XML 1.0 cannot carry are shown as escapes when it is rendered).

The feed uses only the standard library (and pystac, imported when the catalogue is written),
so that readers and the publish step can import it without the geospatial stack.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

from typing import Iterator

from dpatlas.core.files import now_utc
from dpatlas.core.hashing import sha256_bytes, sha256_file
from dpatlas.core.ids import InvalidReason, InvalidReleaseId, validate_reason, validate_release_id
from dpatlas.publication.codebook import published_metadata
from dpatlas.publication.stac import COLLECTION_FILE as STAC_COLLECTION, ITEMS_DIR as STAC_ITEMS
from dpatlas.core.errors import OperatorError

FEED_VERSION = 1
FEED_JSON = "feed.json"
FEED_ATOM = "feed.atom"
LATEST_JSON = "latest.json"
LATEST_LINK = "latest"
LOCK_NAME = ".feed.lock"
MANIFEST = "manifest.json"
TMP_PREFIX = ".feed-tmp-"
# Names the feed itself uses in the root: validate_release_id refuses each (tested).
RESERVED = {FEED_JSON, FEED_ATOM, LATEST_JSON, LATEST_LINK, LOCK_NAME, STAC_COLLECTION,
            STAC_ITEMS}
ATOM_NS = "http://www.w3.org/2005/Atom"
STATUS_PUBLISHED = "published"
STATUS_WITHDRAWN = "withdrawn"
SYNTHETIC_KIND = "synthetic microdata"  # the manifest kind of `dpatlas synthesize`'s folders
SYNTHETIC_CATEGORY = "synthetic"


class FeedError(RuntimeError, OperatorError):
    """The feed refused an operation (unusable id, unverified release, not in the feed...)."""


class InvalidFeedId(FeedError, InvalidReleaseId):
    """A release id the feed refuses (both a FeedError and an ids.InvalidReleaseId)."""


class InvalidFeedReason(FeedError, InvalidReason):
    """A withdrawal reason the feed refuses (both a FeedError and an ids.InvalidReason)."""


# --------------------------------------------------------------------------------- public API


def update_feed(root: Path, release_id: str, base_url: str | None = None) -> dict:
    """Add (or refresh) ``release_id`` in the feed after its folder became visible.

    Reads ``<root>/<release_id>/manifest.json``, checks that every listed file exists with the
    listed sha256 and size (``FeedError`` otherwise, and nothing of the feed is touched), then
    writes feed.json and feed.atom and moves the ``latest`` pointer. Returns the feed entry.

    ``latest`` is the newest release (by the manifest's ``published`` time; among equal times
    the one added to the feed last) whose status is "published". For a new release that is the
    release just added. Refreshing a release that was withdrawn re-checks its files but keeps it
    withdrawn (withdrawal is deliberate and is not undone by a refresh). ``base_url``: where
    the root is served (publish.base_url): the feed's URLs are absolute under it from now on.
    """
    root = Path(root)
    _check_id(release_id)
    entry = _verified_entry(root, release_id)       # hashing happens outside the lock
    with _locked(root):
        feed = _load(root)
        releases = feed["releases"]
        old = next((r for r in releases if r["release_id"] == release_id), None)
        if old is None:
            releases.insert(0, entry)               # among equal `published`, added last = newer
        else:
            if old.get("status") == STATUS_WITHDRAWN:
                for key in ("status", "withdrawn_reason", "withdrawn_at"):
                    entry[key] = old.get(key)
            releases[releases.index(old)] = entry
        feed["releases"] = _sorted(releases)
        feed["latest"] = _newest_published(feed["releases"])
        feed["updated"] = _now()
        if base_url:
            feed["base_url"] = base_url
        # The feed lists the release before the pointer may name it.
        _write_feed(root, feed)
        _write_latest(root, feed["latest"])
    return entry


def update_synthetic(root: Path, synthetic_id: str) -> dict:
    """List the synthetic-microdata folder ``<root>/<synthetic_id>`` (``dpatlas synthesize``)
    in the feed, after checking its files against its manifest; returns the entry.

    Synthetic entries live in feed.json's ``synthetic`` list, apart from ``releases``: they are
    never ``latest``, the web map does not offer them, and a release's status is untouched.
    Each names its ``source_release``; the Atom feed and the STAC catalogue show them (the STAC
    Item links to its source's). Idempotent: listing it again refreshes the entry.
    """
    root = Path(root)
    _check_id(synthetic_id)
    entry = _verified_entry(root, synthetic_id, time_key="created")
    manifest = json.loads((root / synthetic_id / MANIFEST).read_bytes())
    if manifest.get("kind") != SYNTHETIC_KIND:
        raise FeedError(f"{synthetic_id} is not a synthetic-microdata folder (its manifest's "
                        f"kind is {manifest.get('kind')!r})")
    source = manifest.get("source_release")
    _check_id(source)
    entry = {**entry, "kind": SYNTHETIC_KIND, "source_release": source}
    with _locked(root):
        feed = _load(root)
        if any(r["release_id"] == synthetic_id for r in feed["releases"]):
            raise FeedError(f"{synthetic_id} is listed as a release: a synthetic folder needs "
                            "an id of its own")
        others = [e for e in feed["synthetic"] if e.get("release_id") != synthetic_id]
        feed["synthetic"] = [entry, *others]
        feed["updated"] = _now()
        _write_feed(root, feed)
    return entry


def withdraw(root: Path, release_id: str, reason: str, *, withdrawn_at: str | None = None,
             list_unlisted: bool = False) -> dict:
    """Mark a release withdrawn: it stays listed with status "withdrawn", the reason and time.

    The reason is validated first (:func:`dpatlas.core.ids.validate_reason`). If the release was
    ``latest``, ``latest`` moves to the newest remaining published release (or null). The
    release folder is left alone. ``withdrawn_at``: the time to record (e.g. the ledger's), now
    if None.

    Idempotent: withdrawing a withdrawn release writes nothing and keeps its first reason and
    time. A release that is not in the feed cannot be withdrawn (:class:`FeedError`), unless
    ``list_unlisted``: then its folder is verified against its manifest, as by ``update_feed``,
    and it is listed directly as withdrawn (a crash between completing a release and its feed
    update left it out), never becoming ``latest``.

    Returns the feed entry plus ``"changed"``: False if it was withdrawn already.
    """
    root = Path(root)
    _check_id(release_id)
    why = _check_reason(reason)
    if withdrawn_at is not None and _parse_time(withdrawn_at) is None:
        raise FeedError(f"withdrawn_at {withdrawn_at!r} is not an ISO-8601 time")
    with _locked(root):
        feed = _load(root)
        entry = next((r for r in feed["releases"] if r["release_id"] == release_id), None)
        if entry is not None and entry.get("status") == STATUS_WITHDRAWN:
            _write_stac(root, feed["releases"], feed["synthetic"])  # completes a crashed update
            return {**entry, "changed": False}
        if entry is None:
            if not list_unlisted:
                raise FeedError(f"release {release_id!r} is not in the feed at {root}: only a "
                                "release in the feed can be withdrawn from it")
            entry = _verified_entry(root, release_id)
            feed["releases"] = _sorted([entry, *feed["releases"]])
        entry["status"] = STATUS_WITHDRAWN
        entry["withdrawn_at"] = withdrawn_at or _now()
        entry["withdrawn_reason"] = why
        feed["latest"] = _newest_published(feed["releases"])
        feed["updated"] = _now()
        # The pointer moves first (to a release already listed), so it never names a release
        # that the current feed.json shows as withdrawn.
        _write_latest(root, feed["latest"])
        _write_feed(root, feed)
    return {**entry, "changed": True}


def feed_damage(root: Path, adding: str | None = None) -> str | None:
    """Why the feed's indexes must be rebuilt before they are updated (None: they need not):
    feed.json unreadable, not a feed of this version, or missing beside a release folder
    other than ``adding`` (the one about to be listed: the first release of a root has no
    feed yet). Updated as they are, a corrupt feed refused every release after its charge,
    and a missing one was written again with the newest release only."""
    root = Path(root)
    try:
        _load(root)
    except FeedError as e:
        return str(e)
    if not (root / FEED_JSON).exists() and any(f.name != adding
                                                for f in _release_folders(root)):
        return f"{root / FEED_JSON} is missing"
    return None


def rebuild_feed(root: Path, status_of) -> dict:
    """Write feed.json, feed.atom, the STAC catalogue and the ``latest`` pointer again from
    the truth: the release folders in ``root`` (each verified against its manifest) and the
    ledger, ``status_of(id)`` giving a release's ledger row (None: never charged).

    A folder is listed only if the ledger holds it as published or withdrawn, with the
    manifest the ledger completed it with; a withdrawn one is listed withdrawn with the
    ledger's reason and time. Synthetic-microdata folders go to the synthetic list. Returns
    ``{"releases": [...], "synthetic": [...], "withdrawn": [...], "skipped": {id: why}}``."""
    root = Path(root)
    with _locked(root):
        base_url = None  # a damaged feed's base URL is lost with it
        with contextlib.suppress(FeedError):
            base_url = read_feed(root).get("base_url")
        found: dict[str, list] = {"releases": [], "synthetic": []}
        skipped: dict[str, str] = {}
        for folder in _release_folders(root):
            rid = folder.name
            row = status_of(rid) or {}
            try:
                kind, entry = _rebuilt_entry(root, rid, row)
            except FeedError as e:
                skipped[rid] = str(e)
                continue
            found[kind].append((row.get("published_at") or "", entry))
        releases, synthetic = ([e for _, e in sorted(found[k], key=lambda p: p[0], reverse=True)]
                               for k in ("releases", "synthetic"))
        feed = {"updated": _now(), "releases": _sorted(releases), "synthetic": synthetic}
        feed["latest"] = _newest_published(feed["releases"])
        if base_url:
            feed["base_url"] = base_url
        _write_feed(root, feed)
        _write_latest(root, feed["latest"])
    return {"releases": [r["release_id"] for r in feed["releases"]],
            "synthetic": [r["release_id"] for r in synthetic],
            "withdrawn": [r["release_id"] for r in feed["releases"]
                          if r["status"] == STATUS_WITHDRAWN],
            "skipped": skipped}


def _release_folders(root: Path) -> list[Path]:
    """The real folders of ``root`` named as a release may be, that hold a manifest."""
    folders = []
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        try:
            validate_release_id(folder.name)
        except InvalidReleaseId:
            continue  # the web map's, the catalogue's folders
        if not folder.is_symlink() and folder.is_dir() and (folder / MANIFEST).is_file():
            folders.append(folder)
    return folders


def _rebuilt_entry(root: Path, rid: str, row: dict) -> tuple[str, dict]:
    """A folder's feed entry from its verified manifest and its ledger ``row``, and which
    list it goes to; FeedError says why it is not listed."""
    status = row.get("status")
    if status not in (STATUS_PUBLISHED, STATUS_WITHDRAWN):
        raise FeedError(f"the ledger holds it as {status or 'never charged'}")
    try:
        manifest = json.loads((root / rid / MANIFEST).read_bytes())
    except (OSError, ValueError) as e:
        raise FeedError(f"its manifest cannot be read: {e}") from None
    synthetic = isinstance(manifest, dict) and manifest.get("kind") == SYNTHETIC_KIND
    entry = _verified_entry(root, rid, time_key="created" if synthetic else "published")
    if row.get("manifest_sha256") and row["manifest_sha256"] != entry["manifest_sha256"]:
        raise FeedError("its manifest is not the one the ledger completed it with")
    if synthetic:
        _check_id(manifest.get("source_release"))
        return "synthetic", {**entry, "kind": SYNTHETIC_KIND,
                             "source_release": manifest["source_release"]}
    if status == STATUS_WITHDRAWN:
        entry.update(status=STATUS_WITHDRAWN, withdrawn_at=row.get("withdrawn_at"),
                     withdrawn_reason=row.get("reason"))
    return "releases", entry


def listed(root: Path, release_id: str) -> dict | None:
    """The feed entry of ``release_id``, or None if the feed does not list it. Takes no lock."""
    _check_id(release_id)
    return next((r for r in read_feed(root)["releases"] if r["release_id"] == release_id), None)


def verify_release(root: Path, release_id: str) -> dict:
    """Check a release folder against its manifest (FeedError if it does not match); returns
    the entry it would have in the feed. Writes nothing."""
    _check_id(release_id)
    return _verified_entry(Path(root), release_id)


def read_feed(root: Path) -> dict:
    """The feed in feed.json (an empty feed if none has been written yet): its JSON Feed
    items' entries (:mod:`dpatlas.publication.json_feed`), or a feed of the format before it
    as it is. Takes no lock."""
    from dpatlas.publication import json_feed

    path = Path(root) / FEED_JSON
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _empty()
    try:
        feed = json.loads(data)
    except json.JSONDecodeError as e:
        raise FeedError(f"{path} is not valid JSON: {e}") from e
    if json_feed.is_json_feed(feed):
        feed = json_feed.entries(feed, FEED_VERSION)
    if not isinstance(feed, dict) or not isinstance(feed.get("releases"), list):
        raise FeedError(f"{path} is not a dpatlas feed")
    return feed


def latest(root: Path) -> str | None:
    """The release id that the ``latest`` pointer (latest.json) names, or None."""
    path = Path(root) / LATEST_JSON
    try:
        pointer = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise FeedError(f"{path} is not valid JSON: {e}") from e
    return pointer.get("release_id")


# ------------------------------------------------------------------------- checking a release


def _check_id(release_id: str) -> None:
    """One rule for release ids everywhere (dpatlas.core.ids): no reserved names (feed.json,
    latest...), no path separators, no characters that need escaping in a URL or XML."""
    try:
        validate_release_id(release_id)
    except InvalidReleaseId as e:
        raise InvalidFeedId(str(e)) from None


def _check_reason(reason: str) -> str:
    try:
        return validate_reason(reason, "withdrawal reason")
    except InvalidReason as e:
        raise InvalidFeedReason(str(e)) from None


def _verified_entry(root: Path, release_id: str, time_key: str = "published") -> dict:
    folder = root / release_id
    if folder.is_symlink() or not folder.is_dir():
        raise FeedError(f"release folder {folder} does not exist (or is not a real folder)")
    try:
        raw = (folder / MANIFEST).read_bytes()
    except FileNotFoundError:
        raise FeedError(f"release {release_id!r} has no {MANIFEST}") from None
    try:
        manifest = json.loads(raw)
    except json.JSONDecodeError as e:
        raise FeedError(f"{folder / MANIFEST} is not valid JSON: {e}") from e
    if not isinstance(manifest, dict):
        raise FeedError(f"{folder / MANIFEST} is not a JSON object")
    if manifest.get("release_id") != release_id:
        raise FeedError(f"manifest of folder {release_id!r} is for release "
                        f"{manifest.get('release_id')!r}")
    published = manifest.get(time_key)
    if not isinstance(published, str) or _parse_time(published) is None:
        raise FeedError(f"manifest of {release_id!r} has no valid {time_key!r} time: "
                        f"{published!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise FeedError(f"manifest of {release_id!r} lists no files")

    checked = {}
    problems = []
    for name in sorted(files):
        meta = files[name]
        if (not isinstance(name, str) or not name or name == MANIFEST or name.startswith("/")
                or any(part in ("", ".", "..") for part in name.split("/"))):
            problems.append(f"{name!r}: not a plain relative file name")
            continue
        if not isinstance(meta, dict) or not isinstance(meta.get("sha256"), str):
            problems.append(f"{name}: no sha256 in the manifest")
            continue
        path = folder / name
        if path.is_symlink() or not path.is_file():
            problems.append(f"{name}: missing")
            continue
        size = path.stat().st_size
        if "bytes" in meta and meta["bytes"] != size:
            problems.append(f"{name}: {size} bytes, manifest says {meta['bytes']}")
            continue
        digest = sha256_file(path)
        if digest != meta["sha256"].lower():
            problems.append(f"{name}: sha256 {digest}, manifest says {meta['sha256']}")
            continue
        checked[name] = {"sha256": digest, "bytes": size, "path": f"{release_id}/{name}"}
    if problems:
        raise FeedError(f"release {release_id!r} does not match its manifest: "
                        + "; ".join(problems))
    return {
        "release_id": release_id,
        "published": published,
        "manifest": f"{release_id}/{MANIFEST}",
        "manifest_sha256": sha256_bytes(raw),
        "status": STATUS_PUBLISHED,
        "withdrawn_reason": None,
        "withdrawn_at": None,
        "files": checked,
        # the release's title and notice (publish.title, publish.notice) where set
        **{k: v for k, v in published_metadata(folder).items() if k in ("title", "notice")},
    }


# ------------------------------------------------------------------------------- feed content


def _empty() -> dict:
    return {"feed_version": FEED_VERSION, "updated": None, "latest": None, "releases": []}


def _load(root: Path) -> dict:
    feed = read_feed(root)
    if feed.get("feed_version", FEED_VERSION) != FEED_VERSION:
        raise FeedError(f"feed version {feed.get('feed_version')!r} is not {FEED_VERSION}")
    loaded = {**_empty(), **feed}
    synthetic = loaded.get("synthetic")  # absent from a feed written before it was listed
    if not isinstance(synthetic, list):
        synthetic = []
    loaded["synthetic"] = [e for e in synthetic
                           if isinstance(e, dict) and isinstance(e.get("release_id"), str)]
    return loaded


def _now() -> str:
    return now_utc("microseconds")


def _parse_time(value: str) -> datetime | None:
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except (TypeError, ValueError, AttributeError):
        return None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def _sorted(releases: list[dict]) -> list[dict]:
    """Newest first by the UTC day of `published`; the sort is stable, so releases of one day
    keep the feed's order (added last = newer). Manifests give the day only (the time of day
    would say how long the data took: docs/threat-model.md); older ones gave the second, and
    comparing those within a day would put them after a newer day-only release."""
    floor = datetime.min.replace(tzinfo=timezone.utc)
    return sorted(releases,
                  key=lambda r: (_parse_time(r.get("published") or "") or floor).date(),
                  reverse=True)


def _newest_published(releases: list[dict]) -> str | None:
    return next((r["release_id"] for r in releases if r.get("status") == STATUS_PUBLISHED), None)


def _atom_time(value: str | None) -> str:
    t = _parse_time(value or "") or datetime.now(timezone.utc)
    return t.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# Characters XML 1.0 allows (section 2.2), less the C1 controls, which it allows but which no
# reader should have to display. ElementTree escapes <, > and & but writes any other character
# as it is, so a control character in a stored reason would make feed.atom invalid XML.
_XML_UNSAFE = re.compile("[^\t\n\r\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_safe(value) -> str:
    """Text safe in XML 1.0: each unsafe character shown as its escape (\\x07, \\ufffe)."""
    text = str(value)
    return _XML_UNSAFE.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                      else f"\\u{ord(m.group()):04x}"), text)


def render_atom(feed: dict) -> bytes:
    """An Atom 1.0 (RFC 4287) document for the feed; hrefs are relative to the publish root.

    Well-formed whatever the feed holds (e.g. entries written by an older version): every text
    and attribute goes through :func:`_xml_safe`."""
    ET.register_namespace("", ATOM_NS)

    def sub(parent, tag, text=None, **attrs):
        el = ET.SubElement(parent, f"{{{ATOM_NS}}}{tag}",
                           {k: _xml_safe(v) for k, v in attrs.items()})
        if text is not None:
            el.text = _xml_safe(text)
        return el

    top = ET.Element(f"{{{ATOM_NS}}}feed")
    sub(top, "id", "urn:dpatlas:feed")
    sub(top, "title", "dpatlas releases")
    sub(top, "updated", _atom_time(feed.get("updated")))
    sub(sub(top, "author"), "name", "dpatlas")
    sub(top, "link", rel="self", href=FEED_ATOM, type="application/atom+xml")
    for r in feed["releases"]:
        rid, status = r["release_id"], r.get("status", STATUS_PUBLISHED)
        entry = sub(top, "entry")
        sub(entry, "id", f"urn:dpatlas:release:{rid}")
        sub(entry, "title", f"Release {rid}" + (" (withdrawn)" if status == STATUS_WITHDRAWN
                                                else ""))
        sub(entry, "published", _atom_time(r.get("published")))
        sub(entry, "updated", _atom_time(r.get("withdrawn_at") or r.get("published")))
        sub(entry, "link", rel="alternate", href=f"{rid}/{MANIFEST}", type="application/json")
        _enclosures(sub, entry, r)
        sub(entry, "category", term=status)
        summary = f"Status: {status}."
        if status == STATUS_WITHDRAWN:
            summary += f" Withdrawn at {r.get('withdrawn_at')}: {r.get('withdrawn_reason')}"
        else:
            summary += f" Manifest sha256 {r.get('manifest_sha256')}."
        sub(entry, "summary", summary, type="text")
    status_of = {r["release_id"]: r.get("status") for r in feed["releases"]}
    for s in feed.get("synthetic") or []:
        _synthetic_entry(sub, top, s, status_of.get(s.get("source_release")))
    return ET.tostring(top, encoding="utf-8", xml_declaration=True)


def _enclosures(sub, entry, r: dict) -> None:
    """One enclosure per download of a feed entry (data, metadata, map image, tiles; not the
    web map's page and scripts), each with its media type and length (RFC 4287 §4.2.7.2)."""
    from dpatlas.publication.stac import is_download, media_type

    for name, meta in sorted(r.get("files", {}).items()):
        if is_download(str(name)):
            sub(entry, "link", rel="enclosure", href=meta["path"], length=meta["bytes"],
                title=name, type=media_type(str(name)))


def _synthetic_entry(sub, top, s: dict, source_status: str | None) -> None:
    """The Atom entry of a synthetic-microdata folder: its downloads and its source."""
    sid, source = s.get("release_id"), s.get("source_release")
    entry = sub(top, "entry")
    sub(entry, "id", f"urn:dpatlas:synthetic:{sid}")
    withdrawn = " (source withdrawn)" if source_status == STATUS_WITHDRAWN else ""
    sub(entry, "title", f"Synthetic microdata {sid} of release {source}{withdrawn}")
    sub(entry, "published", _atom_time(s.get("published")))
    sub(entry, "updated", _atom_time(s.get("published")))
    sub(entry, "link", rel="alternate", href=f"{sid}/{MANIFEST}", type="application/json")
    sub(entry, "link", rel="related", href=f"{source}/{MANIFEST}", type="application/json",
        title=f"release {source}")
    _enclosures(sub, entry, s)
    sub(entry, "category", term=SYNTHETIC_CATEGORY)
    sub(entry, "summary", f"Differentially private synthetic microdata drawn for release "
        f"{source}{withdrawn}. Manifest sha256 {s.get('manifest_sha256')}.", type="text")


# ------------------------------------------------------------------------- atomic file writes


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Exclusive flock on <root>/.feed.lock for a read-modify-write of the feed."""
    if not root.is_dir():
        raise FeedError(f"publish root {root} does not exist")
    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _remove_stale_temps(root)   # any temp file present now was left by a crashed writer
        yield
    finally:
        os.close(fd)                # closing the descriptor releases the lock


def _remove_stale_temps(root: Path) -> None:
    from dpatlas.publication.webmap import ASSETS_DIR  # the feed's web map writes under the same lock

    stale = [p for folder in (root, root / STAC_ITEMS) for p in folder.glob(TMP_PREFIX + "*")]
    stale += [p for folder in (root, root / ASSETS_DIR) for p in folder.glob(".*.tmp-*")]
    for p in stale:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _tmp_name(root: Path, final: str) -> Path:
    return root / f"{TMP_PREFIX}{final}-{os.getpid()}-{secrets.token_hex(4)}"


def _fsync_dir(root: Path) -> None:
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:            # some filesystems refuse fsync on a directory
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _atomic_write(root: Path, name: str, data: bytes) -> None:
    """Write to a temp file in root, fsync it, then os.replace it over <root>/<name>."""
    tmp = _tmp_name(root, name)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, root / name)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(root)


def _json_bytes(obj) -> bytes:
    # A lone surrogate (JSON allows the escape "\\ud800", so a hand-edited feed.json may hold
    # one) cannot be UTF-8: it is written back as that same escape, which JSON reads again.
    return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode(
        "utf-8", errors="backslashreplace")


def _write_stac(root: Path, releases: list[dict], synthetic: list[dict] | None = None) -> None:
    """The STAC Collection and Items for ``releases``; only documents whose bytes change are
    written (each atomically), so an unchanged feed writes nothing."""
    from dpatlas.publication import stac

    try:
        docs = stac.build_catalog(root, releases, synthetic)
    except stac.StacError as e:
        raise FeedError(f"the STAC catalogue cannot be built: {e}") from None
    items = root / STAC_ITEMS
    if items.is_symlink() or (items.exists() and not items.is_dir()):
        raise FeedError(f"{items} is not a folder: the STAC items go there; move it away")
    items.mkdir(exist_ok=True)
    for relative, doc in docs.items():
        data = stac.render(doc)
        path = root / relative
        if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
            continue
        _atomic_write(path.parent, path.name, data)


def _write_feed(root: Path, feed: dict) -> None:
    from dpatlas.publication import json_feed

    doc = {"feed_version": FEED_VERSION, "updated": feed["updated"], "latest": feed["latest"],
           "releases": feed["releases"], "synthetic": feed.get("synthetic") or [],
           "base_url": feed.get("base_url")}
    _write_stac(root, doc["releases"], doc["synthetic"] or None)
    _atomic_write(root, FEED_JSON, _json_bytes(json_feed.render(doc, _atom_time)))
    _atomic_write(root, FEED_ATOM, render_atom(doc))
    from dpatlas.publication.webmap import write_feed_map  # the root's web map over feed.json (idempotent)

    write_feed_map(root)


def _write_latest(root: Path, release_id: str | None) -> None:
    pointer = {"release_id": release_id,
               "manifest": f"{release_id}/{MANIFEST}" if release_id else None}
    _atomic_write(root, LATEST_JSON, _json_bytes(pointer))
    link = root / LATEST_LINK
    if release_id is None:
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
    else:
        tmp = _tmp_name(root, LATEST_LINK)
        try:
            os.symlink(release_id, tmp)         # relative: resolves inside the root
            os.replace(tmp, link)               # rename(2) swaps the link atomically
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    _fsync_dir(root)
