"""Locations by path or URL (fsspec): a local folder (a plain path or ``file://``) or object
storage (``s3://``, ``gs://``...). Shared by the staging of confidential rows
(dpatlas.release.staging) and the publish parts (dpatlas.publication.release_parts), which
both read and write where Dask workers on other machines can."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional


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


@contextmanager
def writable_folder(url: str) -> Iterator[Path]:
    """A local folder to write the folder ``url`` from: the folder itself (emptied first: work
    interrupted before is written again; 0700), or, for object storage, a temporary folder
    uploaded to ``url`` when the block ends."""
    local = local_path(url)
    if local is not None:
        shutil.rmtree(local, ignore_errors=True)
        local.mkdir(parents=True, mode=0o700)
        yield local
        return
    with tempfile.TemporaryDirectory(prefix="dpatlas-folder-") as tmp:
        yield Path(tmp)
        remove_tree(url)
        fs, path = url_fs(url)
        fs.put(tmp.rstrip("/") + "/", path, recursive=True)


@contextmanager
def readable_folder(url: str) -> Iterator[Path]:
    """The folder ``url`` as a local folder: itself, or downloaded to a temporary one."""
    local = local_path(url)
    if local is not None:
        yield local
        return
    with tempfile.TemporaryDirectory(prefix="dpatlas-folder-") as tmp:
        fs, path = url_fs(url)
        fs.get(path.rstrip("/") + "/", f"{tmp}/folder/", recursive=True)
        yield Path(tmp) / "folder"
