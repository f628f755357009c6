"""Estimators: the registry, both calls, and output distributions against theory."""

import math

import numpy as np
import pytest
from scipy import stats

import mechanisms as M
from mechanisms.batch import TractBatch, ols, sufficient_stats
from mechanisms.median import GRID_POINTS, Segments, exp_median, smooth_sensitivity
from mechanisms.noise import SeededRandomness, laplace_scale
from mechanisms.pairs import all_pairs, k_matchings

from tests.support.inputs import line_tract

NAMES = ["OLS", "TheilSen", "NoisyStats", "NoisyIntercept", "DPExpTheilSen",
         "DPExpTheilSenMatch", "DPExpTheilSenkMatch", "DPWideTheilSen", "DPSSTheilSen",
         "DPGDPure", "DPGDApprox", "DPGDzCDP", "MOS", "BinAgg", "FreeLunchSSP", "DDSSP", "AdaSSP",
         "ModulatedLR"]


def test_registry_has_exactly_the_names():
    assert sorted(M.ESTIMATORS) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_both_calls_agree(name):
    x, y = line_tract(40, seed=1)
    one = M.estimate(name, x, y, 2.0, seed=7)
    batch = M.estimate_batch(name, TractBatch.single(x, y), 2.0, seed=7)
    assert one.failed == bool(batch.failed[0])
    if not one.failed:
        assert one.p25 == pytest.approx(batch.p25[0]) and one.p75 == pytest.approx(batch.p75[0])
    assert one.guarantee == batch.guarantee


@pytest.mark.parametrize("name", NAMES)
def test_batch_shapes_and_small_tracts_fail(name):
    rng = np.random.default_rng(3)
    sizes = [1, 30, 55, 2, 80]
    labels = np.repeat(np.arange(len(sizes)), sizes)
    x = np.round(rng.uniform(size=labels.size), 2)
    y = np.clip(0.2 + 0.5 * x + rng.normal(0, 0.1, labels.size), 0, 1)
    res = M.estimate_batch(name, TractBatch.from_labels(labels, x, y), 1.0, seed=1, reps=3)
    assert res.p25.shape == (3, 5) and res.failed.shape == (3, 5)
    assert res.failed[:, 0].all() and "fewer than 2" in res.reason[0, 0]
    assert np.isnan(res.p25[res.failed]).all()  # a failure never carries a value
    assert np.isfinite(res.p25[~res.failed]).all()


def test_bad_inputs_are_refused():
    x, y = line_tract(20)
    with pytest.raises(ValueError, match="epsilon"):
        M.estimate("NoisyStats", x, y, 0.0)
    with pytest.raises(KeyError, match="unknown estimator"):
        M.estimate("Nope", x, y, 1.0)
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        M.estimate("DPWideTheilSen", x, y, 1.0, width=3)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        M.estimate("NoisyStats", x * 100, y, 1.0)
    with pytest.raises(ValueError, match="finite"):
        M.estimate("NoisyStats", np.append(x, np.nan), np.append(y, 0.5), 1.0)


# --- NoisyStats and NoisyIntercept ---------------------------------------------------------


def test_noisystats_failure_rate_matches_laplace_tail():
    # A tract with small n·var(x): P(fail) = P(nvar + Lap(b) <= 0) = exp(-nvar/b)/2.
    x = np.array([0.40, 0.45, 0.50, 0.50, 0.55, 0.60, 0.5, 0.52])
    y = np.linspace(0.2, 0.8, x.size)
    eps, reps = 1.0, 40000
    st = sufficient_stats(TractBatch.single(x, y))
    b = laplace_scale(1 - 1 / x.size, eps / 3)
    p = 0.5 * math.exp(-st.nvar[0] / b)
    res = M.estimate_batch("NoisyStats", TractBatch.single(x, y), eps, seed=11, reps=reps)
    rate = res.failed[:, 0].mean()
    assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / reps), (rate, p)
    assert (res.reason[res.failed] == "noisy nvar <= 0").all()
    # the noisy statistics are Laplace around the true ones with the stated scale
    ncov = res.extras["noisy_ncov"][:, 0]
    assert np.mean(ncov) == pytest.approx(st.ncov[0], abs=5 * math.sqrt(2 / reps) * b)
    assert np.var(ncov) == pytest.approx(2 * b * b, rel=0.04)


