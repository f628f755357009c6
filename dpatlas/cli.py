"""The ``dpatlas`` command."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
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


config_app = typer.Typer(help="Release configuration.")
app.add_typer(config_app, name="config")


@config_app.command("example")
def config_example() -> None:
    """Print a documented example configuration."""
    from .config import EXAMPLE

    typer.echo(EXAMPLE, nl=False)


@config_app.command("check")
def config_check(path: Path) -> None:
    """Validate a configuration file and print what it resolves to."""
    from .config import ConfigError, load_config

    try:
        cfg = load_config(path)
    except ConfigError as err:
        _fail(str(err))
    console.print_json(cfg.model_dump_json())


def _fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


@app.command()
def synth(out: Path = typer.Option(Path("data"), help="Output folder."),
          states: str = typer.Option("17", help="Comma-separated state FIPS codes."),
          tracts: int = typer.Option(3108, help="Tracts per state."),
          seed: int = typer.Option(0, help="Seed (state i uses seed + i)."),
          ) -> None:
    """Write an Opportunity-Insights-like synthetic state (or several) and its tract boundaries."""
    from .synth import StateParams, write_synthetic

    with console.status("generating synthetic microdata and boundaries"):
        info = write_synthetic(out, [s.strip() for s in states.split(",") if s.strip()], seed,
                               StateParams(n_tracts=tracts))
    console.print(f"{info['records']:,} records in {info['tracts']:,} tracts of "
                  f"{len(info['states'])} state(s): microdata {info['microdata']}, "
                  f"boundaries {info['boundaries']}")


def run_release(config: Path, release_id: str | None, noise_seed: int | None = None) -> Path:
    """Run the release flow with a progress bar; clear errors, non-zero exit on failure."""
    import os

    # No telemetry (no network here), and room for Prefect's ephemeral server to start on a
    # busy machine (its default 20 s is not always enough on 2 cores).
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .config import ConfigError, load_config

    try:
        load_config(config)  # fail fast, before Prefect starts, on a bad config
    except ConfigError as err:
        _fail(str(err))
    from flows import release as release_module

    with Progress(TextColumn("{task.description:<18}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console) as bar:
        ids: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in ids:
                ids[stage] = bar.add_task(stage, total=total)
            bar.update(ids[stage], completed=done, total=total)

        release_module.PROGRESS = progress
        try:
            folder = release_module.release(str(config), release_id, noise_seed)
        except (ConfigError, FileNotFoundError, FileExistsError, ValueError, RuntimeError) as err:
            _fail(str(err))
        finally:
            release_module.PROGRESS = None
    return Path(folder)


@app.command()
def release(config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
            release_id: str = typer.Option(None, help="Release id (default: from config or new)."),
            noise_seed: int = typer.Option(None, hidden=True,
                                           help="Tests only: repeatable noise, NOT FOR RELEASE."),
            ) -> None:
    """Run (or resume) a release: ingest, validate, allocate, select, estimate, publish.

    Rerunning a published release id publishes nothing new and charges nothing; rerunning an
    interrupted one resumes it without drawing fresh noise for work already drawn.
    """
    started = time.time()
    folder = run_release(config, release_id, noise_seed)
    _report(folder, started)


def _report(folder: Path, started: float) -> None:
    import json
    from datetime import datetime

    manifest = json.loads((folder / "manifest.json").read_text())
    total = manifest["total_per_person"]
    if datetime.fromisoformat(manifest["published"]).timestamp() < started - 1:
        console.print(f"release {manifest['release_id']} was already published at {folder} "
                      f"({manifest['published']}): nothing new published, nothing charged")
        return
    console.print(f"[bold green]published[/] release {manifest['release_id']} at {folder}")
    console.print(f"  tracts: {manifest['counts']['by_status']}; mechanisms: "
                  f"{manifest['counts']['by_mechanism']}")
    console.print(f"  total per person: epsilon = {total['epsilon']:.4g}, delta = "
                  f"{total['delta']:.3g}" + (f", rho = {total['rho']:.4g}" if total['rho'] else ""))
    console.print(f"  files: {', '.join(sorted(manifest['files']))}, manifest.json")


@app.command()
def demo(out: Path = typer.Option(Path("demo"), help="Folder for data, config and releases."),
         release_id: str = typer.Option(None, help="Release id (default: a new one)."),
         profile: str = typer.Option("primary", help="primary | full-suite"),
         ) -> None:
    """Generate the default synthetic state and publish a full release of it."""
    import yaml

    from .calibrate import DEFAULT_THRESHOLDS
    from .synth import StateParams, write_synthetic

    data = out / "data"
    if not (data / "tracts.parquet").exists():
        with console.status("generating the default synthetic state (Illinois-sized)"):
            info = write_synthetic(data, ["17"], 0, StateParams())
        console.print(f"synthetic state: {info['records']:,} records in {info['tracts']:,} "
                      f"tracts -> {data}")
    cfg = {
        "input": {"path": str((data / "microdata").resolve()), "format": "parquet"},
        "boundaries": {"path": str((data / "tracts.parquet").resolve())},
        "privacy": {"epsilon_per_tract": 1.0, "delta": 1e-6},
        "selection": {"rule": "dp", "threshold_file": str(DEFAULT_THRESHOLDS),
                      "budget_share": 0.1},
        "profile": {"name": profile},
        "validation": {"policy": "fail"},
        "publish": {"root": str((out / "releases").resolve())},
    }
    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    started = time.time()
    folder = run_release(config, release_id)
    _report(folder, started)


ledger_app = typer.Typer(help="The privacy budget ledger.")
app.add_typer(ledger_app, name="ledger")


def _config_or_fail(config: Path):
    from .config import ConfigError, load_config

    try:
        return load_config(config)
    except ConfigError as err:
        _fail(str(err))


@ledger_app.command("show")
def ledger_show(config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
                ) -> None:
    """Print what each dataset has spent, its lifetime cap and what is left, per release."""
    from .ledger import Ledger

    cfg = _config_or_fail(config)
    ledger = Ledger(cfg.ledger.url)
    ledger.set_cap(cfg.ledger.dataset, cfg.ledger.cap_epsilon, cfg.ledger.cap_delta)
    console.print(ledger.summary_text(), highlight=False)


@app.command()
def withdraw(release_id: str,
             config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
             reason: str = typer.Option(..., help="Why, for the feed and the ledger."),
             ) -> None:
    """Withdraw a published release: it stays in the feed, marked withdrawn; its budget stays spent."""
    from .feed import withdraw as feed_withdraw
    from .ledger import Ledger, LedgerError

    cfg = _config_or_fail(config)
    try:
        Ledger(cfg.ledger.url).withdraw_release(release_id, reason)
        feed_withdraw(cfg.publish.root, release_id, reason)
    except (LedgerError, RuntimeError, FileNotFoundError) as err:
        _fail(str(err))
    console.print(f"withdrew {release_id}: {reason}")


@app.command()
def rerun(release_id: str,
          config: Path = typer.Option(..., "--config", "-c", help="Release configuration."),
          timeout: float = typer.Option(3600, help="Seconds to wait for the run."),
          ) -> None:
    """Trigger the operator deployment for RELEASE_ID on the Prefect server (PREFECT_API_URL).

    A published id is a no-op; an interrupted one resumes; a new id is a fresh, charged release.
    """
    from deploy.trigger import trigger_release

    _config_or_fail(config)
    try:
        result = trigger_release(str(config.resolve()), release_id, timeout)
    except (RuntimeError, ValueError) as err:
        _fail(str(err))
    console.print(result)
    if str(result.get("state", "")).upper() != "COMPLETED":
        raise typer.Exit(1)


@app.command()
def calibrate(out: Path = typer.Option(Path("thresholds.yaml"), help="Where to write."),
              tracts: int = typer.Option(1000, help="Tracts per synthetic calibration state."),
              reps: int = typer.Option(50, help="Runs per tract."),
              ) -> None:
    """Calibrate the selection thresholds on synthetic states (never on release data)."""
    from .calibrate import calibrate as run, write_thresholds

    result = run(tracts=tracts, reps=reps, progress=lambda m: console.log(m))
    write_thresholds(result, out)
    for rule, r in result["rules"].items():
        console.print(f"{rule} rule: threshold {r['threshold']:.4g} on {r['indicator']}")
    console.print(f"wrote {out}")


@app.command()
def evaluate(out: Path = typer.Option(Path("evaluation"), help="Output folder."),
             reps: int = typer.Option(100, help="Runs per tract and mechanism."),
             seed: int = typer.Option(0, help="Seed of the synthetic state and of the noise."),
             epsilon: list[float] = typer.Option([1.0, 8.0], help="Per-tract budgets."),
             mechanism: list[str] = typer.Option([], help="Mechanisms (default: all DP + MOS)."),
             tracts: int = typer.Option(3108, help="Tracts in the synthetic state."),
             rule: bool = typer.Option(True, help="Add the calibrated dp selection rule as a row."),
             ) -> None:
    """Rebuild the paper's comparison on an Illinois-sized synthetic state: table and plots."""
    from .evaluate import DEFAULT_MECHANISMS, evaluate as run, write_report
    from .synth import StateParams

    from .calibrate import DEFAULT_THRESHOLDS, resolve_threshold
    from .config import SelectionConfig
    from .selection import Rule, RuleEstimate

    mechs = tuple(mechanism) or DEFAULT_MECHANISMS
    extra = {}
    if rule:
        threshold = resolve_threshold(SelectionConfig(rule="dp", threshold_file=DEFAULT_THRESHOLDS))
        extra["SelectionRule(dp)"] = RuleEstimate(Rule("dp", threshold, 0.1))
    t0 = time.perf_counter()
    result = run(mechs, tuple(epsilon), reps, seed, StateParams(n_tracts=tracts),
                 progress=lambda msg: console.log(msg), extra_rows=extra)
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
