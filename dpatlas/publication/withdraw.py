"""Withdraw a published release everywhere: the ledger, then the feed, each step idempotent.

Everything is checked before anything is written (the id, the reason, the ledger row, the feed,
the release folder if the feed does not list it yet). Then the ledger is written first and the
feed second:

- the ledger is the record the budget's owner reads, and withdrawing there also stops any
  resume of the id at once;
- the feed write is a file write that can fail on its own (disk full, permissions): rerunning
  the same withdrawal completes it, because both steps are idempotent and a rerun takes the
  reason and time already recorded (the first withdrawal's), so ledger and feed end up agreeing
  whichever step a crash interrupted, and even if the feed was withdrawn first by hand.
"""

from __future__ import annotations

import os
from pathlib import Path

from dpatlas.publication import feed as feed_mod
from dpatlas.publication.feed import FeedError
from dpatlas.core.ids import InvalidReason, validate_reason, validate_release_id
from dpatlas.ledger import Ledger, LedgerError, display_text

__all__ = ["withdraw_everywhere", "WithdrawIncomplete"]


class WithdrawIncomplete(FeedError):
    """The ledger has the release withdrawn but the feed write failed: run the withdraw again."""


def _valid(reason) -> str | None:
    """A reason recorded earlier, if it is still a valid one (older versions stored anything)."""
    try:
        return validate_reason(reason)
    except InvalidReason:
        return None


def withdraw_everywhere(ledger: Ledger, root: Path, release_id: str, reason: str) -> dict:
    """Withdraw ``release_id`` in ``ledger`` and in the feed at ``root``; idempotent.

    Returns ``{"release_id", "reason", "withdrawn_at", "ledger_changed", "feed_changed",
    "latest", "message"}``: the reason and time recorded (the first withdrawal's, on a rerun),
    whether each side changed (``feed_changed`` None: the feed does not list the release and
    its folder is absent, so there is nothing to withdraw there), the feed's ``latest`` after,
    and a one-line message for the operator.

    Raises before writing anything: ``InvalidReleaseId`` / ``InvalidReason``, ``LedgerError``
    (not in this ledger, not published), ``FeedError`` (no publish root, unreadable feed, an
    unlisted folder that does not match its manifest). Raises :class:`WithdrawIncomplete` if
    the feed write fails after the ledger's: running the same call again completes it.
    """
    rid = validate_release_id(release_id)
    why = validate_reason(reason, "withdrawal reason")
    root = Path(root)
    # The ledger first: a release in progress has no publish root yet, and blaming the
    # config for that misled the operator.
    row = ledger.release(rid)
    if row is None:
        raise LedgerError(f"no release {rid} in the ledger at {ledger.url}: nothing to withdraw "
                          "(is this the release's config?)")
    if row["status"] == "in_progress":
        raise LedgerError(f"release {rid} is in progress in the ledger at {ledger.url} (its run "
                          "has not finished, or was interrupted: rerunning the same id "
                          "finishes it): only a published release can be withdrawn")
    if row["status"] not in ("published", "withdrawn"):
        raise LedgerError(f"release {rid} is {row['status']} in the ledger at {ledger.url}, not "
                          "published: only a published release can be withdrawn")
    if not root.is_dir():
        raise FeedError(f"publish root {root} does not exist: is this the release's config?")
    if feed_mod.feed_damage(root) is not None:  # updated as it is, it would lose releases
        feed_mod.rebuild_feed(root, ledger.release)
    entry = feed_mod.listed(root, rid)  # also proves feed.json readable before any write
    unlisted = entry is None and os.path.lexists(root / rid)
    if unlisted:
        feed_mod.verify_release(root, rid)  # FeedError now, rather than after the ledger write

    # The first recorded withdrawal wins, so that a rerun makes both sides agree.
    if row["status"] == "withdrawn":
        why = _valid(row["reason"]) or why
    elif entry is not None and entry.get("status") == feed_mod.STATUS_WITHDRAWN:
        why = _valid(entry.get("withdrawn_reason")) or why

    done = ledger.withdraw_release(rid, why)
    feed_changed, latest = None, None
    if entry is not None or unlisted:
        try:
            out = feed_mod.withdraw(root, rid, done["reason"] if _valid(done["reason"]) else why,
                                    withdrawn_at=done["withdrawn_at"], list_unlisted=unlisted)
        except (OSError, FeedError) as e:
            raise WithdrawIncomplete(
                f"release {rid} is withdrawn in the ledger, but updating the feed at {root} "
                f"failed ({e}); run the same withdraw again to complete it") from e
        feed_changed = out["changed"]
        latest = feed_mod.read_feed(root).get("latest")
    return {"release_id": rid, "reason": done["reason"], "withdrawn_at": done["withdrawn_at"],
            "ledger_changed": done["changed"], "feed_changed": feed_changed, "latest": latest,
            "message": _message(rid, root, done, feed_changed, latest)}


def _message(rid: str, root: Path, done: dict, feed_changed: bool | None,
             latest: str | None) -> str:
    reason = display_text(done["reason"])
    if feed_changed is None:
        feed_part = f"the feed at {root} does not list it and has no folder for it"
    elif feed_changed:
        feed_part = f"the feed now shows it withdrawn (latest: {latest or 'none'})"
    else:
        feed_part = "the feed already showed it withdrawn"
    if done["changed"]:
        return f"withdrew release {rid} in the ledger; {feed_part}. Reason: {reason}"
    if feed_changed:
        return (f"release {rid} was already withdrawn in the ledger ({done['withdrawn_at']}); "
                f"{feed_part}. Reason: {reason}")
    return (f"release {rid} was already withdrawn ({done['withdrawn_at']}); {feed_part}; "
            f"nothing changed. Reason: {reason}")
