"""Locations by path or URL (fsspec): a local folder (a plain path or ``file://``) or object
storage (``s3://``, ``gs://``...). Shared by the staging of confidential rows
(dpatlas.release.staging) and the publish parts (dpatlas.publication.release_parts), which
both read and write where Dask workers on other machines can."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional


def local_path(url: str) -> Optional[Path]:
    """The path of a ``file://`` URL (or a plain path); None for any other protocol."""
    url = str(url)
    if url.startswith("file://"):
        return Path(url[len("file://"):])
    return None if "://" in url else Path(url)


def join(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, ``/``-separated."""
    return "/".join([str(url).rstrip("/"), *parts])


def url_fs(url: str):
    """fsspec's file system and path for ``url``."""
    import fsspec

    return fsspec.core.url_to_fs(url)


def remove_tree(url: str) -> None:
    """Remove the folder or prefix ``url`` and everything under it (nothing if absent)."""
    local = local_path(url)
    if local is not None:
        if local.is_dir():
            shutil.rmtree(local)
        return
    fs, path = url_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)
