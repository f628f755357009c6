"""Run the data-contract suites (``data_contracts/expectation_suites/*.json``) against pandas frames.

Every call builds its own in-memory GX Data Context, loads the suite from its JSON
file, and validates in (at most) two passes:

1. the whole suite with result format ``BASIC`` (counts, a sample of bad values);
2. only if something failed: the failed *row-level* expectations again with
   result format ``COMPLETE``, whose ``unexpected_index_list`` gives every bad row.

The frame is validated with a fresh ``RangeIndex`` (``reset_index(drop=True)``) so GX's
``unexpected_index_list`` holds positions, and ``ContractResult.bad_rows`` is the union
of those lists -- it comes from GX, no check is re-implemented in pandas.

Conditional expectations (tagged ``meta["dpatlas"]`` in the suite file, see
:mod:`data_contracts.build_suites`): the ``person_id`` null check is kept only when
the frame has a ``person_id`` column; the boundary-completeness expectation is kept only
when ``boundary_geoids`` is given, and receives them as the GX suite parameter
``boundary_geoids``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import unquote, urlparse

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import great_expectations as gx  # noqa: E402
from great_expectations.core.expectation_suite import ExpectationSuiteSchema  # noqa: E402

from great_expectations.checkpoint import UpdateDataDocsAction  # noqa: E402
from great_expectations.core.run_identifier import RunIdentifier  # noqa: E402
from great_expectations.exceptions import DataContextError  # noqa: E402

from data_contracts._context import (  # noqa: E402
    DOCS_SITE,
    RELEASE_CONTEXT_LOCK,
    quiet_context,
    release_context,
)
from data_contracts._spec import (  # noqa: E402
    COVERAGE_SUITE,
    INPUT_SUITE,
    META_KEY,
    MISSING_COLUMN,
    PUBLISHED_LEVEL_SUITES,
    PUBLISHED_SUITE,
    MOE90_MAX,
    MOE90_MAX_PARAMETER,
    STANDARD_ERROR_MAX,
    STANDARD_ERROR_MAX_PARAMETER,
    suite_path,
)

logger = logging.getLogger(__name__)

# BASIC, not SUMMARY: SUMMARY also makes GX compute every row-level expectation's index list
# and pandas query of its unexpected rows, even when there are none, and the first pass reads
# only the counts and the sample (a failed row-level expectation is run again below for its
# rows). The published check of a state's 8,161 tracts took 0.63 against 0.88 CPU-s, an input
# partition of 568,728 records 0.17 against 0.24 (benchmarks/bench_contract_format.py).
FIRST_PASS_FORMAT: dict[str, Any] = {"result_format": "BASIC", "partial_unexpected_count": 5}
COMPLETE_FORMAT: dict[str, Any] = {
    "result_format": "COMPLETE",
    # only the row positions are needed; skip the values and the pandas query string
    "exclude_unexpected_values": True,
    "return_unexpected_index_query": False,
    "partial_unexpected_count": 5,
}
_MAX_LISTED = 10


class ContractError(RuntimeError):
    """The contract machinery itself is broken (bad suite file, docs not written)."""


@dataclass(frozen=True)
class ReleaseDocs:
    """Where one release keeps its validations: a file-backed GX project (suites, Checkpoints,
    validation results) and the release's single Data Docs site. Every check of the release
    (each input partition, then the output table) is a run of a Checkpoint, stored in the
    project under its ``run_name``; :func:`build_release_docs` renders the site from every
    stored run, once per batch of checks (a Checkpoint that rebuilt the site after each run
    re-rendered every earlier run: quadratic in the number of partitions)."""

    project_dir: Path
    docs_dir: Path

    @classmethod
    def in_folder(cls, internal: Path) -> "ReleaseDocs":
        """The layout of a release's internal folder: ``gx/`` and ``data_docs/``."""
        return cls(Path(internal) / "gx", Path(internal) / "data_docs")

    @property
    def index(self) -> Path:
        return self.docs_dir.resolve() / "index.html"


@dataclass
class Failure:
    """One failed expectation.

    ``unexpected_count`` is GX's ``unexpected_count`` for row-level expectations, the
    number of missing values for set-containment (boundary tracts), and 0 for
    table/column-level failures (missing column, wrong dtype) or expectations that
    could not be evaluated (their ``details`` start with ``"not evaluated"``).
    """

    expectation: str
    column: str | None
    unexpected_count: int
    details: str


