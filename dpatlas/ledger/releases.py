"""A release's life in the ledger: charged and leased (:meth:`begin_release`, under the cap's
lock, with the plan it was charged under), resumed only under that plan, then published,
failed or withdrawn. Its charges stay whatever its end: noise may have been drawn."""

from __future__ import annotations

import json
import math

import sqlalchemy as sa

from dpatlas.core.plan_record import (PlanChanged, canonical_plan, describe_changes,
                                      plan_changes)
from dpatlas.ledger.caps import CAP_MATCH_TOL, CapOperations, within_cap
from dpatlas.ledger.charges import Charge, charge_rows
from dpatlas.ledger.errors import BudgetExceeded, LedgerError, ReleaseBusy
from dpatlas.ledger.formatting import (SET_CAP_COMMAND, display_text, fmt, iso_time, now_text,
                                       one_line)
from dpatlas.ledger.leases import LeaseOperations
from dpatlas.ledger.schema import caps_table, charges_table, plans_table, releases_table
from dpatlas.ledger.validation import (DEFAULT_LEASE_SECONDS, checked_dataset,
                                       checked_lease_seconds, checked_reason,
                                       checked_release_id, nonempty_text)

MAX_FAILURE_REASON = 500  # characters of a failure reason kept (they come from exceptions)


