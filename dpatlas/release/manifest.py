"""The accounting manifest of a release: everything an auditor needs to recompute the totals.

The manifest is public. It names files by base name and sha256, never by where they sit on
the machine that made the release, and it states what the guarantee rests on (verified or
not) beside the budget. ``dpatlas.audit`` re-checks it from the release folder alone.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Mapping

import pandas as pd

import mechanisms as M
from mechanisms.accounting import agrees, within
from mechanisms.estimand import (ESTIMAND, ESTIMAND_ID, INTERVAL_MEANING, MOE90_MEANING,
                                 SE_MEANING, TOTAL_ERROR)
from mechanisms.privacy import (CONVERSION_TEXT, GROUP_PRIVACY_RULES, PROJECT_RELATION,
                                MixedRelations, Relation, as_dict, convert_relation)

from dpatlas.publication.cell_stream import TractSummary
from dpatlas.publication.model_estimates import model_published_columns, small_area_section
from dpatlas.publication.level_files import (GEOID_DIGITS, level_files,
                                             level_published_columns)
from dpatlas.release.allocate import (LEVEL_MECHANISM, BudgetPlan, level_estimate_step,
                                      level_interval_step)
from dpatlas.core.config import ReleaseConfig, fingerprint, ledger_backend
from dpatlas.core.hashing import sha256_file
from dpatlas.core.files import now_utc, write_atomic
from dpatlas.publication.tract_files import PUBLISHED_DECIMALS, PublishError, code_version

COMPOSITION = {
    "within_tract_and_cell": "sequential: the steps below run on the same people",
    "across_tracts": "parallel: each person is in exactly one tract per cell",
    "across_cells": "sequential: cells may share people",
    "across_releases": "sequential: tracked by the budget ledger",
}

ACROSS_LEVELS = ("sequential: each person is in one tract, one county and one state, so the "
                 "level steps (levels.<level>.steps) add to the tract's; units of one level "
                 "hold disjoint people (parallel)")

RANDOM_BITS_OS = "os.urandom"
RANDOM_BITS_SEEDED = "seeded (test only, NOT FOR RELEASE)"
# A release whose draws came from more than one source (begun seeded, resumed without a seed):
# said as such, never one of them picked (the audit accepts it in test mode only).
RANDOM_BITS_MIXED = "mixed (NOT FOR RELEASE): "
CONFIG_FILE = "config.json"

# The manifest's schema version: dpatlas.audit.schema checks the fields this version requires.
# 3: p25_se, p75_se beside the intervals (issue 18); 4: one estimand, the tract expected
# outcome, for every value, interval, SE and margin of error, each column declaring it (issue 32).
MANIFEST_VERSION = 4

# Columns whose values are published without noise: public under the replace-one relation
# (status is a function of the public n and of DP outputs). Every other column is paid for by
# a budget step; dpatlas.audit.base holds the same list.
PUBLIC_COLUMNS = ("geoid", "state", "county", "name", "cell", "n", "status", "geometry")

# What the guarantee does not protect (docs/threat-model.md). dpatlas.audit.schema requires exactly
# these keys.
PUBLIC_SECTION = {
    "neighbours": "replace-one: a person's record may change, nobody is added or "
                "removed, so the following are not protected",
    "membership": "which tract and which cell each person is in",
    "counts": "the exact number of records n per tract and cell",
    "columns": list(PUBLIC_COLUMNS),
    "existence": "whether a release exists depends on the data: input validation (policy "
                 "fail, or clip/drop over validation.max_changed_share) and the one-record-"
                 "per-person check (contributions fail) refuse a release before any noise",
    "validity": "with validation policy drop, whether a record is valid (present and in "
                "[0, 1]) is public: n counts valid records only; policy clip changes the record "
                "alone and fail refuses the release",
    "input": "the input is named by a keyed commitment (HMAC-SHA256 of its sha256), never by "
             "its plain hash; the key stays in the internal folder",
    "timing": "not protected: the samplers' running time depends on the data; the manifest's "
              "started and published times are rounded to the day (UTC)",
    "confidential": "the Prefect server, its logs and flow-run parameters, and the internal "
                    "folder (validation reports, quarantine, Data Docs) hold non-DP counts "
                    "and are never published",
    "threat_model": "docs/threat-model.md",
}

# Keys of the flow's ledger entry that may be published (never its URL or file path).
_LEDGER_PUBLIC_KEYS = ("dataset", "release_id", "charges", "epsilon", "delta")


# --------------------------------------------------------------------------------- the pieces


def day_of(timestamp: str) -> str:
    """An ISO-8601 time rounded down to its UTC day (``2026-11-22``): release times are
    public, and the time of day says more about how long the data took than a day does."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).astimezone(
        timezone.utc).date().isoformat() if "T" in timestamp else date.fromisoformat(
        timestamp).isoformat()


