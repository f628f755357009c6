"""``fit_model`` on published-like tables: it reads the published columns and nothing else."""

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely

from dpatlas.small_area import fit_model, model_columns
from dpatlas.small_area.model import kernel_mean, winsorised

# The columns a release publishes (dpatlas.publication.tract_files: TABLE_COLUMNS, intervals,
# SEs) and the level tables' (counties.*, states.*).
TRACT_PUBLISHED = ["geoid", "state", "county", "cell", "n", "mechanism", "status", "reason",
                   "p25", "p75", "p25_raw", "p75_raw", "epsilon_spent", "delta_spent",
                   "p25_lo", "p25_hi", "p75_lo", "p75_hi", "p25_se", "p75_se"]
LEVEL_PUBLISHED = ["geoid", "n", "status", "p25", "p75", "p25_lo", "p25_hi", "p75_lo",
                   "p75_hi", "p25_se", "p75_se"]


def published_like(seed: int = 0, side: int = 30, counties: int = 9):
    """A side × side grid of 7 km tracts (GEOIDs in 9 counties of state 17) with a smooth
    truth, noisy directs (noise shrinking with n), a few suppressed tracts, and the tables
    restricted to the published columns; plus the truth (never given to the model)."""
    rng = np.random.default_rng(seed)
    k = side * side
    ix, iy = np.divmod(np.arange(k), side)
    county = (ix * 3 // side) * 3 + iy * 3 // side
    geoid = np.array([f"17{2 * c + 1:03d}{i:06d}" for c, i in zip(county, range(k))])
    lon, lat = -89 + iy * 0.08, 40 + ix * 0.06  # tracts of about 7 km, as in Illinois
    boxes = shapely.box(lon, lat, lon + 0.08, lat + 0.06)
    boundaries = gpd.GeoDataFrame({"geoid": geoid}, geometry=boxes, crs="EPSG:4326")
    truth25 = 0.4 + 0.05 * np.sin(ix / 6) + 0.03 * np.cos(iy / 5) + rng.normal(0, 0.01, k)
    truth75 = truth25 + 0.17
    n = np.maximum(2, rng.exponential(70, k)).astype(int)
    mech = np.where(rng.uniform(size=k) < 0.5, "NoisyStats", "DPExpTheilSen")
    sd = 3.0 / np.sqrt(n) / (1 + (mech == "NoisyStats"))
    status = np.where(rng.uniform(size=k) < 0.03, "suppressed", "released")
    raw25 = np.where(status == "released", truth25 + rng.normal(0, sd), np.nan)
    raw75 = np.where(status == "released", truth75 + rng.normal(0, sd), np.nan)
    tracts = pd.DataFrame({
        "geoid": geoid, "state": "17", "county": [g[:5] for g in geoid], "cell": "all",
        "n": n, "mechanism": np.where(status == "released", mech, "none"), "status": status,
        "reason": "", "p25": np.clip(raw25, 0, 1), "p75": np.clip(raw75, 0, 1),
        "p25_raw": raw25, "p75_raw": raw75, "epsilon_spent": 0.7, "delta_spent": 0.0,
        "p25_lo": 0.0, "p25_hi": 1.0, "p75_lo": 0.0, "p75_hi": 1.0, "p25_se": 0.2552,
        "p75_se": 0.2552})
    levels = []
    for digits in (5, 2):
        g = pd.DataFrame({"geoid": [x[:digits] for x in geoid], "t25": truth25,
                          "t75": truth75, "n": n}).groupby("geoid")
        lv = g.apply(lambda d: pd.Series({"n": d.n.sum(),
                                          "p25": np.average(d.t25, weights=d.n),
                                          "p75": np.average(d.t75, weights=d.n)}),
                     include_groups=False).reset_index()
        lv["p25"] += rng.normal(0, 0.005, len(lv))
        lv["p75"] += rng.normal(0, 0.005, len(lv))
        lv = lv.assign(status="released", p25_lo=lv.p25 - 0.01, p25_hi=lv.p25 + 0.01,
                       p75_lo=lv.p75 - 0.01, p75_hi=lv.p75 + 0.01, p25_se=0.0051,
                       p75_se=0.0051)
        levels.append(lv[LEVEL_PUBLISHED])
    return tracts[TRACT_PUBLISHED], levels[0], levels[1], boundaries, truth25


def test_fit_model_runs_on_the_published_columns_alone_and_adds_the_model_columns():
    tracts, counties, states, boundaries, truth25 = published_like()
    out = fit_model(tracts, counties, states, boundaries[["geoid", "geometry"]])
    added = [c for q in ("p25", "p75") for c in model_columns(q)]
    assert list(out.columns) == TRACT_PUBLISHED + added  # the published ones kept as they were
    pd.testing.assert_frame_equal(out[TRACT_PUBLISHED], tracts)
    for q in ("p25", "p75"):
        est, lo, hi, se, z = (out[c].to_numpy() for c in model_columns(q))
        assert np.all(np.isfinite(est)) and np.all(np.isfinite(se))  # suppressed ones too
        assert np.all((0 <= lo) & (lo <= est) & (est <= hi) & (hi <= 1)) and np.all(se > 0)
        # the check of the direct against the model: exactly where there is a direct
        has = ((tracts["status"] == "released") & tracts[q].notna()).to_numpy()
        np.testing.assert_array_equal(np.isfinite(z), has)
    # it borrows strength: far better than the directs
    rel = (tracts["status"] == "released").to_numpy()
    rmse = lambda a, m: np.sqrt(np.mean((a[m] - truth25[m]) ** 2))
    assert rmse(out["p25_model"].to_numpy(), rel) < 0.5 * rmse(tracts["p25"].to_numpy(), rel)


def test_fit_model_never_reads_a_column_it_is_not_given():
    """Extra (confidential-looking) columns change nothing: only published ones are read."""
    tracts, counties, states, boundaries, truth25 = published_like(1)
    plain = fit_model(tracts, counties, states, boundaries)
    rng = np.random.default_rng(9)
    secret = dict(true_p25=truth25, nvar=rng.normal(size=len(tracts)))
    spiked = fit_model(tracts.assign(**secret), counties.assign(true_p25=0.5),
                       states.assign(true_p25=0.5), boundaries.assign(secret=1.0))
    cols = [c for q in ("p25", "p75") for c in model_columns(q)]
    pd.testing.assert_frame_equal(plain[cols], spiked[cols])


def test_fit_model_without_level_tables_still_estimates_every_tract():
    tracts, _, _, boundaries, truth25 = published_like(2)
    out = fit_model(tracts, None, None, boundaries)
    assert out["p25_model"].notna().all()
    assert np.corrcoef(out["p25_model"], truth25)[0, 1] > 0.5


def test_fit_model_refuses_tracts_without_a_boundary():
    tracts, counties, states, boundaries, _ = published_like(3, side=12)
    with pytest.raises(ValueError, match="no boundary"):
        fit_model(tracts, counties, states, boundaries.iloc[1:])


def test_kernel_mean_leaves_the_point_itself_out():
    xy = np.array([[0.0, 0.0], [1.0, 0.0], [50.0, 0.0]])
    values = np.array([10.0, 2.0, 7.0])
    got = kernel_mean(xy, values, np.ones(3), 1.0)
    assert got[0] == pytest.approx(2.0) and got[1] == pytest.approx(10.0)
    assert np.isnan(got[2])  # nobody within reach


def test_winsorised_is_symmetric_about_the_median_inside_the_range():
    v = np.array([-3.0, 0.1, 0.3, 0.3, 0.4, 2.0])
    w = winsorised(v)  # median 0.3: window [0, 0.6]
    assert w.min() == 0.0 and w.max() == pytest.approx(0.6)


def test_fit_model_takes_one_cell_and_enough_directs():
    tracts, counties, states, boundaries, _ = published_like(4, side=12)
    two_cells = pd.concat([tracts, tracts.assign(cell="female")], ignore_index=True)
    with pytest.raises(ValueError, match="one cell"):
        fit_model(two_cells, counties, states, boundaries)
    few = tracts.assign(status=np.where(np.arange(len(tracts)) < 40, "released", "suppressed"))
    with pytest.raises(ValueError, match="at least 50 tracts with a direct estimate to fit its variances, got 40"):
        fit_model(few, counties, states, boundaries)


def test_a_single_county_adds_no_collinear_covariate():
    tracts, counties, states, boundaries, truth25 = published_like(5, side=12)
    one = tracts.assign(geoid="17001" + tracts["geoid"].str[5:])
    county = counties.iloc[:1].assign(geoid="17001")
    out = fit_model(one, county, states, boundaries.assign(geoid=one["geoid"]))
    assert out["p25_model"].notna().all() and (out["p25_model_se"] > 0).all()
