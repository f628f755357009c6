"""The directs' DP noise variance known from the release's plan (public), not fitted to them."""

import numpy as np
import pytest

from dpatlas.release.selection import PRIMARY_STEP as RELEASE_PRIMARY_STEP
from dpatlas.small_area import fit_model
from dpatlas.small_area.model import (CALIBRATION_EPSILONS, NOISE_COEFFICIENTS,
                                      SAMPLING_COEFFICIENTS, known_noise, variance_function)
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


def test_known_noise_scales_as_one_over_epsilon_squared_and_interpolates_the_one_over_n_term():
    lo, hi = CALIBRATION_EPSILONS
    at_lo = known_noise({"NoisyStats": lo, "DPExpTheilSen": lo})
    at_hi = known_noise({"NoisyStats": hi})
    assert at_lo["NoisyStats"] == pytest.approx((NOISE_COEFFICIENTS["NoisyStats"] / lo ** 2,
                                                 SAMPLING_COEFFICIENTS["NoisyStats"][0]))
    assert at_lo["DPExpTheilSen"][1] == pytest.approx(SAMPLING_COEFFICIENTS["DPExpTheilSen"][0])
    assert at_hi["NoisyStats"][1] == pytest.approx(SAMPLING_COEFFICIENTS["NoisyStats"][1])
    mid = known_noise({"NoisyStats": np.sqrt(lo * hi)})["NoisyStats"][1]
    assert mid == pytest.approx(np.sqrt(np.prod(SAMPLING_COEFFICIENTS["NoisyStats"])))
    # held constant beyond the calibration budgets; unknown mechanisms and ε ≤ 0 skipped
    assert known_noise({"NoisyStats": 100.0})["NoisyStats"][1] == at_hi["NoisyStats"][1]
    assert known_noise({"OLS": 1.0, "NoisyStats": 0.0}) == {}


def test_variance_function_keeps_the_known_coefficients_and_fits_the_rest():
    rng = np.random.default_rng(3)
    n = rng.integers(5, 400, 4000).astype(float)
    group = np.where(rng.uniform(size=n.size) < 0.5, "NoisyStats", "DPExpTheilSen")
    resid2 = (0.002 + 16.0 / (0.5 * n) ** 2 + 1.0 / n) * rng.chisquare(1, n.size)
    known = {"NoisyStats": (64.0, 1.0)}
    _, params = variance_function(resid2, n, group, known=known)
    assert params["NoisyStats"][:2] == (64.0, 1.0)
    assert params["DPExpTheilSen"][:2] != (64.0, 1.0)  # fitted, not copied


def test_the_point_estimate_shrinks_with_the_known_noise_and_the_release_refits_the_same():
    tracts, counties, states, boundaries, truth25 = published_like()
    geometry = boundaries[["geoid", "geometry"]]
    noise = {"NoisyStats": 0.5, "DPExpTheilSen": 0.5}
    known = fit_model(tracts, counties, states, geometry, noise=noise)
    fitted = fit_model(tracts, counties, states, geometry)
    assert not np.allclose(known["p25_model"], fitted["p25_model"])
    again = fit_model(tracts, counties, states, geometry, noise=dict(noise))
    np.testing.assert_array_equal(known["p25_model"], again["p25_model"])
    assert known.attrs["fits"]["p25"]["sigma2_shrink"] > 0
