"""``dpatlas synthesize``: DP synthetic microdata for a published release, from BinAgg's Alg. 3.

Per tract and cell, BinAgg (mechanisms/binagg.py) releases PrivTree bins of x and noisy bin
counts and sums; Algorithm 3 of Lin, Slavković & Bhoomireddy turns those summaries into rows
(x, y) whose per-bin sums are exactly the released ones, so the aggregated regression on the
rows is BinAgg's estimate (their Cor. 3.1). The rows are post-processing of the summaries
(Dwork & Roth 2014, Prop. 2.1): the synthetic file costs exactly BinAgg's guarantee.

How it is paid for, honestly:

- it is its own entry in the ledger, ``<release>-synthetic`` (or ``synthetic_id``), with one
  budget step per cell, ``synthetic: BinAgg``: a fresh draw on the same people, composed
  sequentially with every other release of the dataset by the ledger's sum;
- everything is checked before the charge (ids, the source release published and its staged
  input present, the output path, ε and δ, the calibration, memory per tract, the cap left);
- the charge is taken once, and the draw made once (draw once, as a release does:
  dpatlas/release/draws.py): the staged folder is recorded in ``draws.jsonl`` in the internal
  folder before it is moved into place. A run stopped after the charge (failed, or killed)
  is finished by a rerun with the same id and request once its lease expired: it reuses the
  recorded draw (never drawing noise that may have been seen again), or draws when none was
  recorded (nothing has read it), and charges nothing more. A published or withdrawn id is
  refused; so is an unfinished one asked for with another request;
- the files are staged in the internal folder, with a manifest listing the guarantee and each
  noise draw's parameters, and renamed into place in one step; ``dpatlas audit FOLDER``
  recomputes the guarantee from the manifest alone.

The data read is the source release's staged input (validated, one record per person and
cell), so the synthetic rows describe exactly the population the release did; tracts with
fewer than ``publish.min_n`` records get no rows, as the release suppresses them (n is public).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import mechanisms as M
from mechanisms.accounting import within
from mechanisms.binagg import binagg_synthetic
from mechanisms.noise import Randomness, default_randomness
from mechanisms.privacy import ZCDP, as_dict, rho_for_approx, sequential, to_approx

from dpatlas.release.allocate import Step
from dpatlas.core.config import ReleaseConfig, fingerprint, load_config, public_config
from dpatlas.core.hashing import sha256_file
from dpatlas.core.plan_record import plan_sha256
from dpatlas.core.ids import MAX_RELEASE_ID_CHARS, validate_release_id
from dpatlas.ledger import Charge, Ledger, redact_url
from dpatlas.release.manifest import day_of
from dpatlas.release.crash import crashpoint
from dpatlas.release.draws import DrawLog, noise_source
from dpatlas.release.plan_record import running_code
from dpatlas.release.preflight import PreflightError, check_noise_source
from dpatlas.release.run_state import InputChanged
from dpatlas.publication.tract_files import code_version, release_folder

ESTIMATOR = "BinAgg"
STEP = "synthetic: BinAgg"
SUFFIX = "-synthetic"
PARQUET, CSV, MANIFEST, CONFIG = "synthetic.parquet", "synthetic.csv", "manifest.json", \
    "config.json"
CSV_SCHEMA = "synthetic.schema.json"  # Frictionless Table Schema of synthetic.csv
# The bin edges are PrivTree's released output (no extra cost): with them, and the noise
# parameters in the manifest, anyone can refit BinAgg's estimate from the rows (Cor. 3.1).
COLUMNS = ("GEOID", "cell", "bin_lo", "bin_hi", "x", "y")
KIND = "synthetic microdata"
# What each column is (the manifest's ``columns``, the Table Schema's descriptions).
COLUMN_TEXT = {
    "GEOID": "Census tract GEOID (11 digits: state, county, tract FIPS codes; text, leading "
             "zeros kept)",
    "cell": "The release's population cell the row belongs to",
    "bin_lo": "The row's PrivTree bin, lower edge of x (released)",
    "bin_hi": "Its upper edge; the noise variance of the bin's sum of x is "
              "(bin_hi / grid_steps)^2 * sigma2 of the step 'bin sums of x'",
    "x": "Synthetic parent income rank (not clipped: Cor. 3.1)",
    "y": "Synthetic child income rank (not clipped: Cor. 3.1)",
}


def synthetic_table_schema() -> dict:
    """The Frictionless Table Schema of ``synthetic.csv``: the six columns, typed and
    described; GEOIDs are text of 11 digits. Rows are not unique (several per bin)."""
    geoid = {"required": True, "pattern": r"^[0-9]{11}$", "minLength": 11, "maxLength": 11}
    return {"fields": [
        {"name": "GEOID", "type": "string", "description": COLUMN_TEXT["GEOID"],
         "constraints": geoid},
        {"name": "cell", "type": "string", "description": COLUMN_TEXT["cell"],
         "constraints": {"required": True}},
        *({"name": c, "type": "number", "description": COLUMN_TEXT[c],
           "constraints": {"required": True}} for c in ("bin_lo", "bin_hi", "x", "y"))],
        "missingValues": [""]}
LEASE_SECONDS = 60.0
RANDOM_BITS_OS = "os.urandom"
RANDOM_BITS_SEEDED = "seeded (test only, NOT FOR RELEASE)"
SCHEMA = pa.schema([("GEOID", pa.string()), ("cell", pa.string()), ("bin_lo", pa.float64()),
                    ("bin_hi", pa.float64()), ("x", pa.float64()), ("y", pa.float64())])

Progress = Callable[[str, int, int], None]


class SynthesizeError(RuntimeError):
    """An operator error: the message is one actionable line; nothing was charged unless it
    says so."""


# ------------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class SyntheticPlan:
    """Everything decided before the charge: what is drawn, what it costs, where it goes."""

    cfg: ReleaseConfig
    source_id: str
    synthetic_id: str
    out: Path
    staged: tuple[Path, ...]
    cells: tuple[str, ...]
    epsilon: float  # the (ε, δ) the caller allowed per tract and cell
    delta: float
    epsilon_param: float  # BinAgg's budget parameter: ρ = ε_param²/2
    step: Step
    charged_epsilon: float  # the step's (ε, δ) at δ, what the ledger charges per cell
    hyper: dict = field(default_factory=dict)
    resume: bool = False  # the ledger holds this id unfinished: finish it, charge nothing

    @property
    def guarantee(self) -> ZCDP:
        return self.step.guarantee

    def charges(self) -> list[Charge]:
        return [Charge(cell, STEP, "zcdp", self.charged_epsilon, self.delta,
                       self.guarantee.rho) for cell in self.cells]

    def plan_entry(self) -> dict:
        """The plan this draw is charged and made under (issue 31): the step as the manifest
        states it (noise, parameters, sensitivity), the charge, and the estimator's
        hyperparameters with their defaults filled in (the request's sha256 holds only those
        given); the ledger refuses a resume under another, as for a release."""
        record = {"estimator": ESTIMATOR, "step": self.step.as_dict(),
                  "charged_epsilon": self.charged_epsilon, "delta": self.delta,
                  "hyper": M.get(ESTIMATOR).hyper(self.hyper), "cells": list(self.cells)}
        return {"plan": record, "plan_sha256": plan_sha256(record),
                "code_version": running_code()}

    def request_sha256(self) -> str:
        """What the ledger records as this entry's configuration: the release config and the
        synthetic request (source, budget, hyperparameters)."""
        return _request_sha256(self.cfg, self.source_id, self.epsilon, self.delta, self.hyper)


def _request_sha256(cfg: ReleaseConfig, source_id: str, epsilon: float, delta: float,
                    hyper: dict) -> str:
    text = json.dumps({"config": fingerprint(cfg), "source_release": source_id,
                       "epsilon": epsilon, "delta": delta, "estimator": ESTIMATOR,
                       "hyper": hyper}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def synthetic_release_id(source_id: str) -> str:
    """The default ledger id of a release's synthetic file: ``<release>-synthetic``; for a
    source id too long for that, its first characters, ``-`` and 8 hex digits of its sha256,
    then ``-synthetic`` (still a valid id, the same for the same source, distinct for two)."""
    plain = f"{source_id}{SUFFIX}"
    if len(plain) <= MAX_RELEASE_ID_CHARS:
        return plain
    digest = hashlib.sha256(source_id.encode()).hexdigest()[:8]
    keep = MAX_RELEASE_ID_CHARS - len(SUFFIX) - len(digest) - 1
    return f"{source_id[:keep]}-{digest}{SUFFIX}"


def _budget(epsilon: object, delta: object) -> tuple[float, float]:
    for name, v in (("--epsilon", epsilon), ("--delta", delta)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SynthesizeError(f"{name} must be a finite number, got {v!r}")
    if not epsilon > 0:
        raise SynthesizeError(f"--epsilon must be > 0 (the (epsilon, delta) per tract and cell "
                              f"the synthetic file may cost), got {epsilon!r}")
    if not 0 < delta < 1:
        raise SynthesizeError(f"--delta must lie in (0, 1) (BinAgg is zCDP: its cost is "
                              f"stated as (epsilon, delta)), got {delta!r}")
    return float(epsilon), float(delta)


def _calibrate(epsilon: float, delta: float, hyper: dict) -> tuple[float, Step, float]:
    """BinAgg's parameter whose zCDP guarantee converts to at most (ε, δ) (the conversion the
    release's suite uses), its budget step, and the ε charged at δ."""
    est = M.get(ESTIMATOR)
    param = math.sqrt(2.0 * rho_for_approx(epsilon, delta))
    try:
        steps = est.noise_steps(param, None, **hyper)
        g = est.guarantee(param, None, **hyper)
    except ValueError as err:
        raise SynthesizeError(f"--epsilon {epsilon:g}: {err}") from None
    charged = to_approx(g, delta).epsilon
    if not within(charged, epsilon):
        raise SynthesizeError(f"BinAgg's calibration costs epsilon {charged:.6g} > "
                              f"{epsilon:g}; report this as a bug")
    step = Step(STEP, ESTIMATOR, param, 0.0, g, ((ESTIMATOR, tuple(steps)),))
    return param, step, charged


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def _check_out(cfg: ReleaseConfig, out: Optional[Path], synthetic_id: str,
               resume: bool = False) -> Path:
    """Where the folder goes: ``<publish root>/<synthetic id>`` by default. Nothing may be
    there yet (unless ``resume``: the recorded draw may have been moved there already, checked
    when it is finished), and it must lie outside the internal folder and the input."""
    if out is None:
        root = Path(cfg.publish.root)
        try:
            taken = release_folder(root, synthetic_id)
        except Exception as err:  # PublishError: a link or a file at that name
            raise SynthesizeError(str(err)) from None
        target = root / synthetic_id
    else:
        target = Path(out)
        if os.path.islink(target):
            raise SynthesizeError(f"--out {target} is a symbolic link: give a new folder path")
        taken = target if os.path.lexists(target) else None
    if taken is not None and not resume:
        raise SynthesizeError(f"{target} already exists: give --out a new folder (nothing was "
                              "charged)")
    real = Path(os.path.realpath(target))
    root = Path(os.path.realpath(cfg.publish.root))
    if _inside(real, root) and real.parent != root:
        # Below the root's top level lie published folders (releases, synthetic data): their
        # files are listed and hashed in their manifests, and are never written into.
        raise SynthesizeError(f"--out {target} lies inside the published folder "
                              f"{root / real.relative_to(root).parts[0]}: give a new folder "
                              f"directly in the publish root {root} or outside it (nothing "
                              "was charged)")
    for name, other in (("the internal folder", cfg.publish.internal),
                        ("the input", cfg.input.path)):
        o = Path(os.path.realpath(other))
        if _inside(real, o) or _inside(o, real):
            raise SynthesizeError(f"--out {target} overlaps {name} ({o}): synthetic data is "
                                  "public; write it elsewhere")
    parent = real.parent
    if not parent.is_dir() and out is not None:
        raise SynthesizeError(f"--out: the folder {parent} does not exist")
    return target


