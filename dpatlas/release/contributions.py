"""Contribution bounding: at most one record per person and cell, across ALL partitions.

Why it matters. Every tract and cell is given the full per-tract budget ε, and the release
claims ε per person per cell because tracts compose in *parallel* (McSherry 2009, "Privacy
Integrated Queries", parallel composition: mechanisms on disjoint subsets of the data cost
the maximum, not the sum). That holds only if each person's data lies in one tract per cell.
A person with records in k tracts of a cell (say a tract of state 17 and one of state 18,
which are validated as separate partitions) is protected only at k·ε, by sequential
composition. Cells are different: they compose sequentially anyway (and the ledger charges
every cell), so one person in several cells is allowed.

So the question "at most one record per (person, cell)?" is asked once, over every staged
partition together (never per partition), after validation and before any noise:

- ``fail`` (default): refuse the release, with the offending rows in the quarantine folder;
- ``bound``: keep one record per (person, cell) and remove the rest (see
  :func:`check_contributions` for why the rule keeps replace-one DP valid).

Without a person id column nothing can be checked: :func:`require_person_unit` then requires
the operator to state the assumption, and the manifest lists it as unverified.

Memory stays bounded for millions of records: each partition's (person, cell) pairs are
hashed to one uint64 (pandas' hashing), in batches of records, and kept in a scratch file of
the internal folder; repeated hashes are found by sorting them (8 bytes a record) a bucket at
a time (a bucket: the hashes with the same leading bits, so equal hashes share one; as many
buckets as keep one under ``_BUCKET_BYTES``), and only the records with a repeated hash are
read back and compared by their real ids, so a hash collision can neither remove nor reject
anyone. With many cells a person has many records, so the hashes of a national release grow
with the cells while a bucket does not.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dpatlas.core.config import ConfigError, ReleaseConfig
from dpatlas.core.files import write_atomic, write_parquet_atomic
from dpatlas.release import staged_layout
from dpatlas.release.validate import ValidationFailed
from dpatlas.release.validation_words import quarantine_frame

QUARANTINE_NAME = "duplicate-persons.parquet"
# Hashes sorted at once when looking for repeats (a sort holds about three times this). A
# national release with 6 cells has 31 M records, 0.25 GiB of hashes: with buckets of
# 256 MiB they were sorted at once, 503 MiB at the peak (tracemalloc); with 64 MiB, four
# buckets, 185 MiB, and no slower (2.75 s against 3.19: each bucket reads the files again
# from the page cache, but sorts a quarter).
_BUCKET_BYTES = 64 * 2**20
_BATCH_ROWS = 1 << 20  # records read and hashed at a time
HASHING_THREADS = 2  # staged files hashed at once (see _candidates)
CLAIM = "one record per person and cell"


class ContributionError(ValidationFailed):
    """A person has more than one record in a cell; no noise has been drawn."""


def require_person_unit(cfg: ReleaseConfig) -> dict:
    """Refuse a release whose one-record-per-person claim is neither checkable nor stated.

    Returns the manifest's statement of the claim: ``status`` is ``"verified"`` (a person id
    column is named, so :func:`check_contributions` checks or enforces it) or ``"unverified
    assumption"`` (no id column; the operator set ``privacy.assume_one_record_per_person``).
    Raises :class:`~dpatlas.core.config.ConfigError` when there is neither.
    """
    column = cfg.input.columns.person_id
    if column:
        how = {"fail": "checked: the release stops if any person has two records in a cell",
               "bound": "enforced: of a person's records in a cell only the one with the "
                        "smallest (GEOID, input row) is kept"}[cfg.validation.contributions]
        return {"claim": CLAIM, "status": "verified",
                "basis": f"person id column '{column}', across all partitions; {how}"}
    if cfg.privacy.assume_one_record_per_person:
        return {"claim": CLAIM, "status": "unverified assumption",
                "basis": "no person id column; stated by the operator "
                         "(privacy.assume_one_record_per_person: true)"}
    raise ConfigError(
        "input.columns.person_id is not set and privacy.assume_one_record_per_person is false: "
        "the per-tract budget holds per person only if each person has one record per cell "
        "(parallel composition over tracts), so name the person id column, or set "
        "privacy.assume_one_record_per_person: true if the input is known to have one record "
        "per person")


# --- reading ids ----------------------------------------------------------------------------


def _has_person_ids(staged: list[Path]) -> bool:
    present = ["person_id" in pq.read_schema(p).names for p in staged]
    if any(present) and not all(present):
        missing = [p.name for p, has in zip(staged, present) if not has]
        raise ContributionError(f"staged partitions {missing} have no person_id column while "
                                "others do; rerun the release so every partition is staged "
                                "with the same columns")
    return bool(present) and all(present)


def _ids_are_integers(staged: list[Path]) -> bool:
    """Integer ids in every partition: hash and compare them as int64; text ids in every
    partition: compare them as text. Partitions of both kinds are refused: whether 7 and
    "007" are one person cannot be decided without guessing (the input is read with one type,
    dpatlas.release.ingest, so a staged file of the other kind means the staging changed)."""

    kinds = {p.name: _id_kind(pq.read_schema(p)) for p in staged}
    if len(set(kinds.values())) > 1:
        held = ", ".join(f"{name}: {k}" for name, k in sorted(kinds.items()))
        raise ContributionError(f"staged partitions hold person ids of different types ({held})"
                                "; person ids are compared as one type, so store them as one "
                                "type in every partition and rerun the release")
    return set(kinds.values()) == {"integer"}


def _id_kind(schema: pa.Schema) -> str:
    t = schema.field("person_id").type
    if pa.types.is_integer(t) and t != pa.uint64():
        return "integer"
    return "unsigned 64-bit" if pa.types.is_integer(t) else "text"


def _canonical_ids(ids: pd.Series, as_integers: bool) -> pd.Series:
    """Ids as int64, or as pandas text. Text stays in pyarrow: pandas hashes it to the same
    values as the Python strings it once made of every id, 2.3 times as fast (51 national
    partitions, 5.2 M records: 1.6 s against 3.6)."""
    if as_integers:
        return pd.Series(ids.to_numpy(dtype=np.int64), name="person_id")
    return pd.Series(ids.astype(str).array, name="person_id")


def _key_hashes(frame: pd.DataFrame) -> np.ndarray:
    """One uint64 per record for its (person, cell) pair; equal pairs hash equal."""
    key = pd.DataFrame({"person_id": frame["person_id"].array,
                        "cell": frame["cell"].astype(str).array})
    return pd.util.hash_pandas_object(key, index=False).to_numpy(dtype=np.uint64)


def _repeated(hashes: np.ndarray) -> np.ndarray:
    """The hash values that occur more than once (sorted, unique)."""
    ordered = np.sort(hashes)
    return np.unique(ordered[1:][ordered[1:] == ordered[:-1]])


# --- the check ------------------------------------------------------------------------------


def _partition_hashes(path, as_integers: bool, name=None) -> np.ndarray:
    """The (person, cell) hash of every record of one staged file (a path, or an open file
    called ``name``), in file order (read and hashed ``_BATCH_ROWS`` records at a time: a
    record's hash depends on its pair alone)."""
    parts, missing = [], 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_BATCH_ROWS,
                                                   columns=["person_id", "cell"]):
        frame = batch.to_pandas()
        missing += int(frame["person_id"].isna().sum())
        if not missing:
            frame["person_id"] = _canonical_ids(frame["person_id"], as_integers)
            parts.append(_key_hashes(frame))
    if missing:  # the input contract stops null ids; a staged file should never have one
        raise ContributionError(f"{missing} record(s) in {name or path} have no person id; rerun "
                                "the release so the input contract sees them")
    return np.concatenate(parts) if parts else np.empty(0, np.uint64)


