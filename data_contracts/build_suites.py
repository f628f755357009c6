"""Definitions of the pipeline's data contracts, and the script that writes them.

Run ``python -m data_contracts.build_suites`` to (re)write the Great Expectations
suites under ``data_contracts/expectation_suites/``.  The JSON files are what the pipeline loads
at run time (see :mod:`data_contracts.api`); this module is only the source they
are generated from.  The output is deterministic, so rerunning the script on an
unchanged tree rewrites byte-identical files (a test checks this).

Serialisation is GX's own: ``ExpectationSuiteSchema().dumps(suite, indent=2,
sort_keys=True)``, exactly what a GX file-backed expectations store writes.

Some expectations are *conditional*; they are stored in the suite like any other,
tagged in their ``meta`` under the key ``"dpatlas"``, and the run-time API decides
whether to keep them:

* ``{"only_if_column": "person_id"}`` -- ``person_id`` is never null, in the input
  suite; dropped when the frame has no ``person_id`` column. (Records per person are
  counted across all partitions by :mod:`dpatlas.release.contributions`, not here.)
  Likewise ``{"only_if_column": "cell"}``: ``cell`` is never null nor blank.

That every unit of the boundary file has a row in a published table is a suite of its own,
``published_coverage``, run beside the table's run when the caller gives the boundary units.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

import great_expectations as gx  # noqa: E402
import great_expectations.expectations as gxe  # noqa: E402
from great_expectations.core.expectation_suite import ExpectationSuiteSchema  # noqa: E402
from great_expectations.expectations.row_conditions import Column  # noqa: E402

from data_contracts._spec import (  # noqa: E402
    GEOID_REGEX,
    INPUT_COLUMNS,
    INPUT_SUITE,
    INTEGER_TYPES,
    MECHANISMS,
    META_KEY,
    NOT_BLANK_REGEX,
    NUMERIC_TYPES,
    COUNTY_UNIT_REGEX,
    COVERAGE_SUITE,
    LEVEL_COLUMNS,
    MISSING_COLUMN,
    PUBLISHED_COLUMNS,
    PUBLISHED_LEVEL_SUITES,
    PUBLISHED_SUITE,
    MOE90_MAX,
    MOE90_MAX_PARAMETER,
    STANDARD_ERROR_MAX,
    STANDARD_ERROR_MAX_PARAMETER,
    STATE_GEOID_REGEX,
    STATE_UNIT_REGEX,
    STATUSES,
    SUITES_DIR,
)


def input_suite() -> gx.ExpectationSuite:
    """Contract for the per-person input microdata (ranks already normalised to [0, 1])."""
    suite = gx.ExpectationSuite(
        name=INPUT_SUITE,
        meta={
            "dpatlas_contract": "input microdata: one row per person and cell, columns geoid, x, y "
            "(parent and child ranks normalised to [0, 1]), optional person_id (never null; "
            "records per person are checked across partitions outside this suite) and optional "
            "cell (never null nor blank)",
        },
    )
    for col in INPUT_COLUMNS:
        suite.add_expectation(
            gxe.ExpectColumnToExist(column=col, description=f"column {col} is present")
        )
    for col in ("x", "y"):
        suite.add_expectation(
            gxe.ExpectColumnValuesToNotBeNull(column=col, description=f"{col} is never null")
        )
        suite.add_expectation(
            gxe.ExpectColumnValuesToBeBetween(
                column=col,
                min_value=0.0,
                max_value=1.0,
                description=f"{col} is a rank normalised to [0, 1]",
            )
        )
        suite.add_expectation(
            gxe.ExpectColumnValuesToBeInTypeList(
                column=col, type_list=NUMERIC_TYPES, description=f"{col} is numeric"
            )
        )
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(column="geoid", description="geoid is never null")
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToMatchRegex(
            column="geoid",
            regex=GEOID_REGEX,
            description="geoid is an 11-digit census tract code",
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToMatchRegex(
            column="geoid",
            regex=STATE_GEOID_REGEX,
            description="geoid starts with a valid state FIPS code (50 states, DC, PR)",
        )
    )
    # person_id: only that it is present on every row. How many records a person has is not
    # a per-partition question (one person can appear in two states, and in several cells):
    # dpatlas.release.contributions decides it once, across all partitions.
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(
            column="person_id",
            description="person_id is never null (checked only when the column is present)",
            meta={META_KEY: {"only_if_column": "person_id"}},
        )
    )
    # cell: every record names one. A record without a cell has no group to be estimated in
    # (it was dropped unseen, issue 31 O3), and an empty label cannot be charged.
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(
            column="cell",
            description="cell is never null (checked only when the column is present)",
            meta={META_KEY: {"only_if_column": "cell"}},
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToMatchRegex(
            column="cell",
            regex=NOT_BLANK_REGEX,
            description="cell is not blank (checked only when the column is present)",
            meta={META_KEY: {"only_if_column": "cell"}},
        )
    )
    return suite


# What a published table's unit is, per level: (geoid regex, its description).
_UNITS = {
    "tract": (STATE_GEOID_REGEX,
              "geoid is an 11-digit tract code starting with a valid state FIPS code"),
    "county": (COUNTY_UNIT_REGEX,
               "geoid is a 5-digit county code starting with a valid state FIPS code"),
    "state": (STATE_UNIT_REGEX, "geoid is a valid 2-digit state FIPS code"),
}


def published_suite() -> gx.ExpectationSuite:
    """Contract for the published per-tract table."""
    suite = _published(PUBLISHED_SUITE, "tract", PUBLISHED_COLUMNS)
    _model_expectations(suite)
    return suite


def _model_expectations(suite: gx.ExpectationSuite) -> None:
    """The small-area model's columns, in releases that publish them (kept only when the
    columns exist): in [0, 1] (the SE at least 0), each interval around its estimate."""
    for p in ("p25", "p75"):
        value, lo, hi, se = (f"{p}_model", f"{p}_model_lo", f"{p}_model_hi", f"{p}_model_se")
        only = {META_KEY: {"only_if_column": value}}
        for col in (value, lo, hi):
            suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(
                column=col, min_value=0.0, max_value=1.0, meta=only,
                description=f"{col} (model-based) is in [0, 1] where not null"))
        suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(
            column=se, min_value=0.0, meta=only,
            description=f"{se} (the model's root mean squared error) is >= 0 where not null"))
        for a, b in ((lo, value), (value, hi)):
            suite.add_expectation(gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=b, column_B=a, or_equal=True, ignore_row_if="either_value_is_missing",
                meta=only, description=f"{a} <= {b}: the model interval contains {value}"))


def published_level_suite(level: str) -> gx.ExpectationSuite:
    """Contract for a release's county or state table: the tract table's rules for a unit of
    the level, and every row's ``level`` is that level."""
    suite = _published(PUBLISHED_LEVEL_SUITES[level], level, LEVEL_COLUMNS[level])
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeInSet(
            column="level", value_set=[level], description=f"every row is a {level}"
        )
    )
    return suite