def _staged_input(cfg: ReleaseConfig, source_id: str) -> tuple[Path, ...]:
    folder = Path(cfg.publish.internal) / source_id
    staged = tuple(sorted((folder / "staged").glob("*.parquet")))
    if not staged or not (folder / "validation.json").is_file():
        raise SynthesizeError(
            f"release {source_id} has no validated staged input in {folder} (it is kept by the "
            "release run until `dpatlas purge` removes it): synthesize from a release made on "
            "this machine with this config, not yet purged")
    return staged


def _sizes(staged: tuple[Path, ...]) -> pd.DataFrame:
    frames = [pd.read_parquet(p, columns=["geoid", "cell"]).groupby(["geoid", "cell"]).size()
              .rename("n").reset_index() for p in staged]
    return pd.concat(frames, ignore_index=True)


def _check_memory(cfg: ReleaseConfig, sizes: pd.DataFrame, hyper: dict) -> None:
    n = sizes["n"].to_numpy(dtype=np.int64)
    need = np.asarray(M.get(ESTIMATOR).peak_bytes(n, **hyper), dtype=float)
    limit = cfg.limits.memory_gib * 2**30
    if need.size and need.max() > limit:
        worst = sizes.iloc[int(np.argmax(need))]
        raise SynthesizeError(f"BinAgg would need {need.max() / 2**30:.1f} GiB for tract "
                              f"{worst['geoid']} (n = {int(worst['n'])}), over "
                              f"limits.memory_gib = {cfg.limits.memory_gib:g}")


