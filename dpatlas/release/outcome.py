"""What a release run returns: the typed result the command line and ``dpatlas rerun`` report.

Kept free of Prefect and of the data stack, so a reader of a run's persisted result (JSON, see
deploy/serve.py) needs only pydantic.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel


class BudgetState(BaseModel):
    """The dataset's ledger after the run: spent (every release ever charged) and the cap."""

    dataset: str
    spent_epsilon: float
    spent_delta: float
    cap_epsilon: Optional[float] = None
    cap_delta: Optional[float] = None

    @property
    def left_epsilon(self) -> Optional[float]:
        return None if self.cap_epsilon is None else max(self.cap_epsilon - self.spent_epsilon, 0.0)

    @property
    def share_spent(self) -> Optional[float]:
        """Spent ε over the cap's ε (the automation in deploy/ watches this)."""
        return None if not self.cap_epsilon else self.spent_epsilon / self.cap_epsilon


class ReleaseOutcome(BaseModel):
    """One release run's result.

    ``status`` is ``published`` when this run published the release (and its charge is the
    one recorded for it), ``already_published`` when the id was published before: nothing new
    was published and nothing was charged. It is a path-like of the published folder, so
    ``Path(outcome)`` is that folder.
    """

    release_id: str
    status: Literal["published", "already_published"]
    folder: str
    published_at: str
    by_status: dict[str, int]
    by_mechanism: dict[str, int]
    epsilon_per_person: float
    delta_per_person: float
    rho_per_person: Optional[float] = None
    files: list[str]
    budget: BudgetState

    @property
    def charged(self) -> bool:
        return self.status == "published"

    def __fspath__(self) -> str:
        return self.folder

    def summary_lines(self) -> list[str]:
        """The human summary, one line each (the command line prints these)."""
        b = self.budget
        if not self.charged:
            head = (f"release {self.release_id} was already published at {self.folder} "
                    f"({self.published_at}): nothing new published, nothing charged")
        else:
            head = f"published release {self.release_id} at {self.folder}"
        total = (f"epsilon = {self.epsilon_per_person:.4g}, delta = {self.delta_per_person:.3g}"
                 + (f", rho = {self.rho_per_person:.4g}" if self.rho_per_person else ""))
        cap = ("no cap" if b.cap_epsilon is None
               else f"of the cap {b.cap_epsilon:g}, {b.left_epsilon:.4g} left")
        return [head,
                f"  tracts: {format_counts(self.by_status)}; by mechanism: "
                f"{format_counts(self.by_mechanism, name_first=True)}",
                f"  per person: {total}"
                + ("" if self.charged else " (charged when it was first published)"),
                f"  ledger, dataset {b.dataset}: epsilon {b.spent_epsilon:.4g} spent {cap}",
                f"  files: {', '.join(self.files)}"]


def format_counts(counts: dict[str, int], name_first: bool = False) -> str:
    """``{'released': 3036, 'suppressed': 72}`` as ``3,036 released, 72 suppressed``, largest
    first; ``name_first``: ``NoisyStats 1,560, ...``."""
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{k} {n:,}" if name_first else f"{n:,} {k}" for k, n in items) or "none"
