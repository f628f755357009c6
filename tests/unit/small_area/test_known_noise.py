"""The directs' law (slope, offset and noise variance on the truth) known from the release's plan
(public), not fitted to them (docs/small-area.md, "The directs' law")."""

import numpy as np
import pytest

from dpatlas.release.selection import PRIMARY_STEP as RELEASE_PRIMARY_STEP
from dpatlas.small_area import fit_model
from dpatlas.small_area.model import DIRECT_LAW, direct_law
from dpatlas.small_area.published import PRIMARY_STEP, noise_from_steps

from tests.unit.small_area.test_model import published_like

STEPS = [{"step": "selection: noisy n*var(x)", "epsilon_param": 0.06},
         {"step": "primary: p25 and p75", "epsilon_param": 0.54},
         {"step": "interval: p25 and p75", "epsilon_param": 0.2}]


def test_the_primary_step_is_named_as_the_release_names_it():
    assert PRIMARY_STEP == RELEASE_PRIMARY_STEP


def test_noise_comes_from_the_primary_steps_epsilon_and_is_none_without_one():
    assert noise_from_steps(STEPS) == {"NoisyStats": 0.54, "DPExpTheilSen": 0.54}
    assert noise_from_steps(STEPS[:1]) is None
    assert noise_from_steps(None) is None


def test_the_directs_law_comes_from_public_n_and_the_plans_epsilon_alone():
    n = np.array([5.0, 50.0, 500.0, 50.0])
    mech = np.array(["NoisyStats", "NoisyStats", "NoisyStats", "OLS"])
    s_lo, a_lo, d_lo = direct_law("p25", mech, n, {"NoisyStats": 0.45})
    s_hi, _, d_hi = direct_law("p25", mech, n, {"NoisyStats": 3.56})
    # the direct follows its truth more closely and is less noisy as n and ε grow
    assert np.all(np.diff(s_lo[:3]) > 0) and np.all(np.diff(d_lo[:3]) < 0)
    assert np.all(s_hi[:3] > s_lo[:3]) and np.all(d_hi[:3] < d_lo[:3])
    assert np.all((s_lo[:3] > 0) & (s_lo[:3] < 1.1)) and np.all(d_lo[:3] > 0)
    # a mechanism without a law, or no ε, has none
    assert np.isnan(s_lo[3]) and np.isnan(d_lo[3]) and np.isnan(a_lo[3])
    assert np.all(np.isnan(direct_law("p25", mech, n, {"NoisyStats": 0.0})[0]))
    assert set(DIRECT_LAW) == {"NoisyStats", "DPExpTheilSen"}


def test_the_point_estimate_shrinks_with_the_known_noise_and_the_release_refits_the_same():
    tracts, counties, states, boundaries, truth25 = published_like()
    geometry = boundaries[["geoid", "geometry"]]
    noise = {"NoisyStats": 0.5, "DPExpTheilSen": 0.5}
    known = fit_model(tracts, counties, states, geometry, noise=noise)
    fitted = fit_model(tracts, counties, states, geometry)
    assert not np.allclose(known["p25_model"], fitted["p25_model"])
    again = fit_model(tracts, counties, states, geometry, noise=dict(noise))
    np.testing.assert_array_equal(known["p25_model"], again["p25_model"])
    assert known.attrs["fits"]["p25"]["sigma2"] > 0