def _require_published(cfg: ReleaseConfig, source_id: str) -> None:
    ledger = Ledger(cfg.ledger.url, create=False)
    try:
        source = ledger.release(source_id)
        if source is None or source["status"] != "published":
            state = "is not in the ledger" if source is None else f"is {source['status']}"
            raise SynthesizeError(f"release {source_id} {state} at {ledger.url}: synthesize "
                                  "needs a published release")
    finally:
        ledger.close()


def _resumable(cfg: ReleaseConfig, synthetic_id: str, request_sha256: str) -> bool:
    """Whether the ledger holds ``synthetic_id`` unfinished (in progress or failed) with this
    very request: then this run finishes it without a new charge. Refused: a published or
    withdrawn id (a new draw needs a new id), or an unfinished one of another request."""
    ledger = Ledger(cfg.ledger.url, create=False)
    try:
        existing = ledger.release(synthetic_id)
    finally:
        ledger.close()
    if existing is None:
        return False
    if existing["status"] in ("published", "withdrawn"):
        raise SynthesizeError(
            f"{synthetic_id} is already in the ledger ({existing['status']}, charged "
            f"epsilon {existing['epsilon']:.6g}): a new draw needs a new id "
            "(--synthetic-id); nothing was charged")
    if (existing["config_sha256"] != request_sha256
            or existing["dataset"] != cfg.ledger.dataset):
        raise SynthesizeError(
            f"{synthetic_id} is already in the ledger ({existing['status']}, charged epsilon "
            f"{existing['epsilon']:.6g}) for another request: rerun it with the config, "
            "release, --epsilon and --delta it was begun with to finish it (no new charge), "
            "or give a new --synthetic-id; nothing was charged")
    return True


