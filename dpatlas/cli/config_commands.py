"""``dpatlas config example|check``: a release configuration, and every file a release would
read checked before any release (commands.py registers the group)."""

from __future__ import annotations

from pathlib import Path

import typer

from dpatlas.cli.common import console, fail, guard, one_line, operator_errors, styled


config_app = typer.Typer(help="Release configuration.")


@config_app.command("example")
def config_example() -> None:
    """Print a documented example configuration."""
    from dpatlas.core.config import EXAMPLE

    typer.echo(EXAMPLE, nl=False)


@config_app.command("check")
def config_check(path: Path) -> None:
    """Validate a configuration and every file a release would read; print what it resolves to
    (without secrets), then every problem at once: exit 2 if a release would be refused."""
    import json

    from dpatlas.core.config import load_config
    from dpatlas.ledger import redact_url

    with guard():
        cfg = load_config(path)
        resolved = json.loads(cfg.model_dump_json())
        resolved["ledger"]["url"] = redact_url(cfg.ledger.url)
        console.print_json(json.dumps(resolved))
        found, problems = _check_config_files(cfg)
    for line in found:
        console.print(styled("ok", "green", f" {line}"), soft_wrap=True)
    if problems:
        fail(f"a release with {path} would be refused ({len(problems)} problem"
              f"{'s' if len(problems) != 1 else ''}):\n" + "\n".join(f"  - {p}" for p in problems))


def _check_config_files(cfg) -> tuple[list[str], list[str]]:
    """Open every file the release reads: what was found, and every reason a release would be
    refused (all of them, not the first only)."""
    from dpatlas.ledger import Ledger
    from dpatlas.release.boundaries import load_boundaries
    from dpatlas.release.contributions import require_person_unit
    from dpatlas.release.ingest import partitions
    from dpatlas.release.preflight import check_paths, refusals_before_ingest
    from dpatlas.release.thresholds import resolve_threshold

    problems = refusals_before_ingest(cfg)  # what a release refuses before reading any data
    found = []
    _check_schedule(cfg, found, problems)
    if _attempt(lambda: check_paths(cfg) or True, problems):
        found.append("paths: publish root, internal folder and input are separate; the "
                     "ledger is outside the publish root")
    unit = _attempt(lambda: require_person_unit(cfg), problems)
    if unit:
        found.append(_person_unit_line(cfg, unit))
    if Path(cfg.input.path).exists():
        parts = _attempt(lambda: partitions(cfg.input), problems, report=True)
        if parts is not None:
            found.append(f"input {cfg.input.path}: {len(parts)} partition(s), "
                         f"{sum(p.rows for p in parts):,} rows, columns present")
    if Path(cfg.boundaries.path).exists():
        b = _attempt(lambda: load_boundaries(cfg.boundaries.path, cfg.boundaries.geoid_column),
                     problems, report=True)
        if b is not None:
            found.append(f"boundaries {cfg.boundaries.path}: {len(b):,} tracts, CRS {b.crs}")
    if cfg.selection.rule != "fixed":
        threshold = _attempt(lambda: resolve_threshold(cfg.selection), problems)
        if threshold is not None:
            found.append(f"selection threshold: {threshold:.6g}")
    cap = _attempt(lambda: _ledger_cap(Ledger, cfg), problems)
    if cap:
        found.append(f"ledger {cap[0]}: dataset {cfg.ledger.dataset} has the lifetime cap "
                     f"eps={cap[1][0]:g} delta={cap[1][1]:g}")
    return found, problems


def _person_unit_line(cfg, unit: dict) -> str:
    """What config check says of the one-record-per-person claim: it reads no record, so it
    says who checks it (the release, over the person id column) or that nobody does; never
    "verified" (issue 31 O12: it said so for duplicates and for a missing input)."""
    if unit["status"] != "verified":
        return (f"{unit['claim']}: an unverified assumption "
                "(privacy.assume_one_record_per_person: true), which nothing checks")
    return (f"{unit['claim']}: not read here; each release checks it before its charge, over "
            f"person id column '{cfg.input.columns.person_id}' across all partitions "
            f"(validation.contributions: {cfg.validation.contributions})")


def _check_schedule(cfg, found: list[str], problems: list[str]) -> None:
    """The schedule as `python -m deploy.serve` registers it: refused by the same check."""
    from deploy.schedule import cron_schedule

    if cfg.schedule.cron and _attempt(lambda: cron_schedule(cfg.schedule), problems,
                                      report=True) is not None:
        found.append(f"schedule: {cfg.schedule.cron!r} in {cfg.schedule.timezone}")


def _ledger_cap(ledger_class, cfg):
    """The ledger's URL (redacted) and the dataset's cap (None: no cap)."""
    with ledger_class(cfg.ledger.url, create=False) as ledger:
        cap = ledger.cap(cfg.ledger.dataset)
        return (ledger.url, cap) if cap is not None else None


def _attempt(check, problems: list[str], report: bool = False):
    """``check()``'s result, or None on an operator error: added to ``problems`` if
    ``report`` (a check of data), else already among them (a check before ingest)."""
    # a ValueError too, but only where refusals_before_ingest has reported it already (an
    # unreadable threshold file)
    try:
        return check()
    except (operator_errors() if report else (*operator_errors(), ValueError)) as err:
        if report:
            problems.append(one_line(err))
        return None
