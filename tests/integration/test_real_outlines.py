"""Issue 21 item 6: the synthetic geography is a real place. Tracts lie in the real outlines
(libpysal's bundled examples, read here on their own, not through the code under test), and
their GEOIDs' state and county codes are those of the outline they lie in."""

import geopandas as gpd
import numpy as np
import pytest
import shapely
from libpysal.examples import load_example

from dpatlas.evaluation.synthetic_input import StateParams, tract_geoids
from dpatlas.core.places import county_names
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries


def _read(example, file_name):
    return gpd.read_file(load_example(example).get_path(file_name), engine="pyogrio")


@pytest.fixture(scope="module")
def nc_counties():
    frame = _read("sids2", "sids2.shp")
    return frame.set_index(frame["FIPS"].astype(str)).geometry


@pytest.fixture(scope="module")
def us_states():
    frame = _read("us_income", "us48.shp")
    return frame.set_index(frame["STATE_FIPS"].astype(str)).geometry


@pytest.fixture(scope="module")
def north_carolina():
    """The default synthetic state: 3,108 tracts over North Carolina's 100 counties."""
    params = StateParams()
    geoids, _ = tract_geoids("37", params.n_tracts, params.counties)
    return synth_boundaries(list(geoids), seed=0)


def _representative_points(gdf):
    return shapely.point_on_surface(gdf.geometry.to_numpy())


def test_default_state_is_north_carolina_with_its_real_county_codes(north_carolina, nc_counties):
    assert StateParams().counties == 100
    assert (north_carolina["state"] == "37").all()
    assert set(north_carolina["county"]) == set(nc_counties.index)  # all 100, no made-up code
    assert len(north_carolina) == 3108


def test_each_tract_lies_in_the_county_its_geoid_names(north_carolina, nc_counties):
    points = _representative_points(north_carolina)
    counties = nc_counties.loc[north_carolina["county"]].to_numpy()
    assert shapely.contains(counties, points).all()
    # Every tract inside its county: what sticks out is rounding, not area.
    outside = shapely.area(shapely.difference(north_carolina.geometry.to_numpy(), counties))
    assert outside.max() < 1e-9
    # And the point lies in no other county (the codes name the one it is in).
    tree = shapely.STRtree(nc_counties.to_numpy())
    hits = tree.query(points, predicate="within")
    assert len(hits[0]) == len(points)
    assert (nc_counties.index[hits[1]] == north_carolina["county"].to_numpy()[hits[0]]).all()


def test_counties_tile_the_state(north_carolina, nc_counties, us_states):
    tracts = north_carolina.geometry.to_numpy()
    state = us_states.loc["37"]
    covered = shapely.union_all(tracts)
    assert shapely.area(tracts).sum() == pytest.approx(covered.area, rel=1e-6)  # no overlap
    assert covered.area / state.area > 0.995  # no big gaps
    assert covered.difference(state.buffer(1e-6)).area < 1e-9 * state.area
    by_county = north_carolina.assign(area=shapely.area(tracts)).groupby("county")["area"].sum()
    real = shapely.area(nc_counties.loc[by_county.index].to_numpy())
    assert np.allclose(by_county.to_numpy(), real, rtol=0.01)  # each county filled
    assert shapely.coverage_is_valid(tracts)


def test_real_county_boundaries_are_deterministic(north_carolina):
    geoids = list(north_carolina["geoid"][:300])  # 10 counties
    first = synth_boundaries(geoids, seed=4)
    again = synth_boundaries(geoids, seed=4)
    assert again.geometry.geom_equals_exact(first.geometry, tolerance=0).all()
    other = synth_boundaries(geoids, seed=5)
    assert not other.geometry.geom_equals_exact(first.geometry, tolerance=1e-6).all()


def test_several_states_sit_in_their_real_outlines(us_states):
    # Illinois and California with synthetic counties; North Carolina with codes that are not
    # all real (102 counties: 201 and 203 do not exist) gets synthetic counties too.
    geoids = [g for state, counties in (("17", 12), ("06", 9), ("37", 102))
              for g in tract_geoids(state, 150 if state != "37" else 204, counties)[0]]
    gdf = synth_boundaries(geoids, seed=1)
    points = _representative_points(gdf)
    tree = shapely.STRtree(us_states.to_numpy())
    hits = tree.query(points, predicate="within")
    assert len(hits[0]) == len(points)  # each tract in exactly one state
    assert (us_states.index[hits[1]] == gdf["state"].to_numpy()[hits[0]]).all()
    for state, part in gdf.groupby("state"):
        covered = shapely.union_all(part.geometry.to_numpy())
        assert covered.area / us_states.loc[state].area > 0.98, state


def test_states_not_outlined_sit_at_their_place():
    gdf = synth_boundaries([f"{s}001000100" for s in ("02", "15", "72")], seed=0)
    centres = shapely.get_coordinates(shapely.centroid(gdf.geometry.to_numpy()))
    assert np.allclose(centres, [(-152.0, 64.0), (-157.0, 20.8), (-66.5, 18.2)], atol=1.0)


def test_county_names_are_the_real_ones():
    names = county_names()
    assert len(names) == 100
    assert names["37119"] == "Mecklenburg" and names["37183"] == "Wake"
    assert names["37001"] == "Alamance"


def test_demo_data_of_the_old_default_state_is_regenerated(tmp_path):
    from dpatlas.cli.demo import demo_data_current
    from dpatlas.evaluation.synthetic_input import write_synthetic

    params = StateParams(n_tracts=20, counties=2)
    write_synthetic(tmp_path / "old", ["17"], seed=0, params=params)  # before issue 21
    write_synthetic(tmp_path / "new", ["37"], seed=0, params=params)
    assert not demo_data_current(tmp_path / "old")
    assert demo_data_current(tmp_path / "new")


def test_the_published_county_level_carries_real_county_names(tmp_path):
    import json

    import pandas as pd

    from dpatlas.audit.levels import level_column_payer
    from dpatlas.publication.geojson import write_geojson_rfc7946
    from dpatlas.publication.level_files import assemble_level, level_table_schema

    geoids = list(tract_geoids("37", 6, 3)[0]) + list(tract_geoids("17", 4, 2)[0])
    results = pd.DataFrame(columns=["level", "geoid", "cell", "n", "mechanism", "status",
                                    "reason", "p25_raw", "p75_raw", "epsilon_spent",
                                    "delta_spent"])  # no records: every county suppressed
    table = assemble_level(results, synth_boundaries(geoids), "county", ["all"])
    names = dict(zip(table["geoid"], table["name"]))
    assert (names["37001"], names["37003"], names["37005"]) == (
        "Alamance County, North Carolina", "Alexander County, North Carolina",
        "Alleghany County, North Carolina")  # Census-style (issue 33 item 4)
    assert pd.isna(names["17001"])  # Illinois' counties here are synthetic: no name
    write_geojson_rfc7946(table, tmp_path / "counties.geojson")
    features = json.loads((tmp_path / "counties.geojson").read_text())["features"]
    assert {f["properties"]["geoid"]: f["properties"]["name"] for f in features}["37005"] == \
        "Alleghany County, North Carolina"
    fields = [f["name"] for f in level_table_schema(list(table.columns.drop("geometry")),
                                                    "county")["fields"]]
    assert fields.index("name") == fields.index("county") + 1
    assert level_column_payer("name", "county") == "public"
    assert level_column_payer("name", "state") == "public"  # states are named too (issue 33)
    assert level_column_payer("county", "state") is None