def _check_ledger(cfg: ReleaseConfig, synthetic_id: str, charge: tuple[float, float]) -> None:
    ledger = Ledger(cfg.ledger.url, create=False)
    try:
        spent = ledger.spent(cfg.ledger.dataset)
    finally:
        ledger.close()
    if spent["cap_epsilon"] is None:
        raise SynthesizeError(f"dataset {cfg.ledger.dataset!r} has no lifetime cap in the "
                              "ledger: set one with `dpatlas ledger set-cap`")
    eps, delta = charge
    short = [name for name, need, key in (("epsilon", eps, "epsilon"), ("delta", delta, "delta"))
             if not within(spent[key] + need, spent[f"cap_{key}"])]
    if short:
        # Say which one is short: with a cap delta of 0 a smaller --epsilon cannot help.
        fix = {("epsilon",): "use a smaller --epsilon or raise the cap's epsilon",
               ("delta",): ("the cap's delta is what is short: BinAgg needs delta > 0, so "
                            "raise the cap's delta (dpatlas ledger set-cap ... --delta)"
                            + (" or use a smaller --delta" if spent["left_delta"] > 0 else ""))
               }.get(tuple(short), "raise the cap (its epsilon and delta)")
        raise SynthesizeError(
            f"{synthetic_id} would spend epsilon {eps:.6g} (delta {delta:.3g}) on dataset "
            f"{cfg.ledger.dataset}: left epsilon {spent['left_epsilon']:.6g} (delta "
            f"{spent['left_delta']:.3g}); {fix}")


