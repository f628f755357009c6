"""Stress scenarios for the interval evaluation (issue 18, item 3). Research code: the release
path never imports this module.

Each scenario draws a synthetic state, tract by tract, that breaks one assumption the demo
generator (dpatlas/evaluation/synthetic_input.py: symmetric Gaussian errors, mid-sized tracts, continuous-looking
ranks) quietly satisfies. Every scenario returns a :class:`StressState`: the records as a
:class:`mechanisms.TractBatch`, the per-tract TRUE estimand and the census reading.

**Estimand** (issue 32; ``mechanisms/estimand.py``): the tract's *expected outcome*, the
population least-squares prediction at x* = 0.25 and 0.75 of the law that generated the
tract's records. With the tract's parent ranks x_i fixed (its own x distribution) and
m_i = E[y | x_i] under the scenario's law (errors, truncation, censoring, outliers, rounding),

    b = Σ(x − x̄)(m − m̄) / Σ(x − x̄)²,   a = m̄ − b·x̄,
    p25 = clip(a + b·0.25, 0, 1),   p75 = clip(a + b·0.75, 0, 1).

m_i is the mean of ``POPULATION_DRAWS`` independent draws of the child at x_i from the
scenario's own law (``StressState.law``, the very function that drew the records), as
``small_area_stress.py`` does: the LS line of those means equals the LS line through all the
draws. Its Monte Carlo error is 1/sqrt(POPULATION_DRAWS) of the tract's sampling error (an SD
1/8 as large at 64 draws, adding 1.6% to the error variance a scored estimate is judged by).
Where the law is a line with errors that never leave [0, 1], this is the generator's line.
The clip makes it a rank, as every published value is clipped.

**Census reading** (secondary, ``StressState.census``): the least-squares line of the tract's
own observed ranks (``least_squares_line``), a finite-population quantity with no sampling
error; ``theil_sen_line`` gives DPExpTheilSen's census reading (the median of the tract's
pairwise predictions, see docs/uncertainty.md). These were the estimands before issue 32.

The generators' constants were chosen from the shapes they should produce (stated beside each
one), not tuned on any evaluation result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mechanisms.batch import X_HIGH, X_LOW, TractBatch, ols, sufficient_stats

SCENARIOS = ("demo", "heteroskedastic", "skewed", "censored", "outliers", "narrow_x", "small",
             "large", "tied_x", "size_dependent")
# The scenarios the banded rule was calibrated on (dpatlas/defaults/thresholds.yaml): the ones
# added since are held out of its calibration.
RULE_CALIBRATION_SCENARIOS = SCENARIOS[:9]
MEAN_TRACT_SIZE = 70.0  # as the demo generator (about 70 children per Illinois tract)
MIN_TRACT_SIZE = 5
SMALL_SIZES = (5, 40)
LARGE_SIZES = (500, 2000)
NARROW_HALF_WIDTH = 0.025  # narrow_x: every tract's x within ±0.025 of its centre
OUTLIER_SHARE = 0.03  # outliers: 3% of a tract's records (at least one)
SIZE_EFFECT = 0.06  # size_dependent: intercept shift per SD of log n (larger tracts do better)
POPULATION_DRAWS = 64  # draws of every child for the expected outcome (module doc)
_POPULATION_STREAM = 32  # the expected outcome's draws: a stream of their own

# A scenario's law of the children's ranks given the records' x, in batch order: a fresh draw
# of every y from the generator's own law (the function that drew the records).
ChildLaw = Callable[[np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class StressState:
    """A scenario's records and its per-tract estimand (arrays in batch tract order)."""

    scenario: str
    batch: TractBatch
    truth: dict[str, np.ndarray]  # "p25", "p75": the tract's expected outcome (module doc)
    params: dict = field(default_factory=dict)
    # "p25", "p75": the census reading, the least-squares line of the tract's own records
    census: dict[str, np.ndarray] = field(default_factory=dict)
    law: ChildLaw | None = field(default=None, repr=False)


def least_squares_line(batch: TractBatch) -> dict[str, np.ndarray]:
    """The estimand: p25 and p75 of each tract's least-squares line (NaN if x has no spread)."""
    fit = ols(sufficient_stats(batch))
    return {name: np.where(fit.ok, np.clip(value, 0.0, 1.0), np.nan)
            for name, value in (("p25", fit.p25), ("p75", fit.p75))}


