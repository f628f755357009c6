"""Checks that run before a release writes or charges anything.

A release must never charge the ledger for work that cannot complete, nor write where it must
not. Everything here is decided from the configuration, the file system and public facts (the
tract sizes n), so it spends no privacy budget.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

import mechanisms as M

from dpatlas.core.config import ReleaseConfig
from dpatlas.release.contributions import require_person_unit
from dpatlas.core.files import write_atomic
from dpatlas.core.ids import validate_release_id
from dpatlas.publication.publish_root import ROOT_MARKER
from dpatlas.publication.tract_files import release_folder
from dpatlas.core.errors import ReleaseRefused


class PreflightError(RuntimeError, ReleaseRefused):
    """The release cannot run as configured; nothing was written or charged."""


def _inside(a: Path, b: Path) -> bool:
    """True if ``a`` is ``b`` or lies below it."""
    return a == b or b in a.parents


def _real(p: Path) -> Path:
    return Path(os.path.realpath(p))


def check_before_writing(cfg: ReleaseConfig, release_id: str | None,
                         noise_seed: int | None) -> None:
    """Everything decidable without the data: the id and its path (when the id is known yet),
    the noise source, the privacy unit. The command line runs it before it starts a Prefect
    server; the flow runs it again, since deployments call the flow directly."""
    if release_id is not None:
        check_paths(cfg, validate_release_id(release_id))
    check_staging(cfg)
    check_noise_source(cfg, noise_seed)
    require_person_unit(cfg)


def check_before_ingest(cfg: ReleaseConfig, release_id: str | None) -> None:
    """Refuse, before a row is read, a release that :func:`refusals_before_ingest` already
    knows would be refused; every reason at once."""
    found = refusals_before_ingest(cfg, release_id)
    if len(found) == 1:
        raise PreflightError(f"{found[0]}; nothing was read or charged")
    if found:
        raise PreflightError(f"{len(found)} problems, so nothing was read or charged:\n"
                             + "\n".join(f"  - {p}" for p in found))


def refusals_before_ingest(cfg: ReleaseConfig, release_id: str | None = None) -> list[str]:
    """Why a release would be refused, decided from the configuration, the file system and
    the ledger alone (no input row is read): every reason, not the first only, so that
    `dpatlas config check` lists them all and a release stops before its ingest. Empty for a
    release the ledger holds as published: rerunning it reads and writes nothing."""
    from dpatlas.ledger import Ledger, LedgerError

    try:
        ledger = Ledger(cfg.ledger.url, create=False)
    except (LedgerError, OSError) as err:
        return _refusals_without_ledger(cfg, release_id) + [str(err)]
    with ledger:
        entry = _ledger_entry(ledger, release_id)
        if entry is not None and entry.get("status") == "published":
            return []
        found = _refusals_without_ledger(cfg, release_id)
        if entry is None:  # a charge to come: it needs the ledger's cap
            found += _refusal_of(lambda: _check_cap(ledger, cfg))
    return found


def _ledger_entry(ledger, release_id: str | None) -> dict | None:
    """The ledger's entry of ``release_id`` (None: no id yet, or not in the ledger); an
    unreadable ledger is reported as an entry-less one, its error by the cap check."""
    from dpatlas.ledger import LedgerError

    if release_id is None:
        return None
    try:
        return ledger.release(release_id)
    except (LedgerError, OSError):
        return None


def _refusals_without_ledger(cfg: ReleaseConfig, release_id: str | None) -> list[str]:
    found = []
    for check in (lambda: check_paths(cfg, release_id), lambda: check_staging(cfg),
                  lambda: require_person_unit(cfg), lambda: _check_thresholds(cfg)):
        found += _refusal_of(check)
    return found + _missing_inputs(cfg) + _unwritable_roots(cfg)


def _refusal_of(check) -> list[str]:
    """The refusal ``check`` raises, as a message (none if it passes)."""
    from dpatlas.core.errors import OperatorError

    try:
        check()
    # ValueError: a calibration file without the rule's threshold (release/thresholds.py)
    except (OperatorError, OSError, ValueError) as err:
        return [str(err)]
    return []


def _check_thresholds(cfg: ReleaseConfig) -> None:
    """The selection's threshold (and the banded rule's bands) can be read."""
    from dpatlas.release.thresholds import resolve_schedule, resolve_threshold

    resolve_threshold(cfg.selection)
    if cfg.selection.rule == "banded":
        resolve_schedule(cfg.selection)


def _missing_inputs(cfg: ReleaseConfig) -> list[str]:
    return [f"{what} not found: {path}" for what, path in
            (("input", cfg.input.path), ("boundaries", cfg.boundaries.path))
            if not Path(path).exists()]


def _unwritable_roots(cfg: ReleaseConfig) -> list[str]:
    """The publish root and the internal folder can be written (or created) by this user."""
    found = []
    for key, path in (("publish.root", cfg.publish.root),
                      ("publish.internal_root", cfg.publish.internal)):
        existing = Path(path)
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
            found.append(f"{key} {path} cannot be written by this user ({existing} is not "
                         "writable)")
    return found


def _check_cap(ledger, cfg: ReleaseConfig) -> None:
    """A charge needs the dataset's lifetime cap in the ledger, and the one the config states."""
    from dpatlas.ledger import LedgerError
    from dpatlas.ledger.formatting import SET_CAP_COMMAND

    dataset = cfg.ledger.dataset
    if ledger.cap(dataset) is None:
        raise LedgerError(f"no lifetime budget cap is set for dataset {dataset} in the ledger "
                          f"at {ledger.url}, and a release is refused without one: set one "
                          f"with `{SET_CAP_COMMAND.format(dataset=dataset)}`")
    if cfg.ledger.cap_epsilon is not None or cfg.ledger.cap_delta is not None:
        ledger.check_stated_cap(dataset, (cfg.ledger.cap_epsilon, cfg.ledger.cap_delta))