@dataclass(frozen=True)
class Outcome:
    """One expectation of a run, met or not, in plain values (what a report shows).

    ``unexpected_count``: GX's count of offending values where the expectation counts them
    (row-level expectations), else None; ``details`` is the :class:`Failure`'s for a failed
    expectation, the expectation's description (and observed value) for a met one."""

    expectation: str
    column: str | None
    success: bool
    unexpected_count: int | None
    details: str


@dataclass
class ContractResult:
    suite: str
    success: bool
    failures: list[Failure]
    bad_rows: np.ndarray  # bool, one per row of the validated frame
    docs_index: Path | None = None
    validation_result: Any = field(default=None, repr=False)  # GX's first-pass result
    outcomes: list[Outcome] = field(default_factory=list)  # every expectation, suite order
    stored_suite: str | None = None  # the suite's name in the release's GX project

    @property
    def n_bad_rows(self) -> int:
        return int(self.bad_rows.sum())

    def summary(self) -> str:
        """One line per failed expectation: name, column, count (and what was wrong)."""
        if self.success:
            return f"{self.suite}: all expectations met"
        lines = []
        for f in self.failures:
            lines.append(
                f"{f.expectation} column={f.column or '-'} count={f.unexpected_count}: {f.details}"
            )
        return "\n".join(lines)

    def raise_for_failures(self) -> None:
        if not self.success:
            raise ValueError(f"data contract {self.suite!r} violated:\n{self.summary()}")


# ----------------------------------------------------------------------------- suites


def load_suite_dict(name: str) -> dict:
    """The suite file parsed with GX's schema (a plain dict)."""
    path = suite_path(name)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ContractError(
            f"suite file {path} missing; run `python -m data_contracts.build_suites`"
        ) from exc
    return ExpectationSuiteSchema().loads(text)


def load_suite(name: str, keep: Callable[[dict], bool] | None = None) -> gx.ExpectationSuite:
    """Load suite ``name`` from its JSON file, keeping the expectations ``keep`` accepts.

    GX's ``ExpectationSuite(...)`` only *logs* invalid expectation configurations and
    drops them, so the count is checked here.
    """
    data = load_suite_dict(name)
    expectations = [e for e in data["expectations"] if keep is None or keep(e)]
    data = {**data, "expectations": expectations}
    suite = gx.ExpectationSuite(**data)
    if len(suite.expectations) != len(expectations):
        raise ContractError(
            f"suite {name}: {len(expectations) - len(suite.expectations)} expectation(s) "
            "in the JSON file are not valid for this GX version"
        )
    return suite


def _keeper(columns: Sequence[str]) -> Callable[[dict], bool]:
    """Keeps an expectation unless it is tagged ``only_if_column`` and the frame lacks it."""
    cols = set(columns)

    def keep(expectation: dict) -> bool:
        tag = (expectation.get("meta") or {}).get(META_KEY) or {}
        return not ("only_if_column" in tag and tag["only_if_column"] not in cols)

    return keep


# ----------------------------------------------------------------------------- running


def _positional(df: pd.DataFrame) -> pd.DataFrame:
    idx = df.index
    if (
        isinstance(idx, pd.RangeIndex)
        and idx.start == 0
        and idx.step == 1
        and idx.name is None
    ):
        return df
    return df.reset_index(drop=True)


def _short(value: Any, limit: int = _MAX_LISTED) -> str:
    if isinstance(value, (list, tuple)):
        shown = ", ".join(repr(v) for v in list(value)[:limit])
        more = f", ... ({len(value)} in all)" if len(value) > limit else ""
        return f"[{shown}{more}]"
    return repr(value)


def _column_of(kwargs: dict) -> str | None:
    if kwargs.get("column") is not None:
        return str(kwargs["column"])
    if kwargs.get("column_list"):
        return ",".join(map(str, kwargs["column_list"]))
    if kwargs.get("column_A") is not None:
        return f"{kwargs['column_A']},{kwargs['column_B']}"
    return None


def _exception_message(exception_info: Any) -> str | None:
    """GX puts one exception dict at the top, or one per failing metric: find a message."""
    if not exception_info:
        return None
    info = dict(exception_info)
    if "raised_exception" in info:
        infos = [info]
    else:
        infos = [v for v in info.values() if isinstance(v, dict)]
    for item in infos:
        if item.get("raised_exception"):
            lines = str(item.get("exception_message") or "error").strip().splitlines()
            return lines[0] if lines else "error"
    return None