def population_line(batch: TractBatch, law: ChildLaw, rng: np.random.Generator,
                    draws: int = POPULATION_DRAWS) -> dict[str, np.ndarray]:
    """The expected outcome: p25, p75 of each tract's least-squares line of E[y | x] at its own
    x, E[y | x_i] the mean of ``draws`` independent draws of ``law`` (module doc)."""
    total = np.zeros(batch.x.size)
    for _ in range(draws):
        total += law(rng)
    return least_squares_line(TractBatch(batch.x, total / draws, batch.starts, batch.labels))


def theil_sen_line(batch: TractBatch) -> dict[str, np.ndarray]:
    """The median of each tract's pairwise predictions at 0.25 and 0.75 (pairs with distinct
    x, predictions clipped as DPExpTheilSen clips them): the exact, non-private Theil–Sen,
    clipped to [0, 1] as the least-squares line is."""
    import mechanisms as M

    out = M.estimate_batch("TheilSen", batch, 1.0, reps=1, seed=1)
    return {"p25": np.where(out.failed[0], np.nan, np.clip(out.p25[0], 0.0, 1.0)),
            "p75": np.where(out.failed[0], np.nan, np.clip(out.p75[0], 0.0, 1.0))}


# ---------------------------------------------------------------------------------------------
# Building blocks: sizes, x, lines, errors


def _sizes_demo_like(rng, tracts: int) -> np.ndarray:
    return np.maximum(MIN_TRACT_SIZE, np.rint(rng.exponential(MEAN_TRACT_SIZE, tracts))
                      ).astype(np.int64)


def _sizes_between(rng, tracts: int, bounds: tuple[int, int]) -> np.ndarray:
    return rng.integers(bounds[0], bounds[1] + 1, tracts).astype(np.int64)


def _x_spread(rng, centre: np.ndarray, n: np.ndarray, concentration: float = 4.0) -> np.ndarray:
    """x ~ Beta with mean ``centre`` per tract: continuous ranks, tracts of different mixes."""
    c = np.repeat(centre, n)
    return rng.beta(c * concentration, (1 - c) * concentration)


def _lines(rng, tracts: int) -> tuple[np.ndarray, np.ndarray]:
    """(intercept, slope) per tract: the national rank-rank slope 0.34 ± 0.10 (Chetty et al.
    2014) and intercepts that keep the line inside [0.15, 0.85] over x in [0, 1]."""
    slope = np.clip(rng.normal(0.34, 0.10, tracts), 0.0, 0.6)
    icpt = rng.uniform(0.2, 0.8 - slope)
    return icpt, slope


def _truncated(rng, mean: np.ndarray, draw: Callable[[int], np.ndarray]) -> np.ndarray:
    """mean + e with e from ``draw``, redrawn where the sum leaves [0, 1] (no censoring)."""
    e = draw(mean.size)
    for _ in range(200):
        bad = np.nonzero((mean + e < 0) | (mean + e > 1))[0]
        if bad.size == 0:
            break
        e[bad] = draw(bad.size)
    return np.clip(mean + e, 0.0, 1.0)


def _state(name: str, n: np.ndarray, x: np.ndarray, y: np.ndarray, params: dict,
           law: ChildLaw) -> StressState:
    """The records in batch order (zero-padded labels: batch order = draw order, so ``law``,
    which draws in record order, draws in batch order too); ``truth`` is filled in by
    ``scenario_state``."""
    labels = np.repeat(np.array([f"t{i:05d}" for i in range(n.size)]), n)
    batch = TractBatch.from_labels(labels, x, y)
    return StressState(name, batch, {}, params, least_squares_line(batch), law)


@dataclass(frozen=True)
class GaussianLaw:
    """y = mean + N(0, sd²) per record, the error redrawn where y would leave [0, 1] (a normal
    truncated to [0, 1]: E[y] is known in closed form, which the tests use)."""

    mean: np.ndarray  # the generator's line at each record's x
    sd: np.ndarray

    def __call__(self, rng: np.random.Generator) -> np.ndarray:
        mean, scale = self.mean, self.sd
        e = rng.normal(0.0, 1.0, mean.size) * scale
        for _ in range(200):  # redraw per record with its own sd, so heteroskedasticity is kept
            bad = np.nonzero((mean + e < 0) | (mean + e > 1))[0]
            if bad.size == 0:
                break
            e[bad] = rng.normal(0.0, 1.0, bad.size) * scale[bad]
        return np.clip(mean + e, 0.0, 1.0)


def _gaussian_state(name: str, rng, n: np.ndarray, x: np.ndarray, sd, params: dict,
                    lines: tuple[np.ndarray, np.ndarray] | None = None) -> StressState:
    icpt, slope = _lines(rng, n.size) if lines is None else lines
    t = np.repeat(np.arange(n.size), n)
    law = GaussianLaw(icpt[t] + slope[t] * x,
                      np.broadcast_to(np.asarray(sd, dtype=float), x.shape).copy())
    return _state(name, n, x, law(rng), params, law)