def check_paths(cfg: ReleaseConfig, release_id: str | None = None) -> None:
    """Publish root, internal root and input are disjoint; a SQLite ledger lies outside the
    publish root; the release path is usable (when a ``release_id`` is given)."""
    root, internal = _real(cfg.publish.root), _real(cfg.publish.internal)
    named = {"publish.root": root, "publish.internal_root": internal,
             "input.path": _real(cfg.input.path)}
    items = list(named.items())
    for i, (na, a) in enumerate(items):
        for nb, b in items[i + 1:]:
            if _inside(a, b) or _inside(b, a):
                raise PreflightError(
                    f"{na} ({a}) and {nb} ({b}) overlap: the public tree, the internal folder "
                    "(staged raw microdata) and the input must be three separate folders")
    if _inside(_real(cfg.boundaries.path), internal):
        raise PreflightError(f"boundaries.path lies inside the internal folder {internal}")
    ledger = ledger_file(cfg.ledger.url)
    if ledger is not None and _inside(_real(ledger), root):
        raise PreflightError(
            f"the ledger {ledger} lies inside the publish root {root}: everything there is "
            "public (served, copied, mirrored), and the ledger holds every release's charges "
            "and this machine's paths; move it outside the publish root (ledger.url); "
            "nothing was charged")
    for p in (root, internal):
        if p.exists() and not p.is_dir():
            raise PreflightError(f"{p} exists and is not a folder")
    if release_id is not None:
        release_folder(cfg.publish.root, release_id)  # no link or file where the release goes


def check_staging(cfg: ReleaseConfig) -> None:
    """``staging_url`` (if set) is usable, and outside the publish root and the input."""
    from dpatlas.release.staging import check_staging_url

    check_staging_url(cfg.staging_url, {"the publish root": cfg.publish.root,
                                        "the input": cfg.input.path})


def ledger_file(url: str) -> Path | None:
    """The file of a SQLite ledger (None: another database, or no file)."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - the ledger reports an unusable URL itself
        return None
    db = parsed.database
    if parsed.get_backend_name() != "sqlite" or not db or db == ":memory:" \
            or db.startswith("file:"):
        return None
    return Path(db).expanduser()


def check_noise_source(cfg: ReleaseConfig, noise_seed: int | None) -> None:
    """Repeatable (seeded) noise only in a test root; a root is either public or test."""
    if noise_seed is not None and cfg.publish.mode != "test":
        raise PreflightError("a noise seed makes the noise repeatable, which is for tests only: "
                             "it is refused for a public release (set publish.mode: test and a "
                             "test publish root to use one)")
    marker = Path(cfg.publish.root) / ROOT_MARKER
    if marker.exists():
        try:
            mode = json.loads(marker.read_text()).get("mode")
        except (OSError, ValueError):
            mode = None
        if mode != cfg.publish.mode:
            raise PreflightError(f"the publish root {cfg.publish.root} holds {mode} releases; "
                                 f"this config's publish.mode is {cfg.publish.mode}: use a "
                                 "separate root for test releases")


def mark_root(cfg: ReleaseConfig) -> None:
    """Record the root's mode (public or test) the first time a release writes to it."""
    root = Path(cfg.publish.root)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / ROOT_MARKER
    if not marker.exists():
        write_atomic(marker, lambda tmp: tmp.write_text(json.dumps({"mode": cfg.publish.mode})))


