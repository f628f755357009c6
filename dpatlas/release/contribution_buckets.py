"""The contributions check's hashing on the workers (issue 35; the check itself:
:func:`dpatlas.release.contributions.check_contributions`).

With ``runner: dask`` each partition's validation task hashes the (person, cell) pairs of
the rows it staged (:func:`write_hash_buckets`: the same hashes as the flow's own check) and
writes them beside them, split by their leading ``BUCKET_BITS`` bits into one file per bucket
with each hash's position in the staged file. Equal hashes share a bucket, so one task per
bucket (:func:`repeated_in_bucket`) finds every repeated hash over all partitions from its
own files alone, and returns only the positions of the records that have one; the flow reads
those records and decides as the check always did (the ids compared, not the hashes).

A bucket task holds its bucket of every partition: about 1/16 of the release's hashes (8
bytes and 8 of position a record, sorted once), e.g. ≈ 220 MB for 217 M records.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow.parquet as pq

from dpatlas.core.locations import join, local_path, url_fs
from dpatlas.release.contributions import _id_kind, _partition_hashes, _repeated
from dpatlas.release.staging import read_bytes, write_bytes

BUCKET_BITS = 4
BUCKETS = 2 ** BUCKET_BITS


def bucket_url(folder: str, bucket: int) -> str:
    return join(folder, f"bucket-{bucket:02d}.npz")


def write_hash_buckets(staged: str, folder: str) -> int:
    """Hash every record of the staged file ``staged`` (path or URL) and write the hashes,
    with their positions in the file, into ``folder``, one file per bucket of leading bits
    (private); returns the number of records hashed."""
    local = local_path(staged)
    if local is not None:
        hashes = _partition_hashes(local, _id_kind(pq.read_schema(local)) == "integer")
    else:
        fs, path = url_fs(staged)
        with fs.open(path, "rb") as file:
            as_integers = _id_kind(pq.ParquetFile(file).schema_arrow) == "integer"
            hashes = _partition_hashes(file, as_integers, staged)
    leading = hashes >> np.uint64(64 - BUCKET_BITS)
    order = np.argsort(leading, kind="stable")
    bounds = np.searchsorted(leading[order], np.arange(BUCKETS + 1, dtype=np.uint64))
    for bucket in range(BUCKETS):
        own = order[bounds[bucket]:bounds[bucket + 1]]
        buffer = io.BytesIO()
        np.savez(buffer, hashes=hashes[own], positions=own.astype(np.int64))
        write_bytes(bucket_url(folder, bucket), buffer.getvalue())
    return len(hashes)


def repeated_in_bucket(bucket: int, folders: list[str]) -> dict[int, np.ndarray]:
    """The positions of the records whose hash is repeated in this bucket over every
    partition's ``folders`` (by the partition's index in ``folders``, none if it has none)."""
    loaded = [np.load(io.BytesIO(read_bytes(bucket_url(folder, bucket)))) for folder in folders]
    hashes = [file["hashes"] for file in loaded]
    repeated = _repeated(np.concatenate(hashes)) if hashes else np.empty(0, np.uint64)
    found = {}
    if len(repeated):
        for index, (file, own) in enumerate(zip(loaded, hashes)):
            hit = np.isin(own, repeated)
            if hit.any():
                found[index] = file["positions"][hit]
    return found


def merge_buckets(found: list[dict[int, np.ndarray]]) -> dict[int, np.ndarray]:
    """Every bucket's positions, by partition."""
    merged: dict[int, list[np.ndarray]] = {}
    for bucket in found:
        for index, positions in bucket.items():
            merged.setdefault(index, []).append(positions)
    return {index: np.concatenate(parts) for index, parts in merged.items()}