# ---------------------------------------------------------------------------------------------
# The scenarios


def demo(rng, tracts: int, seed: int) -> StressState:
    """The demo generator itself (dpatlas/evaluation/synthetic_input.py), at another seed than the demo's."""
    from dpatlas.evaluation.synthetic_input import StateParams, batch_of, oi_like_state

    params = StateParams(n_tracts=tracts)
    df = oi_like_state(seed, params)
    batch = batch_of(df)
    lines = df.attrs["truth"].set_index("geoid").loc[batch.labels]
    t = batch.tract_of_record
    mean = lines["intercept"].to_numpy()[t] + lines["slope"].to_numpy()[t] * batch.x

    def law(r):  # the generator's: the line plus N(0, noise_sd²), clipped, rounded to 0.01
        return np.round(np.clip(mean + r.normal(0.0, params.noise_sd, mean.size), 0.0, 1.0), 2)
    return StressState("demo", batch, {}, {"synth_seed": seed}, least_squares_line(batch), law)


def heteroskedastic(rng, tracts: int, seed: int) -> StressState:
    """Error sd grows with the parent rank, 0.03 at x = 0 to 0.28 at x = 1 (a factor of 9)."""
    n = _sizes_demo_like(rng, tracts)
    x = _x_spread(rng, rng.uniform(0.2, 0.8, tracts), n)
    return _gaussian_state("heteroskedastic", rng, n, x, 0.03 + 0.25 * x,
                           {"sd": "0.03 + 0.25 x"})


def skewed(rng, tracts: int, seed: int) -> StressState:
    """Right-skewed errors: 0.15·(Exp(1) − 1), skewness 2 (a few children far above the line,
    most a little below it), redrawn where y would leave [0, 1]."""
    n = _sizes_demo_like(rng, tracts)
    x = _x_spread(rng, rng.uniform(0.2, 0.8, tracts), n)
    icpt, slope = _lines(rng, tracts)
    t = np.repeat(np.arange(tracts), n)
    mean = icpt[t] + slope[t] * x - 0.1  # room above the line for the long right tail
    mean = np.clip(mean, 0.1, 0.7)

    def law(r):
        return _truncated(r, mean, lambda k: 0.15 * (r.exponential(1.0, k) - 1.0))
    return _state("skewed", n, x, law(rng), {"errors": "0.15 (Exp(1) - 1)"}, law)


def censored(rng, tracts: int, seed: int) -> StressState:
    """y = clip(α + βx + N(0, 0.3²), 0, 1): a sizeable share of the records exactly at 0 and
    at 1 (bounded ranks piled up at the ends)."""
    n = _sizes_demo_like(rng, tracts)
    x = _x_spread(rng, rng.uniform(0.2, 0.8, tracts), n)
    icpt, slope = _lines(rng, tracts)
    t = np.repeat(np.arange(tracts), n)
    mean = icpt[t] + slope[t] * x

    def law(r):
        return np.clip(mean + r.normal(0.0, 0.3, mean.size), 0.0, 1.0)
    return _state("censored", n, x, law(rng), {"errors": "N(0, 0.3^2), y clipped to [0, 1]"},
                  law)


def outliers(rng, tracts: int, seed: int) -> StressState:
    """3% of each tract's records (at least one) moved to the far end of x from the tract's
    centre, with y at the opposite end of the line: high leverage, against the trend."""
    n = _sizes_demo_like(rng, tracts)
    centre = rng.uniform(0.3, 0.7, tracts)
    x = _x_spread(rng, centre, n, concentration=8.0)
    state = _gaussian_state("outliers", rng, n, x, 0.12, {})
    b = state.batch
    x, y = b.x.copy(), b.y.copy()
    slots, low_y = [], []  # the outlier records and whether their y is at the low end
    for t in range(tracts):
        s, k = b.starts[t], b.n[t]
        m = max(1, int(round(OUTLIER_SHARE * k)))
        far_right = centre[t] < 0.5  # zero-padded labels: batch order = draw order
        x[s:s + m] = rng.uniform(0.97, 1.0, m) if far_right else rng.uniform(0.0, 0.03, m)
        y[s:s + m] = rng.uniform(0.0, 0.05, m) if far_right else rng.uniform(0.95, 1.0, m)
        slots.append(np.arange(s, s + m))
        low_y.append(np.full(m, far_right))
    slots, low_y = np.concatenate(slots), np.concatenate(low_y)
    batch = TractBatch(x, y, b.starts, b.labels)

    def law(r):  # the rest at their x as drawn; the outliers (fixed x) uniform at their end
        out = state.law(r)
        u = r.uniform(0.0, 0.05, slots.size)
        out[slots] = np.where(low_y, u, 0.95 + u)
        return out
    return StressState("outliers", batch, {}, {"outlier_share": OUTLIER_SHARE},
                       least_squares_line(batch), law)


