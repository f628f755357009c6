"""The small-area model's stress scenarios: each breaks what it says it breaks, its truth is
the estimand it says, and the command writes its table."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dpatlas.evaluation import small_area_stress as S
from mechanisms.batch import TractBatch
from dpatlas.evaluation.stress import least_squares_line
from tests.support.cli import invoke

TRACTS = 150


@pytest.fixture(scope="module")
def base():
    return S.synthetic_state(201, TRACTS)


def _residuals(state):
    lines = state.records.attrs["truth"].set_index("geoid").loc[state.records["geoid"]]
    r = state.records
    return (r["child_rank"] - lines["intercept"].to_numpy()
            - lines["slope"].to_numpy() * r["parent_rank"]).to_numpy()


def test_error_laws_break_what_they_say(base):
    skewed = S.stressed_state(201, "skewed", TRACTS)
    assert stats.skew(_residuals(skewed)) > stats.skew(_residuals(base)) + 0.5
    censored = S.stressed_state(201, "censored", TRACTS).records["child_rank"]
    assert censored.min() >= 0.15 and censored.max() <= 0.85
    assert (censored == 0.85).mean() > 0.02  # top-coded mass
    het = S.stressed_state(201, "heteroskedastic", TRACTS)
    x, r = het.records["parent_rank"].to_numpy(), _residuals(het)
    assert r[x > 0.7].std() > 1.5 * r[x < 0.3].std()



def test_outliers_replace_three_percent_of_the_children(monkeypatch):
    # without the Gaussian errors every child sits on the line (to the rounding, or at a clip)
    # but the outliers
    monkeypatch.setattr(S, "NOISE_SD", 0.0)
    state = S.stressed_state(201, "outliers", TRACTS)
    off = np.abs(_residuals(state)) > 0.011
    assert 0.02 < off.mean() < 0.04, off.mean()


def test_narrow_x_and_sizes(base):
    narrow = S.stressed_state(201, "narrow_x", TRACTS).records
    spread = narrow.groupby("geoid")["parent_rank"].agg(lambda v: v.max() - v.min())
    assert spread.max() <= 0.05 + 0.01 + 1e-9
    small = S.stressed_state(201, "small", TRACTS).records.groupby("geoid").size().mean()
    large = S.stressed_state(201, "large", TRACTS).records.groupby("geoid").size().mean()
    assert small < 25 < 50 < base.records.groupby("geoid").size().mean() < 100 < 400 < large


def test_truth_is_the_population_line_where_the_error_law_changes():
    """The truth is the line through many draws of each tract's children at its own x: close
    to the observed line where the tract is large, and without its sampling noise."""
    state = S.stressed_state(201, "skewed", TRACTS)
    r = state.records
    batch = TractBatch.from_labels(r["geoid"].to_numpy(), r["parent_rank"].to_numpy(),
                                   r["child_rank"].to_numpy())
    own = least_squares_line(batch)
    truth = state.truth.set_index("geoid").loc[batch.labels.astype(str)]
    gap = np.abs(truth["p25"].to_numpy() - own["p25"])
    big = batch.n >= 150
    small = (batch.n >= 5) & (batch.n <= 20)
    assert big.sum() >= 5 and small.sum() >= 5
    # the observed line is the population line plus sampling error, ~ 1/sqrt(n)
    assert np.nanmedian(gap[big]) < 0.5 * np.nanmedian(gap[small])
    # the skewed law's mean is 0, so where nothing is clipped the line is the generator's
    line = r.attrs["truth"].set_index("geoid").loc[batch.labels.astype(str)]
    gen = line["intercept"].to_numpy() + 0.25 * line["slope"].to_numpy()
    assert np.nanmedian(np.abs(truth["p25"].to_numpy() - gen)) < 0.03
    assert S.stressed_state(201, "small", TRACTS).truth["p25"].notna().all()


def test_unknown_scenario_is_refused():
    with pytest.raises(ValueError, match="unknown scenario"):
        S.stressed_state(201, "bimodal")


def test_stress_command_writes_its_table(tmp_path):
    res = invoke("evaluate-small-area", "--stress", "--quick", "--out", tmp_path)
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(tmp_path / "stress.csv")
    assert list(rows["scenario"]) == list(S.SCENARIOS[:2]) and (rows["epsilon"] == 1).all()
    assert rows["coverage"].between(0, 1).all() and (rows["p25 model RMSE"] > 0).all()
    md = (tmp_path / "stress.md").read_text()
    assert "### ε = 1" in md and "| metric | skewed | heteroskedastic |" in md
