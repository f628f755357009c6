"""The ``dpatlas`` command."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Differentially private per-tract mobility release (dpatlas).")
console = Console()


@app.command()
def estimators() -> None:
    """List the registered estimators, their guarantee at epsilon = 1 and their noise sampler."""
    import mechanisms as M

    table = Table("name", "guarantee at eps=1", "noise sampler", "what it is")
    for name, est in M.REGISTRY.items():
        table.add_row(name, est.guarantee(1.0).describe(), est.sampler, est.summary)
    console.print(table)


@app.command()
def demo(epsilon: float = typer.Option(1.0, help="Privacy budget per tract (pure epsilon)."),
         seed: int = typer.Option(0, help="Seed of the synthetic state (noise uses OS entropy)."),
         ) -> None:
    """Generate the default synthetic state and run the primary estimators on every tract."""
    import mechanisms as M
    from mechanisms.batch import ols, sufficient_stats

    from .synth import batch_of, oi_like_state

    with console.status("generating the synthetic Illinois-like state"):
        df = oi_like_state(seed)
        batch = batch_of(df)
    console.print(f"synthetic state: {batch.n_tracts} tracts, {len(df):,} records "
                  f"(seed {seed})")
    fit = ols(sufficient_stats(batch))
    table = Table("estimator", "guarantee per tract", "released", "failed",
                  "median |p25 - OLS|", "seconds")
    for name in ("NoisyStats", "DPExpTheilSen", "NoisyIntercept"):
        t0 = time.perf_counter()
        with console.status(f"running {name} on {batch.n_tracts} tracts"):
            res = M.estimate_batch(name, batch, epsilon)
        secs = time.perf_counter() - t0
        err = np.nanmedian(np.abs(res.p25 - fit.p25))
        table.add_row(name, res.guarantee.describe(), str(int((~res.failed).sum())),
                      str(int(res.failed.sum())), f"{err:.3f}", f"{secs:.2f}")
    console.print(table)
    console.print("Noise came from the operating system's CSPRNG through the grid samplers "
                  "(see README). Tracts hold disjoint people: the guarantee per person is "
                  "the per-tract one (parallel composition) for each estimator run.")


@app.command()
def evaluate(out: Path = typer.Option(Path("evaluation"), help="Output folder."),
             reps: int = typer.Option(100, help="Runs per tract and mechanism."),
             seed: int = typer.Option(0, help="Seed of the synthetic state and of the noise."),
             epsilon: list[float] = typer.Option([1.0, 8.0], help="Per-tract budgets."),
             mechanism: list[str] = typer.Option([], help="Mechanisms (default: all DP + MOS)."),
             tracts: int = typer.Option(3108, help="Tracts in the synthetic state."),
             ) -> None:
    """Rebuild the paper's comparison on an Illinois-sized synthetic state: table and plots."""
    from .evaluate import DEFAULT_MECHANISMS, evaluate as run, write_report
    from .synth import StateParams

    mechs = tuple(mechanism) or DEFAULT_MECHANISMS
    t0 = time.perf_counter()
    result = run(mechs, tuple(epsilon), reps, seed, StateParams(n_tracts=tracts),
                 progress=lambda msg: console.log(msg))
    paths = write_report(result, out)
    table = Table("mechanism", "epsilon", "tracts", "share below SE", "median ratio",
                  "failure rate")
    for r in result.summary.itertuples():
        table.add_row(r.mechanism, f"{r.epsilon:g}", str(r.tracts), f"{r.share_below_se:.3f}",
                      f"{r.median_ratio:.3f}", f"{r.mean_failure_rate:.3f}")
    console.print(table)
    thr = result.crossover.get("threshold")
    console.print(f"NoisyStats/DPExpTheilSen crossover in n*eps*var(x): "
                  f"{'not found' if thr is None else f'{thr:.3g}'}")
    console.print(f"wrote {len(paths)} files to {out} in {time.perf_counter() - t0:.0f}s")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