def _published(name: str, level: str, columns) -> gx.ExpectationSuite:
    geoid_regex, geoid_text = _UNITS[level]
    suite = gx.ExpectationSuite(
        name=name,
        meta={
            "dpatlas_contract": "published table: one row per (geoid, cell) with DP "
            "statistics p25/p75 (clipped to [0, 1]) released only where status == released",
        },
    )
    for col in columns:
        suite.add_expectation(
            gxe.ExpectColumnToExist(column=col, description=f"column {col} is present")
        )
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(column="geoid", description="geoid is never null")
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToMatchRegex(
            column="geoid",
            regex=geoid_regex,
            description=geoid_text,
        )
    )
    suite.add_expectation(
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["geoid", "cell"],
            description="one row per (geoid, cell)",
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(column="status", description="status is never null")
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeInSet(
            column="status",
            value_set=list(STATUSES),
            description="status is one of " + ", ".join(STATUSES),
        )
    )
    for col in ("p25", "p75"):
        suite.add_expectation(
            gxe.ExpectColumnValuesToBeBetween(
                column=col,
                min_value=0.0,
                max_value=1.0,
                description=f"{col} (clipped display value) is in [0, 1] where not null",
            )
        )
        suite.add_expectation(
            gxe.ExpectColumnValuesToNotBeNull(
                column=col,
                row_condition=Column("status") == "released",
                description=f"{col} is present on released rows",
            )
        )
        suite.add_expectation(
            gxe.ExpectColumnValuesToBeNull(
                column=col,
                row_condition=Column("status") != "released",
                description=f"{col} is null on rows that are not released",
            )
        )
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(column="n", description="n is never null")
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeBetween(column="n", min_value=0, description="n >= 0")
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeInTypeList(
            column="n", type_list=INTEGER_TYPES, description="n is an integer column"
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(
            column="epsilon_spent", description="epsilon_spent is never null"
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeBetween(
            column="epsilon_spent", min_value=0.0, description="epsilon_spent >= 0"
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(
            column="delta_spent", description="delta_spent is never null"
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeBetween(
            column="delta_spent",
            min_value=0.0,
            max_value=1.0,
            description="delta_spent is in [0, 1]",
        )
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToNotBeNull(column="mechanism", description="mechanism is never null")
    )
    suite.add_expectation(
        gxe.ExpectColumnValuesToBeInSet(
            column="mechanism",
            value_set=list(MECHANISMS),
            description="mechanism is a known estimator (or none)",
        )
    )
    # Confidence intervals, in releases that publish them (kept only when the columns exist).
    for p in ("p25", "p75"):
        for end in ("lo", "hi"):
            col = f"{p}_{end}"
            _exactly_where_released(suite, col, 1.0,
                                    f"{col} (interval end) is in [0, 1] where not null",
                                    f"{col} is present on released rows")
        for lo, hi in ((f"{p}_lo", p), (p, f"{p}_hi")):
            suite.add_expectation(gxe.ExpectColumnPairValuesAToBeGreaterThanB(
                column_A=hi, column_B=lo, or_equal=True, ignore_row_if="either_value_is_missing",
                meta={META_KEY: {"only_if_column": f"{p}_lo"}},
                description=f"{lo} <= {hi}: the interval contains the released {p}"))
        # Standard errors of the total error (drawn-for by the interval step) and their 90%
        # margins of error (post-processing): exactly where the interval is.
        for col, top in ((f"{p}_se", {"$PARAMETER": STANDARD_ERROR_MAX_PARAMETER}),
                         (f"{p}_moe90", {"$PARAMETER": MOE90_MAX_PARAMETER})):
            _exactly_where_released(
                suite, col, top, f"{col} is in [0, its cap] where not null (standard error at "
                f"most {STANDARD_ERROR_MAX}, margin of error at most {MOE90_MAX})",
                f"{col} is present on released rows (they carry intervals)")
    return suite


def coverage_suite() -> gx.ExpectationSuite:
    """Every unit of the boundaries has a row in the published table (tract, county or
    state). Checked on a frame of its own, a row per boundary unit with ``missing_geoid`` its
    code where the table has no row of it (data_contracts.api.coverage_frame): so the failure
    names the missing units, and the table's run carries no parameter of 40,000 codes, which
    GX copies each time it reads the expectation (1.6 of a national part's 3.1 CPU-s)."""
    suite = gx.ExpectationSuite(
        name=COVERAGE_SUITE,
        meta={"dpatlas_contract": "every unit of the boundary file (a tract; or a county or "
              "state the boundary tracts make up) has a row in the published table"})
    suite.add_expectation(gxe.ExpectColumnValuesToBeNull(
        column=MISSING_COLUMN,
        description="every unit of the boundary file is in the table: the codes listed here "
                    "have no row in it"))
    return suite


def _exactly_where_released(suite, col: str, top, range_text: str, present_text: str) -> None:
    """``col`` in [0, ``top``], present on released rows and null elsewhere, when it exists."""
    only = {META_KEY: {"only_if_column": col}}
    suite.add_expectation(gxe.ExpectColumnValuesToBeBetween(
        column=col, min_value=0.0, max_value=top, meta=only, description=range_text))
    suite.add_expectation(gxe.ExpectColumnValuesToNotBeNull(
        column=col, row_condition=Column("status") == "released", meta=only,
        description=present_text))
    suite.add_expectation(gxe.ExpectColumnValuesToBeNull(
        column=col, row_condition=Column("status") != "released", meta=only,
        description=f"{col} is null on rows that are not released"))


SUITE_BUILDERS = {INPUT_SUITE: input_suite, PUBLISHED_SUITE: published_suite,
                  **{name: (lambda level=level: published_level_suite(level))
                     for level, name in PUBLISHED_LEVEL_SUITES.items()},
                  COVERAGE_SUITE: coverage_suite}


def serialise(suite: gx.ExpectationSuite) -> str:
    """The suite as GX's file store writes it (sorted keys, indent 2), plus a newline."""
    return ExpectationSuiteSchema().dumps(suite, indent=2, sort_keys=True) + "\n"


def build(out_dir: Path | None = None) -> list[Path]:
    """Write every suite as ``<out_dir>/<name>.json`` (default: ``data_contracts/expectation_suites``)."""
    from data_contracts._context import quiet_context

    # GX 1.x: ExpectationSuite.add_expectation needs a current Data Context.
    quiet_context()
    out_dir = SUITES_DIR if out_dir is None else Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, builder in SUITE_BUILDERS.items():
        path = out_dir / f"{name}.json"
        path.write_text(serialise(builder()), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else None
    for path in build(out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
