"""feed.json is JSON Feed 1.1 (issue 33, item 7): its shape checked against the spec's rules
(https://jsonfeed.org/version/1.1), its URLs resolving to the published files, dpatlas's own
fields in "_dpatlas" extensions, and a feed of the format before it still read."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from urllib.parse import urljoin

from dpatlas.publication import feed as F
from tests.integration.test_feed import at, make_release

# The spec's top-level and item keys; any other must be an extension (it starts with "_").
TOP_KEYS = {"version", "title", "home_page_url", "feed_url", "description", "user_comment",
            "next_url", "icon", "favicon", "authors", "language", "expired", "hubs", "items"}
ITEM_KEYS = {"id", "url", "external_url", "title", "content_html", "content_text", "summary",
             "image", "banner_image", "date_published", "date_modified", "authors", "tags",
             "language", "attachments"}
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def check_json_feed(doc: dict) -> None:
    """The rules of JSON Feed 1.1 a feed must keep (types, required keys, formats)."""
    assert doc["version"] == "https://jsonfeed.org/version/1.1"
    assert isinstance(doc["title"], str) and doc["title"]
    assert isinstance(doc["items"], list)
    for key in doc:
        assert key in TOP_KEYS or key.startswith("_"), key
    for key in ("home_page_url", "feed_url", "description"):
        assert key not in doc or isinstance(doc[key], str), key
    ids = [item["id"] for item in doc["items"]]
    assert len(set(ids)) == len(ids)  # unique: readers tell items apart by it
    for item in doc["items"]:
        for key in item:
            assert key in ITEM_KEYS or key.startswith("_"), key
        assert isinstance(item["id"], str) and item["id"]
        assert isinstance(item.get("content_text"), str) or isinstance(item.get("content_html"),
                                                                       str)
        for key in ("url", "title", "content_text"):
            assert isinstance(item.get(key, ""), str), key
        for key in ("date_published", "date_modified"):
            assert key not in item or RFC3339.match(item[key]), item.get(key)
        assert all(isinstance(t, str) for t in item.get("tags", []))
        for attachment in item.get("attachments", []):
            assert set(attachment) <= {"url", "mime_type", "title", "size_in_bytes",
                                       "duration_in_seconds"}
            assert isinstance(attachment["url"], str) and isinstance(attachment["mime_type"],
                                                                     str)
            assert isinstance(attachment["size_in_bytes"], int)


def _doc(root: Path) -> dict:
    return json.loads((root / F.FEED_JSON).read_text())


def _resolves(root: Path, url: str, base: str) -> Path:
    """The published file a feed URL names, the URL taken against feed.json's own URL."""
    full = urljoin(f"{base}{F.FEED_JSON}", url)
    assert full.startswith(base), full
    return root / full[len(base):]


def test_feed_json_is_json_feed_1_1_and_its_attachments_are_the_files(tmp_path):
    make_release(tmp_path, "r1", at(0))
    make_release(tmp_path, "r2", at(60 * 24))
    F.update_feed(tmp_path, "r1")
    F.update_feed(tmp_path, "r2")
    F.withdraw(tmp_path, "r1", "wrong boundaries")
    doc = _doc(tmp_path)
    check_json_feed(doc)
    assert "feed_url" not in doc  # no base URL given: it would be a guess
    assert doc["_dpatlas"]["latest"] == "r2"
    datetime.fromisoformat(doc["_dpatlas"]["updated"])
    assert [i["id"] for i in doc["items"]] == ["urn:dpatlas:release:r2", "urn:dpatlas:release:r1"]
    old = doc["items"][1]
    assert old["title"] == "Release r1 (withdrawn)" and old["tags"] == ["withdrawn"]
    assert "wrong boundaries" in old["content_text"] and "date_modified" in old
    assert old["date_published"] == "2026-01-01T00:00:00Z"
    assert old["_dpatlas"]["status"] == "withdrawn" and old["_dpatlas"]["release_id"] == "r1"
    for item in doc["items"]:
        named = {a["title"] for a in item["attachments"]}
        assert named == {"tracts.parquet", "tracts.geojson", "tracts.csv", "p25_map.png"}
        for a in item["attachments"]:
            path = _resolves(tmp_path, a["url"], "https://x.example/atlas/")
            assert path.is_file() and path.stat().st_size == a["size_in_bytes"]
        assert {a["mime_type"] for a in item["attachments"]} >= {"text/csv", "image/png"}
    # what the rest of dpatlas reads (picker, withdrawal, STAC) is the entries, as before
    assert F.read_feed(tmp_path)["releases"] == [i["_dpatlas"] for i in doc["items"]]


def test_with_a_base_url_every_url_is_absolute_and_kept_by_later_writes(tmp_path):
    base = "https://data.example.org/atlas/"
    make_release(tmp_path, "r1", at(0))
    F.update_feed(tmp_path, "r1", base)
    F.withdraw(tmp_path, "r1", "superseded")  # knows no base URL: keeps the feed's
    doc = _doc(tmp_path)
    check_json_feed(doc)
    assert doc["feed_url"] == base + "feed.json" and doc["home_page_url"] == base + "index.html"
    (item,) = doc["items"]
    assert item["url"] == base + "r1/manifest.json"  # this fake release has no map page
    assert all(a["url"].startswith(base + "r1/") for a in item["attachments"])
    assert all(_resolves(tmp_path, a["url"], base).is_file() for a in item["attachments"])
    assert F.read_feed(tmp_path)["base_url"] == base


def test_a_feed_of_the_format_before_is_read_and_written_as_json_feed(tmp_path):
    make_release(tmp_path, "r1", at(0))
    F.update_feed(tmp_path, "r1")
    entries = F.read_feed(tmp_path)["releases"]
    legacy = {"feed_version": 1, "updated": at(1), "latest": "r1", "releases": entries}
    (tmp_path / F.FEED_JSON).write_text(json.dumps(legacy))
    assert F.read_feed(tmp_path)["releases"] == entries
    make_release(tmp_path, "r2", at(60 * 24))
    F.update_feed(tmp_path, "r2")
    doc = _doc(tmp_path)
    check_json_feed(doc)
    assert [i["_dpatlas"]["release_id"] for i in doc["items"]] == ["r2", "r1"]


def test_a_rebuilt_feed_keeps_its_base_url_and_a_corrupt_one_is_rebuilt_without(tmp_path):
    base = "https://data.example.org/atlas/"
    make_release(tmp_path, "r1", at(0))
    F.update_feed(tmp_path, "r1", base)
    sha = F.read_feed(tmp_path)["releases"][0]["manifest_sha256"]
    row = {"status": "published", "published_at": at(0), "manifest_sha256": sha}
    F.rebuild_feed(tmp_path, lambda rid: row)
    assert _doc(tmp_path)["feed_url"] == base + "feed.json"
    (tmp_path / F.FEED_JSON).write_text("{not json")
    F.rebuild_feed(tmp_path, lambda rid: row)
    doc = _doc(tmp_path)
    check_json_feed(doc)
    assert "feed_url" not in doc and doc["_dpatlas"]["latest"] == "r1"