class ReleaseOperations(CapOperations, LeaseOperations):
    """Charging, resuming and ending releases."""

    def begin_release(self, release_id: str, dataset: str, charges: list[Charge],
                      config_sha256: str, owner: str,
                      lease_seconds: float = DEFAULT_LEASE_SECONDS,
                      expected_cap: tuple[float | None, float | None] | None = None,
                      plan: dict | None = None) -> str:
        """Record a release and its charges if the dataset's cap allows, and take its lease.

        Returns
        - "new": recorded and charged, ``owner`` holds the lease for ``lease_seconds``;
        - "resume": this id exists unfinished (in progress or failed) with the same config hash
          and dataset, and its lease had expired, was released, or already is ``owner``'s: no
          new charge; ``owner`` now holds the lease and resumes it;
        - "published": already completed: no new charge, no lease, nothing to do.

        ``expected_cap``: the cap the config states, if any ((eps, delta); None parts are not
        compared); checked when the release is charged (a resume charges nothing).

        ``plan``: the plan entry (``{"plan", "plan_sha256", "code_version"}``), recorded with a
        new charge; a resume whose plan is not the recorded one raises :class:`PlanChanged`
        naming what changed, and writes nothing (no attempt, no lease). A release charged
        before plans were recorded is compared by its charges (each step's and cell's type,
        ε, δ, ρ), and its plan recorded when they agree.

        Raises :class:`ReleaseBusy` (another owner's lease is live: the message names it and
        when it expires; or the ledger stayed locked past ``lock_timeout``),
        :class:`BudgetExceeded` (nothing written), :class:`LedgerError` (no cap: the message
        gives the command that sets one; the config's cap is not the ledger's; the id exists
        with another config hash or dataset, or was withdrawn; an invalid charge or id).
        """
        checked_release_id(release_id)
        checked_dataset(dataset)
        nonempty_text(config_sha256, "config_sha256")
        nonempty_text(owner, "owner")
        lease = checked_lease_seconds(lease_seconds)
        rows = charge_rows(release_id, charges)
        charge_eps = math.fsum(r["epsilon"] for r in rows)
        charge_delta = math.fsum(r["delta"] for r in rows)

        def attempt(conn: sa.Connection) -> str:
            c, r = caps_table.c, releases_table.c
            # Lock the dataset's cap row first (PostgreSQL: FOR UPDATE; SQLite holds the whole
            # database since BEGIN IMMEDIATE), then look at the release and the spend: every
            # insert of a charge of this dataset happens under this same lock.
            cap = conn.execute(sa.select(c.cap_epsilon, c.cap_delta).where(c.dataset == dataset)
                               .with_for_update()).first()
            row = conn.execute(self._release_select().where(r.release_id == release_id)
                               .with_for_update()).mappings().first()
            now = self._db_clock(conn)  # after the locks: a wait does not age it
            if row is not None:
                return self._existing(conn, row, dataset, config_sha256, owner, now, lease,
                                      plan, rows)
            if cap is None:
                raise LedgerError(
                    f"no lifetime budget cap is set for dataset {dataset!r} in the ledger at "
                    f"{self.url}, so release {release_id} cannot be charged: set one with "
                    f"`{SET_CAP_COMMAND.format(dataset=dataset)}`")
            self._check_expected_cap(dataset, cap, expected_cap)
            spent_eps, spent_delta, _ = self._spent(conn, dataset)
            after_eps, after_delta, _ = self._spent(conn, dataset, rows)
            if not (within_cap(after_eps, cap.cap_epsilon)
                    and within_cap(after_delta, cap.cap_delta)):
                left_eps = max(cap.cap_epsilon - spent_eps, 0.0)
                left_delta = max(cap.cap_delta - spent_delta, 0.0)
                raise BudgetExceeded(
                    f"release {release_id} would spend eps={fmt(charge_eps)} "
                    f"(delta={fmt(charge_delta)}) on dataset {dataset}: already spent "
                    f"eps={fmt(spent_eps)} of the lifetime cap {fmt(cap.cap_epsilon)} "
                    f"(delta {fmt(spent_delta)} of {fmt(cap.cap_delta)}); "
                    f"left eps={fmt(left_eps)} (delta {fmt(left_delta)})",
                    release_id=release_id, dataset=dataset, spent_epsilon=spent_eps,
                    spent_delta=spent_delta, charge_epsilon=charge_eps,
                    charge_delta=charge_delta, cap_epsilon=cap.cap_epsilon,
                    cap_delta=cap.cap_delta)
            if self.after_cap_check is not None:
                self.after_cap_check()
            stamp = now_text()
            conn.execute(releases_table.insert().values(
                release_id=release_id, dataset=dataset, status="in_progress", owner=owner,
                config_sha256=config_sha256, manifest_sha256=None, reason=None, attempts=1,
                created_at=stamp, updated_at=stamp, published_at=None, withdrawn_at=None,
                lease_owner=owner, lease_expires=now + lease))
            conn.execute(charges_table.insert(),
                         [{**x, "release_id": release_id, "charged_at": stamp} for x in rows])
            if plan is not None:
                self._record_plan(conn, release_id, plan, "charge")
            return "new"

        return self._run_write(attempt, f"release {release_id}")

    def _existing(self, conn: sa.Connection, row, dataset: str, config_sha256: str,
                  owner: str, now: float, lease: float, plan: dict | None = None,
                  rows: list[dict] = ()) -> str:
        rid = row["release_id"]
        if row["dataset"] != dataset:
            raise LedgerError(f"release {rid} exists for dataset {row['dataset']!r}, "
                              f"not {dataset!r}: use a new release id")
        if row["config_sha256"] != config_sha256:
            raise LedgerError(
                f"release {rid} exists with another configuration (config sha256 "
                f"{row['config_sha256'][:12]}..., this run {config_sha256[:12]}...): a release "
                f"id is resumed only with its own configuration; use a new release id")
        if row["status"] == "published":
            return "published"
        if row["status"] == "withdrawn":
            raise LedgerError(f"release {rid} was withdrawn ({display_text(row['reason'])}): its "
                              "budget stays spent and it cannot be resumed; use a new release id")
        holder, expires = row.get("lease_owner"), row.get("lease_expires")
        if holder is not None and holder != owner and expires is not None and expires > now:
            raise ReleaseBusy(
                f"release {rid} is being run by {display_text(holder)}: its lease in the ledger at "
                f"{self.url} lasts until {iso_time(expires)} (in {expires - now:.0f} s, by the "
                "database's clock); wait for that run to finish, or, if it died, for the lease "
                "to expire, then run again",
                holder=holder, lease_expires=expires)
        if plan is not None:
            self._check_plan(conn, rid, plan, rows)
        r = releases_table.c
        conn.execute(releases_table.update().where(r.release_id == rid).values(
            status="in_progress", owner=owner, attempts=r.attempts + 1, updated_at=now_text(),
            lease_owner=owner, lease_expires=now + lease))
        return "resume"

    def _check_plan(self, conn: sa.Connection, rid: str, plan: dict, rows: list[dict]) -> None:
        """A resume draws under the plan its release was charged under (refused otherwise,
        before anything is written); one charged before plans were recorded must have the
        same charges, and then records this plan."""
        p = plans_table.c
        stored = conn.execute(sa.select(p.plan_sha256, p.plan, p.code_version)
                              .where(p.release_id == rid)).mappings().first()
        if stored is not None:
            if stored["plan_sha256"] == plan["plan_sha256"]:
                return  # the code version may differ: recorded, never compared
            changes = plan_changes(json.loads(stored["plan"]), plan["plan"])
            code = json.loads(stored["code_version"])
            raise PlanChanged(
                f"release {rid} was charged in the ledger at {self.url} under another budget "
                f"plan than this run's ({describe_changes(changes)}): its draws must be made "
                "under the plan it was charged for; finish it with the version that charged it "
                f"(dpatlas {code.get('package', '?')}, git {code.get('git_commit') or 'unknown'})"
                " or start a new release id (the charge is unchanged)", changes)
        changes = self._charge_changes(conn, rid, rows)
        if changes:
            raise PlanChanged(
                f"release {rid} was charged in the ledger at {self.url} (before plans were "
                f"recorded) for other budget steps than this run's ({describe_changes(changes)})"
                ": its draws must be made under the plan it was charged for; finish it with "
                "the version that charged it or start a new release id (the charge is "
                "unchanged)", changes)
        self._record_plan(conn, rid, plan, "resume")

    @staticmethod
    def _charge_changes(conn: sa.Connection, rid: str, rows: list[dict]) -> list[str]:
        """How this run's charges differ from the recorded ones, per step and cell."""
        ch = charges_table.c
        keys = ("guarantee_type", "epsilon", "delta", "rho")
        recorded = {(x["step"], x["cell"]): x for x in conn.execute(
            sa.select(ch.step, ch.cell, *[ch[k] for k in keys])
            .where(ch.release_id == rid)).mappings()}
        now = {(x["step"], x["cell"]): x for x in rows}
        changes = []
        for step, cell in sorted(set(recorded) | set(now)):
            old, new = recorded.get((step, cell)), now.get((step, cell))
            where = f"step {step}, cell {cell}"
            if old is None or new is None:
                changes.append(f"{where}: {'charged' if old else 'not charged'} → "
                               f"{'charged' if new else 'not charged'}")
                continue
            for k in keys:
                a, b = old[k], new[k]
                same = (a == b if isinstance(a, str) or a is None or b is None
                        else math.isclose(a, b, rel_tol=CAP_MATCH_TOL, abs_tol=0.0))
                if not same:
                    changes.append(f"{where}: {k} {a!r} → {b!r}")
        return changes

    @staticmethod
    def _record_plan(conn: sa.Connection, rid: str, plan: dict, how: str) -> None:
        conn.execute(plans_table.insert().values(
            release_id=rid, plan_sha256=plan["plan_sha256"], plan=canonical_plan(plan["plan"]),
            code_version=json.dumps(plan["code_version"], sort_keys=True), recorded_at=now_text(),
            recorded_by=how))

    def release_plan(self, release_id: str) -> dict | None:
        """The plan entry a release was charged under (None: none recorded)."""
        checked_release_id(release_id)
        if plans_table.name not in self._tables:
            return None
        p = plans_table.c
        with self._reading(f"release {release_id}") as conn:
            row = conn.execute(sa.select(plans_table).where(p.release_id == release_id)
                               ).mappings().first()
        if row is None:
            return None
        return {"plan": json.loads(row["plan"]), "plan_sha256": row["plan_sha256"],
                "code_version": json.loads(row["code_version"]),
                "recorded_at": row["recorded_at"], "recorded_by": row["recorded_by"]}

    def complete_release(self, release_id: str, manifest_sha256: str, owner: str) -> None:
        """Mark an in-progress release published; ``owner`` must hold its lease.

        Idempotent: an already-published release with the same manifest is left as it is
        (whoever asks). Raises :class:`LeaseLost` if another owner took the release over."""
        nonempty_text(manifest_sha256, "manifest_sha256")
        nonempty_text(owner, "owner")

        def decide(row, now):
            st = row["status"]
            if st == "published":
                if row["manifest_sha256"] == manifest_sha256:
                    return None
                raise LedgerError(f"release {release_id} is already published with another "
                                  f"manifest ({row['manifest_sha256']})")
            if st == "withdrawn":
                raise LedgerError(f"release {release_id} is withdrawn: it cannot be published")
            lost = self._lost(row, owner, now, "complete_release")
            if lost is not None:
                raise lost
            return {"status": "published", "manifest_sha256": manifest_sha256,
                    "published_at": now_text()}

        self._change(release_id, "complete_release", decide)

    def fail_release(self, release_id: str, reason: str, owner: str | None = None) -> None:
        """Mark a release failed and drop its lease. Its charges stay: noise may be drawn.

        ``owner``: the run that failed (it must hold the lease: :class:`LeaseLost` otherwise);
        None (an operator): refused with :class:`ReleaseBusy` while another owner's lease is
        live. The reason is kept on one line (at most 500 characters)."""

        def decide(row, now):
            st = row["status"]
            if st in ("published", "withdrawn"):
                raise LedgerError(f"release {release_id} is {st} and cannot fail now"
                                  + ("; withdraw it instead" if st == "published" else ""))
            holder, expires = row.get("lease_owner"), row.get("lease_expires")
            if owner is not None:
                lost = self._lost(row, owner, now, "fail_release")
                if lost is not None and st != "failed":
                    raise lost
            elif holder is not None and expires is not None and expires > now:
                raise ReleaseBusy(f"release {release_id} is being run by {display_text(holder)} "
                                  f"(lease until {iso_time(expires)}): it cannot be failed now",
                                  holder=holder, lease_expires=expires)
            return {"status": "failed", "lease_owner": None, "lease_expires": None,
                    "reason": one_line(str(reason), MAX_FAILURE_REASON)}

        self._change(release_id, "fail_release", decide)

    def withdraw_release(self, release_id: str, reason: str) -> dict:
        """Mark a published release withdrawn, for good. Its charges stay: its outputs were out.

        The reason is validated first (:func:`dpatlas.core.ids.validate_reason`). Idempotent: a
        withdrawn release is left as it is, with its first reason and time. Returns
        ``{"release_id", "status": "withdrawn", "reason", "withdrawn_at", "changed"}``,
        ``changed`` False when it was withdrawn already. A release that is not published
        (in progress, failed, unknown) cannot be withdrawn: :class:`LedgerError`."""
        why = checked_reason(reason, "withdrawal reason")
        seen: dict = {}

        def decide(row, _db_now):
            seen.update(row)
            if row["status"] == "withdrawn":
                return None
            if row["status"] != "published":
                raise LedgerError(
                    f"release {release_id} is {row['status']}, not published: only a published "
                    "release can be withdrawn (an unfinished one is resumed or left failed; its "
                    "budget stays spent either way)")
            return {"status": "withdrawn", "reason": why, "withdrawn_at": now_text()}

        values = self._change(release_id, "withdraw_release", decide)
        if values is None:
            return {"release_id": release_id, "status": "withdrawn", "reason": seen["reason"],
                    "withdrawn_at": seen["withdrawn_at"], "changed": False}
        return {"release_id": release_id, "status": "withdrawn", "reason": why,
                "withdrawn_at": values["withdrawn_at"], "changed": True}
