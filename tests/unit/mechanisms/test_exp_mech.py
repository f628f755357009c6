"""The exact exponential-mechanism median (mechanisms/median.py) and its geometric levels.

Laws are checked against brute force over the whole output grid (P(r) ∝ exp(ε·u(r)/(2k)) with
the realised ε = ⌊ε_med·2^20⌋/2^20), point by point on a coarse grid so that every point is
observed; the structure the sampler relies on (runs of grid points by level, the nearest
occupied interval) is checked exactly against brute force.
"""

import math

import numpy as np
import pytest
from scipy import stats

from mechanisms import median
from mechanisms.median import (EXP_RATE_DENOMINATOR, Segments, exp_median, exp_median_epsilon,
                               exp_median_rate)
from mechanisms.noise import Randomness, SeededRandomness, geometric

T_DEN = EXP_RATE_DENOMINATOR
U64_MAX = 2**64 - 1


@pytest.fixture
def coarse_grid(monkeypatch):
    """A 64-step output grid on which every point is observable in 200k draws."""
    monkeypatch.setattr(median, "GRID_POINTS", 64)
    return 64


class ScriptedRandomness(Randomness):
    """Hands out a fixed list of words, in order; fails if asked for more than it has."""

    name = "scripted"

    def __init__(self, words):
        self.script = [int(w) for w in words]
        self.used = 0

    def words(self, n: int) -> np.ndarray:
        assert self.used + n <= len(self.script), "the sampler asked for more words than scripted"
        out = np.array(self.script[self.used:self.used + n], dtype=np.uint64)
        self.used += n
        return out


class EveryOtherWordAllOnes(Randomness):
    """Every other word is 0xFFFF_FFFF_FFFF_FFFF, the word that made uniform01 return 1.0."""

    name = "all-ones-interleaved"

    def __init__(self, seed: int):
        self._seeded = SeededRandomness(seed)
        self._next_is_ones = True

    def words(self, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.uint64)
        first = 0 if self._next_is_ones else 1
        out[first::2] = np.uint64(U64_MAX)
        out[1 - first::2] = self._seeded.words(out[1 - first::2].size)
        self._next_is_ones = (n % 2 == 0) == self._next_is_ones
        return out


def realised_epsilon(eps_med: float) -> float:
    return exp_median_epsilon(exp_median_rate(eps_med))


def exact_law(z, eps_med, k, lo, hi, theta=0.0):
    """P(grid index i) by brute force: ∝ exp(ε·u(r_i)/(2k)) with
    u(r) = −|min(A, h) + max(B − h, 0) − m/2|, A = #{z < r+θ}, B = #{z < r−θ}, h = ⌊m/2⌋
    (θ = 0: u = −|#{z < r} − m/2|)."""
    eps = realised_epsilon(eps_med)
    z = np.sort(np.asarray(z, dtype=float))
    m, h = z.size, z.size // 2
    r = lo + np.arange(median.GRID_POINTS + 1) * (hi - lo) / median.GRID_POINTS
    a = np.searchsorted(z, r + theta, side="left")
    b = np.searchsorted(z, r - theta, side="left")
    u = -np.abs(np.minimum(a, h) + np.maximum(b - h, 0) - m / 2)
    w = np.exp(eps * (u - u.max()) / (2 * k))
    return w / w.sum()


def grid_index(out, lo, hi):
    idx = (out - lo) / ((hi - lo) / median.GRID_POINTS)
    assert np.allclose(idx, np.round(idx), atol=1e-6), "an output is not a grid point"
    return np.round(idx).astype(np.int64)


def assert_law(index, p, min_expected=30):
    """Chi-square over every grid point (p > 1e-4), and the observed support is the full one."""
    expected = p * index.size
    assert expected.min() >= min_expected, "test case too peaked to observe every point"
    observed = np.bincount(index, minlength=p.size)
    assert observed.size == p.size, "an output lies beyond the grid"
    assert np.all(observed > 0), "a grid point of positive probability never came out"
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def segments(*tracts):
    z = np.concatenate([np.sort(np.asarray(t, dtype=float)) for t in tracts]) if tracts else \
        np.zeros(0)
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in tracts])]).astype(np.int64)
    return Segments(z, offsets)


# --- the law, point by point ----------------------------------------------------------------
# Values are off the 1/64 grid (and so are z ± θ), so "z < r" has one meaning for everyone.

ODD = [0.11, 0.23, 0.23, 0.47, 0.71]
EVEN = [0.11, 0.23, 0.23, 0.29, 0.47, 0.71]


@pytest.mark.parametrize("z,eps,k", [(ODD, 3.0, 1), (EVEN, 3.0, 1), (EVEN, 0.7, 1),
                                     (ODD, 5.3, 3)])