def random_bits_description(random_source: str | Mapping[str, int]) -> str:
    """What the manifest says about the noise's random bits: never a seed value.

    Anything but the OS CSPRNG is described as seeded, so an unexpected source string (which
    might carry a seed) is never copied into the public manifest. ``random_source`` may be the
    draw log's sources with their counts (``DrawLog.noise_sources``): several are said so.
    """
    if isinstance(random_source, str):
        return RANDOM_BITS_OS if random_source == RANDOM_BITS_OS else RANDOM_BITS_SEEDED
    described = sorted({random_bits_description(s) for s in random_source})
    if len(described) == 1:
        return described[0]
    return RANDOM_BITS_MIXED + " and ".join(described)


def sampler_description(plan: BudgetPlan, random_source: str | Mapping[str, int]) -> dict:
    used = {"NoisyStats", "DPExpTheilSen"} | {s.estimator for s in plan.suite}
    out = {"random_bits": random_bits_description(random_source),
           "per_estimator": {name: M.get(name).sampler for name in sorted(used)},
           "note": "see docs/estimators.md, 'Noise: why it is safe against floating-point attacks'"}
    if not isinstance(random_source, str):  # from the draw log: how many draws each made
        by_bits: dict[str, int] = {}
        for source, n in random_source.items():
            bits = random_bits_description(source)
            by_bits[bits] = by_bits.get(bits, 0) + int(n)
        out["draws_by_random_bits"] = dict(sorted(by_bits.items()))
    return out


def tree_sha256(path: Path) -> str:
    """sha256 of a file, or of a folder as its sorted relative names and contents (streamed)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(bytes.fromhex(sha256_file(f)))
    return h.hexdigest()


def public_boundaries(cfg: ReleaseConfig) -> dict:
    """The boundary file by base name, content hash and vintage (no machine path)."""
    path = Path(cfg.boundaries.path)
    return {"file": path.name, "sha256": tree_sha256(path),
            "hashed_as": "file" if path.is_file() else "folder (relative names and contents)",
            "vintage": cfg.boundaries.vintage or "unstated"}


def public_ledger_entry(cfg: ReleaseConfig, entry: dict | None) -> dict | None:
    """The flow's ledger entry reduced to public facts: backend kind, dataset, id, sums."""
    if entry is None:
        return None
    out = {"backend": ledger_backend(cfg.ledger.url)}
    out.update({k: entry[k] for k in _LEDGER_PUBLIC_KEYS if k in entry})
    return out


def assumptions(cfg: ReleaseConfig, input_facts: dict) -> dict:
    """What the guarantee rests on, split into what the flow checked and what it did not.

    ``input_facts``: {"person_id_checked": bool, "person_id_column": str | None,
    "contributions_policy": "fail" | "bound", "validation_policy": "fail" | "clip" | "drop"}.
    Counts of rejected or bounded rows are not differentially private and are not published.
    """
    verified, unverified = [], []
    column = input_facts.get("person_id_column")
    if input_facts.get("person_id_checked"):
        if input_facts.get("contributions_policy") == "bound":
            verified.append("at most one record per person and cell (enforced across all "
                            f"partitions with person id column {column}: a person's extra "
                            "records were removed by a rule that reads only that person's "
                            "records)")
        else:
            verified.append("one record per person and cell (checked across all partitions "
                            f"with person id column {column})")
    elif cfg.privacy.assume_one_record_per_person:
        unverified.append("one record per person and cell (operator's statement: "
                          "privacy.assume_one_record_per_person)")
    else:
        unverified.append("one record per person and cell (neither checked nor stated by "
                          "the operator)")
    unverified.append("n per tract and cell is public (the replace-one neighbouring "
                      "relation's assumption: the guarantee does not protect n)")
    policy = input_facts.get("validation_policy", cfg.validation.policy)
    if policy == "drop":
        unverified.append("n counts only rows that passed validation; dropped rows (count "
                          "internal) change n")
    elif policy == "clip":
        verified.append("ranks outside [0, 1] were clipped to [0, 1] record by record before "
                        "any noise (count internal)")
    return {"verified": verified, "unverified": unverified}


