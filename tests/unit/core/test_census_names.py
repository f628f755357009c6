"""Census-style names (issue 33 item 4) and the state FIPS table they spell states from."""

from __future__ import annotations

import pytest

from dpatlas.core.census_names import (county_name, state_name, tract_name, tract_number,
                                       unit_names)
from dpatlas.core.state_fips import STATE_FIPS

NAMES = {"37183": "Wake", "37119": "Mecklenburg"}


def test_the_fips_table_has_the_50_states_dc_and_puerto_rico():
    assert len(STATE_FIPS) == 52
    assert STATE_FIPS["11"] == ("DC", "District of Columbia")
    assert STATE_FIPS["72"] == ("PR", "Puerto Rico")
    assert STATE_FIPS["37"] == ("NC", "North Carolina")
    assert STATE_FIPS["02"] == ("AK", "Alaska") and STATE_FIPS["56"] == ("WY", "Wyoming")
    assert not {"03", "07", "14", "43", "52"} & set(STATE_FIPS)  # codes never assigned
    postal = [p for p, _ in STATE_FIPS.values()]
    names = [n for _, n in STATE_FIPS.values()]
    assert len(set(postal)) == len(set(names)) == 52
    assert all(len(p) == 2 and p.isupper() for p in postal)
    assert all(len(code) == 2 and code.isdigit() for code in STATE_FIPS)


@pytest.mark.parametrize("geoid, number", [
    ("37183001200", "12"), ("37183001201", "12.01"), ("37183052407", "524.07"),
    ("37183980100", "9801"), ("37183000100", "1"), ("37183010000", "100"),
    ("37183000001", "0.01"),
])
def test_the_tract_number_is_the_census_ones(geoid, number):
    assert tract_number(geoid) == number


def test_tract_county_and_state_names_are_census_style():
    assert tract_name("37183001200", NAMES) == "Census Tract 12; Wake County; North Carolina"
    assert tract_name("37119005401", NAMES) == \
        "Census Tract 54.01; Mecklenburg County; North Carolina"
    assert county_name("37183", NAMES) == "Wake County, North Carolina"
    assert state_name("37") == "North Carolina" and state_name("72") == "Puerto Rico"


def test_a_county_without_a_known_name_is_left_out_not_invented():
    assert county_name("17001", NAMES) is None
    assert tract_name("17001000100", NAMES) == "Census Tract 1; Illinois"


def test_unit_names_by_level():
    assert unit_names(["37183001200", "37183001200"], "tract", NAMES) == [
        "Census Tract 12; Wake County; North Carolina"] * 2
    assert unit_names(["37183", "17001"], "county", NAMES) == [
        "Wake County, North Carolina", None]
    assert unit_names(["37", "11"], "state", NAMES) == ["North Carolina",
                                                         "District of Columbia"]