def narrow_x(rng, tracts: int, seed: int) -> StressState:
    """Every tract's x within ±0.025 of its own centre (a homogeneous neighbourhood): n·var(x)
    is tiny, so the slope is poorly determined and p25, p75 are far extrapolations."""
    n = _sizes_demo_like(rng, tracts)
    centre = rng.uniform(0.1, 0.9, tracts)
    x = np.repeat(centre, n) + rng.uniform(-NARROW_HALF_WIDTH, NARROW_HALF_WIDTH, n.sum())
    return _gaussian_state("narrow_x", rng, n, np.clip(x, 0, 1), 0.15,
                           {"half_width": NARROW_HALF_WIDTH})


def small(rng, tracts: int, seed: int) -> StressState:
    """Tract sizes uniform on 5–40."""
    n = _sizes_between(rng, tracts, SMALL_SIZES)
    x = _x_spread(rng, rng.uniform(0.2, 0.8, tracts), n)
    return _gaussian_state("small", rng, n, x, 0.15, {"sizes": SMALL_SIZES})


def large(rng, tracts: int, seed: int) -> StressState:
    """Tract sizes uniform on 500–2,000."""
    n = _sizes_between(rng, tracts, LARGE_SIZES)
    x = _x_spread(rng, rng.uniform(0.2, 0.8, tracts), n)
    return _gaussian_state("large", rng, n, x, 0.15, {"sizes": LARGE_SIZES})


def tied_x(rng, tracts: int, seed: int) -> StressState:
    """Whole percentile ranks, x and y on the 0.01 grid (as released ranks are): many records
    of a tract share an x, and y values repeat too."""
    n = _sizes_demo_like(rng, tracts)
    x = np.round(_x_spread(rng, rng.uniform(0.2, 0.8, tracts), n, concentration=6.0), 2)
    state = _gaussian_state("tied_x", rng, n, x, 0.15, {"grid": 0.01})
    b = state.batch
    batch = TractBatch(b.x, np.round(b.y, 2), b.starts, b.labels)

    def law(r):
        return np.round(state.law(r), 2)
    return StressState("tied_x", batch, {}, {"grid": 0.01}, least_squares_line(batch), law)


def size_dependent(rng, tracts: int, seed: int) -> StressState:
    """Outcomes that depend on tract size: demo-like sizes and Gaussian errors (sd 0.15), the
    intercept raised by SIZE_EFFECT per SD of log n (about ±0.1 between the smallest and the
    largest tracts), kept so that the line stays inside [0.1, 0.9] over x in [0, 1]."""
    n = _sizes_demo_like(rng, tracts)
    x = _x_spread(rng, rng.uniform(0.2, 0.8, tracts), n)
    icpt, slope = _lines(rng, tracts)
    log_n = np.log(n)
    icpt = np.clip(icpt + SIZE_EFFECT * (log_n - log_n.mean()) / log_n.std(), 0.1,
                   0.9 - slope)
    return _gaussian_state("size_dependent", rng, n, x, 0.15,
                           {"intercept": f"+{SIZE_EFFECT} per SD of log n"}, (icpt, slope))


_GENERATORS = {"demo": demo, "heteroskedastic": heteroskedastic, "skewed": skewed,
               "censored": censored, "outliers": outliers, "narrow_x": narrow_x, "small": small,
               "large": large, "tied_x": tied_x, "size_dependent": size_dependent}


def scenario_state(name: str, tracts: int, seed: int) -> StressState:
    """Scenario ``name`` with ``tracts`` tracts, drawn from ``seed`` (its own stream), with its
    expected outcome per tract (``truth``, from a stream of its own) and census reading."""
    if name not in _GENERATORS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    if tracts < 5:
        raise ValueError(f"need tracts >= 5, got {tracts}")
    rng = np.random.default_rng([seed, SCENARIOS.index(name)])
    state = _GENERATORS[name](rng, tracts, seed)
    expected = population_line(state.batch, state.law, np.random.default_rng(
        [seed, SCENARIOS.index(name), _POPULATION_STREAM]))
    return StressState(name, state.batch, expected,
                       {**state.params, "seed": seed, "tracts": tracts,
                        "population_draws": POPULATION_DRAWS}, state.census, state.law)