def plan_synthetic(config_path: Path, release_id: str, epsilon: float, *,
                   delta: Optional[float] = None, synthetic_id: Optional[str] = None,
                   out: Optional[Path] = None, noise_seed: Optional[int] = None,
                   **hyper) -> SyntheticPlan:
    """Validate the request and calibrate BinAgg; reads only (no write, no charge).

    ``epsilon``/``delta``: the (ε, δ) per tract and cell the file may cost (δ defaults to the
    config's ``privacy.delta``); BinAgg gets the ρ whose conversion at δ fits it."""
    cfg = load_config(Path(config_path))
    try:
        source = validate_release_id(release_id)
        sid = validate_release_id(synthetic_release_id(source) if synthetic_id is None
                                  else synthetic_id)  # '' is refused, not the default
        check_noise_source(cfg, noise_seed)
    except (ValueError, PreflightError) as err:
        raise SynthesizeError(str(err)) from None
    if sid == source:
        raise SynthesizeError("--synthetic-id must differ from the release id")
    eps, dlt = _budget(epsilon, cfg.privacy.delta if delta is None else delta)
    hp = M.get(ESTIMATOR).hyper(hyper)
    param, step, charged = _calibrate(eps, dlt, hp)
    resume = _resumable(cfg, sid, _request_sha256(cfg, source, eps, dlt, hyper))
    target = _check_out(cfg, out, sid, resume)
    _require_published(cfg, source)
    staged = _staged_input(cfg, source)
    sizes = _sizes(staged)
    _check_memory(cfg, sizes[sizes["n"] >= cfg.publish.min_n], hp)
    cells = tuple(sorted(sizes["cell"].astype(str).unique()))
    if not resume:  # a resume was charged when it began
        _check_ledger(cfg, sid, (charged * len(cells), dlt * len(cells)))
    return SyntheticPlan(cfg, source, sid, target, staged, cells, eps, dlt, param, step,
                         charged, hyper, resume)


# ------------------------------------------------------------------------------- the drawing


def _chunks(df: pd.DataFrame, min_n: int, size: int):
    """(cell, batch) per cell and chunk of ``size`` tracts with at least ``min_n`` records."""
    for cell, part in df.groupby("cell", sort=True):
        n = part.groupby("geoid").size()
        keep = n.index[n >= min_n]
        part = part[part["geoid"].isin(keep)]
        geoids = np.sort(keep.to_numpy(dtype=str))
        for i in range(0, geoids.size, size):
            rows = part[part["geoid"].isin(geoids[i:i + size])]
            yield str(cell), M.TractBatch.from_labels(rows["geoid"].to_numpy(dtype=str),
                                                      rows["x"].to_numpy(float),
                                                      rows["y"].to_numpy(float))


def _draw(plan: SyntheticPlan, rand: Randomness, parquet: pq.ParquetWriter, csv_path: Path,
          progress: Optional[Progress]) -> dict:
    """Stream every staged partition through BinAgg; each chunk's draws spend first from a
    privacy filter holding the charged guarantee (mechanisms/privacy_filter.py)."""
    rows = tracts = 0
    first_csv = True
    for k, path in enumerate(plan.staged):
        df = pd.read_parquet(path, columns=["geoid", "cell", "x", "y"])
        for cell, batch in _chunks(df, plan.cfg.publish.min_n, plan.cfg.partition_tracts):
            meter = M.PrivacyFilter({STEP: plan.guarantee}, batch.labels).meter(STEP)
            _, synthetic = binagg_synthetic(batch, plan.epsilon_param, rand, meter=meter,
                                            **plan.hyper)
            out = pd.DataFrame({"GEOID": synthetic["tract"].astype(str), "cell": cell,
                                "bin_lo": synthetic["bin_lo"].to_numpy(float),
                                "bin_hi": synthetic["bin_hi"].to_numpy(float),
                                "x": synthetic["x"].to_numpy(float),
                                "y": synthetic["y"].to_numpy(float)})
            parquet.write_table(pa.Table.from_pandas(out, schema=SCHEMA, preserve_index=False))
            out.to_csv(csv_path, mode="w" if first_csv else "a", header=first_csv, index=False)
            first_csv = False
            rows += len(out)
            tracts += batch.n_tracts
        if progress is not None:
            progress("synthesize", k + 1, len(plan.staged))
    if first_csv:
        pd.DataFrame(columns=list(COLUMNS)).to_csv(csv_path, index=False)
    return {"rows": rows, "tracts": tracts}


