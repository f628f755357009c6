"""The audit compares a tile's attributes with the table's row: a tile may leave out only the
columns the map never shows (TILE_OMITTED); any other missing column is read as null."""

from __future__ import annotations

from dpatlas.audit.formats import _compare
from dpatlas.audit.tiles import TILE_OMITTED

COLUMNS = ["geoid", "cell", "p25", "p25_raw", "p25_se"]
TABLE = {("17001000100", "all"): {"geoid": "17001000100", "cell": "all", "p25": 0.41,
                                 "p25_raw": 0.4123, "p25_se": 0.05}}


def tile_compare(row: dict) -> list[str]:
    return _compare("tracts.pmtiles", [row], TABLE, COLUMNS, exact_columns=False,
                    complete=False, omitted=TILE_OMITTED)


def test_a_tile_without_the_columns_the_map_never_shows_passes():
    assert {"p25_raw", "p25_se"} <= TILE_OMITTED
    assert tile_compare({"geoid": "17001000100", "cell": "all", "p25": 0.41}) == []


def test_a_tile_that_carries_them_is_still_compared():
    row = {"geoid": "17001000100", "cell": "all", "p25": 0.41, "p25_raw": 0.5, "p25_se": 0.05}
    assert tile_compare(row) == ["tracts.pmtiles: p25_raw differs from tracts.parquet in 1 "
                                 "row(s), e.g. 17001000100"]


def test_a_tile_without_a_value_the_map_shows_is_a_finding():
    assert tile_compare({"geoid": "17001000100", "cell": "all"}) == [
        "tracts.pmtiles: p25 differs from tracts.parquet in 1 row(s), e.g. 17001000100"]
