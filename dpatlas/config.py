"""The release configuration: a YAML file validated with pydantic.

Unknown keys are errors (a typo must not silently fall back to a default); every error names
the key and what is allowed. ``EXAMPLE`` is the documented example that ``dpatlas config
example`` prints; the tests check that it validates.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

# The estimators a release may publish (the DP ones of the registry).
PUBLISHABLE = ("NoisyStats", "NoisyIntercept", "DPExpTheilSen", "DPExpTheilSenMatch",
               "DPExpTheilSenkMatch", "DPWideTheilSen", "DPSSTheilSen", "DPGDPure", "DPGDzCDP",
               "DPGDApprox")
PRIMARY = ("NoisyStats", "DPExpTheilSen")


class ConfigError(ValueError):
    """A configuration problem, with a message meant for the operator."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Columns(_Strict):
    geoid: str = "geoid"
    parent_rank: str = "parent_rank"
    child_rank: str = "child_rank"
    person_id: Optional[str] = None
    cell: Optional[str] = None


class InputConfig(_Strict):
    path: Path
    format: Literal["parquet", "csv"] = "parquet"
    columns: Columns = Columns()
    rank_scale: Literal["unit", "percentile"] = "unit"


class BoundariesConfig(_Strict):
    path: Path
    geoid_column: str = "GEOID"


class PrivacyConfig(_Strict):
    unit: Literal["person"] = "person"
    neighbouring: Literal["replace-one"] = "replace-one"
    epsilon_per_tract: float = Field(1.0, gt=0, le=100)
    delta: float = Field(1e-6, gt=0, lt=1e-2)


class SelectionConfig(_Strict):
    rule: Literal["dp", "public", "fixed"] = "dp"
    threshold: Optional[float] = Field(None, gt=0)
    threshold_file: Optional[Path] = None
    budget_share: float = Field(0.1, gt=0, lt=1)
    mechanism: Literal["NoisyStats", "DPExpTheilSen"] = "DPExpTheilSen"

    @model_validator(mode="after")
    def _threshold_given(self):
        if self.rule != "fixed" and (self.threshold is None) == (self.threshold_file is None):
            raise ValueError("selection: give exactly one of 'threshold' or 'threshold_file' "
                             f"for rule '{self.rule}'")
        return self


class ProfileConfig(_Strict):
    name: Literal["primary", "full-suite"] = "primary"
    suite_share: float = Field(0.5, gt=0, lt=1)
    suite: tuple[str, ...] = PUBLISHABLE

    @model_validator(mode="after")
    def _known(self):
        bad = [s for s in self.suite if s not in PUBLISHABLE]
        if bad:
            raise ValueError(f"profile.suite: unknown estimator(s) {bad}; allowed: "
                             f"{', '.join(PUBLISHABLE)}")
        return self


class ValidationConfig(_Strict):
    policy: Literal["fail", "clip", "drop"] = "fail"


class PublishConfig(_Strict):
    root: Path = Path("releases")
    internal_root: Optional[Path] = None  # default: <root>-internal, beside the publish root
    min_n: int = Field(2, ge=2)  # tracts with fewer records are suppressed (n is public)

    @property
    def internal(self) -> Path:
        return self.internal_root or self.root.with_name(self.root.name + "-internal")


class ScheduleConfig(_Strict):
    cron: Optional[str] = None  # e.g. "0 3 1 * *": 03:00 on the 1st of every month
    timezone: str = "UTC"


class LedgerConfig(_Strict):
    url: str = "sqlite:///ledger.db"  # relative SQLite paths are relative to the config file
    dataset: str = "default"  # the population whose lifetime budget is capped
    cap_epsilon: float = Field(10.0, gt=0)
    cap_delta: float = Field(1e-5, ge=0, lt=1)


class ReleaseConfig(_Strict):
    release_id: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    input: InputConfig
    boundaries: BoundariesConfig
    privacy: PrivacyConfig = PrivacyConfig()
    selection: SelectionConfig
    profile: ProfileConfig = ProfileConfig()
    validation: ValidationConfig = ValidationConfig()
    publish: PublishConfig = PublishConfig()
    partition_tracts: int = Field(2000, ge=1, le=1_000_000)
    schedule: ScheduleConfig = ScheduleConfig()
    ledger: LedgerConfig = LedgerConfig()
    runner: Literal["local", "dask"] = "local"
    dask_address: Optional[str] = None  # runner dask: a scheduler address; none = local cluster
    dask_workers: int = Field(2, ge=1, le=256)


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; `dpatlas config example` lists every key)"
        elif e["type"] == "literal_error" and "expected" in e.get("ctx", {}):
            msg = f"must be one of {e['ctx']['expected']}"
        got = e.get("input")
        got_text = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        lines.append(f"  {key}: {msg}{got_text}")
    return "\n".join(lines)


