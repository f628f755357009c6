"""Caps and spend: setting a dataset's lifetime cap (with its history), the config's stated cap
checked against the ledger's, and the composed spend of a dataset that every cap check reads
(δ summed; ε summed, or the zCDP charges' ρ summed and converted once where that is tighter)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import sqlalchemy as sa

from mechanisms.accounting import lifetime_epsilon, within

from dpatlas.ledger.backend import LedgerBackend
from dpatlas.ledger.errors import CapBelowSpent, LedgerError
from dpatlas.ledger.formatting import SET_CAP_COMMAND, fmt, now_text
from dpatlas.ledger.schema import cap_changes_table, caps_table, charges_table, releases_table
from dpatlas.ledger.validation import (check_cap, checked_reason, default_actor, finite_number,
                                       nonempty_text)

CAP_MATCH_TOL = 1e-12  # relative tolerance when comparing a config's stated cap to the ledger's


def _is_zcdp(row: dict) -> bool:
    return row["guarantee_type"] == "zcdp" and row["rho"] is not None


def within_cap(total: float, cap: float) -> bool:
    """The cap check, under the one tolerance policy (``mechanisms.accounting.REL_TOL``)."""
    return bool(within(total, cap))


@dataclass(frozen=True)
class _CapRow:
    cap_epsilon: float
    cap_delta: float


class CapOperations(LedgerBackend):
    """The ledger's caps and the spend they bound."""

    def set_cap(self, dataset: str, cap_epsilon: float, cap_delta: float, reason: str,
                actor: str | None = None, force: bool = False) -> bool:
        """Set (or change) the lifetime cap per privacy unit of a dataset, with a reason.

        The only code path that writes a cap. The change (time, old -> new, reason, actor:
        ``host:user`` by default) is kept in ``ledger_cap_changes`` and shown by
        :meth:`summary_text`. Returns False (and writes nothing) if the cap already is this one.
        Raises :class:`InvalidLedgerReason` for a blank or multi-line reason, and
        :class:`CapBelowSpent` for a cap below what the dataset has already spent, unless
        ``force`` (then no release of it can be charged until the cap is raised again).
        """
        dataset, eps, delta = check_cap(dataset, cap_epsilon, cap_delta)
        why = checked_reason(reason, "reason for the cap change")
        who = nonempty_text(actor, "actor") if actor is not None else default_actor()

        def upsert(conn: sa.Connection) -> bool:
            now = now_text()
            c = caps_table.c
            old = conn.execute(sa.select(c.cap_epsilon, c.cap_delta).where(c.dataset == dataset)
                               .with_for_update()).first()
            if old is not None and (old.cap_epsilon, old.cap_delta) == (eps, delta):
                return False
            spent_eps, spent_delta, _ = self._spent(conn, dataset)
            if not force and not (within_cap(spent_eps, eps) and within_cap(spent_delta, delta)):
                raise CapBelowSpent(
                    f"a cap of eps={fmt(eps)} delta={fmt(delta)} for dataset {dataset} is "
                    f"below what it has already spent (eps={fmt(spent_eps)} "
                    f"delta={fmt(spent_delta)}; spent budget is never refunded): no release of "
                    "it could be charged until the cap is raised again. Nothing was changed; "
                    "to do this on purpose (e.g. to stop all releases), add --force")
            if old is None:
                conn.execute(caps_table.insert().values(
                    dataset=dataset, cap_epsilon=eps, cap_delta=delta, created_at=now,
                    updated_at=now))
            else:
                conn.execute(caps_table.update().where(c.dataset == dataset).values(
                    cap_epsilon=eps, cap_delta=delta, updated_at=now))
            conn.execute(cap_changes_table.insert().values(
                dataset=dataset, old_epsilon=None if old is None else old.cap_epsilon,
                old_delta=None if old is None else old.cap_delta, new_epsilon=eps,
                new_delta=delta, reason=why, actor=who, changed_at=now))
            return True

        return self._run_write(upsert, f"set_cap {dataset}")

    def cap(self, dataset: str) -> tuple[float, float] | None:
        """The dataset's lifetime cap (epsilon, delta) in this ledger, or None."""
        if caps_table.name not in self._tables:
            return None
        c = caps_table.c
        with self._reading(f"cap of {dataset}") as conn:
            row = conn.execute(sa.select(c.cap_epsilon, c.cap_delta)
                               .where(c.dataset == dataset)).first()
        return None if row is None else (float(row.cap_epsilon), float(row.cap_delta))

    def cap_changes(self, dataset: str | None = None) -> list[dict]:
        """The cap's history, oldest first: changed_at, dataset, old/new eps and delta, reason,
        actor."""
        if cap_changes_table.name not in self._tables:
            return []
        q = sa.select(cap_changes_table).order_by(cap_changes_table.c.change_id)
        if dataset is not None:
            q = q.where(cap_changes_table.c.dataset == dataset)
        with self._reading("cap history") as conn:
            return [dict(r) for r in conn.execute(q).mappings().all()]

    def check_stated_cap(self, dataset: str, expected) -> None:
        """:class:`LedgerError` if the config's stated cap (``expected``: (eps, delta), None
        parts not compared) is not this ledger's cap of ``dataset`` (read only)."""
        cap = self.cap(dataset)
        if cap is not None:
            self._check_expected_cap(dataset, _CapRow(*cap), expected)

    def _check_expected_cap(self, dataset: str, cap, expected) -> None:
        """The config's stated cap, if it states one, must be the ledger's (which rules)."""
        if expected is None:
            return
        exp_eps, exp_delta = expected
        for name, want, have in (("epsilon", exp_eps, cap.cap_epsilon),
                                 ("delta", exp_delta, cap.cap_delta)):
            if want is None:
                continue
            want = finite_number(want, f"the config's cap {name}", hi=1.0 if name == "delta" else
                           math.inf)
            if not math.isclose(want, have, rel_tol=CAP_MATCH_TOL, abs_tol=0.0):
                raise LedgerError(
                    f"the config states a lifetime cap for dataset {dataset} of "
                    f"eps={fmt(exp_eps)} delta={fmt(exp_delta)}, but the ledger at {self.url} "
                    f"has eps={fmt(cap.cap_epsilon)} delta={fmt(cap.cap_delta)}: the cap is "
                    f"the ledger's; fix the config, or change the cap with "
                    f"`{SET_CAP_COMMAND.format(dataset=dataset)}`")

    @staticmethod
    def _spent(conn: sa.Connection, dataset: str,
               adding: Iterable[dict] = ()) -> tuple[float, float, int]:
        """The dataset's lifetime (ε, δ) (with the charge rows ``adding`` composed in, for a
        release being charged) and its release count: δ summed; ε by the accountant's
        ``lifetime_epsilon`` (zCDP charges' ρ summed and converted once where that is tighter
        than adding every charge's ε)."""
        r, ch = releases_table.c, charges_table.c
        joined = charges_table.join(releases_table, ch.release_id == r.release_id)

        def sums(*where):
            return conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(ch.epsilon), 0.0),
                          sa.func.coalesce(sa.func.sum(ch.delta), 0.0),
                          sa.func.coalesce(sa.func.sum(ch.rho), 0.0))
                .select_from(joined).where(r.dataset == dataset, *where)).one()

        adding = list(adding)
        eps, delta, _ = sums()
        eps = math.fsum([float(eps), *(x["epsilon"] for x in adding)])
        delta = math.fsum([float(delta), *(x["delta"] for x in adding)])
        concentrated = [x for x in adding if _is_zcdp(x)]
        z_eps, z_delta, z_rho = sums(ch.guarantee_type == "zcdp", ch.rho.is_not(None))
        z_delta = math.fsum([float(z_delta), *(x["delta"] for x in concentrated)])
        z_rho = math.fsum([float(z_rho), *(x["rho"] for x in concentrated)])
        if z_rho > 0:
            o_eps, _, _ = sums(sa.or_(ch.guarantee_type != "zcdp", ch.rho.is_(None)))
            others = math.fsum([float(o_eps), *(x["epsilon"] for x in adding
                                                if not _is_zcdp(x))])
            eps = lifetime_epsilon(eps, others, z_rho, z_delta)
        n = conn.execute(sa.select(sa.func.count()).select_from(releases_table)
                         .where(r.dataset == dataset)).scalar_one()
        return eps, float(delta), int(n)