def test_law_matches_the_exponential_mechanism(coarse_grid, z, eps, k):
    out = exp_median(segments(z), eps, k, 0.0, 1.0, SeededRandomness(11), reps=200_000)
    assert out.shape == (200_000, 1)
    assert_law(grid_index(out[:, 0], 0.0, 1.0), exact_law(z, eps, k, 0.0, 1.0))


def test_widened_law_matches(coarse_grid):
    z = [0.11, 0.23, 0.29, 0.47, 0.71]
    out = exp_median(segments(z), 3.0, 1, 0.0, 1.0, SeededRandomness(12), reps=200_000,
                     widen=0.05)
    p = exact_law(z, 3.0, 1, 0.0, 1.0, theta=0.05)
    assert_law(grid_index(out[:, 0], 0.0, 1.0), p)
    # and widening did change the law (the test can tell the two apart)
    assert np.abs(p - exact_law(z, 3.0, 1, 0.0, 1.0)).max() > 0.01


def test_many_tracts_and_rounds_keep_each_tract_law(coarse_grid, monkeypatch):
    # Per-tract ε and k, an empty tract, a tract of ties; tiny rounds so jobs are split over
    # many rounds and most need several.
    monkeypatch.setattr(median, "_MAX_TRIALS_PER_ROUND", 4096)
    monkeypatch.setattr(median, "_MAX_TRIALS_PER_JOB", 3)
    tracts = [[], ODD, EVEN, [0.61, 0.61, 0.61]]
    eps, k = np.array([0.7, 3.0, 1.3, 2.0]), np.array([1, 2, 1, 1])
    out = exp_median(segments(*tracts), eps, k, 0.0, 1.0, SeededRandomness(13), reps=120_000)
    for t, z in enumerate(tracts):
        assert_law(grid_index(out[:, t], 0.0, 1.0), exact_law(z, eps[t], k[t], 0.0, 1.0))


def test_non_unit_bounds_and_rate_rounding(coarse_grid):
    # ε_med = 0.3 is not a multiple of 2^-20: the law is the one at ⌊0.3·2^20⌋/2^20.
    lo, hi = -0.5, 1.5
    z = [-0.33, 0.17, 0.41, 0.93, 1.21]
    out = exp_median(segments(z), 0.3, 1, lo, hi, SeededRandomness(14), reps=200_000)
    assert_law(grid_index(out[:, 0], lo, hi), exact_law(z, 0.3, 1, lo, hi))


# --- the structure the sampler relies on, exactly --------------------------------------------


def brute_distances(breakpoints, lo, hi):
    """D(r) = |2·#{b < r} − m| for every grid point r (breakpoints already widened)."""
    r = lo + np.arange(median.GRID_POINTS + 1) * (hi - lo) / median.GRID_POINTS
    below = np.searchsorted(np.sort(breakpoints), r, side="left")
    return np.abs(2 * below - len(breakpoints))


@pytest.mark.parametrize("theta", [0.0, 3 / 128])
def test_level_runs_and_nearest_occupied_interval_match_brute_force(coarse_grid, theta):
    # Values on a 1/128 grid over [0, 1]: on grid points, between them, at lo and hi, tied.
    rng = np.random.default_rng(5)
    tracts = [rng.integers(0, 129, rng.integers(0, 14)) / 128 for _ in range(60)]
    tracts += [[1.0, 1.0, 1.0], [0.0] * 4, [0.5] * 7, []]
    seg = segments(*tracts)
    bp = median._Breakpoints(seg, 0.0, 1.0, theta)
    d_min = bp.nearest_occupied_distance()
    for t, z in enumerate(tracts):
        z = np.sort(np.asarray(z, dtype=float))
        h = z.size // 2
        b = np.clip(np.r_[z[:h] - theta, z[h:] + theta], 0.0, 1.0)
        dist = brute_distances(b, 0.0, 1.0)
        assert d_min[t] == dist.min()
        levels = np.arange(0, z.size + 3)
        start, size = bp.level_range(np.full(levels.size, t), levels)
        for g, s0, n in zip(levels, start, size):
            inside = np.nonzero(dist <= g)[0]
            assert n == inside.size
            if n:
                assert np.array_equal(inside, np.arange(s0, s0 + n)), "run not contiguous"


# --- intervals far lighter than 2^-60 of the total ------------------------------------------

LIGHT_Z = np.linspace(0.0005, 0.9995, 2001)  # m = 2001, about 500 grid points per interval
LIGHT_EPS = 0.125  # with k = 1: ρ = exp(−1/32) per unit of D