def _condition_text(cond: Any) -> str:
    """``{'column': {'name': 'status'}, 'operator': '!=', 'parameter': 'released'}`` -> text."""
    if hasattr(cond, "dict"):
        cond = cond.dict()
    if isinstance(cond, dict):
        name = (cond.get("column") or {}).get("name")
        if cond.get("type") == "comparison":
            return f"{name} {cond.get('operator')} {cond.get('parameter')!r}"
        if cond.get("type") == "nullity":
            return f"{name} is {'null' if cond.get('is_null') else 'not null'}"
    return str(cond)


def _failure(r: Any) -> Failure:
    config = r.expectation_config
    kwargs = dict(config.kwargs)
    result = r.result or {}
    column = _column_of(kwargs)
    desc = config.description or config.type
    cond = kwargs.get("row_condition")
    if cond:
        desc += f" (rows where {_condition_text(cond)})"

    error = _exception_message(r.exception_info)
    if error is not None:
        return Failure(config.type, column, 0, f"not evaluated: {error}")
    if config.type == "expect_column_to_exist":
        return Failure(config.type, column, 0, f"column {column!r} is missing")
    if "missing_count" in result and "unexpected_count" not in result:
        # set containment: values that should be present but are not
        missing = result.get("partial_missing_list") or []
        return Failure(
            config.type,
            column,
            int(result["missing_count"]),
            f"{desc}; missing e.g. {_short(missing)}",
        )
    if result.get("unexpected_count") is not None:
        sample = result.get("partial_unexpected_list")
        extra = f"; e.g. {_short(sample)}" if sample else ""
        return Failure(config.type, column, int(result["unexpected_count"]), desc + extra)
    observed = result.get("observed_value")
    extra = f"; observed {observed!r}" if observed is not None else ""
    return Failure(config.type, column, 0, desc + extra)


def _outcome(r: Any) -> Outcome:
    config = r.expectation_config
    if not r.success:
        failure = _failure(r)
        return Outcome(failure.expectation, failure.column, False,
                       failure.unexpected_count, failure.details)
    result = r.result or {}
    count = result.get("unexpected_count")
    observed = result.get("observed_value")
    details = (config.description or config.type) + (
        f"; observed {_short(observed)}" if observed is not None else "")
    return Outcome(config.type, _column_of(dict(config.kwargs)), True,
                   None if count is None else int(count), details)


def _get_or_add(get: Callable[[], Any], add: Callable[[], Any]) -> Any:
    """GX stores raise (DataContextError, KeyError or LookupError) for a missing name."""
    try:
        return get()
    except (DataContextError, KeyError, LookupError):
        return add()


def _suite_variant(suite_name: str, keep: Callable[[dict], bool]) -> str:
    """The stored suite's name: the suite's, plus what its conditions left out (the input
    suite without ``person_id`` is another suite than with it)."""
    left_out = sorted({str(v) for e in load_suite_dict(suite_name)["expectations"] if not keep(e)
                       for v in ((e.get("meta") or {}).get(META_KEY) or {}).values()})
    return suite_name + "".join(f"-without-{v}" for v in left_out)


def _run_checkpoint(context, suite, batch_definition, batch_parameters: dict,
                    expectation_parameters: dict | None, run_name: str):
    """Run (creating on first use) the Checkpoint of ``suite``: its validation is stored in
    the release's context; the site is rendered later, once, by :func:`build_release_docs`."""
    name = suite.name
    checkpoint = _get_or_add(
        lambda: context.checkpoints.get(name),
        lambda: context.checkpoints.add(gx.Checkpoint(
            name=name,
            validation_definitions=[context.validation_definitions.add(
                gx.ValidationDefinition(name=name, data=batch_definition, suite=suite))],
            actions=[], result_format=FIRST_PASS_FORMAT)))
    # A Checkpoint stored by an earlier run of the release (a resume) is brought to what a new
    # one is, and saved (GX refuses to run a Checkpoint that differs from its stored copy):
    # one begun before the site was built once per batch had an UpdateDataDocsAction (the
    # site is built afterwards anyway), one begun before the first pass was BASIC, SUMMARY.
    actions = [a for a in checkpoint.actions if not isinstance(a, UpdateDataDocsAction)]
    if actions != checkpoint.actions or checkpoint.result_format != FIRST_PASS_FORMAT:
        checkpoint.actions, checkpoint.result_format = actions, FIRST_PASS_FORMAT
        checkpoint.save()
    result = checkpoint.run(batch_parameters=batch_parameters,
                            expectation_parameters=expectation_parameters,
                            run_id=RunIdentifier(run_name=run_name))
    (first,) = result.run_results.values()
    return first