def relations_section(neighbouring: str) -> dict:
    """How the manifest's relations read: what the ledger charges in, and the one conversion
    a step may apply to noise stated for another relation (``privacy.convert_relation``)."""
    return {"charged_in": neighbouring,
            "conversion": {"add-remove -> replace-one": CONVERSION_TEXT,
                           "rules": dict(GROUP_PRIVACY_RULES),
                           "replace-one -> add-remove": "not available: n changes"},
            "rule": "each noise step's guarantee is stated for its own relation; a budget "
                    "step's guarantee is stated for charged_in; noise of another relation is "
                    "converted draw by draw by the rules above, then composed"}


def step_entry(step) -> dict:
    """A budget step as the manifest prints it: ``Step.as_dict()`` plus the relation of the
    step and, per alternative, of its noise and the conversion applied (if any)."""
    d = step.as_dict()
    relation = step.guarantee.relation
    d["relation"] = relation.value
    conversions = {}
    for label, noise_steps in step.noise:
        found = sorted({ns.relation.value for ns in noise_steps})
        if found != [relation.value]:
            conversions[label] = {"noise_relations": found, "to": relation.value,
                                  "by": CONVERSION_TEXT}
    if conversions:
        d["relation_conversions"] = conversions
    return d


def check_relations(plan: BudgetPlan, neighbouring: str) -> None:
    """Every step is charged in the project's relation (``neighbouring``), and every noise
    step of another relation has the stated conversion to it: otherwise nothing is published
    (a bug: the ledger would have charged figures for the wrong neighbours)."""
    try:
        want = Relation.parse(neighbouring)
    except ValueError as err:
        raise PublishError(f"privacy.neighbouring: {err}") from None
    problems = []
    if want is not PROJECT_RELATION:
        problems.append(f"the configured relation {want.value} is not the project's "
                        f"{PROJECT_RELATION.value}")
    for step in plan.steps:
        rel = getattr(step.guarantee, "relation", None)
        if rel is not want:
            problems.append(f"step {step.name!r} is stated for "
                            f"{getattr(rel, 'value', rel)}, the ledger charges {want.value}")
            continue
        for label, noise_steps in step.noise:
            for ns in noise_steps:
                try:
                    convert_relation(ns.guarantee, want)
                except MixedRelations:
                    problems.append(f"step {step.name!r}, {label}, noise {ns.name!r}: "
                                    f"{ns.relation.value} noise cannot be charged as "
                                    f"{want.value}")
    if problems:
        raise PublishError("the budget's neighbouring relations disagree (a bug; nothing was "
                           "published): " + "; ".join(problems))


def _close(a: float, b: float) -> bool:
    return agrees(a, b)  # the one tolerance policy (mechanisms.accounting.REL_TOL)


def check_budget_consistent(budget: dict, totals: dict, n_cells: int,
                            ledger_entry: dict | None) -> None:
    """The manifest's ε and δ figures agree with each other and with the ledger's charges:
    spent within available, the total δ is the cells' δ, the ledger's sums are the cells'
    charges. A disagreement is a bug, and nothing is published."""
    eps, delta = budget["epsilon_per_tract_and_cell"], budget["delta_per_tract_and_cell"]
    problems = []
    if not within(eps, budget["epsilon_available"]):
        problems.append(f"epsilon spent {eps:.17g} is over the available "
                        f"{budget['epsilon_available']:.17g}")
    if not within(delta, budget["delta_available"]):
        problems.append(f"delta spent {delta:.6g} is over the available "
                        f"{budget['delta_available']:.6g}")
    if not _close(totals["delta"], delta * n_cells):
        problems.append(f"total delta {totals['delta']:.6g} != {n_cells} cell(s) x {delta:.6g}")
    if ledger_entry is not None:
        for key, per_cell in (("epsilon", eps), ("delta", delta)):
            if key in ledger_entry and not _close(ledger_entry[key], per_cell * n_cells):
                problems.append(f"ledger {key} {ledger_entry[key]:.17g} != {n_cells} cell(s) "
                                f"x {per_cell:.17g}")
    if problems:
        raise PublishError("the manifest's budget figures disagree (a bug; nothing was "
                           "published): " + "; ".join(problems))