def geometric_words(v: int) -> list[int]:
    """Words that make geometric() return ⌊t·v/s⌋: U = 0 (kept: Bernoulli(0/t) fails at once),
    then v Bernoulli(e^-1) successes (K = 2 → 3, then stops) and one failure (K stops at 2)."""
    return [0, 0] + [0, 1] * v + [1]


def test_scripted_words_give_any_geometric_level():
    t, s = 4 * T_DEN, T_DEN // 8
    rand = ScriptedRandomness(geometric_words(17))
    assert geometric(rand, [t], [s])[0] == 17 * t // s
    assert rand.used == len(rand.script)


def test_intervals_lighter_than_2_to_minus_60_have_positive_probability():
    m, k = LIGHT_Z.size, 1
    seg = segments(LIGHT_Z)
    bp = median._Breakpoints(seg, 0.0, 1.0, 0.0)
    n_grid = median.GRID_POINTS + 1
    d_min = int(bp.nearest_occupied_distance()[0])
    assert d_min == 1  # m odd: the two middle intervals
    # The end intervals (j = 0 and j = m, D = m) weigh ρ^(m−1) ≈ e^-62.5 relative to a middle
    # one of the same size: below 2^-60 of the total (float64 inversion gives them 0 or 2^-52).
    counts = np.diff(np.r_[0, bp.cutoff(np.zeros(m + 1, np.int64), np.arange(1, m + 2))])
    dist = np.abs(2 * np.arange(m + 1) - m)
    logw = np.log(counts) - realised_epsilon(LIGHT_EPS) * dist / (4 * k)
    rel = np.exp(logw - logw.max() - np.log(np.exp(logw - logw.max()).sum()))
    assert rel[0] < 2.0**-60 and rel[-1] < 2.0**-60 and counts[0] > 0 and counts[-1] > 0
    # Level m − 1 excludes them, level m takes in the whole grid.
    start, size = bp.level_range(np.zeros(2, np.int64), np.array([m - 1, m]))
    assert (start[1], size[1]) == (0, n_grid)
    assert start[0] == counts[0] and size[0] == n_grid - counts[0] - counts[-1]
    # Words that reach level m exist: G = ⌊t·V/s⌋ with t = 4k·2^20, s = rate.
    t, s = 4 * k * T_DEN, exp_median_rate(LIGHT_EPS)
    v = -(-(m - d_min) * s // t)
    g = geometric(ScriptedRandomness(geometric_words(v)), [t], [s])[0]
    assert g + d_min >= m
    # ... and with it, a trial whose uniform word is the last grid index outputs hi, a point of
    # interval m; the word 0 outputs lo, in interval 0.
    for word, expect in ((n_grid - 1, n_grid - 1), (0, 0)):
        ok, idx = median._trials(bp, np.zeros(1, np.int64), np.array([g + d_min]),
                                 ScriptedRandomness([word]))
        assert ok[0] and idx[0] == expect


def test_light_tract_law_on_the_heavy_part():
    m, k, reps = LIGHT_Z.size, 1, 20_000
    out = exp_median(segments(LIGHT_Z), LIGHT_EPS, k, 0.0, 1.0, SeededRandomness(15), reps=reps)
    p = exact_law(LIGHT_Z, LIGHT_EPS, k, 0.0, 1.0)
    r = np.arange(median.GRID_POINTS + 1) / median.GRID_POINTS
    interval = np.searchsorted(LIGHT_Z, r, side="left")  # j = #{z < r}
    p_int = np.bincount(interval, weights=p, minlength=m + 1)
    got = np.bincount(np.searchsorted(LIGHT_Z, out[:, 0], side="left"), minlength=m + 1)
    heavy = p_int * reps >= 5
    obs = np.r_[got[heavy], got[~heavy].sum()]
    exp = np.r_[p_int[heavy], p_int[~heavy].sum()] * reps
    assert heavy.sum() > 40
    assert stats.chisquare(obs[exp > 0], exp[exp > 0]).pvalue > 1e-4


# --- empty intervals: values at the upper bound ---------------------------------------------

AT_HI = [0.2, 0.5, 1.0, 1.0, 1.0]  # clipped predictions: the interval above z_m is empty


def test_empty_last_interval_law_and_no_crash(coarse_grid):
    seg = segments(AT_HI)
    bp = median._Breakpoints(seg, 0.0, 1.0, 0.0)
    m = len(AT_HI)
    cuts = bp.cutoff(np.zeros(m + 2, np.int64), np.arange(m + 2))
    assert cuts[m] == cuts[m + 1] == median.GRID_POINTS + 1  # c_m = 0 (and c_3 = c_4 = 0)
    assert bp.nearest_occupied_distance()[0] == 1  # the middle intervals are empty
    out = exp_median(seg, 3.0, 1, 0.0, 1.0, SeededRandomness(16), reps=200_000)
    assert_law(grid_index(out[:, 0], 0.0, 1.0), exact_law(AT_HI, 3.0, 1, 0.0, 1.0))


def test_all_ones_words_are_rejected_not_mapped_to_the_top(coarse_grid):
    out = exp_median(segments(AT_HI), 3.0, 1, 0.0, 1.0, EveryOtherWordAllOnes(17), reps=200_000)
    assert_law(grid_index(out[:, 0], 0.0, 1.0), exact_law(AT_HI, 3.0, 1, 0.0, 1.0))


def test_clipped_tracts_on_the_full_grid_never_raise():
    # Every value at hi (or at lo): the only occupied interval has D = m; huge ε.
    tracts = [[1.5] * 40, [-0.5] * 41, [1.5] * 3 + [0.2], [1.5]]
    out = exp_median(segments(*tracts), 50.0, 1, -0.5, 1.5, SeededRandomness(18), reps=3000)
    assert np.all((out >= -0.5) & (out <= 1.5))
    # All at hi: every grid point has D = m, so the output is uniform on [lo, hi].
    assert abs(out[:, 0].mean() - 0.5) < 5 * 2 / math.sqrt(12 * 3000)


# --- the rate -------------------------------------------------------------------------------


def test_rate_rounds_epsilon_down_by_less_than_one_quantum():
    for e in np.r_[np.geomspace(1e-5, 50.0, 4001), 1.0, 0.5, 3 * 2.0**-20, 50.0]:
        got = exp_median_epsilon(exp_median_rate(e))
        assert e - 1.0 / T_DEN <= got <= e


def test_rate_round_trips_through_epsilon():
    for s in [1, 2, 3, 12345, T_DEN, 50 * T_DEN, 2**35 + 7]:
        assert exp_median_rate(exp_median_epsilon(s)) == s


@pytest.mark.parametrize("bad", [0.0, -1.0, 0.5 / T_DEN, float("nan"), float("inf"), 2.0**21])
def test_rate_refuses_bad_budgets(bad):
    with pytest.raises(ValueError):
        exp_median_rate(bad)


@pytest.mark.parametrize("kwargs", [dict(k=0), dict(k=1.5), dict(epsilon=1e-7),
                                    dict(epsilon=np.nan), dict(lo=1.0, hi=1.0),
                                    dict(widen=-0.1), dict(reps=0)])
def test_exp_median_refuses_bad_arguments(kwargs):
    args = dict(epsilon=1.0, k=1, lo=0.0, hi=1.0, reps=1, widen=0.0) | kwargs
    with pytest.raises(ValueError):
        exp_median(segments(ODD), args["epsilon"], args["k"], args["lo"], args["hi"],
                   SeededRandomness(0), reps=args["reps"], widen=args["widen"])


def test_no_tracts():
    assert exp_median(segments(), 1.0, 1, 0.0, 1.0, SeededRandomness(0), reps=3).shape == (3, 0)


# --- geometric ------------------------------------------------------------------------------


@pytest.mark.parametrize("t,s", [(10, 3), (7, 7), (4 * 5 * T_DEN, T_DEN), (2**44, 2**40)])
def test_geometric_pmf_and_mean(t, s):
    n = 200_000
    y = geometric(SeededRandomness(t % 1000 + s % 1000), np.full(n, t), s)
    rho = math.exp(-s / t)
    support = np.arange(int(math.log(1e-4) / math.log(rho)) + 1)
    pmf = (1 - rho) * rho**support
    observed = np.r_[np.bincount(y, minlength=support.size)[:support.size],
                     (y >= support.size).sum()]
    expected = np.r_[pmf, 1 - pmf.sum()] * n
    assert y.min() >= 0
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    mean, sd = rho / (1 - rho), math.sqrt(rho) / (1 - rho)
    assert abs(y.mean() - mean) < 5 * sd / math.sqrt(n)


def test_geometric_per_entry_parameters():
    n = 100_000
    t = np.r_[np.full(n, 10), np.full(n, 8 * T_DEN)]
    s = np.r_[np.full(n, 3), np.full(n, T_DEN)]
    y = geometric(SeededRandomness(3), t, s)
    for part, (tt, ss) in zip((y[:n], y[n:]), ((10, 3), (8 * T_DEN, T_DEN))):
        rho = math.exp(-ss / tt)
        mean, sd = rho / (1 - rho), math.sqrt(rho) / (1 - rho)
        assert abs(part.mean() - mean) < 5 * sd / math.sqrt(n)


@pytest.mark.parametrize("t,s", [(0, 1), (2**44 + 1, 1), (5, 0)])
def test_geometric_refuses_scales_it_cannot_sample_exactly(t, s):
    with pytest.raises(ValueError):
        geometric(SeededRandomness(0), [t], [s])
