from __future__ import annotations

from prefect import get_run_logger, task

from dpatlas.allocate import BudgetPlan
from dpatlas.config import LedgerConfig
from dpatlas.ledger import Charge, Ledger
from mechanisms.privacy import ApproxDP, PureDP, ZCDP, to_approx

from .common import TASK_OPTIONS

# How long a release's lease in the ledger lasts without renewal. The run renews it every
# third of this; another host may take an in-progress release over only after it expires.
LEASE_SECONDS = 60.0


def charges(budget: BudgetPlan, cells: list[str]) -> list[Charge]:
    """One charge per budget step and cell, each with its (ε, δ) and, where it has one, ρ."""
    out = []
    for cell in cells:
        for step in budget.steps:
            g = step.guarantee
            if isinstance(g, PureDP):
                eps, delta, rho = g.epsilon, 0.0, g.epsilon ** 2 / 2
            elif isinstance(g, ApproxDP):
                eps, delta, rho = g.epsilon, g.delta, None
            elif isinstance(g, ZCDP):
                conv = to_approx(g, budget.conversion_delta)
                eps, delta, rho = conv.epsilon, conv.delta, g.rho
            else:
                raise ValueError(f"step {step.name}: {g.describe()} cannot be charged")
            out.append(Charge(cell, step.name, g.kind, eps, delta, rho))
    return out


@task(name="ledger-charge", **TASK_OPTIONS)
def charge_release(cfg: LedgerConfig, release_id: str, budget: BudgetPlan, cells: list[str],
                   config_sha256: str, owner: str) -> str:
    """Record the release's charges and take its lease before any noise is drawn.

    Refused over the ledger's lifetime cap, when the ledger has no cap, when the config states
    a cap other than the ledger's, or while another owner holds the release's lease.
    """
    ledger = Ledger(cfg.url)
    expected = None
    if cfg.cap_epsilon is not None or cfg.cap_delta is not None:
        expected = (cfg.cap_epsilon, cfg.cap_delta)
    status = ledger.begin_release(release_id, cfg.dataset, charges(budget, cells),
                                  config_sha256, owner, lease_seconds=LEASE_SECONDS,
                                  expected_cap=expected)
    spent = ledger.spent(cfg.dataset)
    get_run_logger().info("ledger: release %s is %s; dataset %s has spent eps=%.4g of %.4g",
                          release_id, status, cfg.dataset, spent["epsilon"], spent["cap_epsilon"])
    return status