def parse_config(data: dict, source: str = "<config>", base: Path | None = None) -> ReleaseConfig:
    """Validate a config mapping; relative paths are taken relative to ``base``."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid configuration in {source}: expected a mapping of keys")
    try:
        cfg = ReleaseConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None
    return _resolve_paths(cfg, base) if base else cfg


def load_config(path: Path) -> ReleaseConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"configuration file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    return parse_config(data, str(path), base=path.parent)


def _resolve_paths(cfg: ReleaseConfig, base: Path) -> ReleaseConfig:
    def fix(p: Optional[Path]) -> Optional[Path]:
        return None if p is None or p.is_absolute() else (base / p)

    updates = {
        "input": cfg.input.model_copy(update={"path": fix(cfg.input.path) or cfg.input.path}),
        "boundaries": cfg.boundaries.model_copy(
            update={"path": fix(cfg.boundaries.path) or cfg.boundaries.path}),
        "publish": cfg.publish.model_copy(update={
            "root": fix(cfg.publish.root) or cfg.publish.root,
            "internal_root": fix(cfg.publish.internal_root) or cfg.publish.internal_root}),
    }
    url = cfg.ledger.url
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        rel = url[len("sqlite:///"):]
        if rel and rel != ":memory:":
            updates["ledger"] = cfg.ledger.model_copy(
                update={"url": "sqlite:///" + str((base / rel).resolve())})
    if cfg.selection.threshold_file is not None:
        updates["selection"] = cfg.selection.model_copy(
            update={"threshold_file": fix(cfg.selection.threshold_file)
                    or cfg.selection.threshold_file})
    return cfg.model_copy(update=updates)


def fingerprint(cfg: ReleaseConfig) -> str:
    """sha256 of the validated configuration (canonical JSON), for the manifest."""
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()


EXAMPLE = """\
# dpatlas release configuration. Relative paths are relative to this file.
release_id: null              # null: a new id (date + random suffix) for every run

input:
  path: data/microdata        # a Parquet file, a hive-partitioned Parquet dataset (state=17/...),
                              # or a CSV file
  format: parquet             # parquet | csv
  columns:                    # your column names for what the pipeline needs
    geoid: geoid              # 11-digit tract GEOID (2 state + 3 county + 6 tract digits)
    parent_rank: parent_rank  # x
    child_rank: child_rank    # y
    person_id: null           # optional: checked for duplicates
    cell: null                # optional: demographic cell; each cell gets its own budget
  rank_scale: unit            # unit: ranks on [0, 1]; percentile: ranks on [0, 100]

boundaries:
  path: data/tracts.parquet   # TIGER/Line tracts: zipped shapefile, GeoPackage, GeoParquet, GeoJSON
  geoid_column: GEOID

privacy:
  unit: person                # the privacy unit
  neighbouring: replace-one   # n per tract is public, as in the Opportunity Atlas
  epsilon_per_tract: 1.0      # budget per tract and cell (pure epsilon unless the suite needs delta)
  delta: 1.0e-6               # used only by (epsilon, delta) estimators in the full suite

selection:                    # which mechanism publishes p25/p75 in each tract
  rule: dp                    # dp: spend budget_share on a noisy n*var(x) and compare
                              #     n*eps*var(x) with the threshold (NoisyStats if above);
                              # public: NoisyStats if n >= threshold; fixed: always `mechanism`
  threshold_file: thresholds.yaml   # written by `dpatlas calibrate` (never fit on release data)
  # threshold: 30.0           # ... or a number instead of threshold_file
  budget_share: 0.1           # dp rule: share of the tract budget spent on selection
  mechanism: DPExpTheilSen    # fixed rule: NoisyStats | DPExpTheilSen

profile:
  name: primary               # primary: p25/p75 of the selected mechanism get the whole budget
                              # full-suite: primary + every estimator in `suite`, each with a share
  suite_share: 0.5            # full-suite: share of the budget split equally over the suite
  # suite: [NoisyStats, NoisyIntercept, DPExpTheilSen, DPGDPure]   # default: every DP estimator

validation:
  policy: fail                # fail: stop before any noise; clip: clip ranks to [0, 1];
                              # drop: move bad rows to quarantine and go on

publish:
  root: releases              # one folder per release id, plus the feed
  internal_root: null         # validation reports, quarantine; default: <root>-internal
  min_n: 2                    # tracts with fewer records are suppressed

partition_tracts: 2000        # tracts per partition (one task run per partition and stage)

schedule:
  cron: null                  # e.g. "0 3 1 * *" for the scheduled deployment (deploy/serve.py)
  timezone: UTC

ledger:                       # the privacy budget ledger (a SQLAlchemy URL)
  url: sqlite:///ledger.db    # or postgresql+psycopg://user@host/db for shared deployments
  dataset: default            # whose lifetime budget is capped
  cap_epsilon: 10.0           # lifetime cap per person, summed over releases
  cap_delta: 1.0e-5

runner: local                 # local | dask (prefect-dask)
dask_address: null            # runner dask: scheduler address, e.g. tcp://10.0.0.5:8786; null = a local cluster
dask_workers: 2               # workers of the local cluster
"""
