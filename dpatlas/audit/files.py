"""The folder itself: the files check (a: every listed file with its sha256 and size, nothing
else, no special file), bounded reads (:func:`readable`), JSON reading, and the config (b) and
mode checks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from contextvars import ContextVar
from pathlib import Path

from .part_names import (PARTS_FOLDERS, VALUES_FOLDER, is_part, is_values_document,
                         listed_parts, unlisted_parts)
from .base import (
    CONFIG, MANIFEST, MAX_JSON_DEPTH, MAX_MANIFEST_BYTES, Mismatch, RANDOM_BITS,
    RANDOM_BITS_MIXED, SYNTHETIC_CSV, SYNTHETIC_PARQUET, _synthetic, close,
)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_files(folder: Path, m: dict) -> str:
    files = m.get("files")
    if not isinstance(files, dict) or not files:
        raise Mismatch("the manifest lists no files")
    problems = []
    for name, info in files.items():
        if not isinstance(name, str) or ("/" in name and not is_part(name)
                                         and not is_values_document(name)) or "\\" in name \
                or name in ("", ".", ".."):
            problems.append(f"{name!r} is not a plain file name")
            continue
        path = folder / name
        if kind := not_regular(path):
            problems.append(f"{name} is {kind}, not a regular file: not read")
        elif not path.is_file():
            problems.append(f"{name} missing")
        elif path.stat().st_size != info.get("bytes"):
            problems.append(f"{name} has {path.stat().st_size} bytes, manifest says "
                            f"{info.get('bytes')}")
        elif _sha256(path) != info.get("sha256"):
            problems.append(f"{name} sha256 differs from the manifest")
    extra = sorted(p.name for p in folder.iterdir() if p.name not in files and p.name != MANIFEST
                   and p.name not in PARTS_FOLDERS and p.name != VALUES_FOLDER)
    extra += unlisted_parts(folder, files)
    if extra:
        problems.append(f"files not in the manifest: {extra}")
    odd = [f"{name} ({kind})" for name in extra if (kind := not_regular(folder / name))]
    if odd:
        problems.append(f"not regular files, not read: {', '.join(odd)}")
    required = ((SYNTHETIC_PARQUET, SYNTHETIC_CSV, CONFIG) if _synthetic(m)
                else (CONFIG,) if listed_parts(m) else ("tracts.parquet", CONFIG))
    for required in required:
        if required not in files:
            problems.append(f"{required} is not listed")
    if problems:
        raise Mismatch("; ".join(problems))
    return f"{len(files)} files match their sha256 and size; no other files"


def _json_object(path: Path, name: str, error: type[Exception],
                 limit: int = MAX_MANIFEST_BYTES) -> dict:
    """The JSON object in ``path``; ``error`` (with ``name`` in the message) if there is none,
    if the file is over ``limit`` bytes (refused before reading) or nests too deeply."""
    try:
        size = readable(path).stat().st_size
        if size > limit:
            raise error(f"{name} is {size:,} bytes, over the {limit:,} this audit reads")
        with open(path, "rb") as fh:
            # its size, not the limit: read(n) sets n bytes aside before it reads
            raw = fh.read(size + 1)
        if len(raw) > limit:
            raise error(f"{name} grew past the {limit:,} bytes this audit reads")
        obj = json.loads(raw)
    except (OSError, ValueError) as err:
        raise error(f"{name} cannot be read: {err}") from None
    except RecursionError:
        raise error(f"{name} nests too deeply to read") from None
    if json_depth_exceeds(obj, MAX_JSON_DEPTH):
        raise error(f"{name} nests deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(obj, dict):
        raise error(f"{name} is not a JSON object")
    return obj


def _config(folder: Path) -> dict:
    return _json_object(folder / CONFIG, CONFIG, Mismatch)


def check_config(folder: Path, m: dict) -> str:
    cfg = _config(folder)
    budget, sel = m["budget"], m["selection"]
    problems = []

    def same(label, a, b):
        equal = close(float(a), float(b)) if isinstance(a, (int, float)) and isinstance(
            b, (int, float)) and not isinstance(a, bool) else a == b
        if not equal:
            problems.append(f"{label}: config {a!r} != manifest {b!r}")

    privacy, selection = cfg["privacy"], cfg["selection"]
    same("privacy.epsilon_per_tract", privacy["epsilon_per_tract"], budget["epsilon_available"])
    same("privacy.delta", privacy["delta"], budget["delta_available"])
    same("privacy.unit", privacy["unit"], m["privacy_unit"])
    same("privacy.neighbouring", privacy["neighbouring"], m["neighbouring_relation"])
    same("selection.rule", selection["rule"], sel["rule"])
    if selection["rule"] in ("dp", "banded"):
        same("selection.budget_share", selection["budget_share"], sel["budget_share"])
    if selection.get("threshold") is not None:
        same("selection.threshold", selection["threshold"], sel["threshold"])
    same("profile.name", cfg["profile"]["name"], m["profile"])
    suite = sorted(s["estimator"] for s in budget["steps"] if s.get("estimator"))
    if cfg["profile"]["name"] == "full-suite":
        same("profile.suite", sorted(cfg["profile"]["suite"]), suite)
    elif suite:
        problems.append(f"profile primary but the budget has suite steps {suite}")
    same("publish.mode", cfg["publish"]["mode"], m["mode"])
    if "min_n" in m:
        same("publish.min_n", cfg["publish"]["min_n"], m["min_n"])
    same("boundaries.vintage", cfg["boundaries"].get("vintage") or "unstated",
         m["boundaries"]["vintage"])
    same("boundaries.path", cfg["boundaries"]["path"], m["boundaries"]["file"])
    if m.get("ledger_entry"):
        same("ledger.dataset", cfg["ledger"]["dataset"], m["ledger_entry"].get("dataset"))
    if cfg["validation"]["policy"] == "drop" and not any(
            "dropped rows" in a for a in m["assumptions"]["unverified"]):
        problems.append("validation.policy is drop but the assumptions do not say n excludes "
                        "dropped rows")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"config.json agrees with the manifest (epsilon {budget['epsilon_available']}"
            f", delta available {budget['delta_available']}, rule {sel['rule']}, profile "
            f"{m['profile']}, mode {m['mode']})")


def check_mode(folder: Path, m: dict) -> str:
    mode, bits = m.get("mode"), m.get("noise_sampler", {}).get("random_bits")
    if mode not in ("public", "test"):
        raise Mismatch(f"mode {mode!r} is neither public nor test")
    mixed = isinstance(bits, str) and bits.startswith(RANDOM_BITS_MIXED)  # from the draw log
    if bits not in RANDOM_BITS and not mixed:
        raise Mismatch(f"random_bits {bits!r} is not one of {list(RANDOM_BITS)}")
    if mode == "public" and bits != "os.urandom":
        raise Mismatch("a public release with seeded noise")
    return f"mode {mode}, random bits {bits}"


def json_depth_exceeds(obj, limit: int) -> bool:
    """Whether ``obj`` nests deeper than ``limit`` (iteratively: no recursion to exhaust)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                   else item))
    return False