def _validate(suite_name: str, df: pd.DataFrame, docs_dir: Path | None,
              parameters: dict[str, Any], release: ReleaseDocs | None = None,
              run_name: str | None = None) -> ContractResult:
    if release is None:  # a throw-away context of its own
        return _validate_in_context(suite_name, df, docs_dir, parameters, release, run_name)
    with RELEASE_CONTEXT_LOCK:
        context = release_context(release.project_dir, release.docs_dir)  # the run's own
        try:
            return _validate_in_context(suite_name, df, docs_dir, parameters, release, run_name)
        finally:
            _forget_frame(context)


def _forget_frame(context) -> None:
    """Drop the frame a run in the release's context loaded, and every metric computed from it.

    The release's context is kept for the whole process (:func:`release_context`), and with
    it the pandas engine of its data source, which held the last run's frame and its per-row
    metrics until the next run replaced them: on a 4 M-record group of a national input,
    about 200 MiB of pyarrow text and a few row-level conditions, kept while the flow read
    and checked the next group. Its metric cache is also keyed by the batch's id, which is the
    same for every run of a suite, so no run should find another run's metrics in it."""
    try:
        engine = context.data_sources.get("dpatlas").execution_engine
    except (DataContextError, KeyError, LookupError):
        return
    if engine is None:
        return
    cache = getattr(engine, "_metric_cache", None)  # no public way to empty it in GX 1.x
    if isinstance(cache, dict):
        cache.clear()
    engine.batch_manager.reset_batch_cache()
    engine.batch_manager.batch_data_cache.clear()


def _validate_in_context(
    suite_name: str,
    df: pd.DataFrame,
    docs_dir: Path | None,
    parameters: dict[str, Any],
    release: ReleaseDocs | None = None,
    run_name: str | None = None,
) -> ContractResult:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"expected a pandas DataFrame, got {type(df).__name__}")
    frame = _positional(df)
    keep = _keeper([str(c) for c in frame.columns])
    if release is not None:
        context = release_context(release.project_dir, release.docs_dir)
        variant = _suite_variant(suite_name, keep)
        suite = _get_or_add(lambda: context.suites.get(variant),
                            lambda: context.suites.add(_renamed(load_suite(suite_name, keep),
                                                                variant)))
        source = _get_or_add(lambda: context.data_sources.get("dpatlas"),
                             lambda: context.data_sources.add_pandas(name="dpatlas"))
        asset = _get_or_add(lambda: source.get_asset(variant),
                            lambda: source.add_dataframe_asset(name=variant))
        batch_definition = _get_or_add(
            lambda: asset.get_batch_definition("whole_frame"),
            lambda: asset.add_batch_definition_whole_dataframe(name="whole_frame"))
    else:
        context = quiet_context(docs_dir)
        suite = context.suites.add(load_suite(suite_name, keep))
        batch_definition = (
            context.data_sources.add_pandas(name="dpatlas")
            .add_dataframe_asset(name=suite_name)
            .add_batch_definition_whole_dataframe(name="whole_frame")
        )
    batch_parameters = {"dataframe": frame}
    expectation_parameters = parameters or None

    docs_index: Path | None = None
    if release is not None:
        first = _run_checkpoint(context, suite, batch_definition, batch_parameters,
                                expectation_parameters, run_name or suite.name)
        batch = None
    elif docs_dir is not None:
        # A ValidationDefinition stores its result in the context, which Data Docs render.
        definition = context.validation_definitions.add(
            gx.ValidationDefinition(name=suite_name, data=batch_definition, suite=suite)
        )
        first = definition.run(
            batch_parameters=batch_parameters,
            expectation_parameters=expectation_parameters,
            result_format=FIRST_PASS_FORMAT,
        )
        urls = context.build_data_docs(site_names=[DOCS_SITE])
        docs_index = Path(unquote(urlparse(urls[DOCS_SITE]).path))
        if not docs_index.is_file():
            raise ContractError(f"Data Docs index was not written: {docs_index}")
        batch = None
    else:
        batch = batch_definition.get_batch(batch_parameters=batch_parameters)
        first = batch.validate(
            suite, result_format=FIRST_PASS_FORMAT, expectation_parameters=expectation_parameters
        )

    # GX does not keep suite order in its results; report failures in suite order.
    order = {e.id: i for i, e in enumerate(suite.expectations)}
    in_order = sorted(first.results,
                      key=lambda r: order.get(r.expectation_config.id, len(order)))
    failed = [r for r in in_order if not r.success]
    failures = [_failure(r) for r in failed]
    bad_rows = np.zeros(len(frame), dtype=bool)

    # Second pass: COMPLETE only for failed row-level expectations that were evaluated.
    row_level = [
        r
        for r in failed
        if r.result
        and r.result.get("unexpected_count")
        and _exception_message(r.exception_info) is None
    ]
    if row_level:
        if batch is None:
            batch = batch_definition.get_batch(batch_parameters=batch_parameters)
        for r in row_level:
            rerun = batch.validate(
                r.expectation_config.to_domain_obj(),
                result_format=COMPLETE_FORMAT,
                expectation_parameters=expectation_parameters,
            )
            index = rerun.result.get("unexpected_index_list")
            if index is None:
                continue
            if index and isinstance(index[0], dict):  # named index: cannot happen after reset
                raise ContractError("unexpected_index_list is not positional")
            positions = np.asarray(index, dtype=np.intp)
            bad_rows[positions] = True

    return ContractResult(
        suite=suite_name,
        success=bool(first.success),
        failures=failures,
        bad_rows=bad_rows,
        docs_index=docs_index,
        validation_result=first,
        outcomes=[_outcome(r) for r in in_order],
        stored_suite=suite.name,
    )


