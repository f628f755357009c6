"""The published ``name`` column (issue 33 item 4): Census-style names of the units of a
level, from their GEOIDs and the county names the package knows (public geography only)."""

from __future__ import annotations

import pandas as pd

from dpatlas.core.census_names import unit_names
from dpatlas.core.places import county_names

NAME_TEXT = {
    "tract": "Census-style name of the tract (the Census Bureau's NAME, e.g. \"Census Tract "
             "12.01; Wake County; North Carolina\"; the county is left out where its name is "
             "not known); public: from the GEOID and public geography only",
    "county": "Census-style name of the county (e.g. \"Wake County, North Carolina\"); empty "
              "where the package does not know the county's real name; public: from the "
              "GEOID and public geography only",
    "state": "Name of the state (e.g. \"North Carolina\"); public: from the GEOID's state FIPS "
             "code",
}


def names_of(geoids: pd.Series, level: str) -> pd.Series:
    """The ``name`` of every unit of ``level`` (its GEOIDs), aligned with ``geoids``."""
    return pd.Series(unit_names(geoids.astype(str), level, county_names()), index=geoids.index,
                     dtype=object)


def name_field(level: str) -> dict:
    """The ``name`` field of the level's Table Schema."""
    return {"name": "name", "type": "string", "description": NAME_TEXT[level]}
