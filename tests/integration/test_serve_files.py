"""`dpatlas serve` on Starlette (issue 34, item 2): what Starlette would do differently from the
server's rules is held to them: ranges it would refuse or answer in several parts, a folder's
index that links out of the root or is a database, the types of the files the map reads; and
what it adds (revalidation with ETag) is checked."""

from __future__ import annotations

import os
import shutil
import sqlite3

import pytest

from tests.integration.test_tiles import _get, served  # noqa: F401  (fixture)


@pytest.mark.parametrize("header", ["items=0-5", "bytes=5-2", "bytes=abc", "bytes=-",
                                    "bytes=0-1,4-5", "bytes=0-1, 0-9"])
def test_a_range_not_honoured_is_ignored_not_refused(served, header):  # noqa: F811
    """Starlette answers these 400 or multipart; RFC 9110 §14.2 lets a server ignore them."""
    connect, data = served
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": header})
    assert response.status == 200 and body == data, header
    assert response.getheader("Content-Type") == "application/vnd.pmtiles"


def test_any_range_of_an_empty_file_is_unsatisfiable(served, tmp_path):  # noqa: F811
    connect, _ = served
    (tmp_path / "root" / "r1" / "empty.pmtiles").write_bytes(b"")
    response, body = _get(connect, "/r1/empty.pmtiles", {"Range": "bytes=0-"})
    assert response.status == 416 and body == b""
    assert response.getheader("Content-Range") == "bytes */0"
    response, body = _get(connect, "/r1/empty.pmtiles")
    assert response.status == 200 and body == b""


def test_a_folders_index_is_served_only_if_it_may_be(served, tmp_path):  # noqa: F811
    """The index of ``folder/`` passes the same rules as any file: a link out of the root or
    a database under the name index.html is a 404, and says nothing of what it is."""
    connect, _ = served
    root = tmp_path / "root"
    (tmp_path / "notes.html").write_text("<title>confidential notes</title>")
    (root / "linked").mkdir()
    os.symlink(tmp_path / "notes.html", root / "linked" / "index.html")
    (root / "renamed").mkdir()
    database = sqlite3.connect(root / "renamed" / "ledger.db")
    database.execute("create table t (path text)")
    database.commit()
    database.close()
    shutil.move(root / "renamed" / "ledger.db", root / "renamed" / "index.html")
    for path in ("/linked/", "/linked", "/linked/index.html", "/renamed/", "/renamed"):
        response, body = _get(connect, path)
        assert response.status == 404, path
        assert b"confidential" not in body and b"SQLite" not in body, path


@pytest.mark.parametrize("name, media_type", [
    ("feed.json", "application/json"), ("tracts.geojson", "application/geo+json"),
    ("app.mjs", "text/javascript"), ("app.js", "text/javascript"),
    ("feed.atom", "application/atom+xml")])
def test_the_map_reads_each_file_with_its_type(served, tmp_path, name, media_type):  # noqa: F811
    connect, _ = served
    (tmp_path / "root" / name).write_text("{}")
    response, body = _get(connect, f"/{name}")
    assert response.status == 200 and body == b"{}"
    assert response.getheader("Content-Type") == media_type


def test_a_file_is_revalidated_not_sent_again(served):  # noqa: F811
    """``Cache-Control: no-cache`` asks a viewer to revalidate: an unchanged file is a 304."""
    connect, data = served
    response, body = _get(connect, "/r1/tracts.pmtiles")
    assert response.status == 200 and body == data
    assert response.getheader("Cache-Control") == "no-cache"
    etag = response.getheader("ETag")
    assert etag
    response, body = _get(connect, "/r1/tracts.pmtiles", {"If-None-Match": etag})
    assert response.status == 304 and body == b""
    assert response.getheader("Cache-Control") == "no-cache"


def test_a_database_swapped_in_between_check_and_send_is_not_served(served, tmp_path,  # noqa: F811
                                                                    monkeypatch):
    """The check and the send read one open file: a database moved onto the checked path in
    the gap between them (the lookup and the response) is not what is sent."""
    from dpatlas.publication.serve import PublishedFiles

    connect, data = served
    path = tmp_path / "root" / "r1" / "tracts.pmtiles"
    swap = tmp_path / "root" / "r1" / ".swap"
    database = sqlite3.connect(swap)
    database.execute("create table t (secret text)")
    database.commit()
    database.close()
    forged = swap.read_bytes()
    swap.write_bytes((forged + bytes(len(data)))[:len(data)])  # the same size as the file
    looked_up = PublishedFiles.lookup_path

    def lookup_then_swap(self, relative):
        found = looked_up(self, relative)
        if relative.endswith("tracts.pmtiles") and found[1] is not None:
            os.replace(swap, path)  # the gap: after the check, before the send
        return found

    monkeypatch.setattr(PublishedFiles, "lookup_path", lookup_then_swap)
    response, body = _get(connect, "/r1/tracts.pmtiles")
    assert not body.startswith(b"SQLite format 3")
    assert response.status == 200 and body == data
    assert path.read_bytes().startswith(b"SQLite format 3")  # the swap did happen
