"""Census-style names (the Census Bureau's NAME) of tracts, counties and states, from public
geography only: the GEOID, the state FIPS table and the county's name where it is known.

- tract: "Census Tract 12; Wake County; North Carolina" (the tract code 001200 as the Census
  prints it: no leading zeros, ".01" where its last two digits are not 00);
- county: "Wake County, North Carolina";
- state: "North Carolina".

A county whose name is not known (synthetic counties) has no name; its tracts' names then
leave the county out ("Census Tract 12; Illinois").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dpatlas.core.state_fips import STATE_FIPS


def tract_number(geoid: str) -> str:
    """The tract code of an 11-digit GEOID as the Census prints it: 001200 -> "12",
    001201 -> "12.01", 980100 -> "9801"."""
    code = geoid[5:11]
    whole, decimals = str(int(code[:4])), code[4:]
    return whole if decimals == "00" else f"{whole}.{decimals}"


def state_name(state_fips: str) -> str:
    """The state's name from its 2-digit FIPS code ("37" -> "North Carolina")."""
    return STATE_FIPS[state_fips][1]


def county_name(county_fips: str, county_names: Mapping[str, str]) -> str | None:
    """"Wake County, North Carolina" for a 5-digit county code whose base name ("Wake") is
    in ``county_names``; None for a county without a known name."""
    base = county_names.get(county_fips)
    return f"{base} County, {state_name(county_fips[:2])}" if base else None


def tract_name(geoid: str, county_names: Mapping[str, str]) -> str:
    """"Census Tract 12; Wake County; North Carolina" (without the county where its name is
    not known)."""
    base = county_names.get(geoid[:5])
    parts = [f"Census Tract {tract_number(geoid)}", *([f"{base} County"] if base else []),
             state_name(geoid[:2])]
    return "; ".join(parts)


_BUILDERS = {"tract": tract_name, "county": county_name,
             "state": lambda fips, _names: state_name(fips)}


def unit_names(geoids: Iterable[str], level: str,
               county_names: Mapping[str, str]) -> list[str | None]:
    """The name of every GEOID of ``level`` (tract: 11 digits, county: 5, state: 2)."""
    build = _BUILDERS[level]
    known: dict[str, str | None] = {}
    return [known[g] if g in known else known.setdefault(g, build(g, county_names))
            for g in geoids]
