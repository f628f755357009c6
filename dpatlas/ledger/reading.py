"""What the ledger tells: a release's row, a dataset's spend, every charge, and the summary
``dpatlas ledger show`` prints (as data and as text). Reads only."""

from __future__ import annotations

import pandas as pd
import sqlalchemy as sa

from dpatlas.ledger.caps import CapOperations, within_cap
from dpatlas.ledger.formatting import iso_time, summary_text
from dpatlas.ledger.schema import ADDED_RELEASE_COLUMNS, caps_table, charges_table, releases_table
from dpatlas.ledger.validation import checked_release_id

ENTRY_COLUMNS = ["release_id", "dataset", "status", "cell", "step", "guarantee_type",
                 "epsilon", "delta", "rho", "charged_at"]


class LedgerReading(CapOperations):
    """The ledger's reads."""

    def release(self, release_id: str) -> dict | None:
        """The release's row as a dict (plus its charge count and eps/delta sums), or None.

        ``lease_owner`` / ``lease_expires`` (epoch seconds, database clock) say who runs it."""
        checked_release_id(release_id)
        if not self._has_ledger():
            return None
        r, ch = releases_table.c, charges_table.c
        with self._reading(f"release {release_id}") as conn:
            row = conn.execute(self._release_select().where(r.release_id == release_id)
                               ).mappings().first()
            if row is None:
                return None
            n, eps, delta = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0),
                          sa.func.coalesce(sa.func.sum(ch.delta), 0.0))
                .where(ch.release_id == release_id)).one()
        return {**self._full_row(row), "charges": int(n), "epsilon": float(eps),
                "delta": float(delta)}

    def spent(self, dataset: str) -> dict:
        """The dataset's spend, cap and what is left (caps and left are None with no cap)."""
        out = {"dataset": dataset, "epsilon": 0.0, "delta": 0.0, "cap_epsilon": None,
               "cap_delta": None, "left_epsilon": None, "left_delta": None, "releases": 0}
        if not self._has_ledger():
            return out
        with self._reading(f"spend of {dataset}") as conn:
            cap = conn.execute(sa.select(caps_table.c.cap_epsilon, caps_table.c.cap_delta)
                               .where(caps_table.c.dataset == dataset)).first()
            eps, delta, n = self._spent(conn, dataset)
        out.update(epsilon=eps, delta=delta, releases=n)
        if cap is not None:
            out.update(cap_epsilon=cap.cap_epsilon, cap_delta=cap.cap_delta,
                       left_epsilon=max(cap.cap_epsilon - eps, 0.0),
                       left_delta=max(cap.cap_delta - delta, 0.0))
        return out

    def entries(self, dataset: str | None = None) -> pd.DataFrame:
        """One row per charge, with its release's id, dataset and status."""
        rows = []
        if self._has_ledger():
            r, ch = releases_table.c, charges_table.c
            q = (sa.select(r.release_id, r.dataset, r.status, ch.cell, ch.step,
                           ch.guarantee_type, ch.epsilon, ch.delta, ch.rho, ch.charged_at)
                 .select_from(charges_table.join(releases_table, ch.release_id == r.release_id))
                 .order_by(r.created_at, r.release_id, ch.seq))
            if dataset is not None:
                q = q.where(r.dataset == dataset)
            with self._reading("entries") as conn:
                rows = conn.execute(q).all()
        df = pd.DataFrame([tuple(x) for x in rows], columns=ENTRY_COLUMNS)
        for col in ("epsilon", "delta", "rho"):
            df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
        return df

    def summary(self) -> dict:
        """What ``dpatlas ledger show`` shows, as data (``--json``): the URL (no password);
        per dataset its cap (None: none set), the cap's history, what is spent and left, and
        per release its id, status, start, charged eps and delta, reason and lease. Reads only."""
        out = {"url": self.url, "ledger_exists": self._has_ledger(), "datasets": []}
        if not out["ledger_exists"]:
            return out
        r, ch = releases_table.c, charges_table.c
        lease_cols = ([r.lease_owner, r.lease_expires]
                      if set(ADDED_RELEASE_COLUMNS) <= self._release_columns else [])
        cols = [r.release_id, r.dataset, r.status, r.created_at, r.reason, *lease_cols]
        eps_sum = sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0).label("eps")
        delta_sum = sa.func.coalesce(sa.func.sum(ch.delta), 0.0).label("delta")
        with self._reading("summary") as conn:
            caps = {x.dataset: x for x in conn.execute(sa.select(caps_table)).all()}
            rels = conn.execute(
                sa.select(*cols, eps_sum, delta_sum)
                .select_from(releases_table.outerjoin(charges_table,
                                                      ch.release_id == r.release_id))
                .group_by(*cols).order_by(r.dataset, r.created_at, r.release_id)
            ).mappings().all()
            now = self._db_clock(conn)
            lifetime = {ds: self._spent(conn, ds)[:2]
                        for ds in set(caps) | {x["dataset"] for x in rels}}
        history = self.cap_changes()
        for ds in sorted(lifetime):
            eps, delta = lifetime[ds]  # zCDP charges composed as rho (see _spent)
            cap = caps.get(ds)
            out["datasets"].append({
                "dataset": ds,
                "cap": None if cap is None else {"epsilon": cap.cap_epsilon,
                                                 "delta": cap.cap_delta},
                "cap_changes": [h for h in history if h["dataset"] == ds],
                "spent": {"epsilon": eps, "delta": delta},
                "left": None if cap is None else {
                    "epsilon": max(cap.cap_epsilon - eps, 0.0),
                    "delta": max(cap.cap_delta - delta, 0.0)},
                "over_cap": cap is not None and not (within_cap(eps, cap.cap_epsilon)
                                                     and within_cap(delta, cap.cap_delta)),
                "releases": [self._release_summary(x, now) for x in rels
                             if x["dataset"] == ds]})
        return out

    @staticmethod
    def _release_summary(x, now: float) -> dict:
        holder, expires = x.get("lease_owner"), x.get("lease_expires")
        leased = x["status"] == "in_progress" and holder is not None and expires is not None
        return {"release_id": x["release_id"], "status": x["status"],
                "started": x["created_at"], "epsilon": float(x["eps"]),
                "delta": float(x["delta"]), "reason": x["reason"],
                "lease": {"owner": holder, "until": iso_time(expires), "live": expires > now}
                if leased else None}

    def summary_text(self) -> str:
        """Per dataset: cap, its history, spent, left; per release: id, status, start, eps, delta.

        Every stored text is shown with its control characters escaped (:func:`display_text`), so
        a reason or id cannot forge a line."""
        return summary_text(self.summary())