def mechanisms_in_play(plan, n: np.ndarray) -> dict[str, np.ndarray]:
    """Per estimator, which (tract, cell) rows may run it (a function of the public n only)."""
    rule = plan.rule
    if rule.kind == "fixed":
        out = {rule.mechanism: np.ones(n.size, dtype=bool)}
    elif rule.kind == "public":
        big = n >= rule.threshold
        out = {"NoisyStats": big, "DPExpTheilSen": ~big}
    elif rule.kind == "banded":  # n names the mechanism, except in the dp band
        band = rule.band_choice(n, plan.primary_epsilon)
        out = {"NoisyStats": band != "DPExpTheilSen", "DPExpTheilSen": band != "NoisyStats"}
    else:  # dp: the noisy choice can fall either way in any tract
        out = {"NoisyStats": np.ones(n.size, dtype=bool),
               "DPExpTheilSen": np.ones(n.size, dtype=bool)}
    for name in (s.estimator for s in plan.suite):  # the suite runs in every tract
        out[name] = np.ones(n.size, dtype=bool)
    return out


def check_feasible(cfg: ReleaseConfig, plan, sizes: pd.DataFrame) -> None:
    """Refuse, before any charge, a release that would publish nothing or run out of memory.

    ``sizes``: one row per (geoid, cell) with data, column ``n`` (public).
    """
    n = sizes["n"].to_numpy(dtype=np.int64)
    eligible = n >= cfg.publish.min_n
    if not eligible.any():
        raise PreflightError(
            f"every tract has fewer than publish.min_n = {cfg.publish.min_n} records (largest "
            f"n = {int(n.max()) if n.size else 0}): the release would suppress everything, so "
            "nothing was charged")
    limit = cfg.limits.memory_gib * 2**30
    for name, rows in mechanisms_in_play(plan, n).items():
        rows = rows & eligible
        if not rows.any():
            continue
        est = M.get(name)
        need = np.asarray(est.peak_bytes(n[rows], **est.defaults), dtype=np.float64)
        over = need > limit
        if over.any():
            worst = int(np.argmax(need))
            sub = sizes[rows].iloc[worst]
            raise PreflightError(
                f"{name} would need {need[worst] / 2**30:.1f} GiB for tract {sub['geoid']} "
                f"(cell {sub['cell']}, n = {int(sub['n'])}), over limits.memory_gib = "
                f"{cfg.limits.memory_gib:g} ({int(over.sum())} tract(s) over); nothing was "
                "charged. Raise the limit on a larger machine, or choose a rule that gives "
                "such tracts NoisyStats (selection.rule: public with a threshold below their n)")


def check_subflow_parameters(subflow, parameters: dict) -> None:
    """Refuse, before the charge, a subflow call whose parameters the Prefect server would
    refuse (``server.api.max_parameter_size``, measured as the server measures it: compact
    JSON of the flow's own serialisation). Found after the charge, it would fail the run with
    the budget spent; a national release is the case (docs/national.md)."""
    from prefect.settings import get_current_settings

    limit = get_current_settings().server.api.max_parameter_size
    if limit <= 0:
        return
    size = len(json.dumps(subflow.serialize_parameters(parameters),
                          separators=(",", ":")).encode())
    if size > limit:
        raise PreflightError(
            f"the {subflow.name} subflow's parameters are {size:,} bytes as JSON, over the "
            f"Prefect server's limit of {limit:,} (PREFECT_SERVER_API_MAX_PARAMETER_SIZE; "
            f"{_what_grows(parameters)}): raise partition_tracts or the server's limit; "
            "nothing was charged")


def _what_grows(parameters: dict) -> str:
    """The lists that make a subflow's parameters large, counted: "67 chunks", "4 parts"."""
    named = [(key, value) for key, value in parameters.items()
             if isinstance(value, (list, tuple)) and key not in ("sources",)]
    return ", ".join(f"{len(value)} {key}" for key, value in named) or "no lists"
