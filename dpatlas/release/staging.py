"""Staging by URL: where Dask workers on other machines read a chunk's rows and write its draws.

With ``staging_url`` set (``file:///shared/folder``, ``s3://bucket/prefix``, ``gs://...``), the
release copies its validated partitions to ``<staging_url>/<release id>/staged/`` and each
chunk's task, wherever it runs, reads only its own GEOID range from there and writes its draw
beside it. What crosses the Dask scheduler is then the chunk (a GEOID range and a URL), never
its records. Every access goes through fsspec (s3fs, gcsfs for object storage, credentials from
the environment as those libraries read them); a ``file://`` location is kept private (folders
0700, files 0600), as the internal folder is.

Staged data are confidential microdata: an object-storage prefix must be readable only by the
release's machines (see deploy/README.md).
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Optional

import pandas as pd
import pyarrow.parquet as pq

from dpatlas.core.errors import ReleaseRefused
from dpatlas.core.files import write_bytes_atomic
from dpatlas.core.locations import join, local_path, remove_tree, url_fs

__all__ = ["check_staging_url", "join", "list_files", "read_bytes", "read_parquet",
           "release_location", "remove_tree", "sha256_url", "stage_files", "write_parquet"]


class StagingLocationError(ValueError, ReleaseRefused):
    """``staging_url`` cannot take a release's staged rows; nothing was read or charged."""


def check_staging_url(url: Optional[str], forbidden: dict[str, Path]) -> None:
    """Refuse a staging location the release could not use, or must not write person-level
    rows to: a scheme fsspec does not know or whose package is not installed (found before
    the input is read, not after), or a local folder inside one of ``forbidden`` (what ->
    folder: the publish root, which is public; the input, which the staged copy would join).
    A relative path is the config's to resolve (dpatlas.core.config), so it is absolute here."""
    if not url:
        return
    local = local_path(url)
    if local is None:
        _check_scheme(url)
        return
    real = Path(os.path.realpath(local))
    for what, folder in forbidden.items():
        folder = Path(os.path.realpath(folder))
        if real == folder or folder in real.parents:
            raise StagingLocationError(
                f"staging_url {url} lies inside {what} {folder}: the staged copy holds "
                "person-level rows, so it must be a folder of its own (outside the publish "
                "root, which is public, and the input, which it would join); nothing was read "
                "or charged")


def _check_scheme(url: str) -> None:
    import fsspec
    from fsspec.registry import known_implementations

    scheme = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError:
        package = known_implementations.get(scheme, {}).get("class", scheme).split(".")[0]
        raise StagingLocationError(
            f"staging_url {url}: the {scheme}:// scheme needs the package {package}, which is "
            f"not installed here (install {package}, or use a file:// folder); nothing was read "
            "or charged") from None
    except ValueError:
        raise StagingLocationError(
            f"staging_url {url}: unknown scheme {scheme}:// (use file:///shared/folder, a "
            "path, s3://bucket/prefix or gs://bucket/prefix); nothing was read or charged"
        ) from None


def release_location(staging_url: str, release_id: str) -> str:
    """The release's own prefix under the configured staging URL."""
    return join(staging_url, release_id)


def list_files(url: str) -> dict[str, int]:
    """Every file under the folder or prefix ``url`` (URL -> bytes); empty if there is none."""
    local = local_path(url)
    if local is not None:
        return ({str(p): p.stat().st_size for p in sorted(local.rglob("*")) if p.is_file()}
                if local.is_dir() else {})
    fs, path = url_fs(url)
    if not fs.exists(path):
        return {}
    protocol = url.split("://", 1)[0]
    return {f"{protocol}://{name}": int(info.get("size") or 0)
            for name, info in sorted(fs.find(path, detail=True).items())}


def write_bytes(url: str, data: bytes) -> None:
    """Whole or not at all: a local file is renamed into place (0600 in a 0700 folder); an
    object store's put is atomic already."""
    local = local_path(url)
    if local is not None:
        write_bytes_atomic(local, data, private=True)
        return
    fs, path = url_fs(url)
    fs.pipe_file(path, data)


def read_bytes(url: str) -> bytes:
    local = local_path(url)
    if local is not None:
        return local.read_bytes()
    fs, path = url_fs(url)
    return fs.cat_file(path)


def sha256_url(url: str) -> str:
    return hashlib.sha256(read_bytes(url)).hexdigest()


def write_parquet(frame: pd.DataFrame, url: str, write=None) -> str:
    """``frame`` as Parquet at ``url``; returns the sha256 of the bytes written. ``write``:
    how the frame is written to a buffer (default: ``to_parquet`` without the index)."""
    buffer = io.BytesIO()
    if write is None:
        frame.to_parquet(buffer, index=False)
    else:
        write(frame, buffer)
    data = buffer.getvalue()
    write_bytes(url, data)
    return hashlib.sha256(data).hexdigest()


def read_parquet(url: str, columns=None, filters=None) -> pd.DataFrame:
    """A Parquet file by URL, filtered while reading (only the columns, row groups and rows
    asked for)."""
    local = local_path(url)
    if local is not None:
        return pd.read_parquet(local, columns=columns, filters=filters)
    fs, path = url_fs(url)
    return pq.read_table(path, filesystem=fs, columns=columns, filters=filters).to_pandas()


def stage_files(files: list[Path], location: str) -> dict[Path, str]:
    """Copy each local file to ``<location>/staged/<name>``; returns each file's URL."""
    urls = {}
    for file in files:
        url = join(location, "staged", Path(file).name)
        write_bytes(url, Path(file).read_bytes())
        urls[Path(file)] = url
    return urls