def _repeated_in_buckets(hash_files: list[Path], total: int) -> np.ndarray:
    """The repeated hash values over all files (sorted, unique), sorting one bucket of
    leading bits at a time so that no more than about ``_BUCKET_BYTES`` are sorted at once."""
    bits = max(0, int(np.ceil(np.log2(max(1, total * 8) / _BUCKET_BYTES))))
    if bits == 0:
        return _repeated(np.concatenate([np.load(f) for f in hash_files]))
    shift = np.uint64(64 - bits)
    found = []
    for bucket in range(2 ** bits):
        own = [h[(h >> shift) == bucket] for h in map(np.load, hash_files)]
        found.append(_repeated(np.concatenate(own)))
    return np.concatenate(found)


def _hash_to_file(path: Path, as_integers: bool, out: Path) -> int:
    """Every record's (person, cell) hash of one staged file into ``out`` (``.npy``, person-level
    scratch); how many records it has."""
    hashes = _partition_hashes(path, as_integers)
    np.save(out, hashes)
    return len(hashes)


def _candidates(staged: list[Path], as_integers: bool,
                scratch: Path) -> tuple[pd.DataFrame, int]:
    """The records whose (person, cell) hash is repeated, with their file, and the total count.

    Two passes over the staged files: hashes first (8 bytes a record, in files under
    ``scratch``, compared a bucket at a time), then only the candidate rows are kept in memory.
    The files are hashed two at a time, in threads: reading Parquet and hashing release the
    interpreter lock for most of the time (the national input's 51 files: 1.54 s against 2.05,
    one after the other, on two cores), and the flow waits for this check alone.
    """
    hash_files = [scratch / f"hashes-{index}.npy" for index in range(len(staged))]
    with ThreadPoolExecutor(HASHING_THREADS) as threads:
        total = sum(threads.map(_hash_to_file, staged, [as_integers] * len(staged),
                                hash_files))
    if not staged:
        return pd.DataFrame(), total
    repeated = _repeated_in_buckets(hash_files, total)
    positions = {}
    if len(repeated):
        for index, hash_file in enumerate(hash_files):
            hit = np.flatnonzero(np.isin(np.load(hash_file), repeated))
            if len(hit):
                positions[index] = hit
    return _rows_at(staged, positions), total


