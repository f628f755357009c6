"""The release configuration: a YAML file validated with pydantic.

Unknown keys are errors (a typo must not silently fall back to a default); every error names
the key and what is allowed. ``EXAMPLE`` is the documented example that ``dpatlas config
example`` prints; the tests check that it validates.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Literal, Optional

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)

from mechanisms import DEFAULT_SUITE, PUBLISHABLE

from dpatlas.core.ids import (InvalidDatasetName, InvalidReleaseId, validate_dataset_name,
                              validate_release_id)
from dpatlas.core.errors import ReleaseRefused

# PUBLISHABLE: the estimators a release may publish, derived from the registry (its DP
# estimators whose noise sampler is safe to publish), so an evaluation-only one cannot slip in.
PRIMARY = ("NoisyStats", "DPExpTheilSen")

# Geography levels a release may publish; a person is in one unit of each (issue 20, item 1).
LEVELS = ("tract", "county", "state")
# The default split of epsilon_per_tract across the levels a release publishes, chosen by
# `dpatlas evaluate-small-area` (docs/small-area.md) on the calibration seeds: 0.7/0.27/0.03
# was better than 0.7/0.2/0.1 on every measure but the p25 RMSE, and only it brought two
# releases' model p25 to a correlation >= 0.7; 0.66/0.31/0.03 then kept the model's p25 RMSE
# (0.0430 both) and brought the county p25's median error from 0.022 to 0.018 (the target is
# 0.02); the state is so large that 0.03 of the budget estimates it to about 0.002.
# Levels a config leaves out drop out and the rest are scaled to sum to 1; [tract] alone
# keeps the whole budget.
DEFAULT_LEVEL_SHARES = {"tract": 0.66, "county": 0.31, "state": 0.03}
LEVEL_SHARE_TOLERANCE = 1e-9
# The published data's licence unless publish.license says otherwise (an SPDX identifier):
# CC BY 4.0 lets anyone reuse the files with attribution, which the tiles and catalogues carry.
DEFAULT_LICENSE = "CC-BY-4.0"
# publish keys that describe the published files without changing any value in them: left out
# of the config's hash, so a release resumes (and old configs hash) as before they existed.
# What a reader is told about a release (issue 33): optional, in config.json only when set.
READER_METADATA_KEYS = ("title", "description", "measure", "notice", "contact")
PUBLISH_METADATA_KEYS = ("internal_retention_days", "license", "citation", "base_url",
                         *READER_METADATA_KEYS)

# The calibration shipped with the package (`dpatlas calibrate` on synthetic states): the
# selection's threshold file when a config names neither a threshold nor a file, so the
# example config runs as printed.
SHIPPED_THRESHOLDS = Path(__file__).parents[1] / "defaults" / "thresholds.yaml"


class ConfigError(ValueError, ReleaseRefused):
    """A configuration problem, with a message meant for the operator."""


class _Strict(BaseModel):
    # No NaN or infinity anywhere: a cap of .inf or an epsilon of .nan is an error, not a value.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value, info):
        # YAML turns `true` into a bool, and pydantic would take it as 1 for a float or int
        # field: a budget of `true` must be an error, not epsilon = 1.
        field = cls.model_fields.get(info.field_name)
        ann = getattr(field, "annotation", None)
        if isinstance(value, bool) and ann in (float, int, Optional[float], Optional[int]):
            raise ValueError("must be a number, not true/false")
        return value


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
    vintage: Optional[str] = None  # e.g. "TIGER/Line 2020 tracts": printed in the manifest


MIN_EPSILON_PER_TRACT = 1e-3


class PrivacyConfig(_Strict):
    unit: Literal["person"] = "person"
    neighbouring: Literal["replace-one"] = "replace-one"
    epsilon_per_tract: float = Field(1.0, gt=0, le=100)
    delta: float = Field(1e-6, gt=0, lt=1e-2)
    # Parallel composition over tracts needs each person in at most one tract per cell. With a
    # person id column that is checked; without one the operator must state it, and the
    # manifest lists it as an unverified assumption.
    assume_one_record_per_person: bool = False

    @field_validator("epsilon_per_tract")
    @classmethod
    def _sensible_epsilon(cls, value: float) -> float:
        # Refused here, before any input is read: below it the mechanisms' noise grids cannot
        # be calibrated (1e-300 failed in the allocation, after the ingest), and the noise
        # would swamp every tract's estimate long before that.
        if value < MIN_EPSILON_PER_TRACT:
            raise ValueError(f"must be at least {MIN_EPSILON_PER_TRACT:g}, the smallest "
                             "sensible budget per tract (below it the noise swamps every "
                             "estimate; far below it the mechanisms' noise grids cannot be "
                             "calibrated at all)")
        return value


class SelectionConfig(_Strict):
    rule: Literal["dp", "public", "fixed", "banded"] = "dp"
    threshold: Optional[float] = Field(None, gt=0)
    threshold_file: Optional[Path] = None
    budget_share: float = Field(0.1, gt=0, lt=1)
    mechanism: Literal["NoisyStats", "DPExpTheilSen"] = "DPExpTheilSen"

    @model_validator(mode="before")
    @classmethod
    def _shipped_thresholds_by_default(cls, data):
        # Neither a threshold nor a file: the shipped calibration, named explicitly, so the
        # fingerprint and the manifest say which file the release used.
        if (isinstance(data, dict) and data.get("rule", "dp") != "fixed"
                and data.get("threshold") is None and data.get("threshold_file") is None):
            return {**data, "threshold_file": SHIPPED_THRESHOLDS}
        return data

    @model_validator(mode="after")
    def _threshold_given(self):
        if self.rule == "banded" and (self.threshold is not None or self.threshold_file is None):
            raise ValueError("selection: rule 'banded' takes its bands and threshold from "
                             "'threshold_file' (written by dpatlas calibrate); give no "
                             "'threshold'")
        if self.rule != "fixed" and (self.threshold is None) == (self.threshold_file is None):
            raise ValueError("selection: give exactly one of 'threshold' or 'threshold_file' "
                             f"for rule '{self.rule}'")
        return self


class ProfileConfig(_Strict):
    name: Literal["primary", "full-suite"] = "primary"
    suite_share: float = Field(0.5, gt=0, lt=1)
    suite: tuple[str, ...] = DEFAULT_SUITE

    @model_validator(mode="after")
    def _known(self):
        bad = [s for s in self.suite if s not in PUBLISHABLE]
        if bad:
            raise ValueError(f"profile.suite: unknown estimator(s) {bad}; allowed: "
                             f"{', '.join(PUBLISHABLE)}")
        return self


class IntervalsConfig(_Strict):
    # A confidence interval for p25 and p75 of every released tract, for the tract expected
    # outcome (mechanisms/estimand.py: the population least-squares prediction of the law that
    # generated the tract's records), covering the total error (sampling error and privacy
    # noise), with the standard error and 90% margin of error beside it; paid from the primary
    # budget.
    enabled: bool = True
    share: float = Field(0.25, gt=0, lt=1)  # of the primary budget, spent on the interval
    level: float = Field(0.95, ge=0.5, lt=1)
    # wider: not counted reliable by the evaluations (the maps hatch an interval spanning
    # more than one colour class instead, dpatlas.publication.colours.spans_classes)
    low_reliability_width: float = Field(0.5, gt=0, le=1)


class ValidationConfig(_Strict):
    policy: Literal["fail", "clip", "drop"] = "fail"
    # A person with more than one record in a cell: fail (default), or bound (keep one record
    # per person and cell by a rule that looks only at that person's own records).
    contributions: Literal["fail", "bound"] = "fail"
    # clip/drop refuse the release when they would change more than this share of the rows
    # (a whole file on the wrong scale must not be "cleaned" into a release).
    max_changed_share: float = Field(0.01, ge=0, le=1)


class PublishConfig(_Strict):
    root: Path = Path("releases")
    internal_root: Optional[Path] = None  # default: <root>-internal, beside the publish root
    min_n: int = Field(2, ge=2)  # tracts with fewer records are suppressed (n is public)
    # public: a real release (noise from the OS CSPRNG only). test: a test root, the only kind
    # that accepts repeatable (seeded) noise; its manifests and feed say NOT FOR RELEASE.
    mode: Literal["public", "test"] = "public"
    # Days a published (or withdrawn) release keeps its person-level internal files (the
    # staged copies of the confidential input, the quarantined rows) before `dpatlas purge`
    # removes them; null keeps them forever. Unfinished releases are never purged.
    internal_retention_days: Optional[int] = Field(30, ge=0)
    # The published data's licence, an SPDX identifier (STAC, datapackage.json, the tiles'
    # attribution); and how to cite the release (free text: STAC sci:citation, the manifest,
    # datapackage.json). Metadata about the files, not what they hold: outside the hash.
    license: str = Field(DEFAULT_LICENSE, pattern=r"^[A-Za-z0-9][A-Za-z0-9.+-]*$",
                         max_length=100)
    citation: Optional[str] = Field(None, min_length=1, max_length=2000)
    # What a reader is told about the release (the map, the PNG, the feed, STAC, the data
    # package, the release's README.md): its title, a description, the measure's definition,
    # a notice shown wherever the data are (e.g. that they are synthetic) and whom to contact.
    title: Optional[str] = Field(None, min_length=1, max_length=200)
    description: Optional[str] = Field(None, min_length=1, max_length=2000)
    measure: Optional[str] = Field(None, min_length=1, max_length=2000)
    notice: Optional[str] = Field(None, min_length=1, max_length=500)
    contact: Optional[str] = Field(None, min_length=1, max_length=300)
    # Where the publish root is served (https://example.org/atlas/): the feed's and the
    # Prefect artifact's links are absolute under it; none: relative to the publish root.
    base_url: Optional[str] = Field(None, pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
                                    max_length=500)

    @field_validator("base_url")
    @classmethod
    def _base_url_a_folder(cls, value: Optional[str]) -> Optional[str]:
        return value if value is None or value.endswith("/") else value + "/"

    @field_validator("citation")
    @classmethod
    def _citation_not_a_path(cls, value: Optional[str]) -> Optional[str]:
        # The audit refuses a manifest string that starts like a path or URL (no machine
        # paths may leak); a citation names its DOI or URL after the text, not first.
        if value is not None and (value.strip().startswith(("/", "~", "\\"))
                                  or re.match(r"^[a-z][a-z0-9+.-]*://", value.strip(), re.I)):
            raise ValueError("publish.citation must begin with text (authors, title), not a "
                             "URL or path: put the DOI or URL after the text")
        return value

    @property
    def internal(self) -> Path:
        return self.internal_root or self.root.with_name(self.root.name + "-internal")


class ScheduleConfig(_Strict):
    cron: Optional[str] = None  # e.g. "0 3 1 * *": 03:00 on the 1st of every month
    timezone: str = "UTC"


class LedgerConfig(_Strict):
    url: str = "sqlite:///ledger.db"  # relative SQLite paths are relative to the config file
    dataset: str = Field("default", min_length=1, max_length=200)  # whose lifetime budget
    # The lifetime cap is the ledger's (`dpatlas ledger set-cap`). A config may state the cap
    # it expects; a release is refused when the ledger's cap differs.
    cap_epsilon: Optional[float] = Field(None, gt=0)
    cap_delta: Optional[float] = Field(None, ge=0, lt=1)

    @field_validator("dataset")
    @classmethod
    def _valid_dataset(cls, value):
        try:
            return validate_dataset_name(value)
        except InvalidDatasetName as err:
            raise ValueError(str(err)) from None


class LimitsConfig(_Strict):
    # Memory one estimation chunk may use; a tract whose mechanism would need more is refused
    # (or, under the dp rule, given NoisyStats by its public n) before anything is charged.
    memory_gib: float = Field(4.0, gt=0, le=1024)


class SmallAreaConfig(_Strict):
    # Model-based tract estimates (p25_model, p75_model with intervals and SE): post-processing
    # of the published tract, county and state tables (docs/small-area.md), no budget.
    model: bool = False


class ReleaseConfig(_Strict):
    release_id: Optional[str] = None
    input: InputConfig
    boundaries: BoundariesConfig
    privacy: PrivacyConfig = PrivacyConfig()
    selection: SelectionConfig
    profile: ProfileConfig = ProfileConfig()
    intervals: IntervalsConfig = IntervalsConfig()
    validation: ValidationConfig = ValidationConfig()
    publish: PublishConfig = PublishConfig()
    partition_tracts: int = Field(2000, ge=1, le=1_000_000)
    schedule: ScheduleConfig = ScheduleConfig()
    ledger: LedgerConfig = LedgerConfig()
    runner: Literal["local", "dask"] = "local"
    dask_address: Optional[str] = None  # runner dask: a scheduler address; none = local cluster
    dask_workers: int = Field(2, ge=1, le=256)
    # The local runner's worker processes for the draws' arithmetic (0: the flow's threads;
    # dpatlas.release.compute_pool)
    local_processes: int = Field(2, ge=0, le=256)
    # Where the chunks' partitions and draws are staged for workers on other machines
    # (file:///shared/folder, s3://bucket/prefix; dpatlas.release.staging); none = not staged
    staging_url: Optional[str] = None
    limits: LimitsConfig = LimitsConfig()
    # The geography levels published, and the split of epsilon_per_tract across them (levels
    # compose sequentially: each person is in one tract, one county and one state).
    levels: tuple[Literal["tract", "county", "state"], ...] = ("tract",)
    level_shares: Optional[dict[str, float]] = None
    small_area: SmallAreaConfig = SmallAreaConfig()
    # The folder of the config file its relative paths were resolved against (load_config):
    # the fingerprint states paths inside it relative to it.
    _base: Optional[Path] = PrivateAttr(default=None)

    @field_validator("level_shares", mode="before")
    @classmethod
    def _no_bool_shares(cls, value):
        if isinstance(value, dict) and any(isinstance(v, bool) for v in value.values()):
            raise ValueError("each share must be a number, not true/false")
        return value

    @model_validator(mode="after")
    def _levels_valid(self):
        if "tract" not in self.levels:
            raise ValueError("levels: must include tract (counties and states are published "
                             "beside the tracts)")
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"levels: {list(self.levels)} names a level twice")
        if self.small_area.model and not {"county", "state"} <= set(self.levels):
            # fit_model removes the directs' bias against the county estimates and benchmarks
            # to the state's; without them it would publish biased values, unevaluated.
            raise ValueError("small_area.model needs the county and state levels (levels: "
                             "[tract, county, state]): the model removes the tract directs' "
                             "bias against the county estimates and benchmarks to the state's")
        if self.level_shares is None:
            return self
        shares = self.level_shares
        unknown = sorted(set(shares) - set(LEVELS))
        if unknown:
            raise ValueError(f"level_shares: unknown level(s) {unknown}; allowed: "
                             f"{', '.join(LEVELS)}")
        if set(shares) != set(self.levels):
            raise ValueError(f"level_shares: give a share for exactly the levels "
                             f"{list(self.levels)} (got {sorted(shares)})")
        bad = {k: v for k, v in shares.items() if not 0 < v <= 1}
        if bad:
            raise ValueError(f"level_shares: each share must be a number in (0, 1]; got {bad}")
        if abs(sum(shares.values()) - 1.0) > LEVEL_SHARE_TOLERANCE:
            raise ValueError(f"level_shares: the shares must sum to 1 (they sum to "
                             f"{sum(shares.values()):.12g})")
        return self

    def shares(self) -> dict[str, float]:
        """The share of epsilon_per_tract each published level spends, in ``levels`` order."""
        if self.level_shares is not None:
            return {level: float(self.level_shares[level]) for level in self.levels}
        if self.levels == ("tract",):
            return {"tract": 1.0}
        if set(self.levels) == set(DEFAULT_LEVEL_SHARES):  # as stated (no rescaling rounding)
            return {level: DEFAULT_LEVEL_SHARES[level] for level in self.levels}
        total = sum(DEFAULT_LEVEL_SHARES[level] for level in self.levels)
        return {level: DEFAULT_LEVEL_SHARES[level] / total for level in self.levels}

    @field_validator("release_id")
    @classmethod
    def _valid_id(cls, value):
        if value is not None:
            try:
                validate_release_id(value)
            except InvalidReleaseId as err:
                raise ValueError(str(err)) from None
        return value


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
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
        # Resolved, so the same file spelled two ways gives the same config (and hash).
        return None if p is None else (base / p).expanduser().resolve()

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
    if cfg.staging_url:
        updates["staging_url"] = _resolve_staging_url(cfg.staging_url, base)
    if cfg.selection.threshold_file is not None:
        updates["selection"] = cfg.selection.model_copy(
            update={"threshold_file": fix(cfg.selection.threshold_file)
                    or cfg.selection.threshold_file})
    resolved = cfg.model_copy(update=updates)
    resolved._base = base.expanduser().resolve()
    return resolved


def _resolve_staging_url(url: str, base: Path) -> str:
    """A local staging location (a path or a ``file://`` URL) made absolute against ``base``,
    as the config's other paths are: resolved against the working directory instead, a
    person-level copy landed where no configured folder (and no purge from elsewhere) saw it."""
    if url.startswith("file://"):
        return "file://" + str((base / Path(url[len("file://"):]).expanduser()).resolve())
    if "://" in url:
        return url  # object storage: not a path
    return str((base / Path(url).expanduser()).resolve())


def fingerprint(cfg: ReleaseConfig, relative_paths: bool = True) -> str:
    """sha256 of the validated configuration with its paths resolved (canonical JSON).

    Paths are resolved when the config is loaded, so a config read through a relative or an
    absolute path, or naming a file as ``./x`` or ``x``, hashes the same. Where the work runs
    (the internal scratch folder, the task runner, the Dask cluster) does not change what is
    published, so it is left out: two hosts running one release with their own scratch folders
    hold the same config.

    ``relative_paths=False``: the fingerprint of the versions before issue 31 (every path
    absolute), which a release they began was recorded under (``tasks.state.open_release``).
    """
    data = cfg.model_dump(mode="json", exclude={"runner", "dask_address", "dask_workers",
                                               "local_processes", "staging_url"})
    data["publish"].pop("internal_root", None)
    for key in PUBLISH_METADATA_KEYS:  # housekeeping and metadata, not the release
        data["publish"].pop(key, None)
    _drop_default_levels(cfg, data)
    if relative_paths:
        _paths_inside_config_folder(cfg, data)
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


CONFIG_FOLDER = "<config folder>"


def _paths_inside_config_folder(cfg: ReleaseConfig, data: dict) -> None:
    """Paths inside the config file's folder stated relative to it: a folder moved whole (the
    demo's, whose config names its files relatively) holds the same config wherever it lies.
    A path outside it stays absolute: moving the config alone changes what it names."""
    base = cfg._base
    if base is None:
        return

    def inside(text: Optional[str]) -> Optional[str]:
        if text is None:
            return None
        try:
            return f"{CONFIG_FOLDER}/{Path(text).relative_to(base).as_posix()}"
        except ValueError:
            return text

    for section, key in (("input", "path"), ("boundaries", "path"), ("publish", "root"),
                         ("selection", "threshold_file")):
        data[section][key] = inside(data[section].get(key))
    url, sqlite = data["ledger"]["url"], "sqlite:///"
    if url.startswith(sqlite):
        data["ledger"]["url"] = sqlite + inside(url[len(sqlite):])


def ledger_backend(url: str) -> str:
    """The ledger's database kind ("sqlite", "postgresql"): no host, user, file or password."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).get_backend_name()
    except Exception:  # noqa: BLE001 - an unparseable URL is still never published
        return "unknown"


def public_config(cfg: ReleaseConfig) -> dict:
    """The configuration as published with a release (``config.json``): no secrets and no
    machine paths. Files are named by their base name (their sha256 is in the manifest);
    the publish and internal roots, the ledger's URL and the Dask address are left out."""
    data = cfg.model_dump(mode="json")
    data["input"]["path"] = Path(cfg.input.path).name
    data["boundaries"]["path"] = Path(cfg.boundaries.path).name
    if cfg.selection.threshold_file is not None:
        data["selection"]["threshold_file"] = Path(cfg.selection.threshold_file).name
    data["publish"].pop("root", None)
    data["publish"].pop("internal_root", None)
    data["publish"].pop("internal_retention_days", None)
    data["publish"].pop("base_url", None)  # a URL: where it is served, not what it is
    for key in READER_METADATA_KEYS:  # unset: left out, so older config.json files are unchanged
        if data["publish"].get(key) is None:
            data["publish"].pop(key, None)
    data["ledger"]["url"] = f"{ledger_backend(cfg.ledger.url)}: (withheld)"
    data.pop("dask_address", None)
    data.pop("staging_url", None)
    _drop_default_levels(cfg, data)
    return data


def _drop_default_levels(cfg: ReleaseConfig, data: dict) -> None:
    """A config that publishes tracts only dumps as it did before levels existed, so its
    fingerprint and config.json are unchanged (a release resumes under the same hash)."""
    if cfg.levels == ("tract",) and cfg.level_shares is None:
        data.pop("levels", None)
        data.pop("level_shares", None)
    if not cfg.small_area.model:  # likewise a release without the model (the default)
        data.pop("small_area", None)


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
    person_id: person_id      # one record per person and cell is checked across all
                              # partitions with it (or set privacy.assume_one_record_per_person)
    cell: null                # optional: demographic cell; each cell gets its own budget
  rank_scale: unit            # unit: ranks on [0, 1]; percentile: ranks on [0, 100]

boundaries:
  path: data/tracts.parquet   # TIGER/Line tracts: zipped shapefile, GeoPackage, GeoParquet, GeoJSON
  geoid_column: GEOID
  vintage: null               # e.g. "TIGER/Line 2020 tracts" (stated in the manifest)

privacy:
  unit: person                # the privacy unit
  neighbouring: replace-one   # n per tract is public, as in the Opportunity Atlas
  epsilon_per_tract: 1.0      # per tract and cell, 0.001 to 100 (pure unless the suite needs delta)
  delta: 1.0e-6               # used only by (epsilon, delta) estimators in the full suite
  assume_one_record_per_person: false   # true only without a person id: then the manifest
                              # lists "one record per person" as an unverified assumption

selection:                    # which mechanism publishes p25/p75 in each tract
  rule: dp                    # dp: spend budget_share on a noisy n*var(x) and compare
                              #     n*eps*var(x) with the threshold (NoisyStats if above);
                              # public: NoisyStats if n >= threshold; fixed: always `mechanism`
                              # banded: bands of n from threshold_file (docs/selection.md)
  # threshold_file: thresholds.yaml  # default: the calibration shipped with dpatlas;
                              # or a file written by `dpatlas calibrate` (never fit on release data)
  # threshold: 30.0           # ... or a number instead of a threshold file
  budget_share: 0.1           # dp rule: share of the tract budget spent on selection
  mechanism: DPExpTheilSen    # fixed rule: NoisyStats | DPExpTheilSen

profile:
  name: primary               # primary: p25/p75 of the selected mechanism get the whole budget
                              # full-suite: primary + every estimator in `suite`, each with a share
  suite_share: 0.5            # full-suite: share of the budget split equally over the suite
  # suite: [NoisyStats, NoisyIntercept, DPExpTheilSen, DPGDPure]   # default: every DP estimator but BinAgg

intervals:                    # a DP confidence interval for p25 and p75 of every released tract
  enabled: true
  share: 0.25                 # of the primary budget (mechanisms/intervals.py says how it is used)
  level: 0.95
  low_reliability_width: 0.5  # wider: unreliable in the evaluations (maps: interval spans classes)

validation:
  policy: fail                # fail: stop before any noise; clip: clip ranks to [0, 1];
                              # drop: move bad rows to quarantine and go on
  contributions: fail         # a person twice in a cell: fail, or bound (keep one record)
  max_changed_share: 0.01     # clip/drop refuse the release when they change more rows

publish:
  root: releases              # one folder per release id, plus the feed
  internal_root: null         # validation reports, quarantine; default: <root>-internal
  min_n: 2                    # tracts with fewer records are suppressed
  mode: public                # public | test (a test root: the only kind that takes seeded noise)
  internal_retention_days: 30  # `dpatlas purge` removes published releases' staged input after; null: never
  license: CC-BY-4.0          # the data's licence (SPDX id), in the catalogues and tiles
  citation: null              # how to cite the release (text, then any DOI or URL)
  title: null                 # the release's title (map, PNG, feed, STAC, datapackage, README.md)
  description: null           # what the release is, in a sentence or two
  measure: null               # the definition of the measure (in README.md, datapackage.json)
  # shown wherever the data are; this example's data are `dpatlas synth`'s: for your own
  # data replace it (or null)
  notice: "SYNTHETIC DATA (dpatlas synth): no real people; do not use these values for any decision."
  contact: null               # whom to ask about the release
  base_url: null              # where the publish root is served, e.g. https://example.org/atlas/
                              # (the feed's and Prefect artifact's links are absolute under it)

partition_tracts: 2000        # tracts per partition (one task run per partition and stage)

schedule:
  cron: null                  # e.g. "0 3 1 * *" for the scheduled deployment (deploy/serve.py)
  timezone: UTC

ledger:                       # the privacy budget ledger (a SQLAlchemy URL)
  url: sqlite:///ledger.db    # or postgresql+psycopg://user@host/db for shared deployments
  dataset: default            # whose lifetime budget is capped
  cap_epsilon: null           # the cap is the ledger's (dpatlas ledger set-cap); a number here
  cap_delta: null             # is the cap this config expects: refused if the ledger differs

runner: local                 # local | dask (prefect-dask)
dask_address: null            # runner dask: scheduler address, e.g. tcp://10.0.0.5:8786; null = a local cluster
dask_workers: 2               # workers of the local cluster
local_processes: 2            # runner local: processes computing the draws of a release of 500,000+ records (0: threads)
staging_url: null             # e.g. file:///shared/dpatlas-staging or s3://bucket/prefix: workers read chunks there
                              # (person-level rows: never inside the publish root or the input)

limits:
  memory_gib: 4.0             # a tract whose mechanism needs more memory is refused up front

levels: [tract]               # geography levels published: tract, county, state (tract always)
# level_shares: {tract: 0.66, county: 0.31, state: 0.03}  # split of epsilon_per_tract across
                              # the levels (default: these, scaled to the levels given)
small_area:
  model: false                # true: publish model-based tract estimates (p25_model...;
                              # post-processing, no budget; needs levels county and state)
"""