def _manifest(plan: SyntheticPlan, counts: dict, random_bits: str, files: dict) -> dict:
    g, cells = plan.guarantee, len(plan.cells)
    total = sequential([g] * cells)
    total_approx = to_approx(total, plan.delta * cells)
    return {
        "kind": KIND,
        "release_id": plan.synthetic_id,
        "source_release": plan.source_id,
        "mode": plan.cfg.publish.mode,
        "created": day_of(pd.Timestamp.now(tz="UTC").isoformat()),  # docs/threat-model.md
        "code_version": code_version(),
        "privacy_unit": plan.cfg.privacy.unit,
        "neighbouring_relation": plan.cfg.privacy.neighbouring,
        "method": ("BinAgg (Lin, Slavkovic & Bhoomireddy): PrivTree bins of x, discrete-"
                   "Gaussian bin counts and sums per tract and cell; rows by Algorithm 3 from "
                   "those summaries (post-processing); the aggregated regression on a tract's "
                   "rows is BinAgg's estimate (Cor. 3.1)"),
        "hyperparameters": M.get(ESTIMATOR).hyper(plan.hyper),
        "min_n": plan.cfg.publish.min_n,
        "cells": list(plan.cells),
        "composition": {"within_tract_and_cell": "sequential: one step",
                        "across_tracts": "parallel: each person is in one tract per cell",
                        "across_cells": "sequential: cells may share people",
                        "across_releases": "sequential: tracked by the budget ledger"},
        "budget": {"epsilon_available": plan.epsilon, "delta_available": plan.delta,
                   "conversion_delta": plan.delta, "steps": [plan.step.as_dict()],
                   "per_tract_and_cell": as_dict(g),
                   "epsilon_per_tract_and_cell": plan.charged_epsilon,
                   "delta_per_tract_and_cell": plan.delta},
        "total_per_person": {"epsilon": total_approx.epsilon, "delta": total_approx.delta,
                             "rho": total.rho, "guarantee": as_dict(total), "cells": cells},
        "ledger_entry": {"dataset": plan.cfg.ledger.dataset, "release_id": plan.synthetic_id,
                         "charges": cells, "epsilon": plan.charged_epsilon * cells,
                         "delta": plan.delta * cells},
        "noise_sampler": {"random_bits": random_bits,
                          "per_estimator": {ESTIMATOR: M.get(ESTIMATOR).sampler}},
        "columns": dict(COLUMN_TEXT),
        "license": plan.cfg.publish.license,
        "citation": plan.cfg.publish.citation,
        "counts": counts,
        "files": files,
    }


def _stage(plan: SyntheticPlan, rand: Randomness, random_bits: str,
           progress: Optional[Progress]) -> Path:
    staging = Path(plan.cfg.publish.internal) / plan.synthetic_id / "staging"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    with pq.ParquetWriter(staging / PARQUET, SCHEMA) as writer:
        counts = _draw(plan, rand, writer, staging / CSV, progress)
    (staging / CONFIG).write_text(json.dumps(public_config(plan.cfg), indent=2, sort_keys=True))
    (staging / CSV_SCHEMA).write_text(json.dumps(synthetic_table_schema(), indent=2) + "\n")
    files = {name: {"sha256": sha256_file(staging / name),
                    "bytes": (staging / name).stat().st_size}
             for name in (PARQUET, CSV, CSV_SCHEMA, CONFIG)}
    manifest = _manifest(plan, counts, random_bits, files)
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    return staging


# --------------------------------------------------------------------- draw once, reuse after


DRAW_STAGE, DRAW_CHUNK = "synthesize", "all"  # the one draw of a synthetic file, in its log


