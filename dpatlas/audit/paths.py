"""The machine-paths check (x): no absolute path or URL in manifest.json or config.json, no
machine path or address in any other published file."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.parquet as pq

from .base import CONFIG, MANIFEST, Mismatch
from .part_names import is_part
from .files import NotRead, _config, readable
from .tiles import pmtiles_metadata


def check_no_machine_paths(folder: Path, m: dict) -> str:
    bad = []

    def walk(obj, where):
        if isinstance(obj, str):
            t = obj.strip()
            if t.startswith(("/", "~", "\\")) or re.match(r"^[A-Za-z]:[\\/]", t) \
                    or re.match(r"^[a-z][a-z0-9+.-]*://", t, re.IGNORECASE):
                bad.append(f"{where}={obj!r}")
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(k, f"{where}.{k}(key)")
                walk(v, f"{where}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]")

    walk(m, "")
    walk(_config(folder), "config.json")
    in_files, n_read = _published_machine_paths(folder, m)
    bad += in_files
    if bad:
        raise Mismatch(f"{len(bad)} machine path(s), e.g. {bad[0]}")
    return (f"no absolute path or URL in manifest.json or config.json, no machine path in the "
            f"{n_read} other published file(s) read as text (tile and Parquet metadata too)")


# --- machine paths in every published file, not only manifest.json and config.json

_PATH_PART = rb"[A-Za-z0-9._~+@%-]"
# A folder's name begins so; not "%3E" or "-" (a data URI's or a minified regex's /%3E/, /-/g)
_PART_START = rb"[A-Za-z0-9_.~]"
_SLASH = rb"(?:/|\\/)"  # a JSON writer may escape "/" as "\/"
_NOT_AFTER = rb"[A-Za-z0-9._~:/\\+@%-]"  # a "/" after one of these does not begin a path
_SCHEMES = ("file", "sqlite", "postgres", "postgresql", "psycopg", "psycopg2", "mysql", "s3",
            "s3a", "gs", "gcs", "abfs", "abfss", "az", "hdfs", "smb", "sftp", "ssh", "ftp")
# What a path or address of the machine that made the release looks like inside text: an
# absolute POSIX path of two parts or more (not a relative ../x, a URL's /path after its host,
# a closing </tag>, "p25/p75"), a Windows drive path, a home-relative path, a URL of a file,
# database or bucket, and a web address of this machine or its private network. Public web
# addresses (a licence, the map's libraries) are not machine paths. Every alternative begins
# with one literal character ("/", "\\", "~", ":") and looks behind it, so the regex engine
# skips to those characters (tens of MB/s on GeoJSON).
MACHINE_PATH_IN_TEXT = re.compile(
    rb"/(?<!" + _NOT_AFTER + rb"/)" + _PART_START + _PATH_PART + rb"*" + _SLASH + _PART_START
    + rb"|\\/(?<!" + _NOT_AFTER + rb"\\/)" + _PART_START + _PATH_PART + rb"*" + _SLASH
    + _PART_START
    + rb"|~(?<![A-Za-z0-9._-]~)" + _SLASH + _PATH_PART
    + rb"|:(?<=[A-Za-z]:)(?<![A-Za-z0-9][A-Za-z]:)(?:\\+|/)" + _PATH_PART
    + rb"|:(?i:" + b"|".join(rb"(?<=" + s.encode() + rb":)" for s in _SCHEMES) + rb")//"
    + rb"[A-Za-z0-9_.~/\[@]"  # a host or a path follows (a bare "file://" names nothing)
    + rb"|:(?i:(?<=http:)|(?<=https:))//(?i:localhost|127\.|10\.|192\.168\."
      rb"|172\.(?:1[6-9]|2[0-9]|3[01])\.)")
TEXT_CHUNK = 1 << 20
_TEXT_OVERLAP = 512  # more than a match needs to be recognised: one across two chunks is seen


def machine_path_in_text(raw: bytes) -> str | None:
    """The first machine path in ``raw`` with a little context, or None."""
    found = MACHINE_PATH_IN_TEXT.search(raw)
    if not found:
        return None
    start = found.start()
    return raw[start:start + 60].split(b"\n")[0].decode("utf-8", "replace")


def _text_file_machine_path(path: Path) -> tuple[str | None, bool]:
    """(the first machine path in a published file, whether it was read as text): streamed in
    chunks; a binary file (a NUL byte in its first chunk) is not text and not read further."""
    tail = b""
    with open(readable(path), "rb") as fh:
        first = True
        while chunk := fh.read(TEXT_CHUNK):
            if first and b"\0" in chunk[:8192]:
                return None, False
            first = False
            found = machine_path_in_text(tail + chunk)
            if found:
                return found, True
            tail = chunk[-_TEXT_OVERLAP:]
    return None, True


def _published_machine_paths(folder: Path, m: dict) -> tuple[list[str], int]:
    """(machine paths found, files read) in every published file but manifest.json and
    config.json (checked string by string): text files streamed, a PMTiles archive's metadata,
    a Parquet file's key-value metadata; other binary files (an image) and files the audit
    does not open (not regular, over their size: the files check names them) skipped."""
    found, read = [], 0
    for name in sorted(m.get("files") or {}):
        if name in (MANIFEST, CONFIG) or not isinstance(name, str) or (
                "/" in name and not is_part(name)):
            continue
        path = folder / name
        try:
            if name.endswith(".pmtiles"):
                hit, is_text = machine_path_in_text(pmtiles_metadata(path)), True
            elif name.endswith(".parquet"):
                metadata = pq.read_schema(readable(path)).metadata or {}
                hit, is_text = machine_path_in_text(b"\n".join(metadata.values())), True
            else:
                hit, is_text = _text_file_machine_path(path)
        except (NotRead, FileNotFoundError):  # the files check names it
            continue
        except Exception as err:  # noqa: BLE001 - a file that cannot be read is not cleared
            found.append(f"{name} cannot be read ({type(err).__name__}), so not checked")
            continue
        read += is_text
        if hit:
            found.append(f"{name}: {hit!r}")
    return found, read