def _rows_at(staged: list[Path], positions: dict[int, np.ndarray]) -> pd.DataFrame:
    """The records at ``positions`` (file order) of each staged file (by its index), with
    ``_file``, the index."""
    parts = []
    for index in sorted(positions):
        frame = pd.read_parquet(staged[index]).iloc[np.sort(positions[index])]
        parts.append(frame.reset_index(drop=True).assign(_file=index))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _confirmed(candidates: pd.DataFrame, as_integers: bool) -> pd.DataFrame:
    """Records sharing their real (person id, cell) with another record: the true repeats."""
    if candidates.empty:
        return candidates
    key = candidates.assign(
        _pid=_canonical_ids(candidates["person_id"], as_integers).to_numpy(),
        _cell=candidates["cell"].astype(str).to_numpy(dtype=object))
    size = key.groupby(["_pid", "_cell"], sort=False)["row"].transform("size")
    return key[size.to_numpy() > 1].reset_index(drop=True)


def _keep_smallest_geoid_then_row(repeats: pd.DataFrame) -> np.ndarray:
    """True for the one record kept per (person, cell): the smallest (GEOID, input row)."""
    ordered = repeats.sort_values(["_pid", "_cell", "geoid", "row"], kind="stable")
    first = ~ordered.duplicated(["_pid", "_cell"], keep="first")
    return first.reindex(repeats.index).to_numpy(dtype=bool)


def _rewrite_without(path: Path, rows: np.ndarray) -> int:
    """Remove the records with these input rows from a staged file, atomically."""
    frame = pd.read_parquet(path)
    keep = ~frame["row"].isin(rows).to_numpy()
    # Readers see the old file or the new one, never half of one, laid out as staged
    write_atomic(path, partial(staged_layout.write, frame[keep].reset_index(drop=True)),
                 private=True)
    return int((~keep).sum())