def _open_draw_log(plan: SyntheticPlan) -> DrawLog:
    """The draw log of this synthetic id, begun for a new charge or checked for a resume.

    Its header holds the request and output folder (as config) and the staged input: a resume
    must ask for the same file. An unfinished charge whose log is gone is refused: whether its
    noise was drawn and seen cannot be told, and it is never drawn again."""
    internal = Path(plan.cfg.publish.internal) / plan.synthetic_id
    log = DrawLog(internal)
    if not plan.resume and log.path.exists():
        # No charge in the ledger, so no draw was made under this log (a charge refused, or
        # an interrupted first run before its charge): begun again, unless it records a draw.
        if len(log.lines()) > 1:
            raise SynthesizeError(
                f"{log.path} records a synthetic draw but the ledger at "
                f"{redact_url(plan.cfg.ledger.url)} has no {plan.synthetic_id}: "
                "is this the right ledger? Nothing was charged")
        log.path.unlink()
    elif plan.resume and not log.path.exists():
        raise SynthesizeError(
            f"{plan.synthetic_id} is charged but unfinished in the ledger, and its draw log "
            f"{log.path} is missing: whether its noise was drawn and seen cannot be told, so it "
            "is never drawn again; restore the log from a backup to finish it, or give a new "
            "--synthetic-id (the charge stays spent)")
    internal.mkdir(parents=True, exist_ok=True)
    request = hashlib.sha256(f"{plan.request_sha256()} {os.path.realpath(plan.out)}"
                             .encode()).hexdigest()
    inputs = hashlib.sha256(" ".join(f"{p.name}:{sha256_file(p)}" for p in plan.staged)
                            .encode()).hexdigest()
    try:
        DrawLog.open(internal, plan.synthetic_id, request, inputs)
    except InputChanged:
        raise SynthesizeError(
            f"{plan.synthetic_id} was begun with another --out, request or staged input of "
            f"{plan.source_id} ({log.path}): rerun it exactly as it was begun to finish it (no "
            "new charge), or give a new --synthetic-id") from None
    return log


def _recorded_draw(log: DrawLog, plan: SyntheticPlan) -> tuple[Optional[Path], bool]:
    """The recorded draw's folder and whether it is in place already ((None, False): no draw
    recorded). A recorded draw found nowhere intact is refused, never drawn again."""
    draw = log.draws().get((DRAW_STAGE, DRAW_CHUNK))
    if draw is None:
        if os.path.lexists(plan.out):
            raise SynthesizeError(f"{plan.out} exists but is not the recorded draw of "
                                  f"{plan.synthetic_id}: move it away and run again to finish "
                                  "it (no new charge)")
        return None, False
    staged = log.internal / Path(draw["path"]).parent
    for folder, in_place in ((Path(plan.out), True), (staged, False)):
        if (folder / MANIFEST).is_file() and _intact(folder, draw["sha256"]):
            return folder, in_place
    raise SynthesizeError(
        f"the recorded synthetic draw of {plan.synthetic_id} ({staged}, manifest sha256 "
        f"{draw['sha256']}) is neither there nor in {plan.out}, or differs: noise that may have "
        "been seen is never drawn again; restore it from a backup and run again, or give a new "
        "--synthetic-id (the charge stays spent)")


def _intact(folder: Path, manifest_sha256: str) -> bool:
    """The folder's manifest is the recorded one and every file it lists has its sha256."""
    if sha256_file(folder / MANIFEST) != manifest_sha256:
        return False
    files = json.loads((folder / MANIFEST).read_text()).get("files", {})
    return all((folder / name).is_file() and sha256_file(folder / name) == f["sha256"]
               for name, f in files.items())