# ------------------------------------------------------------------------- no machine paths

_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_URL_WITH_PATH = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def _strings(obj: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(obj, str):
        yield where, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield f"{where}.{k}", str(k)
            yield from _strings(v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _strings(v, f"{where}[{i}]")


def machine_paths(obj: Any, local: tuple[str, ...] = ()) -> list[str]:
    """Every string in ``obj`` (keys too) that looks like a path or URL of the machine:
    absolute POSIX or Windows paths, home-relative paths, URLs, or any of ``local``."""
    found = []
    for where, s in _strings(obj):
        t = s.strip()
        if (t.startswith(("/", "~", "\\")) or _DRIVE.match(t) or _URL_WITH_PATH.match(t)
                or any(p and p in t for p in local)):
            found.append(f"{where or '(top)'}={s!r}")
    return found


def _local_paths(cfg: ReleaseConfig) -> tuple[str, ...]:
    paths = [cfg.input.path, cfg.boundaries.path, cfg.publish.root, cfg.publish.internal,
             cfg.selection.threshold_file]
    # Only paths with a folder part: a bare base name (e.g. "tracts.parquet") is published.
    return tuple(str(p) for p in paths if p is not None and len(Path(p).parts) > 1)


INPUT_COMMITMENT_KEY = "input_commitment.key"
INPUT_COMMITMENT_SCHEME = "hmac-sha256"


def _write_private(path: Path, data: bytes) -> None:
    """``data`` into a new file readable by its owner only from the moment it exists."""
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
        fh.write(data)


def input_commitment(input_sha256: str, internal: Path) -> dict:
    """A hiding commitment to the confidential input, for the public manifest.

    The input's own sha256 is a deterministic, non-DP function of the microdata: publishing it
    would let anyone who knows the file but one record confirm that record by re-hashing (with
    percentile ranks there are only 101 × 101 candidates). Instead the manifest carries
    HMAC-SHA256(key, input sha256) under a random 256-bit key kept in the release's internal
    folder (mode 0600, created once, so a resumed release commits with the same key). Without
    the key the value says nothing about the data; the operator can show an entitled auditor
    which input a release came from by handing over the key.
    """
    key_file = Path(internal) / INPUT_COMMITMENT_KEY
    if not key_file.exists():
        write_atomic(key_file, lambda tmp: _write_private(tmp, secrets.token_bytes(32)),
                     private=True)
    key = key_file.read_bytes()
    if len(key) != 32:
        raise ValueError(f"{key_file}: the input commitment key must hold 32 bytes")
    return {"scheme": INPUT_COMMITMENT_SCHEME,
            "value": hmac.new(key, input_sha256.encode("ascii"), hashlib.sha256).hexdigest(),
            "key": f"{INPUT_COMMITMENT_KEY} in the release's internal folder (never published)"}


# ------------------------------------------------------------------------------ the manifest


def selection_section(rule, primary_epsilon: float) -> dict:
    """The manifest's selection: the rule, its threshold and the share of the tract budget a
    selection draw takes; for the banded rule also the bands in force at this budget (public
    parameters: n is public, so which band a tract is in is too)."""
    drawn = rule.kind in ("dp", "banded")
    out = {"rule": rule.kind, "threshold": rule.threshold,
           "budget_share": rule.share if drawn else 0.0}
    if rule.kind == "banded":
        out["bands"] = [{"n_below": None if math.isinf(u) else u, "choice": c}
                        for u, c in rule.bands(primary_epsilon)]
        out["bands_note"] = ("each tract's band is chosen by its public n; a band naming a "
                             "mechanism runs it with the whole primary budget, the dp band "
                             "spends budget_share of it on the selection draw first")
    return out


def levels_section(plan: BudgetPlan, level_tables: dict) -> dict:
    """The manifest's ``levels``: per level above the tract, its files, budget steps (with
    their share of the per-person budget), what pays each column, and its counts."""
    out = {}
    for lp in plan.levels:
        table = level_tables[lp.level]
        ci_step = level_interval_step(lp.level) if lp.interval_epsilon else None
        out[lp.level] = {
            "unit": f"the tract GEOID's first {GEOID_DIGITS[lp.level]} digits",
            "geoid_digits": GEOID_DIGITS[lp.level],
            "files": level_files(lp.level),
            "mechanism": LEVEL_MECHANISM,
            "steps": list(lp.steps),
            "epsilon": lp.epsilon,
            "estimate_epsilon": lp.estimate_epsilon,
            "interval_epsilon": lp.interval_epsilon,
            "published_columns": level_published_columns(
                lp.level, level_estimate_step(lp.level), ci_step, plan.interval_level),
            "counts": {"units": int(table["geoid"].nunique()), "rows": int(len(table)),
                       "by_status": {k: int(v)
                                     for k, v in table["status"].value_counts().items()}},
        }
    return out


def build_manifest(cfg: ReleaseConfig, release_id: str, plan: BudgetPlan,
                   table: pd.DataFrame | TractSummary,
                   input_commitment: dict, random_source: str | Mapping[str, int],
                   started: str, input_facts: dict,
                   ledger_entry: dict | None = None, level_tables: dict | None = None,
                   model_fits: list[dict] | None = None) -> dict:
    """The public manifest of a release (``files`` is added by ``tract_files.stage_release``).

    ``table``: the tract table, or its :class:`TractSummary` added up a group of cells at a
    time (``dpatlas.publication.cell_stream``): the manifest reads its cells and counts only.

    ``ledger_entry``: the flow's entry (sums of the ledger's charges); only its public keys are
    kept and its sums are checked against the plan. ``model_fits``: the small-area model's
    fits when the release publishes it (section ``small_area``; post-processing, no budget).
    """
    # Validation reports (rows quarantined, clipped) are NOT differentially private: they stay
    # in the internal folder and never enter this public manifest.
    summary = table if isinstance(table, TractSummary) else TractSummary.of(table)
    cells = summary.cells
    totals = plan.totals(len(cells))
    per_tract = plan.per_tract()
    # What the ledger charges each tract and cell (basic composition of the steps, each
    # derived from its noise, so at most the configured budget), beside what was configured.
    epsilon_spent, delta_spent = plan.charged()
    budget = {
        "epsilon_per_tract_and_cell": epsilon_spent,
        "delta_per_tract_and_cell": delta_spent,
        "epsilon_available": plan.epsilon_per_tract,
        "delta_available": plan.delta_per_tract,
        "note": "*_per_tract_and_cell: what each tract and cell spends (the ledger's charge, "
                "the sum of the steps' figures); *_available: the configured "
                "privacy.epsilon_per_tract and privacy.delta",
        "steps": [step_entry(s) for s in plan.steps],
        "conversion_delta": plan.conversion_delta,
        "per_tract_and_cell": as_dict(per_tract),
    }
    entry = public_ledger_entry(cfg, ledger_entry)
    check_relations(plan, cfg.privacy.neighbouring)
    check_budget_consistent(budget, totals, len(cells), entry)
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "release_id": release_id,
        "mode": cfg.publish.mode,
        "license": cfg.publish.license,     # SPDX id of the published data's licence
        "citation": cfg.publish.citation,   # how to cite the release (free text or null)
        "started": day_of(started),
        "published": day_of(now_utc()),
        "code_version": code_version(),
        "config_sha256": fingerprint(cfg),
        "config_file": CONFIG_FILE,
        "input_commitment": input_commitment,
        "boundaries": public_boundaries(cfg),
        "privacy_unit": cfg.privacy.unit,
        "neighbouring_relation": cfg.privacy.neighbouring,
        "relations": relations_section(cfg.privacy.neighbouring),
        "public_values": ["n (records per tract and cell)", "tract boundaries"],
        "public": PUBLIC_SECTION,
        "assumptions": assumptions(cfg, input_facts),
        "profile": cfg.profile.name,
        "selection": selection_section(plan.rule, plan.primary_epsilon),
        "min_n": cfg.publish.min_n,
        "budget": budget,
        "composition": COMPOSITION,
        "cells": cells,
        "total_per_person": totals,
        "counts": summary.counts(),
        "published_columns": {
            "p25, p75": f"display values: the raw values rounded to {PUBLISHED_DECIMALS} "
                        "decimals, then clipped to [0, 1] (post-processing; see rounding); "
                        f"they estimate the {ESTIMAND_ID} (section estimand)",
            "p25_raw, p75_raw": "the primary step's release for the tract's mechanism, "
                                f"rounded to {PUBLISHED_DECIMALS} decimals",
            **{f"{name}_p25, {name}_p75": f"the step 'suite: {name}', rounded to "
                                          f"{PUBLISHED_DECIMALS} decimals"
               for name in (s.estimator for s in plan.suite)},
            "n, geoid, state, county, name, cell, geometry": "public",
            "mechanism, status, reason": "which mechanism ran and whether it failed: a "
                                         "function of the DP selection, the public n and the "
                                         "DP outputs (failure of NoisyStats = its noisy nvar <= 0)",
            "epsilon_spent, delta_spent": "the budget charged to the tract's records in the "
                                          "cell: every step of budget.steps summed "
                                          "(budget.*_per_tract_and_cell), the county and "
                                          "state steps included",
            **({"p25_lo, p25_hi, p75_lo, p75_hi":
                f"the step 'interval: p25 and p75': {plan.interval_level:.0%} "
                f"{INTERVAL_MEANING} (mechanisms/intervals.py; post-processing of the primary "
                "release plus the interval step's own noise)",
                "p25_se, p75_se":
                "post-processing of the step 'interval: p25 and p75' (no budget of its own): "
                f"the {SE_MEANING}; rounded up to {PUBLISHED_DECIMALS} decimals",
                "p25_moe90, p75_moe90":
                "post-processing of the step 'interval: p25 and p75' (no budget of its own): "
                f"the {MOE90_MEANING}; ceil(1.645 x se) at {PUBLISHED_DECIMALS} decimals"}
               if plan.interval_epsilon else {}),
            **({key: f"{text}; they estimate the {ESTIMAND_ID}, as p25 and p75 do"
                for key, text in model_published_columns().items()}
               if model_fits is not None else {}),
        },
        "estimand": {"id": ESTIMAND_ID, "definition": ESTIMAND, "error": TOTAL_ERROR,
                     "applies_to": "every published value, interval, standard error and "
                                   "margin of error, direct and model-based alike "
                                   "(mechanisms/estimand.py)"},
        "intervals": ({"level": plan.interval_level, "epsilon": plan.interval_epsilon,
                       "estimand": f"the {ESTIMAND_ID}, covering the {TOTAL_ERROR}",
                       "method": {"NoisyStats": "privacy noise: Laplace bounds on n var(x), "
                                  "the slope and the mean of x, the release's three Laplace "
                                  "noises integrated exactly; sampling error: the least-squares "
                                  "prediction's t-interval with the residual spread bounded by a "
                                  "DP n var(y); the two half-widths added in quadrature "
                                  "(docs/uncertainty.md)",
                                  "DPExpTheilSen": "exact exponential-mechanism quantiles of "
                                  "the pairwise predictions at a public rank offset covering "
                                  "the privacy error and the pairwise median's sampling error "
                                  "(Sarathy & Vadhan 2022 style; Hoeffding's U-statistic "
                                  "variance bound)",
                                  "standard errors": "plug-in estimates of the total error's "
                                  "standard deviation from the interval step's DP statistics "
                                  "and the public noise scales, capped at 0.5 "
                                  "(mechanisms/intervals.py)"}}
                      if plan.interval_epsilon else None),
        "noise_sampler": sampler_description(plan, random_source),
        "ledger_entry": entry,
    }
    if plan.levels:
        manifest["composition"] = {**COMPOSITION, "across_levels": ACROSS_LEVELS}
        manifest["levels"] = levels_section(plan, level_tables or {})
    if model_fits is not None:
        manifest["small_area"] = small_area_section(model_fits)
    leaked = machine_paths(manifest, _local_paths(cfg))
    if leaked:
        raise PublishError(f"the manifest would publish a machine path (a bug; nothing was "
                           f"published): {leaked[0]}")
    return manifest
