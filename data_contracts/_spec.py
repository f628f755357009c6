"""Names and fixed parameters shared by the suite builder and the run-time API."""

from __future__ import annotations

from pathlib import Path

SUITES_DIR = Path(__file__).resolve().parent / "expectation_suites"

INPUT_SUITE = "input_microdata"
PUBLISHED_SUITE = "published_tracts"
#: The county and state tables of a release with levels (issue 20): the tract contract's
#: rules for a unit of the level, its GEOID of 5 or 2 digits, and a ``level`` column.
PUBLISHED_LEVEL_SUITES = {"county": "published_counties", "state": "published_states"}
#: Every unit of the boundaries has a row in a published table (tracts, counties, states):
#: a run of its own on one row per boundary unit, beside the table's run (data_contracts.api).
COVERAGE_SUITE = "published_coverage"
#: The coverage frame's column: a boundary unit's code where the table has no row of it.
MISSING_COLUMN = "missing_geoid"

#: The 50 states, DC (11) and Puerto Rico (72).
STATE_FIPS: tuple[str, ...] = (
    "01", "02", "04", "05", "06", "08", "09", "10", "11", "12",
    "13", "15", "16", "17", "18", "19", "20", "21", "22", "23",
    "24", "25", "26", "27", "28", "29", "30", "31", "32", "33",
    "34", "35", "36", "37", "38", "39", "40", "41", "42", "44",
    "45", "46", "47", "48", "49", "50", "51", "53", "54", "55",
    "56", "72",
)  # fmt: skip
assert len(STATE_FIPS) == 52 and len(set(STATE_FIPS)) == 52

# \Z, not $: the values are searched (pandas str.contains), and $ also matches before a
# trailing newline, so "17001000100\n" passed.
GEOID_REGEX = r"^[0-9]{11}\Z"
# Non-capturing group: with a capturing one pandas warns on every str.contains call.
STATE_GEOID_REGEX = "^(?:" + "|".join(STATE_FIPS) + r")[0-9]{9}\Z"
COUNTY_UNIT_REGEX = "^(?:" + "|".join(STATE_FIPS) + r")[0-9]{3}\Z"
STATE_UNIT_REGEX = "^(?:" + "|".join(STATE_FIPS) + r")\Z"


#: The characters Python's ``str.isspace`` (and so its regular expressions' ``\s``) calls
#: whitespace (Python 3.11, Unicode 14; tests/unit/test_contract_patterns.py checks the list
#: against the running Python's).
WHITESPACE: tuple[int, ...] = (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85,
                               0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F,
                               0x205F, 0x3000)
_ESCAPES = {0x09: r"\t", 0x0A: r"\n", 0x0B: r"\v", 0x0C: r"\f", 0x0D: r"\r"}

# "The cell is not blank": some character that is not whitespace. Not r"\S": RE2 (pyarrow)
# reads \s as ASCII [\t\n\f\r ] only, so pandas runs a pattern with \S in Python, row by
# row, which took 1.6-2.4 of the 3.9 CPU-s of checking a staged partition of 3,981,096
# records (issue 35). Spelt out, the class means the same in both engines (the test checks
# every code point in each) and runs in pyarrow: 0.25-0.35 CPU-s there. Below U+0100 as
# escapes both know (\xhh), above as the characters (Python's \uXXXX is not RE2's \x{XXXX}).
NOT_BLANK_REGEX = "[^" + "".join(_ESCAPES.get(c) or (f"\\x{c:02x}" if c < 0x100 else chr(c))
                                 for c in WHITESPACE) + "]"

STATUSES: tuple[str, ...] = ("released", "suppressed", "failed")
MECHANISMS: tuple[str, ...] = (
    "NoisyStats",
    "DPExpTheilSen",
    "NoisyIntercept",
    "DPExpTheilSenMatch",
    "DPExpTheilSenkMatch",
    "DPWideTheilSen",
    "DPSSTheilSen",
    "DPGDPure",
    "DPGDzCDP",
    "DPGDApprox",
    "none",
)

#: dtypes accepted as "numeric" for the rank columns: numpy names and pandas nullable
#: extension dtypes; for an ``object`` column GX checks each value's type instead, which
#: is what the Python names "float" / "int" are for.
NUMERIC_TYPES: list[str] = [
    "float", "int", "float64", "float32", "float16", "int64", "int32", "int16", "int8",
    "uint64", "uint32", "uint16", "uint8",
    "Float64Dtype", "Float32Dtype", "Int64Dtype", "Int32Dtype", "Int16Dtype", "Int8Dtype",
]  # fmt: skip
INTEGER_TYPES: list[str] = [
    "int", "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8",
    "Int64Dtype", "Int32Dtype", "Int16Dtype", "Int8Dtype",
    "UInt64Dtype", "UInt32Dtype", "UInt16Dtype", "UInt8Dtype",
]  # fmt: skip

INPUT_COLUMNS = ("geoid", "x", "y")
PUBLISHED_COLUMNS = (
    "geoid", "state", "county", "name", "cell", "n", "mechanism", "status", "reason",
    "p25", "p75", "p25_raw", "p75_raw", "epsilon_spent", "delta_spent",
)  # fmt: skip

#: A level table's columns: the tract table's, with ``level`` and without ``county`` for states.
LEVEL_COLUMNS = {
    "county": ("level", *PUBLISHED_COLUMNS),
    "state": ("level", *(c for c in PUBLISHED_COLUMNS if c != "county")),
}

META_KEY = "dpatlas"

#: The published standard errors (p25_se, p75_se: of the total error, mechanisms/estimand.py)
#: are at most SE_CAP = 0.5, and their 90% margins of error (p25_moe90, p75_moe90) at most
#: 1.645 x 0.5 rounded up to 4 decimals. Suite parameters: the publication passes the SE's
#: (dpatlas.publication.tract_files.standard_error_maximum); the margin's is MOE90_MAX.
STANDARD_ERROR_MAX_PARAMETER = "standard_error_max"
MOE90_MAX_PARAMETER = "moe90_max"
STANDARD_ERROR_MAX = 0.5
MOE90_MAX = 0.8225


def suite_path(name: str) -> Path:
    return SUITES_DIR / f"{name}.json"