def _move_into_place(staging: Path, target: Path) -> None:
    """One rename where possible; across file systems a copy beside the target, then one
    rename, so a reader never sees a half-written folder."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staging, target)
    except OSError:
        beside = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        shutil.copytree(staging, beside)
        os.rename(beside, target)
        shutil.rmtree(staging)


def synthesize_release(config_path: Path, release_id: str, epsilon: float,
                       out: Optional[Path] = None, *, delta: Optional[float] = None,
                       synthetic_id: Optional[str] = None, noise_seed: Optional[int] = None,
                       progress: Optional[Progress] = None, **hyper) -> Path:
    """Write DP synthetic microdata (Parquet and CSV: GEOID, cell, bin_lo, bin_hi, x, y; no
    person ids) for published release
    ``release_id``, charged to the ledger as ``synthetic_id`` (default
    ``<release_id>-synthetic``) at (``epsilon``, ``delta``) per tract and cell; returns the
    folder (``out``, default ``<publish root>/<synthetic id>``).

    Raises :class:`SynthesizeError` (one line, exit 2) before any charge for a bad request;
    ledger errors (over the cap, busy) come from dpatlas/ledger/store.py, also before any noise."""
    plan = plan_synthetic(Path(config_path), release_id, epsilon, delta=delta,
                          synthetic_id=synthetic_id, out=out, noise_seed=noise_seed, **hyper)
    cfg = plan.cfg
    owner = f"{socket.gethostname()}:{os.getpid()}:synthesize"
    log = _open_draw_log(plan)  # before the charge: a charged id always has its log
    ledger = Ledger(cfg.ledger.url)
    try:
        expected = None
        if cfg.ledger.cap_epsilon is not None or cfg.ledger.cap_delta is not None:
            expected = (cfg.ledger.cap_epsilon, cfg.ledger.cap_delta)
        status = ledger.begin_release(plan.synthetic_id, cfg.ledger.dataset, plan.charges(),
                                      plan.request_sha256(), owner, LEASE_SECONDS, expected,
                                      plan=plan.plan_entry())
        if status != ("resume" if plan.resume else "new"):  # another run got there between
            raise SynthesizeError(f"{plan.synthetic_id} is {status} in the ledger by another "
                                  "run since this one began: nothing was charged by this run")
        with ledger.leased(plan.synthetic_id, owner, LEASE_SECONDS) as lease:
            try:
                crashpoint("synthesize-after-charge")
                folder, in_place = _recorded_draw(log, plan)
                if folder is None:
                    bits = RANDOM_BITS_OS if noise_seed is None else RANDOM_BITS_SEEDED
                    folder = _stage(plan, default_randomness(noise_seed), bits, progress)
                    crashpoint("before-record-synthetic")
                    log.record(DRAW_STAGE, DRAW_CHUNK, folder / MANIFEST,
                               noise_source(noise_seed))
                lease.check()
                if not in_place:
                    _move_into_place(folder, plan.out)
                    crashpoint("synthesize-after-move")
                ledger.complete_release(plan.synthetic_id,
                                        sha256_file(plan.out / MANIFEST), owner)
            except BaseException as err:
                # Noise may have been drawn: the entry is marked failed (while this run still
                # holds the lease) and its charge stays; a rerun with the same id and request
                # finishes it from its recorded draw.
                try:
                    reason = " ".join(f"{type(err).__name__}: {err}".split())[:300]
                    ledger.fail_release(plan.synthetic_id, reason, owner)
                except Exception:  # noqa: BLE001 - the original error is the one to report
                    pass
                raise
    finally:
        ledger.close()
    _list_in_feed(plan)
    return plan.out


def _list_in_feed(plan: SyntheticPlan) -> None:
    """A folder written in the publish root (the default ``--out``) whose source release the
    root's feed lists enters that feed and its STAC catalogue beside the source; one written
    elsewhere is the operator's to place."""
    from dpatlas.publication.feed import (FeedError, feed_damage, listed, rebuild_feed,
                                          update_synthetic)

    root = Path(os.path.realpath(plan.cfg.publish.root))
    if Path(os.path.realpath(plan.out)).parent != root:
        return
    try:
        if feed_damage(root, adding=plan.synthetic_id) is not None:  # would lose releases
            with Ledger(plan.cfg.ledger.url, create=False) as ledger:
                rebuild_feed(root, ledger.release)
        if listed(root, plan.source_id) is None:
            return
    except FeedError as err:
        raise SynthesizeError(f"{plan.out} is written and charged, but the feed at {root} "
                              f"cannot be read: {err}") from None
    try:
        update_synthetic(root, plan.synthetic_id)
    except FeedError as err:
        raise SynthesizeError(f"{plan.out} is written and charged, but the feed could not list "
                              f"it: {err}") from None