def check_contributions(staged: list[Path], policy: str, internal: Path,
                        columns: dict[str, str] | None = None,
                        found: "tuple[dict[int, np.ndarray], int] | None" = None) -> dict:
    """At most one record per (person, cell) over all staged partitions; fail or bound.

    ``staged`` are the validated partitions (Parquet: row, geoid, x, y, cell, person_id),
    ``policy`` is ``validation.contributions``, ``internal`` the release's internal folder.
    Every record of a (person, cell) with several records is written to
    ``internal/quarantine/duplicate-persons.parquet`` (with ``staged_file``, and under
    ``bound`` a ``kept`` flag), under the input's column names (``columns``,
    :func:`~dpatlas.release.validate.input_column_names`). ``found``: the repeated hashes
    found on the workers (:mod:`dpatlas.release.contribution_buckets`), as the positions of
    their records in each staged file (by index in ``staged``) and the number of records
    hashed; without it the hashes are computed and compared here.

    ``fail`` raises :class:`ContributionError` naming the number of persons and records and
    the quarantine file. ``bound`` keeps, for each such (person, cell), the record with the
    smallest (GEOID, input row), rewrites the affected staged files atomically, and goes on.

    Why ``bound`` keeps replace-one DP valid: the kept record is chosen by a rule that reads
    only that person's own records, and only their GEOIDs and input positions, never their
    ranks. So bounding is a per-person transformation T(D) = ∪_p f(D_p): replacing one
    person's records changes only that person's kept records, at most one per cell, and no one
    else's, so T maps neighbours to neighbours (a 1-stable transformation in the sense of
    McSherry 2009, PINQ: M∘T is c·ε-DP for a c-stable T and an ε-DP M; here c = 1). Because
    the choice ignores the ranks, a neighbour that changes a person's ranks leaves every
    tract's n unchanged, which is the
    replace-one relation (n public) the estimators are proved under. A rule that looked at
    other people's records (e.g. "keep the copy in the smaller tract") would let one person's
    data decide whose record survives, and would not be stable.

    Returns counts for the internal report (not DP; never put them in the manifest):
    ``checked``, ``policy``, ``records``, ``persons_repeated``, ``records_of_repeated``,
    ``records_removed``, ``files_rewritten``, ``quarantine_file``.
    """
    if policy not in ("fail", "bound"):
        raise ValueError(f"validation.contributions must be 'fail' or 'bound', not {policy!r}")
    staged = [Path(p) for p in staged]
    report = {"checked": False, "policy": policy, "records": None, "persons_repeated": 0,
              "records_of_repeated": 0, "records_removed": 0, "files_rewritten": [],
              "quarantine_file": None}
    if not staged or not _has_person_ids(staged):
        return report
    as_integers = _ids_are_integers(staged)
    internal.mkdir(parents=True, exist_ok=True)
    # person-level hashes: private scratch in the internal folder, removed when done
    if found is not None:
        candidates, total = _rows_at(staged, found[0]), found[1]
    else:
        with tempfile.TemporaryDirectory(prefix="contribution-hashes-", dir=internal) as scratch:
            candidates, total = _candidates(staged, as_integers, Path(scratch))
    repeats = _confirmed(candidates, as_integers)
    report.update(checked=True, records=total)
    if repeats.empty:
        return report

    persons = int(repeats["_pid"].nunique())
    report.update(persons_repeated=persons, records_of_repeated=len(repeats))
    quarantine = internal / "quarantine" / QUARANTINE_NAME
    shown = repeats.assign(staged_file=[staged[i].name for i in repeats["_file"]])
    if policy == "fail":
        write_parquet_atomic(quarantine_frame(shown.drop(columns=["_pid", "_cell", "_file"]),
                                              columns), quarantine, private=True)
        states = sorted({str(g)[:2] for g in repeats["geoid"]})
        raise ContributionError(
            f"{persons:,} person(s) have more than one record in a cell ({len(repeats):,} "
            f"records, in tracts of state(s) {', '.join(states)}); the per-tract budget holds "
            "per person only with one record per person and cell, so no noise was drawn and "
            f"nothing was published. Their rows are in {quarantine}; fix the input, or set "
            "validation.contributions: bound to keep one record per person and cell.")

    kept = _keep_smallest_geoid_then_row(repeats)
    write_parquet_atomic(quarantine_frame(shown.assign(kept=kept).drop(
        columns=["_pid", "_cell", "_file"]), columns), quarantine, private=True)
    removed = repeats[~kept]
    rewritten = []
    for index, rows in removed.groupby("_file")["row"]:
        path = staged[int(index)]
        report["records_removed"] += _rewrite_without(path, rows.to_numpy())
        rewritten.append(str(path))
    report.update(files_rewritten=rewritten, quarantine_file=str(quarantine))
    return report