def _renamed(suite: gx.ExpectationSuite, name: str) -> gx.ExpectationSuite:
    suite.name = name
    return suite


# ----------------------------------------------------------------------------- public API


def validate_input(df: pd.DataFrame, docs_dir: Path | None = None,
                   release: ReleaseDocs | None = None, run_name: str | None = None
                   ) -> ContractResult:
    """Validate input microdata (geoid, x, y[, person_id]) against ``input_microdata``.

    With ``release``, the validation is a Checkpoint run (named ``run_name``, e.g. the
    partition) recorded in the release's context, which :func:`build_release_docs` renders in
    its Data Docs site (``docs_index`` is None until then); with only ``docs_dir``, a
    throw-away context writes a site there; with neither, nothing is written."""
    return _validate(INPUT_SUITE, df, Path(docs_dir) if docs_dir is not None else None, {},
                     release, run_name)


def validate_published(
    df: pd.DataFrame,
    boundary_geoids: Sequence[str] | None = None,
    docs_dir: Path | None = None,
    release: ReleaseDocs | None = None,
    run_name: str | None = None,
    standard_error_max: float = STANDARD_ERROR_MAX,
) -> ContractResult:
    """Validate the published per-tract table against ``published_tracts``.

    With ``boundary_geoids``, every one of them must appear in ``df.geoid``: checked against
    ``published_coverage`` in a run of its own (same run name), its outcome joined to the
    table's (:func:`_with_coverage`); the failure's ``unexpected_count`` is the number of
    missing tracts, and its details list some. ``standard_error_max``: the largest
    ``p25_se``/``p75_se`` (default: the cap, 0.5); their 90% margins of error are at most
    ``MOE90_MAX``.
    """
    parameters: dict[str, Any] = {STANDARD_ERROR_MAX_PARAMETER: float(standard_error_max),
                                  MOE90_MAX_PARAMETER: MOE90_MAX}
    docs = Path(docs_dir) if docs_dir is not None else None
    coverage = _coverage(df, boundary_geoids, "boundary_geoids", docs, release, run_name)
    table = _validate(PUBLISHED_SUITE, df, docs, parameters, release, run_name)
    return _with_coverage(table, coverage)


