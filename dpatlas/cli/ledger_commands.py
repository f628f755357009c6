"""``dpatlas ledger show|set-cap``: the privacy budget ledger (commands.py registers the
group)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dpatlas.cli.common import (JSON_HELP, config_or_fail, console, emit_json, err_console, fail,
                                guard)


ledger_app = typer.Typer(help="The privacy budget ledger.")


@ledger_app.command("show")
def ledger_show(config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
                as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
                ) -> None:
    """Print each dataset's lifetime cap (and its history), what is spent and left, per release.
    Reads only: it never writes to the ledger."""
    from dpatlas.ledger import Ledger

    # With --json, stdout is the document alone: an error is text on stderr (and exit 2).
    to = err_console if as_json else None
    cfg = config_or_fail(config, to)
    with guard(to=to):
        with Ledger(cfg.ledger.url, create=False) as ledger:
            if as_json:
                emit_json(ledger.summary())
                return
            console.print(ledger.summary_text(), highlight=False, markup=False)


@ledger_app.command("set-cap")
def ledger_set_cap(
        dataset: str = typer.Option(..., help="The dataset (population) whose cap this is."),
        epsilon: float = typer.Option(..., help="Lifetime epsilon per person."),
        delta: Optional[float] = typer.Option(
            None, help="Lifetime delta per person (default: the cap's current delta; a "
            "dataset's first cap needs it, 0 for pure DP only)."),
        reason: str = typer.Option(..., help="Why: recorded with the time in the ledger."),
        config: Path = typer.Option(..., "--config", "-c", help="Config naming the ledger."),
        force: bool = typer.Option(False, "--force", help="Allow a cap below what is already "
                                   "spent (no release can then be charged until it is raised)."),
) -> None:
    """Set a dataset's lifetime privacy-budget cap: the ledger's, recorded with time and reason."""
    from dpatlas.core.ids import validate_reason
    from dpatlas.ledger import Ledger, check_cap

    cfg = config_or_fail(config)
    with guard():
        # every value checked before the ledger is opened to write: opening may create it
        dataset, epsilon, given = check_cap(dataset, epsilon, 0.0 if delta is None else delta)
        why = validate_reason(reason)
        if delta is None:  # the delta cap stays what it is (it silently became 0)
            with Ledger(cfg.ledger.url, create=False) as reading:
                current = reading.cap(dataset)
            if current is None:
                fail(f"dataset {dataset} has no cap in the ledger at {reading.url} yet: give "
                      "its lifetime --delta too (0 for pure DP only: no release with a delta "
                      "could be charged)")
            given = current[1]  # the ledger's own, checked when it was set
        delta = given
        ledger = Ledger(cfg.ledger.url)
        before = ledger.cap(dataset)
        ledger.set_cap(dataset, epsilon, delta, reason=why, force=force)
        spent = ledger.spent(dataset)
    was = "none" if before is None else f"eps={before[0]:g} delta={before[1]:g}"
    console.print(f"dataset {dataset}: lifetime cap eps={epsilon:g} delta={delta:g} (was {was}); "
                  f"reason: {why}", soft_wrap=True)
    if spent["epsilon"] > epsilon or spent["delta"] > delta:
        console.print(f"recorded with --force: the cap is below what is already spent "
                      f"(eps={spent['epsilon']:g} delta={spent['delta']:g}): no "
                      f"release of dataset {dataset} can be charged until the cap is raised "
                      "(spent budget is never refunded)", soft_wrap=True)
