"""The model's columns are pinned bit for bit: the speed-ups of issue 22 (kernel pairs found
once per state and bandwidth) must not move a single value.

``data/model_golden.csv`` was first written BEFORE those changes, by main's code at de13102, with
``.venv/bin/python -m tests.unit.small_area.test_model_golden`` (``write_golden`` below): the
model columns of ``fit_published`` on two synthetic states of ``published_like`` (one cell),
with the plan's noise, at full float64 precision (``%.17g`` round-trips exactly). It was
rewritten once, on purpose, when the point estimate became the bounded-influence EBLUP
(issue 20, branch model20-1; docs/small-area.md, "Heavy-tailed noise"), and again when the
directs' law replaced the size-bin bias correction and the benchmark and the z columns came
(issue 32, branch i32-model; docs/small-area.md, "The directs' law"), and once more when a
kernel mean became a product of a sparse kernel matrix with a vector (issue 35): the same terms
summed in another order, so each mean moved by at most a few units in the 16th digit, and the
model's columns by at most 1.0e-6 (its z) and 3.1e-7 (the estimates and their bounds); 3 of the
5,120 values moved by one published rounding step (1e-4). The kernel means are still checked
against the reference kernel below, to 1e-12."""

from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd

from dpatlas.small_area.published import MODEL_COLUMNS, fit_published
from tests.support.reference_kernel import reference_kernel_mean

from .test_model import published_like

GOLDEN = Path(__file__).parent / "data" / "model_golden.csv"
NOISE = {"NoisyStats": 0.7, "DPExpTheilSen": 0.7}


def golden_inputs():
    """Two states (17 and 18, side by side) of ``published_like``: tracts with geometry,
    counties, states."""
    tracts, counties, states = [], [], []
    for seed, code, shift in ((11, "17", 0.0), (12, "18", 3.0)):
        t, c, s, b, _ = published_like(seed, side=16)
        recode = lambda g: code + g.str[2:]
        geometry = b.geometry.translate(xoff=shift)
        tracts.append(gpd.GeoDataFrame(t.assign(geoid=recode(t["geoid"]), state=code),
                                       geometry=geometry.to_numpy(), crs=b.crs))
        counties.append(c.assign(geoid=recode(c["geoid"]), cell="all"))
        states.append(s.assign(geoid=code, cell="all"))
    return (pd.concat(tracts, ignore_index=True), pd.concat(counties, ignore_index=True),
            pd.concat(states, ignore_index=True))


def model_values() -> pd.DataFrame:
    tracts, counties, states = golden_inputs()
    values, _ = fit_published(tracts, counties, states, NOISE)
    return values.assign(geoid=tracts["geoid"].to_numpy())[["geoid", *MODEL_COLUMNS]]


def write_golden() -> None:
    GOLDEN.parent.mkdir(exist_ok=True)
    with open(GOLDEN, "w") as out:
        out.write("# model columns of fit_published on test_model_golden.golden_inputs(), "
                  "rewritten when the kernel means became sparse matrix products (issue 35)\n")
        model_values().to_csv(out, index=False, float_format="%.17g")


def test_the_model_columns_are_identical_to_the_golden_file():
    want = pd.read_csv(GOLDEN, comment="#", dtype={"geoid": str})
    got = model_values()
    estimates = [c for c in MODEL_COLUMNS if not c.endswith("_z")]  # z: where a direct is
    assert len(got) == 2 * 16 * 16 and got[estimates].notna().all().all()
    pd.testing.assert_frame_equal(got, want, check_exact=True)


if __name__ == "__main__":
    write_golden()


def test_kernel_pairs_found_once_give_the_reference_means():
    from dpatlas.small_area.model import neighbour_kernels

    rng = np.random.default_rng(5)
    xy = rng.uniform(0, 200, size=(3000, 2))
    kernels = neighbour_kernels(xy)
    for trial in range(3):  # the same pairs serve every values/weights the fit passes
        values = np.where(rng.uniform(size=len(xy)) < 0.1, np.nan, rng.normal(size=len(xy)))
        weights = np.where(rng.uniform(size=len(xy)) < 0.05, 0.0, rng.exponential(size=len(xy)))
        for h, pairs in kernels.items():
            got = pairs.mean(values, weights)
            want = reference_kernel_mean(xy, values, weights, h)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
            assert np.isfinite(got).mean() > 0.9
