"""The input contract's "cell is not blank" pattern (data_contracts._spec.NOT_BLANK_REGEX):
the characters Python's ``\\S`` matches, in Python's ``re`` and in pyarrow's RE2 alike, for
every code point, so the contract means what it meant when it was ``\\S`` (issue 35: spelt
out, pandas runs it in pyarrow rather than row by row in Python)."""

from __future__ import annotations

import re
import sys

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from data_contracts._spec import NOT_BLANK_REGEX, WHITESPACE

# Every code point a str can hold in an Arrow array (UTF-8: no lone surrogates).
CHARACTERS = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]


@pytest.fixture(scope="module")
def expected() -> list[bool]:
    """Per character, whether Python's ``\\S`` matches it."""
    return [re.search(r"\S", c) is not None for c in CHARACTERS]


def test_the_whitespace_listed_is_the_running_pythons():
    assert list(WHITESPACE) == [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    assert all(re.fullmatch(r"\s", chr(c)) for c in WHITESPACE)


def test_python_reads_the_pattern_as_its_own_not_whitespace_for_every_character(expected):
    assert sum(expected) == len(CHARACTERS) - len(WHITESPACE)
    pattern = re.compile(NOT_BLANK_REGEX)
    assert [pattern.search(c) is not None for c in CHARACTERS] == expected


def test_pyarrow_reads_the_pattern_as_python_does_for_every_character(expected):
    got = pc.match_substring_regex(pa.array(CHARACTERS), NOT_BLANK_REGEX).to_pylist()
    assert got == expected
    # what RE2 makes of \S itself differs (ASCII whitespace only): why it is spelt out
    re2_own = pc.match_substring_regex(pa.array(["\u00a0", "\u3000", "\x0b"]), r"\S")
    assert re2_own.to_pylist() != [False, False, False]


def test_labels_through_pandas_arrow_strings():
    labels = ["outcome-1", "", " ", "\t\u3000\u00a0", " a ", "\u2028x", "\x85"]
    blank = [False, True, True, True, False, False, True]
    series = pd.Series(labels, dtype=pd.StringDtype("pyarrow"))
    assert series.str.contains(NOT_BLANK_REGEX).tolist() == [not b for b in blank]
    as_objects = pd.Series(labels, dtype=object)  # a CSV read as Python strings
    assert as_objects.str.contains(NOT_BLANK_REGEX).tolist() == [not b for b in blank]
