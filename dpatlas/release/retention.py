"""Retention of a release's internal folder: ``dpatlas purge``.

Every release keeps, in ``<internal root>/<release id>``, the files a resume needs and the
records of what it did. Two of its folders hold person-level records of the confidential
input: ``staged/`` (the validated copy of every input partition) and ``quarantine/`` (the rows
validation or the contribution check set aside). Once a release is published (or withdrawn
after that) the ledger says it is final: a rerun of its id is a no-op that reads nothing of its
internal folder, so those copies serve no release any more and are removed after
``publish.internal_retention_days``.

What is never removed: anything of a release the ledger does not list as published or
withdrawn (in progress, failed, or never charged): resuming it needs its staged input and its
draws. Nor the rest of a final release's internal folder (the draw log and draws, the selection
and results, ``validation.json``, the input commitment key an auditor may be shown, the
Great Expectations reports): they hold no person-level rows.

A release run with ``staging_url`` (Dask workers on other machines) also copied its staged
input to ``<staging_url>/<release id>/staged/``: the purge removes that copy with the rest,
through the same URL (a local folder or object storage). It looks under the staging URL the
config names when the purge runs: a release staged under another URL is purged there by a
config that names it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from dpatlas.core.ids import InvalidReleaseId, validate_release_id

__all__ = ["PERSON_LEVEL_FOLDERS", "PurgeItem", "plan_purge", "purge"]

# The folders of a release's internal folder that hold person-level records.
PERSON_LEVEL_FOLDERS = ("staged", "quarantine")
# Final statuses in the ledger: a release in one of them never runs again.
_FINAL = ("published", "withdrawn")


@dataclass(frozen=True)
class PurgeItem:
    """One release's person-level files: removed (``kept_because`` None) or kept, and why."""

    release_id: str
    folder: Path  # the release's internal folder
    status: str
    age_days: Optional[float]
    files: tuple[Path | str, ...]  # local paths, and URLs of the staged copy (staging_url)
    size: int
    kept_because: Optional[str] = None
    staged_copy: Optional[str] = None  # <staging_url>/<id>/staged, when it holds files

    @property
    def removed(self) -> bool:
        return self.kept_because is None


def _person_level_files(folder: Path) -> list[Path]:
    return sorted(p for name in PERSON_LEVEL_FOLDERS if (folder / name).is_dir()
                  for p in (folder / name).rglob("*") if p.is_file())


def _age_days(row: dict, now: datetime) -> Optional[float]:
    """Days since the release was published (a withdrawn one was published first)."""
    when = row.get("published_at") or row.get("withdrawn_at")
    if not when:
        return None
    return (now - datetime.fromisoformat(when)).total_seconds() / 86400


def _release_folders(internal_root: Path) -> list[tuple[str, Path]]:
    """The internal root's release folders (other names, e.g. ``logs``, are not releases)."""
    if not internal_root.is_dir():
        return []
    out = []
    for folder in sorted(p for p in internal_root.iterdir() if p.is_dir()):
        try:
            out.append((validate_release_id(folder.name), folder))
        except InvalidReleaseId:
            continue
    return out


def _linked(folder: Path) -> Optional[str]:
    """Why a release folder is never purged by following a link: it, or one of its
    person-level folders, is a symbolic link (removing through it would remove files outside
    the internal root; shutil.rmtree refused it and stopped the purge half-done, naming
    nothing). None: no link."""
    for path in (folder, *(folder / name for name in PERSON_LEVEL_FOLDERS)):
        if path.is_symlink():
            return (f"{path} is a symbolic link (to {path.readlink()}): not followed; remove "
                    "the link, or what it points to, by hand")
    return None


def _why_kept(row: Optional[dict], age: Optional[float], older_than_days: float) -> Optional[str]:
    if row is None:
        return ("not in the ledger (never charged): a run of this id resumes from it; delete "
                "the folder by hand if the release is abandoned")
    if row["status"] not in _FINAL:
        return (f"{row['status']}: unfinished, its resume needs the staged input "
                "(publish it, or delete the folder by hand once it is abandoned)")
    if age is None or age < older_than_days:
        return f"{row['status']} less than {older_than_days:g} day(s) ago"
    return None


def _staged_copy(staging_url: Optional[str], rid: str) -> tuple[Optional[str], dict[str, int]]:
    """The release's staged copy under ``staging_url`` and its files (none without one)."""
    if not staging_url:
        return None, {}
    from dpatlas.release import staging

    url = staging.join(staging.release_location(staging_url, rid), "staged")
    files = staging.list_files(url)
    return (url if files else None), files


def plan_purge(internal_root: Path, ledger, older_than_days: float,
               now: Optional[datetime] = None,
               staging_url: Optional[str] = None) -> list[PurgeItem]:
    """What a purge removes, and what it keeps with why: every release folder of
    ``internal_root`` that still holds person-level files, here or in its staged copy under
    ``staging_url``. ``ledger`` answers ``release(id) -> dict | None``
    (:class:`dpatlas.ledger.Ledger`)."""
    if older_than_days < 0:
        raise ValueError(f"older than {older_than_days:g} days: give 0 or more days")
    now = now or datetime.now(timezone.utc)
    items = []
    for rid, folder in _release_folders(Path(internal_root)):
        files = _person_level_files(folder)
        copy, copied = _staged_copy(staging_url, rid)
        if not files and not copied:
            continue  # nothing person-level left (purged before, or never staged)
        row = ledger.release(rid)
        age = _age_days(row, now) if row is not None and row["status"] in _FINAL else None
        items.append(PurgeItem(rid, folder, row["status"] if row else "not in the ledger", age,
                               (*files, *copied),
                               sum(p.stat().st_size for p in files) + sum(copied.values()),
                               _linked(folder) or _why_kept(row, age, older_than_days), copy))
    return items


def purge(items: list[PurgeItem]) -> None:
    """Remove the person-level folders of the releases ``plan_purge`` marked removed."""
    for item in items:
        if not item.removed:
            continue
        if _linked(item.folder) is not None:  # linked since it was planned: never followed
            continue
        for name in PERSON_LEVEL_FOLDERS:
            if (item.folder / name).is_dir():
                shutil.rmtree(item.folder / name)
        if item.staged_copy is not None:
            from dpatlas.release import staging

            staging.remove_tree(item.staged_copy)