# --- hostile files (issue 31, O10): nothing but a regular file within its recorded size is
# ever opened


class NotRead(Mismatch, OSError):
    """A file the audit will not open: not a regular file (a symlink, FIFO, socket, device or
    folder), or larger than the manifest says it is. An OSError too, so every reader's
    ``except OSError`` reports it as that file's finding."""


# The audit under way (set by audit_release): its folder and each listed file's recorded
# size, so no reader reads a file far past what the manifest says it holds. A file edited
# without re-hashing is still read (one report names every problem) up to twice its recorded
# size plus READ_SLACK; a sparse file of terabytes named tracts.pmtiles is not.
_LISTED_SIZES: ContextVar[tuple[Path, dict] | None] = ContextVar("_LISTED_SIZES", default=None)
READ_SLACK = 1 << 20


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it is there but not a regular file (lstat: a symlink is named as
    one, never followed), else None."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)!r}"
        except OSError:
            return "a symbolic link"
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a folder" if stat.S_ISDIR(mode) else "not a regular file")


def _read_limit(path: Path) -> tuple[int, str] | None:
    """The most bytes the audit under way reads of ``path`` and why (None: no limit here)."""
    listed = _LISTED_SIZES.get()
    if listed is None or path.name == MANIFEST or listed[0] not in path.parents:
        return None
    recorded = listed[1].get(path.relative_to(listed[0]).as_posix())
    if isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 0:
        return 0, "not listed in the manifest with its size"
    return 2 * recorded + READ_SLACK, f"the manifest records {recorded:,}"


def readable(path: Path) -> Path:
    """``path``, once it is known to be a regular file within its read limit; NotRead (naming
    it) otherwise, before anything opens it. A missing file is left to its reader to report."""
    path = Path(path)
    kind = not_regular(path)
    if kind:
        raise NotRead(f"{path.name} is {kind}, not a regular file: not read")
    limit = _read_limit(path)
    if limit is not None:
        try:
            size = os.lstat(path).st_size
        except FileNotFoundError:
            return path
        if size > limit[0]:
            raise NotRead(f"{path.name} is {size:,} bytes ({limit[1]}): not read")
    return path


@contextlib.contextmanager
def _reading_limited_to(folder: Path, m: dict):
    """Within: every read of a file of ``folder`` limited by the manifest's recorded size."""
    files = m.get("files") if isinstance(m.get("files"), dict) else {}
    sizes = {name: info.get("bytes") for name, info in files.items() if isinstance(info, dict)}
    token = _LISTED_SIZES.set((folder, sizes))
    try:
        yield
    finally:
        _LISTED_SIZES.reset(token)
