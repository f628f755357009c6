"""feed.json as JSON Feed 1.1 (https://jsonfeed.org/version/1.1): any feed reader lists the
releases, and dpatlas's own fields travel in the spec's extension objects (keys starting
with "_").

One item per feed entry, releases first (newest first), then synthetic-microdata folders:
``id`` a URN (the Atom entry's), ``url`` the release's map page (its manifest where it has
none), ``title`` publish.title or "Release <id>", ``content_text`` the notice and status,
``date_published`` / ``date_modified`` (withdrawal) in RFC 3339, ``tags`` the status, and one
attachment per download (url, mime_type, title, size_in_bytes). URLs are absolute under the
publish root's base URL (publish.base_url) when the feed was given one, else relative to
feed.json (the publish root); ``feed_url`` and ``home_page_url`` are given only then.

Extensions: the feed's ``_dpatlas`` holds ``latest`` (the id the ``latest`` pointer names) and
``updated`` (when the feed was written); each item's ``_dpatlas`` is the entry :mod:`feed`
keeps (release_id, status, published, manifest and its sha256, withdrawal reason and time,
verified files, title and notice where set; synthetic ones their kind and source release).
:func:`entries` reads them back; a feed of the format before it (``releases`` at the top)
is read as it is, and written as JSON Feed at its next update.
"""

from __future__ import annotations

from typing import Callable
from urllib.parse import quote

from dpatlas.publication.stac import MANIFEST, is_download, media_type

VERSION = "https://jsonfeed.org/version/1.1"
EXTENSION = "_dpatlas"
FEED_TITLE = "dpatlas releases"
FEED_FILE, MAP_PAGE = "feed.json", "index.html"
RELEASE_URN, SYNTHETIC_URN = "urn:dpatlas:release:", "urn:dpatlas:synthetic:"  # Atom's ids too
WITHDRAWN = "withdrawn"


def _url(base: str | None, path: str) -> str:
    return f"{base or ''}{quote(path, safe='/')}"


def _item(entry: dict, base: str | None, synthetic: bool, source_status: str | None,
          rfc3339: Callable[[str | None], str]) -> dict:
    rid, status = entry["release_id"], entry.get("status") or "published"
    files = entry.get("files") or {}
    page = f"{rid}/{MAP_PAGE}" if MAP_PAGE in files else f"{rid}/{MANIFEST}"
    if synthetic:
        source = entry.get("source_release")
        gone = " (source withdrawn)" if source_status == WITHDRAWN else ""
        title = f"Synthetic microdata {rid} of release {source}{gone}"
        text = (f"Differentially private synthetic microdata drawn for release {source}{gone}. "
                f"Manifest sha256 {entry.get('manifest_sha256')}.")
        tags = ["synthetic"]
    else:
        title = (entry.get("title") or f"Release {rid}") + (
            " (withdrawn)" if status == WITHDRAWN else "")
        text = f"Status: {status}."
        if status == WITHDRAWN:
            text += f" Withdrawn at {entry.get('withdrawn_at')}: {entry.get('withdrawn_reason')}"
        else:
            text += f" Manifest sha256 {entry.get('manifest_sha256')}."
        if entry.get("notice"):
            text = f"{entry['notice']} {text}"
        tags = [status]
    item = {"id": f"{SYNTHETIC_URN if synthetic else RELEASE_URN}{rid}",
            "url": _url(base, page), "title": title, "content_text": text,
            "date_published": rfc3339(entry.get("published")), "tags": tags}
    if entry.get("withdrawn_at"):
        item["date_modified"] = rfc3339(entry["withdrawn_at"])
    item["attachments"] = [
        {"url": _url(base, meta["path"]), "mime_type": media_type(str(name)),
         "title": str(name), "size_in_bytes": meta["bytes"]}
        for name, meta in sorted(files.items()) if is_download(str(name))]
    item[EXTENSION] = entry
    return item


def render(feed: dict, rfc3339: Callable[[str | None], str]) -> dict:
    """The JSON Feed 1.1 document of the feed ``feed`` (feed.py's: updated, latest, releases,
    synthetic, and base_url if the feed was given one); ``rfc3339`` formats its times."""
    base = feed.get("base_url")
    doc: dict = {"version": VERSION, "title": FEED_TITLE}
    if base:
        doc["home_page_url"] = _url(base, MAP_PAGE)
        doc["feed_url"] = _url(base, FEED_FILE)
    doc["description"] = ("Differentially private releases of income mobility by census tract "
                          "(dpatlas): each item is a release, its files are the attachments.")
    doc[EXTENSION] = {"latest": feed.get("latest"), "updated": feed.get("updated")}
    status_of = {r["release_id"]: r.get("status") for r in feed["releases"]}
    doc["items"] = (
        [_item(r, base, False, None, rfc3339) for r in feed["releases"]]
        + [_item(s, base, True, status_of.get(s.get("source_release")), rfc3339)
           for s in feed.get("synthetic") or []])
    return doc


def is_json_feed(doc) -> bool:
    return isinstance(doc, dict) and doc.get("version") == VERSION


def entries(doc: dict, feed_version: int) -> dict | None:
    """feed.py's view of a JSON Feed document (feed_version, updated, latest, releases,
    synthetic when it has any, base_url when it has one); None if it is not one."""
    own = doc.get(EXTENSION)
    items = doc.get("items")
    if not isinstance(own, dict) or not isinstance(items, list):
        return None
    listed = [(str(i.get("id")).startswith(SYNTHETIC_URN), i.get(EXTENSION))
              for i in items if isinstance(i, dict)]
    listed = [(synthetic, e) for synthetic, e in listed
              if isinstance(e, dict) and isinstance(e.get("release_id"), str)]
    feed = {"feed_version": feed_version, "updated": own.get("updated"),
            "latest": own.get("latest"),
            "releases": [e for synthetic, e in listed if not synthetic]}
    synthetic = [e for is_synthetic, e in listed if is_synthetic]
    if synthetic:
        feed["synthetic"] = synthetic
    feed_url = doc.get("feed_url")
    if isinstance(feed_url, str) and feed_url.endswith(FEED_FILE):
        feed["base_url"] = feed_url[:-len(FEED_FILE)]
    return feed
