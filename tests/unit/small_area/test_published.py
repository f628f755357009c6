"""fit_published: the model on a release's published tables, per cell and state (what the
release publishes and the audit re-fits)."""

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from dpatlas.small_area.published import MODEL_COLUMNS, fit_published, round_model

from tests.unit.small_area.test_model import published_like


def release_tables():
    """State 17 (144 tracts) and state 18 (20 tracts, too few to fit), one cell, with the
    geometry in the tract table and a cell column in every table, as published."""
    tracts, counties, states, boundaries, _ = published_like(side=12)
    big = gpd.GeoDataFrame(tracts, geometry=boundaries.geometry.to_numpy(), crs="EPSG:4326")
    small = big.iloc[:20].copy()
    small["geoid"] = "18" + small["geoid"].str[2:]
    small["geometry"] = shapely.transform(small.geometry.to_numpy(), lambda xy: xy + [5, 0])
    table = pd.concat([big, small], ignore_index=True)
    return (gpd.GeoDataFrame(table, geometry="geometry", crs="EPSG:4326"),
            counties.assign(cell="all"), states.assign(cell="all"))


def test_each_state_is_fitted_alone_and_too_few_directs_leave_empty_columns():
    tracts, counties, states = release_tables()
    values, fits = fit_published(tracts, counties, states)
    assert [(f["cell"], f["state"], f["fitted"]) for f in fits] == [("all", "17", True),
                                                                   ("all", "18", False)]
    assert "fewer than the 50" in fits[1]["reason"] and fits[1]["tracts"] == 20
    in18 = (tracts["geoid"].str[:2] == "18").to_numpy()
    assert values.loc[in18, list(MODEL_COLUMNS)].isna().all().all()
    estimates = [c for c in MODEL_COLUMNS if not c.endswith("_z")]  # z: where a direct is
    assert values.loc[~in18, estimates].notna().all().all()
    assert fits[0]["p25"]["sigma2"] > 0
    assert len(fits[0]["p25"]["beta"]) == len(fits[0]["p25"]["covariates"])
    # state 17 alone gives the same numbers: the small state does not enter its fit
    alone, _ = fit_published(tracts[~in18].reset_index(drop=True), counties, states)
    np.testing.assert_allclose(values.loc[~in18].to_numpy(dtype=float),
                               alone.to_numpy(dtype=float))


def test_rounding_keeps_every_interval_around_its_estimate():
    tracts, counties, states = release_tables()
    values, _ = fit_published(tracts, counties, states)
    rounded = round_model(values, 4)
    ok = rounded["p25_model"].notna()
    for q in ("p25", "p75"):
        r = rounded[ok]
        assert (r[f"{q}_model_lo"] <= r[f"{q}_model"]).all()
        assert (r[f"{q}_model"] <= r[f"{q}_model_hi"]).all()
        assert (r[f"{q}_model_lo"] <= values.loc[ok, f"{q}_model_lo"]).all()
        assert (r[f"{q}_model_se"] >= values.loc[ok, f"{q}_model_se"]).all()
    assert ((rounded[ok] * 1e4).round() - rounded[ok] * 1e4).abs().max().max() < 1e-6


def test_a_states_neighbours_are_found_once_for_all_its_cells_and_fit_as_found_per_cell(
        monkeypatch):
    """Several cells: a state's positions and kernel pairs are the same in every cell, found
    once (a fifth of a publish part's model fits at full scale), and every cell's values are
    bit for bit those of fitting that cell alone."""
    from dpatlas.small_area import published

    tracts, counties, states = release_tables()
    rng = np.random.default_rng(5)
    other = tracts.copy()
    other["cell"] = "b"
    for q in ("p25", "p75"):  # another cell: other values on the same tracts
        other[q] = np.clip(other[q] + rng.normal(0, 0.05, len(other)), 0, 1)
    both = gpd.GeoDataFrame(pd.concat([tracts.assign(cell="a"), other], ignore_index=True),
                            geometry="geometry", crs="EPSG:4326")
    levels = [pd.concat([lv.assign(cell="a"), lv.assign(cell="b")], ignore_index=True)
              for lv in (counties, states)]
    calls = []
    found = published.tract_neighbours
    monkeypatch.setattr(published, "tract_neighbours",
                        lambda b, g: calls.append(len(g)) or found(b, g))
    values, fits = fit_published(both, *levels)
    assert calls == [144]  # state 17 once for both cells; state 18 is too small to fit
    assert [(f["cell"], f["state"], f["fitted"]) for f in fits] == [
        ("a", "17", True), ("a", "18", False), ("b", "17", True), ("b", "18", False)]
    monkeypatch.setattr(published, "tract_neighbours", found)
    for cell, table in (("a", tracts.assign(cell="a")), ("b", other)):
        alone, _ = fit_published(table.reset_index(drop=True),
                                 *(lv[lv["cell"] == cell] for lv in levels))
        rows = (both["cell"] == cell).to_numpy()
        np.testing.assert_array_equal(values.loc[rows].to_numpy(dtype=float),
                                      alone.to_numpy(dtype=float))
    assert not np.allclose(values.loc[both["cell"] == "a", "p25_model"].to_numpy(),
                           values.loc[both["cell"] == "b", "p25_model"].to_numpy())