def validate_published_level(
    df: pd.DataFrame,
    level: str,
    boundary_units: Sequence[str] | None = None,
    release: ReleaseDocs | None = None,
    run_name: str | None = None,
    standard_error_max: float = STANDARD_ERROR_MAX,
) -> ContractResult:
    """Validate a release's county or state table against ``published_counties`` or
    ``published_states``. With ``boundary_units`` (the units the tract boundaries make up),
    every one of them must appear in ``df.geoid`` (``published_coverage``, as for tracts)."""
    if level not in PUBLISHED_LEVEL_SUITES:
        raise ValueError(f"no published contract for level {level!r}; known: "
                         f"{', '.join(PUBLISHED_LEVEL_SUITES)}")
    parameters: dict[str, Any] = {STANDARD_ERROR_MAX_PARAMETER: float(standard_error_max),
                                  MOE90_MAX_PARAMETER: MOE90_MAX}
    coverage = _coverage(df, boundary_units, "boundary_units", None, release, run_name)
    table = _validate(PUBLISHED_LEVEL_SUITES[level], df, None, parameters, release, run_name)
    return _with_coverage(table, coverage)


def coverage_frame(table_geoids: Sequence[str], boundary_units: Sequence[str]) -> pd.DataFrame:
    """One row per unit of the boundaries (sorted, each once): ``geoid``, its code, and
    ``missing_geoid`` the same code where ``table_geoids`` has no row of it, else null."""
    units = pd.Series(sorted({str(g) for g in boundary_units}), dtype=object)
    # pandas' isin hashes (numpy's compares object arrays pairwise: 16 s for 40,000 tracts)
    present = units.isin(pd.Series(table_geoids, dtype=object).astype(str)).to_numpy()
    return pd.DataFrame({"geoid": units,
                         MISSING_COLUMN: np.where(present, None, units.to_numpy())})


def _coverage(df: pd.DataFrame, units: Sequence[str] | None, name: str, docs: Path | None,
              release: ReleaseDocs | None, run_name: str | None) -> ContractResult | None:
    """The ``published_coverage`` run of ``df``'s GEOIDs against ``units`` (None: not
    checked). Run before the table's, so that with ``docs`` (a throw-away site) the site's
    index is the table's."""
    if units is None:
        return None
    if isinstance(units, str):
        raise TypeError(f"{name} must be a sequence of codes, not a str")
    geoids = df["geoid"] if "geoid" in df.columns else []
    return _validate(COVERAGE_SUITE, coverage_frame(geoids, units), docs, {}, release,
                     run_name)


def _with_coverage(table: ContractResult, coverage: ContractResult | None) -> ContractResult:
    """The table's result, with the coverage run's outcome after its own: a failure there
    fails the whole (its rows are boundary units, not the table's: ``bad_rows`` stays the
    table's). Its docs index is the table's."""
    if coverage is None:
        return table
    return replace(table, success=table.success and coverage.success,
                   failures=[*table.failures, *coverage.failures],
                   outcomes=[*table.outcomes, *coverage.outcomes])


def import_release_runs(source: ReleaseDocs, release: ReleaseDocs) -> int:
    """Copy the validation runs stored in another project (a publish part's, checked on a
    worker) into the release's project, with the suites they ran (a suite already there is
    the same suite: one name, one set of expectations), so the release's one Data Docs site
    lists them (and the Checkpoint each ran); returns the number of runs copied. What is
    already there is left as it is."""
    src, dst = Path(source.project_dir) / "gx", Path(release.project_dir) / "gx"
    copied = 0
    with RELEASE_CONTEXT_LOCK:
        release_context(release.project_dir, release.docs_dir)  # the project exists
        for kind, pattern in (("expectations", "*.json"), ("checkpoints", "*.json"),
                              ("validation_definitions", "*.json"),
                              ("uncommitted/validations", "*/*/*/*.json")):
            for path in sorted((src / kind).glob(pattern)):
                target = dst / kind / path.relative_to(src / kind)
                if target.exists():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                copied += kind == "uncommitted/validations"
    return copied


def build_release_docs(release: ReleaseDocs) -> Path:
    """Render the release's Data Docs site from every validation run stored in its project
    (each run's page and the index listing them all); returns the index. One call after a
    batch of checks (every input partition; the output checks) replaces a rebuild per run."""
    with RELEASE_CONTEXT_LOCK:
        context = release_context(release.project_dir, release.docs_dir)
        urls = context.build_data_docs(site_names=[DOCS_SITE])
    index = Path(unquote(urlparse(urls[DOCS_SITE]).path))
    if not index.is_file():
        raise ContractError(f"Data Docs index was not written: {index}")
    return index


def suite_json(name: str) -> dict:
    """The raw JSON of a suite file (for inspection)."""
    return json.loads(suite_path(name).read_text(encoding="utf-8"))
