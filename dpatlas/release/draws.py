"""Draw once: the one checkpoint a release resumes from, ``draws.jsonl`` in its internal folder.

The log is append-only. Its first line is the header: the release id, the sha256 of its config
and of its input, when the release first began (the manifest states that start), the protocol
of its draws, and, from the charge on, the budget plan the release is charged for with its
sha256 and the code version that recorded it. Every later line records one completed noise
draw: its stage (``select``, ``estimate``, ``levels``), its chunk, the file it was persisted to
(relative to the internal folder) with that file's sha256, its noise source, and when.

The rule behind the order: a draw nothing has read yet may be drawn again (noise that no one
has seen leaks nothing); a draw that anything downstream may have read (a later stage's input,
a published file) is never replaced. So each draw is, in this order (:func:`draw_once`):

1. drawn, and written under its pending name ``<chunk>.parquet.unrecorded`` (written under a
   temporary name and renamed into place: ``dpatlas.core.files``);
2. recorded: one line appended in one ``write``, then fsync'd;
3. renamed to its own name ``<chunk>.parquet``;
4. only then handed downstream: the tasks pass on the path :func:`draw_once` returns, so a
   later stage reads only recorded draws.

What a resume finds after a crash at each point (tests/unit/release/test_draws.py):

- before 1 completes: no file (at most a stray temporary one): the draw is made afresh;
- between 1 and 2 (crash point ``before-record-<stage>-<chunk>``): a pending file the log does
  not record, which nothing has read: it is drawn again, over that file, and the log says so;
- during 2: a torn last line (no newline): it is reported and cut off when the log is opened,
  and the draw is made again as above;
- between 2 and 3: a recorded draw still under its pending name: renamed (its sha256 checked)
  and reused;
- after 3: the recorded draw is reused when its file still has the recorded sha256. A
  recorded file that is missing or differs (tampering, disk loss) stops the release with
  :class:`PersistedDrawChanged`, naming the file: it is never drawn again, since what was
  drawn may already have been read downstream.

Draw once does not rest on this file alone (issue 31, O5), since an operator can delete or cut
it:

- deleted: the ledger knows the release was charged; a charged release (in progress or failed
  in the ledger) whose internal folder holds no log is refused (:class:`DrawLogMissing`),
  never drawn afresh;
- cut (lines lost, header intact): a draw file under its own name exists only once its line was
  written (step 3 after step 2), so a ``<chunk>.parquet`` the log does not record means lines
  were lost: the resume is refused when the log is opened, before anything is drawn;
- past publish: the published folder is there; every draw it needs must be recorded
  (:meth:`DrawLog.require_recorded`), else the resume is refused: published values are never
  drawn again.

What is left: a draw made on a worker into the staging URL is persisted there under its own
name before the flow records it, so a cut log redraws such draws as long as nothing was
published; and whoever deletes both lines and their files before publish gets those (never
published) draws drawn again.

The plan (issue 31, item 1): at the charge the flow records the plan in the header
(:meth:`DrawLog.settle_plan`) and in the ledger. A resume whose plan differs from the header's
is refused with :class:`~dpatlas.core.plan_record.PlanChanged` once a draw is recorded (while
none is, nothing was drawn under the old plan and the header takes the new one; the ledger
still compares it with what was charged). A header written before plans were recorded has none
to compare: the ledger's charges per step and cell are compared instead.

The draw layout (issue 35): a draw is recorded under its task's name, and a task's records
follow from how the code groups them (chunks, cell groups, level tasks). The header records
that layout beside the plan, and a resume whose draws would be grouped otherwise (a version
that groups them differently, landed mid-release) is refused with :class:`DrawLayoutChanged`
once a draw is recorded. A header written before layouts were recorded is checked as far as
it can be: every draw it records must be one of the resume's tasks by name.

The header replaces the previous version's ``state.json``: a resume whose config or input
differs is refused with :class:`~dpatlas.release.run_state.InputChanged`. A release begun by
that version (``state.json`` and no log) is migrated when it resumes: its header is taken from
``state.json``, and its persisted selections and estimates, complete by their atomic rename
and perhaps already read, are recorded as draws with their present sha256. A header without a
``protocol`` (written before pending names) keeps its old rule: a file under its own name that
the log does not record is drawn again.

The chunks of one run draw in parallel (threads, or Dask worker processes), so an append holds
an exclusive ``flock`` on the log; other runs of the release are kept out by the ReleaseLock.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections import Counter
from pathlib import Path
from typing import Callable, Iterable, Optional

from dpatlas.core.errors import OperatorError
from dpatlas.core.plan_record import PlanChanged, describe_changes, plan_changes, plan_sha256
from dpatlas.core.files import now_utc, write_bytes_atomic, write_parquet_atomic
from dpatlas.core.hashing import sha256_file
from dpatlas.release import staging
from dpatlas.release.crash import crashpoint
from dpatlas.release.run_state import InputChanged

__all__ = ["DRAWS_FILE", "DrawLayoutChanged", "DrawLog", "DrawLogMissing", "PersistedDrawChanged",
           "draw_once", "noise_source"]

DRAWS_FILE = "draws.jsonl"
# 2: a draw stays under its pending name until its line is written (module doc); a header
# without "protocol" was written before, by the rule that a file may be unrecorded.
DRAW_PROTOCOL = 2
PENDING_SUFFIX = ".unrecorded"
LEGACY_STATE_FILE = "state.json"  # the run state of the version before the log
# Where each stage persists its draws (flows/release.py), for migrating a legacy release.
STAGE_FOLDERS = {"select": "selection", "estimate": "results", "levels": "levels"}


def draw_path(internal: Path, stage: str, name: str) -> Path:
    """Where the draw of (``stage``, ``name``) is persisted in the internal folder."""
    return Path(internal) / STAGE_FOLDERS[stage] / f"{name}.parquet"


Say = Callable[[str], None]
_log = logging.getLogger(__name__)


class PersistedDrawChanged(RuntimeError, OperatorError):
    """A recorded noise draw's file is missing or differs from what was recorded (tampering or
    disk loss), or the log itself is damaged. Never redrawn: it may have been read downstream."""


class DrawLayoutChanged(PlanChanged):
    """A resumed release's noise draws would be grouped into other tasks than the recorded
    ones (another version's grouping): some records' noise would be drawn again, or a draw
    reused for records it was not drawn for."""


class DrawLogMissing(PersistedDrawChanged):
    """The ledger charged this release, but its internal folder holds no draw log: whatever
    was drawn is no longer known, so nothing may be drawn afresh."""


def noise_source(seed: Optional[int]) -> str:
    """How a draw's noise was made, as the log records it."""
    return "os.urandom" if seed is None else f"seeded {seed} (test only)"


class DrawLog:
    """The draws of one release, in ``<internal>/draws.jsonl``."""

    def __init__(self, internal: Path):
        self.internal = Path(internal)
        self.path = self.internal / DRAWS_FILE
        self._protocol: Optional[int] = None  # the header's, read once: it never changes

    # -- opening: the header ------------------------------------------------------------

    @classmethod
    def open(cls, internal: Path, release_id: str, config_sha256: str, input_sha256: str,
             clock: Callable[[], str] = now_utc, say: Say = _log.warning,
             charged: bool = False, earlier_config_sha256: Optional[str] = None) -> dict:
        """Begin the log, or check a resumed one against this run's config and input (raises
        InputChanged); returns its header. Migrates a legacy ``state.json`` release first.

        ``charged``: the ledger holds this release's charge (in progress or failed): a missing
        log is then refused (:class:`DrawLogMissing`) instead of begun afresh.
        ``earlier_config_sha256``: the same config's fingerprint as earlier versions computed
        it, which a release they began (log or ``state.json``) holds; a resume uses the
        header's, which the ledger compares too."""
        log = cls(internal)
        legacy = log.internal / LEGACY_STATE_FILE
        if log.path.exists():
            legacy.unlink(missing_ok=True)  # left by a migration a crash interrupted
            log._cut_torn_tail(say)
            header = log.header()
        elif legacy.exists():
            header = log._migrate(legacy, release_id, clock, say)
        elif charged:
            raise DrawLogMissing(
                f"release {release_id} was charged in the ledger but {log.path} is missing: "
                "the log of its noise draws says which were made, and without it none may be "
                "drawn again; restore the log (and the internal folder) from a backup and run "
                f"again to resume, or start a new release id (the budget charged for "
                f"{release_id} stays spent)")
        else:
            log._refuse_unrecorded(set())  # draw files and no log: refused before writing one
            header = log._begin(release_id, config_sha256, input_sha256, clock())
        log._check_same(header, config_sha256, input_sha256, earlier_config_sha256)
        if log._pending_rule(header):
            log._refuse_unrecorded(set(log.draws()))
        return header

    def _begin(self, release_id: str, config_sha256: str, input_sha256: str, started: str,
               draws: tuple[dict, ...] = ()) -> dict:
        header = {"release_id": release_id, "config_sha256": config_sha256,
                  "input_sha256": input_sha256, "started": started, "protocol": DRAW_PROTOCOL}
        self._write(header, draws)
        return header

    def _write(self, header: dict, draws: tuple[dict, ...] = ()) -> None:
        text = "".join(json.dumps(line, sort_keys=True) + "\n" for line in (header, *draws))
        write_bytes_atomic(self.path, text.encode(), private=True)  # the header appears whole or not at all

    def _pending_rule(self, header: Optional[dict] = None) -> bool:
        """Whether this log's draws keep their pending name until recorded (protocol 2)."""
        if header is not None:
            return header.get("protocol", 1) >= DRAW_PROTOCOL
        if self._protocol is None:  # each draw asks: the log is not read again for it
            self._protocol = self.header().get("protocol", 1)
        return self._protocol >= DRAW_PROTOCOL

    def _refuse_unrecorded(self, recorded: set[tuple[str, str]]) -> None:
        """A draw file under its own name that the log does not record: its line was lost
        (the log was cut or replaced), since a draw takes its name only once recorded."""
        lost = sorted(f"{folder}/{f.name}" for stage, folder in STAGE_FOLDERS.items()
                      for f in (self.internal / folder).glob("*.parquet")
                      if (stage, f.stem) not in recorded)
        if lost:
            raise PersistedDrawChanged(
                f"{self.path} does not record {len(lost)} persisted noise draw(s) "
                f"({', '.join(lost[:3])}{', ...' if len(lost) > 3 else ''}): a draw takes that "
                "name only once its line is written, so lines were cut from the log; a "
                "recorded draw may already have been read downstream and is never drawn "
                "again: restore the log from a backup and run again to resume, or start a "
                f"new release id (the budget charged for {self.internal.name} stays spent)")

    # -- the plan --------------------------------------------------------------------------

    def settle_plan(self, entry: dict, layout: dict, say: Say = _log.warning) -> None:
        """At the charge: the header's plan must be ``entry``'s (``plan_record.plan_entry``)
        and its draw layout ``layout``'s (``plan_record.draw_layout``) once a draw is
        recorded (raises PlanChanged or DrawLayoutChanged, naming what changed, and writes
        nothing); while none is, the header takes ``entry``'s plan and code version and the
        layout."""
        header, *draws = self.lines()
        same_plan = header.get("plan_sha256") == entry["plan_sha256"]
        if draws:
            if not same_plan and "plan" in header:
                changes = plan_changes(header["plan"], entry["plan"])
                raise PlanChanged(
                    f"release {self.internal.name} drew noise under another budget plan than "
                    f"this run's ({describe_changes(changes)}): resuming would mix the two and "
                    f"spend more than was charged; {self._finish_with(header)}", changes)
            # the code version may differ: it is recorded, not compared; a header from
            # before plans were recorded leaves the plan to the ledger, which compares charges
            self._check_layout(header, layout, draws)
            return
        layout_sha256 = plan_sha256(layout)
        if same_plan and header.get("draw_layout_sha256") == layout_sha256:
            return
        if "plan" in header and not same_plan:
            say(f"release {self.internal.name}: no draw was made under the plan its log "
                "recorded; it now records this run's plan")
        self._write({**header, "plan": entry["plan"], "plan_sha256": entry["plan_sha256"],
                     "code_version": entry["code_version"], "draw_layout": layout,
                     "draw_layout_sha256": layout_sha256})

    def _check_layout(self, header: dict, layout: dict, draws: list[dict]) -> None:
        """A resume's draws must be grouped as the recorded ones were: the same task names over
        the same records. A header from before layouts were recorded is checked as far as it
        can be: every recorded draw's name must be one of this run's tasks."""
        if "draw_layout" in header:
            if header.get("draw_layout_sha256") == plan_sha256(layout):
                return
            changes = plan_changes(_by_name(header["draw_layout"]), _by_name(layout))
            if not changes:
                changes = ["the order of the tasks (which seeds them in test mode)"]
            raise DrawLayoutChanged(
                f"release {self.internal.name} recorded noise draws grouped into other tasks "
                f"than this run's ({describe_changes(changes)}): a task's draw is recorded "
                "under its name, so resuming would draw some records' noise again or reuse a "
                f"draw for other records; {self._finish_with(header)}", changes)
        tasks = ({("select", c[0]) for c in layout["chunks"]}
                 | {("estimate", c[0]) for c in layout["chunks"]}
                 | {("levels", u[0]) for u in layout["levels"]})
        strays = sorted({f"{d['stage']} {d['chunk']}" for d in draws
                         if (d["stage"], d["chunk"]) not in tasks})
        if strays:
            changes = [f"{name}: recorded, not a task of this run" for name in strays]
            raise DrawLayoutChanged(
                f"release {self.internal.name} recorded noise draws this run has no task for "
                f"({describe_changes(changes)}): the code groups the draws otherwise than the "
                f"version that drew them; {self._finish_with(header)}", changes)

    def _finish_with(self, header: dict) -> str:
        began = header.get("code_version") or {}
        return (f"finish it with the version that began it (dpatlas "
                f"{began.get('package', '?')}, git {began.get('git_commit') or 'unknown'}) or "
                "start a new release id (nothing was drawn or published by this run)")

    def _check_same(self, header: dict, config_sha256: str, input_sha256: str,
                    earlier_config_sha256: Optional[str] = None) -> None:
        now = {"input": {input_sha256}, "config": {config_sha256, earlier_config_sha256}}
        changed = [k for k in now if header.get(f"{k}_sha256") not in now[k]]
        if changed:
            what = " and ".join(changed)
            raise InputChanged(f"the {what} changed since release {self.internal.name} began; "
                               f"resume needs the same {what}: restore the original {what} to "
                               "resume it, or start a new release id", changed)

    def _migrate(self, legacy: Path, release_id: str, clock: Callable[[], str],
                 say: Say) -> dict:
        """A release begun by the version with ``state.json``: the same header, and its
        persisted draws (which that version may already have read) recorded as they are."""
        state = json.loads(legacy.read_text())
        draws = tuple(self._line(stage, file.stem, file, "unknown (recorded by migration)",
                                 clock())
                      for stage, folder in STAGE_FOLDERS.items()
                      for file in sorted((self.internal / folder).glob("*.parquet")))
        header = self._begin(release_id, state["config_sha256"], state["input_sha256"],
                             state.get("started") or clock(), draws)
        legacy.unlink()
        say(f"release {release_id}: migrated {LEGACY_STATE_FILE} to {DRAWS_FILE} "
            f"({len(draws)} persisted draw(s) recorded as they are)")
        return header

    def _cut_torn_tail(self, say: Say) -> None:
        """A crash while appending leaves a last line without its newline: that draw was never
        recorded (so never read); cut it off so the next append starts a line of its own."""
        data = self.path.read_bytes()
        if data.endswith(b"\n") or not data:
            return
        keep = data.rfind(b"\n") + 1
        with open(self.path, "r+b") as fh:
            fh.truncate(keep)
            os.fsync(fh.fileno())
        say(f"{self.path}: ignored a torn last line (an append a crash interrupted; its draw "
            f"was never recorded, so nothing read it): {data[keep:][:120]!r}")

    # -- reading ---------------------------------------------------------------------------

    def lines(self) -> list[dict]:
        """Every complete line, the header first; a torn last line is left out."""
        text = self.path.read_text()
        rows = text.split("\n")
        if rows[-1]:  # no newline after it: torn by a crash (cut off by open)
            _log.warning("%s: ignoring a torn last line", self.path)
        out = []
        for number, row in enumerate(rows[:-1], start=1):
            try:
                out.append(json.loads(row))
            except json.JSONDecodeError:
                raise PersistedDrawChanged(
                    f"{self.path} line {number} is not a record: the log of noise draws was "
                    "edited or damaged; restore it from a backup to resume, or start a new "
                    "release id") from None
        if not out:
            raise PersistedDrawChanged(f"{self.path} has no header: restore it from a backup "
                                       "to resume, or start a new release id")
        return out

    def header(self) -> dict:
        return self.lines()[0]

    def draws(self) -> dict[tuple[str, str], dict]:
        """The recorded draws by (stage, chunk)."""
        return {(d["stage"], d["chunk"]): d for d in self.lines()[1:]}

    def noise_sources(self) -> Counter:
        """How many recorded draws each noise source made (the manifest's random bits)."""
        return Counter(d.get("noise", "unknown") for d in self.draws().values())

    def require_recorded(self, needed: Iterable[tuple[str, str]], why: str) -> None:
        """Every (stage, chunk) in ``needed`` is recorded, else refused: nothing of them may
        be drawn now (``why``: e.g. the release is already published)."""
        missing = sorted(set(needed) - set(self.draws()))
        if missing:
            names = ", ".join(f"{stage} {chunk}" for stage, chunk in missing[:3])
            raise PersistedDrawChanged(
                f"{why}, but {self.path} does not record {len(missing)} of its noise draws "
                f"({names}{', ...' if len(missing) > 3 else ''}): they are never drawn again; "
                "restore the log from a backup and run again to resume")

    def reuse(self, stage: str, chunk: str) -> Optional[Path]:
        """The persisted file of this recorded draw, checked against its recorded sha256; None
        if the draw is not recorded. A recorded file missing or changed is refused."""
        draw = self.draws().get((stage, chunk))
        if draw is None:
            return None
        if "url" in draw:  # drawn on a worker into the staging location
            return self._reuse_url(draw)
        path = self.internal / draw["path"]
        pending = _pending(path)
        if not path.exists() and pending.exists() and sha256_file(pending) == draw["sha256"]:
            os.replace(pending, path)  # recorded, and a crash came before its rename
        if not path.exists():
            raise PersistedDrawChanged(self._changed(draw, path, "is missing"))
        if sha256_file(path) != draw["sha256"]:
            raise PersistedDrawChanged(self._changed(draw, path, "differs from the one recorded "
                                                                  f"(sha256 {draw['sha256']})"))
        return path

    def _reuse_url(self, draw: dict) -> str:
        url = draw["url"]
        try:
            digest = staging.sha256_url(url)
        except FileNotFoundError:
            raise PersistedDrawChanged(self._changed(draw, url, "is missing")) from None
        if digest != draw["sha256"]:
            raise PersistedDrawChanged(self._changed(draw, url, "differs from the one recorded "
                                                                f"(sha256 {draw['sha256']})"))
        return url

    def _changed(self, draw: dict, path: Path | str, how: str) -> str:
        name = str(path).rsplit("/", 1)[-1]
        return (f"the persisted {draw['stage']} draw of {draw['chunk']}, {path}, {how}: a "
                "recorded noise draw may already have been read downstream, so it is never "
                f"drawn again; restore {name} from a backup and run again to resume, or "
                f"start a new release id (the budget charged for {self.internal.name} stays "
                "spent)")

    # -- recording -------------------------------------------------------------------------

    def record(self, stage: str, chunk: str, path: Path, noise: str,
               clock: Callable[[], str] = now_utc, written: Optional[Path] = None) -> None:
        """Append the line of a draw whose file is in place (one write, fsync'd, under a lock);
        ``written``: where its bytes are now, when not yet at ``path`` (its pending name)."""
        line = json.dumps(self._line(stage, chunk, path, noise, clock(), written),
                          sort_keys=True) + "\n"
        self._append(line)

    def _append(self, line: str) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock

    def record_url(self, stage: str, chunk: str, url: str, sha256: str, noise: str,
                   clock: Callable[[], str] = now_utc) -> None:
        """Append the line of a draw a worker persisted at ``url`` (under the staging URL),
        with the sha256 of the bytes it wrote: recorded by the flow before any later stage is
        given it, so the order above holds wherever the draw was made."""
        line = {"stage": stage, "chunk": chunk, "noise": noise, "recorded": clock(),
                "url": url, "sha256": sha256}
        self._append(json.dumps(line, sort_keys=True) + "\n")

    def _line(self, stage: str, chunk: str, path: Path, noise: str, time: str,
              written: Optional[Path] = None) -> dict:
        return {"stage": stage, "chunk": chunk, "noise": noise, "recorded": time,
                "path": str(Path(path).relative_to(self.internal)),
                "sha256": sha256_file(written or path)}


def _by_name(layout: dict) -> dict:
    """A draw layout keyed by task name, so that a refusal names the tasks that changed."""
    return {"draw_layout_version": layout.get("draw_layout_version"),
            "chunks": {c[0]: {"geoids": c[1:3], "cells": c[3]} for c in layout["chunks"]},
            "levels": {u[0]: {"state": u[1], "cells": u[2]} for u in layout["levels"]}}


def _pending(out: Path) -> Path:
    """Where a draw persisted to ``out`` waits for its record (module doc)."""
    return out.with_name(out.name + PENDING_SUFFIX)


def draw_once(log: DrawLog, stage: str, chunk: str, out: Path, draw: Callable[[], object],
              noise: str, say: Say = _log.info) -> tuple[Path, object]:
    """The recorded draw of (stage, chunk): reused if recorded, else drawn by ``draw()`` (a
    data frame), persisted to ``out`` and recorded. Returns its path, and the frame when it was
    drawn now (None when reused)."""
    reused = log.reuse(stage, chunk)
    if reused is not None:
        say(f"{chunk}: reusing the recorded {stage} draw (no new noise)")
        return reused, None
    pending = _pending(out)
    if not log._pending_rule():  # a log begun before pending names: its old rule
        pending = out
    elif out.exists():  # named only once recorded: its line was cut from the log
        raise PersistedDrawChanged(log._changed({"stage": stage, "chunk": chunk}, out,
                                                "is not recorded in the log (lines were cut)"))
    if pending.exists():
        say(f"{chunk}: {pending.name} was persisted but never recorded (a crash came between), "
            "so nothing has read it: drawing it again")
    frame = draw()
    write_parquet_atomic(frame, pending, private=True)
    crashpoint(f"before-record-{stage}-{chunk}")
    log.record(stage, chunk, out, noise, written=pending)
    if pending != out:
        os.replace(pending, out)
    return out, frame