def test_noisy_intercept_distribution():
    x, y = line_tract(50, seed=4)
    eps, reps = 0.5, 40000
    res = M.estimate_batch("NoisyIntercept", TractBatch.single(x, y), eps, seed=2, reps=reps)
    b = laplace_scale(1 / 50, eps)
    out = res.p25[:, 0]
    assert np.array_equal(out, res.p75[:, 0])
    assert np.mean(out) == pytest.approx(np.mean(y), abs=5 * math.sqrt(2 / reps) * b)
    assert stats.kstest((out - np.mean(y)) / b, "laplace").pvalue > 1e-3


# --- pairs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 7, 10, 31])
def test_pairs_counts_and_k_bound(rand, n):
    b = TractBatch.single(*line_tract(n))
    ap = all_pairs(b)
    assert ap.i.size == n * (n - 1) // 2
    assert len({(min(i, j), max(i, j)) for i, j in zip(ap.i, ap.j)}) == ap.i.size
    for k in (1, 3, 50):
        km = k_matchings(b, k, rand)
        deg = np.bincount(np.concatenate([km.i, km.j]), minlength=n)
        kk = min(k, n - 1 + n % 2)
        assert deg.max() <= min(k, n - 1)  # each record in at most k pairs
        assert km.i.size == kk * (n // 2) if n % 2 == 0 else km.i.size <= kk * ((n + 1) // 2)
        pairs = {(min(i, j), max(i, j)) for i, j in zip(km.i, km.j)}
        assert len(pairs) == km.i.size  # matchings are distinct: no pair twice
        assert all(i != j for i, j in pairs)


def test_all_pairs_are_each_tracts_triu_pairs_in_tract_order():
    # Tracts of sizes 0..9 (and repeats, so several tracts share a size group) in shuffled
    # order: the pairs must come tract by tract, each tract's in triu order, as a per-tract
    # loop would give them.
    rng = np.random.default_rng(4)
    sizes = rng.permutation(np.repeat(np.arange(10), 3))
    labels = np.repeat(np.arange(sizes.size), sizes)
    b = TractBatch.from_labels(labels, rng.uniform(0, 1, labels.size),
                               rng.uniform(0, 1, labels.size))
    ref_t, ref_i, ref_j = [], [], []
    for t in range(b.n_tracts):
        a, c = np.triu_indices(int(b.n[t]), 1)
        ref_t += [t] * a.size
        ref_i += list(b.starts[t] + a)
        ref_j += list(b.starts[t] + c)
    ap = all_pairs(b)
    assert ap.tract.dtype == np.int32 and ap.i.dtype == np.int64
    assert np.array_equal(ap.tract, ref_t)
    assert np.array_equal(ap.i, ref_i) and np.array_equal(ap.j, ref_j)
    assert np.array_equal(ap.k, np.maximum(b.n - 1, 1))


def test_predictions_at_two_points_equal_one_point_at_a_time():
    from mechanisms.pairs import theil_sen_points, theil_sen_predictions
    rng = np.random.default_rng(5)
    labels = np.repeat(np.arange(40), rng.integers(1, 30, 40))
    x = np.round(rng.uniform(0, 1, labels.size), 2)  # ties: pairs with equal x are dropped
    b = TractBatch.from_labels(labels, x, rng.uniform(0, 1, labels.size))
    ap = all_pairs(b)
    tract, (z25, z75) = theil_sen_predictions(b, ap, (0.25, 0.75), -0.5, 1.5)
    for x_star, z in ((0.25, z25), (0.75, z75)):
        t1, z1 = theil_sen_points(b, ap, x_star, -0.5, 1.5)
        assert np.array_equal(t1, tract) and np.array_equal(z1, z)  # bit for bit
    keep = b.x[ap.i] != b.x[ap.j]
    assert tract.size == keep.sum() < ap.i.size
    xi, xj, yi, yj = b.x[ap.i][keep], b.x[ap.j][keep], b.y[ap.i][keep], b.y[ap.j][keep]
    by_hand = yi + (yj - yi) / (xj - xi) * (0.25 - xi)
    assert np.allclose(z25, np.clip(by_hand, -0.5, 1.5), rtol=0, atol=1e-12)


def test_round_robin_rounds_are_rows_of_the_full_table():
    # k matchings build only their chosen rounds (O(k·n) memory): the same pairs as
    # indexing the full (n−1)-round table.
    from mechanisms.pairs import _round_robin
    rng = np.random.default_rng(0)
    for n_even in (2, 4, 10, 32):
        table = _round_robin(n_even)
        assert table.shape == (n_even - 1, n_even // 2, 2)
        for r in range(n_even - 1):  # each round is a perfect matching
            assert sorted(table[r].ravel()) == list(range(n_even))
        pick = rng.integers(0, n_even - 1, (3, min(4, n_even - 1)))
        assert np.array_equal(_round_robin(n_even, pick), table[pick])


def test_all_matchings_give_all_pairs(rand):
    b = TractBatch.single(*line_tract(12))
    km = k_matchings(b, 11, rand)
    assert {(min(i, j), max(i, j)) for i, j in zip(km.i, km.j)} == \
        {(min(i, j), max(i, j)) for i, j in zip(all_pairs(b).i, all_pairs(b).j)}


# --- exponential-mechanism medians: exact output probabilities ------------------------------


def grid_probabilities(z, eps, k, lo, hi, theta=0.0):
    """Brute force over the whole output grid: P(point r) ∝ exp(eps·u(r)/(2k)) with
    u(r) = −|min(A, h) + max(B − h, 0) − m/2|, A = #{z < r+θ}, B = #{z < r−θ}, h = ⌊m/2⌋
    (θ = 0: u(r) = −|#{z < r} − m/2|)."""
    z = np.sort(np.asarray(z, float))
    m, h = z.size, z.size // 2
    r = lo + np.arange(GRID_POINTS + 1) * (hi - lo) / GRID_POINTS
    a = np.searchsorted(z, r + theta, side="left")
    b = np.searchsorted(z, r - theta, side="left")
    u = -np.abs(np.minimum(a, h) + np.maximum(b - h, 0) - m / 2)
    w = np.exp(eps * (u - u.max()) / (2 * k))
    return r, w / w.sum()


@pytest.mark.parametrize("theta", [0.0, 0.05])
def test_exp_median_matches_exact_probabilities(theta):
    z = np.array([0.1, 0.2, 0.2, 0.45, 0.7])
    eps, k, lo, hi = 3.0, 1, 0.0, 1.0
    seg = Segments(z, np.array([0, z.size]))
    out = exp_median(seg, eps, k, lo, hi, SeededRandomness(99), reps=100000, widen=theta)[:, 0]
    r, p = grid_probabilities(z, eps, k, lo, hi, theta)
    edges = np.array([lo, 0.1, 0.15, 0.2, 0.3, 0.4, 0.45, 0.5, 0.7, hi + 1e-9])
    cell = np.searchsorted(edges, r, side="right") - 1
    expected = np.bincount(cell, weights=p, minlength=edges.size - 1)
    observed = np.bincount(np.searchsorted(edges, out, side="right") - 1,
                           minlength=edges.size - 1)
    keep = expected > 0
    assert stats.chisquare(observed[keep], expected[keep] * out.size).pvalue > 1e-3
    assert np.all(observed[~keep] == 0)


def test_widening_adds_mass_near_the_median():
    # Rounded ranks make ties: 21 equal predictions at the median. The plain exponential
    # mechanism gives the tie point no mass (zero-length intervals); the widened one gives
    # every point within θ of it the top utility.
    z = np.concatenate([np.full(21, 0.4), np.linspace(0.1, 0.3, 10), np.linspace(0.5, 0.7, 10)])
    seg = Segments(np.sort(z), np.array([0, z.size]))
    med, theta, eps, reps = 0.4, 0.01, 2.0, 40000
    plain = exp_median(seg, eps, 1, -0.5, 1.5, SeededRandomness(1), reps=reps)[:, 0]
    wide = exp_median(seg, eps, 1, -0.5, 1.5, SeededRandomness(2), reps=reps, widen=theta)[:, 0]
    near = {}
    for name, out, th in (("plain", plain, 0.0), ("wide", wide, theta)):
        r, p = grid_probabilities(z, eps, 1, -0.5, 1.5, th)
        exact = p[np.abs(r - med) <= theta].sum()
        near[name] = np.mean(np.abs(out - med) <= theta)
        tol = 4 * math.sqrt(max(exact * (1 - exact), 1e-6) / reps) + 1e-4
        assert near[name] == pytest.approx(exact, abs=tol), name
    assert near["wide"] > near["plain"] + 0.5


def test_exp_outputs_lie_on_the_grid():
    x, y = line_tract(30, seed=5)
    res = M.estimate_batch("DPExpTheilSen", TractBatch.single(x, y), 1.0, seed=3, reps=200)
    idx = (res.p25 + 0.5) / (2.0 / GRID_POINTS)
    assert np.allclose(idx, np.round(idx), atol=1e-6)


# --- smooth sensitivity ----------------------------------------------------------------------


def smooth_sensitivity_brute(z, k, beta, lo, hi):
    zb = np.concatenate([[lo], np.sort(z), [hi]])
    top, c, best = zb.size - 1, zb.size // 2, 0.0
    for l in range(0, zb.size + 2):
        w = (l + 1) * k
        for t in range(0, w + 1):
            d = zb[min(c + t, top)] - zb[max(c + t - w, 0)]
            best = max(best, math.exp(-beta * l) * d)
    return best


@pytest.mark.parametrize("k,beta", [(1, 0.1), (3, 0.05), (2, 1.0)])
def test_smooth_sensitivity_matches_brute_force(k, beta):
    rng = np.random.default_rng(k)
    for m in (0, 1, 6, 15):
        z = np.sort(rng.uniform(-0.2, 1.2, m))
        seg = Segments(z, np.array([0, m]))
        got = smooth_sensitivity(seg, k, beta, -0.5, 1.5)[0]
        assert got == pytest.approx(smooth_sensitivity_brute(z, k, beta, -0.5, 1.5))


def test_ss_noise_is_student_t_scaled_by_smooth_sensitivity():
    from mechanisms.theil_sen import DPSSTheilSen
    x, y = line_tract(12, seed=8)
    b = TractBatch.single(x, y)
    eps = 4.0
    res = M.estimate_batch("DPSSTheilSen", b, eps, seed=5, reps=20000)
    ap = all_pairs(b)
    from mechanisms.pairs import theil_sen_points
    tract, z = theil_sen_points(b, ap, 0.25, -0.5, 1.5)
    seg = Segments(np.sort(z), np.array([0, z.size]))
    beta, s = DPSSTheilSen.noise_parameters(eps / 2, 3, 0.5)
    sens = smooth_sensitivity(seg, ap.k, beta, -0.5, 1.5)[0]
    centre = np.sort(z)[z.size // 2]
    scaled = (res.p25[:, 0] - centre) / (sens / s)
    assert stats.kstest(scaled, stats.t(3).cdf).pvalue > 1e-3


# --- MOS, DPGD -------------------------------------------------------------------------------


def test_mos_eligibility_rule():
    rng = np.random.default_rng(0)
    xs = [rng.uniform(0, 1, 60), rng.uniform(0, 1, 15), rng.uniform(0.9, 1.0, 40),
          rng.uniform(0, 1, 50)]
    labels = np.concatenate([np.full(len(v), i) for i, v in enumerate(xs)])
    x = np.round(np.concatenate(xs), 2)
    y = np.clip(0.3 + 0.3 * x + rng.normal(0, 0.1, x.size), 0, 1)
    res = M.estimate_batch("MOS", TractBatch.from_labels(labels, x, y), 1.0, seed=1)
    # tract 1 has n < 20; tract 2 has no parent ranks below the state median
    assert list(res.failed) == [False, True, True, False]
    assert "not eligible" in res.reason[1] and "not eligible" in res.reason[2]


def test_dpgd_error_shrinks_with_epsilon():
    x, y = line_tract(200, seed=9, noise=0.1)
    b = TractBatch.single(x, y)
    fit = ols(sufficient_stats(b))
    for name in ("DPGDPure", "DPGDzCDP", "DPGDApprox"):
        errs = [np.median(np.abs(M.estimate_batch(name, b, e, seed=4, reps=200).p25[:, 0]
                                 - fit.p25[0])) for e in (0.2, 20.0)]
        assert errs[1] < errs[0] / 2, (name, errs)
        assert errs[1] < 0.05
