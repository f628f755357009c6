"""BinAgg (mechanisms/binagg.py): noise against its calibration, Corollary 3.1, the CLT
interval's coverage, the derived guarantee, and an empirical audit that catches half the noise."""

import math

import numpy as np
import pytest
from scipy import stats

import mechanisms as M
from mechanisms import binagg
from mechanisms.batch import X_HIGH, X_LOW, TractBatch
from mechanisms.binagg import (COUNTS, PRIVTREE, SUMS_X, SUMS_Y, Bins, PrivTreeLaplace,
                               _SortedRecords, binagg_synthetic, release_bin_stats)
from mechanisms.noise import SeededRandomness, laplace_scale
from mechanisms.privacy import ZCDP, PureDP, to_approx, to_zcdp
from mechanisms.privacy_maps import compose

from audit import _choose_event, budget_scaled, clopper_pearson
from conftest import line_tract

EPSILONS = (0.01, 0.1, 1.0, 2.5, 8.0, 50.0)
LOOSE = 1e-3


def _linear_tracts(n_tracts, n, seed, a=0.3, b=0.4, half_width=0.2):
    """Tracts with y = a + b·x + U(−w, w): E[y | x] exactly linear, y inside [0, 1]."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(n_tracts), n)
    x = rng.uniform(0, 1, labels.size)
    y = a + b * x + rng.uniform(-half_width, half_width, labels.size)
    return TractBatch.from_labels(labels, x, y)


def _fixed_bins(batch, edges, reps, depth=10):
    """The same bins (``edges`` on the 2^-depth grid) for every tract and rep."""
    codes = np.rint(np.asarray(edges) * (1 << depth)).astype(np.int64)
    k = codes.size - 1
    rep = np.repeat(np.arange(reps), batch.n_tracts * k)
    tract = np.tile(np.repeat(np.arange(batch.n_tracts), k), reps)
    lo = np.tile(codes[:-1], reps * batch.n_tracts)
    hi = np.tile(codes[1:], reps * batch.n_tracts)
    return Bins(rep, tract, lo, hi, depth)


def _steps(eps, **hp):
    return {s.name: s for s in M.get("BinAgg").noise_steps(eps, **hp)}


# --- 1. the released bin statistics have the calibrated discrete-Gaussian variance ----------


def _variance_p_value(residuals, variance):
    """Two-sided p-value of (n − 1)s²/σ² ~ χ²(n − 1), with the mean known to be 0 (n s²)."""
    n = residuals.size
    stat = float(np.sum(residuals**2) / variance)
    cdf = stats.chi2.cdf(stat, n)
    return 2 * min(cdf, 1 - cdf)


def test_bin_statistics_noise_has_the_calibrated_variance():
    x, y = line_tract(300, seed=5)
    batch = TractBatch.single(x, y)
    edges = [0.0, 0.25, 0.5, 0.75, 1.0]
    reps, eps = 4000, 1.5
    steps = _steps(eps)
    records = _SortedRecords(batch, 10)
    bins = _fixed_bins(batch, edges, reps)
    out = release_bin_stats(batch, records, bins, steps, SeededRandomness(11), reps, 1)
    assert out.rep.size == reps * 4  # every bin kept (counts ~75, noise sd < 1)
    lo = np.repeat(np.asarray(edges[:-1])[None, :], reps, 0).ravel()
    inside = [(x >= a) & ((x < b) | (b == 1.0)) for a, b in zip(edges[:-1], edges[1:])]
    true_c = np.tile([m.sum() for m in inside], reps)
    true_x = np.tile([x[m].sum() for m in inside], reps)
    true_y = np.tile([y[m].sum() for m in inside], reps)
    assert np.allclose(out.lo, lo)
    for name, noisy, truth, sens in ((COUNTS, out.noisy_count, true_c, np.ones(lo.size)),
                                     (SUMS_X, out.sum_x, true_x, out.hi),
                                     (SUMS_Y, out.sum_y, true_y, np.ones(lo.size))):
        g = steps[name].noise
        for k in range(4):
            sel = slice(k, None, 4)
            var = (sens[sel][0] / g.grid_steps) ** 2 * g.sigma2
            resid = noisy[sel] - truth[sel]
            # rounding to the grid moves the centre by at most half a unit, ≪ the noise sd
            unit = sens[sel][0] / g.grid_steps
            assert abs(resid.mean()) < 4 * math.sqrt(var / resid.size) + unit
            assert _variance_p_value(resid, var) > 1e-3, (name, k, resid.var() / var)
    # the variance the estimator corrects with is that same calibrated variance
    assert np.allclose(out.var_x, (out.hi / steps[SUMS_X].noise.grid_steps) ** 2
                       * steps[SUMS_X].noise.sigma2)


def test_variance_test_can_fail():
    # The same test on noise of 1.1× the sd is refused: the check above has power.
    rng = np.random.default_rng(0)
    assert _variance_p_value(rng.normal(0, 1.1, 16000), 1.0) < 1e-3


# --- 2. Corollary 3.1: the aggregated model on the synthetic rows is the estimate -----------


def _estimate_from_synthetic(df, eps):
    """Alg. 2 recomputed from the synthetic rows alone (independent of the module's code)."""
    g = _steps(eps)[SUMS_X].noise
    out = {}
    for tract, rows in df.groupby("tract"):
        per_bin = rows.groupby("bin").agg(c=("x", "size"), s=("x", "sum"), t=("y", "sum"),
                                          hi=("bin_hi", "first"))
        c, s, t = per_bin["c"].to_numpy(float), per_bin["s"].to_numpy(), per_bin["t"].to_numpy()
        var = (per_bin["hi"].to_numpy() / g.grid_steps) ** 2 * g.sigma2
        z = np.stack([c, s], axis=1)
        w = 1.0 / c
        a = (z * w[:, None]).T @ z - np.diag([0.0, np.sum(w * var)])
        beta = np.linalg.solve(a, (z * w[:, None]).T @ t)
        out[tract] = (beta[0] + beta[1] * X_LOW, beta[0] + beta[1] * X_HIGH)
    return out


def test_synthetic_rows_reproduce_the_estimate():
    batch = _linear_tracts(6, 400, seed=3)
    eps = 4.0
    est, df = binagg_synthetic(batch, eps, SeededRandomness(5))
    assert list(df.columns) == ["tract", "bin", "bin_lo", "bin_hi", "x", "y"]
    assert not est.failed.any()
    sizes = df.groupby(["tract", "bin"]).size()  # c̃_k rows per kept bin, c̃_k >= 2
    assert sizes.size == int(est.extras["bins"].sum()) and sizes.min() >= 2
    again = _estimate_from_synthetic(df, eps)
    for i, label in enumerate(batch.labels):
        p25, p75 = again[label]
        assert p25 == pytest.approx(est.p25[0, i], abs=1e-9)
        assert p75 == pytest.approx(est.p75[0, i], abs=1e-9)
    # the rows are spread within bins (Alg. 3), not collapsed on the bin means
    assert df.groupby(["tract", "bin"])["x"].std().median() > 0


def test_synthetic_spread_has_algorithm_3s_variance():
    # Given the released sums, a row deviates from the bin mean by (ξ − ξ̄)/c̃ with
    # Var ξ = c̃·Var ξ_s: the within-bin sample variance of x is Var ξ_s / c̃ on average.
    batch = _linear_tracts(1, 3000, seed=8)
    eps = 1.0
    _, df = binagg_synthetic(batch, eps, SeededRandomness(9))
    g = _steps(eps)[SUMS_X].noise
    per_bin = df.groupby("bin").agg(v=("x", "var"), c=("x", "size"), hi=("bin_hi", "first"))
    expected = (per_bin["hi"] / g.grid_steps) ** 2 * g.sigma2 / per_bin["c"]
    ratio = float(np.mean(per_bin["v"] / expected))
    assert 0.8 < ratio < 1.25, ratio


# --- 3. the CLT interval's coverage (Thm 4.2) -------------------------------------------------


def _coverage(n, tracts, eps, seed):
    a, b = 0.3, 0.4
    batch = _linear_tracts(tracts, n, seed)
    res = M.estimate_batch("BinAgg", batch, eps, seed=seed + 1)
    ok = ~res.failed
    cover = {}
    for name, xs in (("p25", X_LOW), ("p75", X_HIGH)):
        truth = a + b * xs
        lo, hi = res.extras[f"{name}_lo"][ok], res.extras[f"{name}_hi"][ok]
        cover[name] = float(np.mean((lo <= truth) & (truth <= hi)))
    return cover, float(ok.mean()), float(np.median(res.extras["bins"]))


def test_interval_covers_at_large_n():
    cover, ok, bins = _coverage(2000, 200, 8.0, seed=21)
    assert ok == 1.0
    tol = 3.5 * math.sqrt(0.95 * 0.05 / 200)  # binomial error of 200 tracts, 3.5 sd
    print(f"\ncoverage n=2000 eps=8: {cover}, median bins {bins}")
    for name, c in cover.items():
        assert abs(c - 0.95) <= tol, (name, c)


def test_interval_coverage_at_n_70_is_reported():
    # Thm 4.2 is asymptotic in the number of bins; at n = 70 there are few bins. Measured and
    # printed (run with -s), asserted only to be a real number well above chance.
    cover, ok, bins = _coverage(70, 1000, 8.0, seed=31)
    print(f"\ncoverage n=70 eps=8: {cover}, {ok:.3f} of tracts estimated, median bins {bins}")
    assert ok > 0.5
    for c in cover.values():
        assert 0.5 < c <= 1.0


# --- 4. the guarantee is derived from the noise, and fits the budget --------------------------


def test_guarantee_is_the_composition_of_the_steps_and_fits_the_budget():
    est = M.get("BinAgg")
    for eps in EPSILONS:
        for hp in ({}, {"w_bin": 2.0}, {"w_bin": 1.0, "w_count": 1.0, "w_sum_x": 1.0,
                                         "w_sum_y": 1.0}):
            g = est.guarantee(eps, **hp)
            steps = est.noise_steps(eps, **hp)
            assert isinstance(g, ZCDP) and g == compose(steps)
            assert g.rho <= eps**2 / 2 and g.rho >= eps**2 / 2 * (1 - LOOSE), (eps, hp, g)
            assert [s.name for s in steps] == [PRIVTREE, COUNTS, SUMS_X, SUMS_Y]
            assert isinstance(steps[0].guarantee, PureDP)
            assert [s.repeat for s in steps] == [1, 2, 2, 2]


def test_guarantee_follows_the_split():
    est = M.get("BinAgg")
    parts = {}
    for w_bin in (1.0, 2.0, 4.0):
        steps = est.noise_steps(1.0, w_bin=w_bin)
        parts[w_bin] = to_zcdp(steps[0].guarantee).rho
        # the PrivTree share is w_bin²/(w_bin² + 27) of ρ = 1/2 (within the 0.1% calibration)
        assert parts[w_bin] == pytest.approx(0.5 * w_bin**2 / (w_bin**2 + 27), rel=LOOSE)
    assert parts[1.0] < parts[2.0] < parts[4.0]
    assert est.noise_steps(1.0, w_bin=2.0)[0].noise.scale < est.noise_steps(1.0)[0].noise.scale


def test_guarantee_follows_a_stale_calibration(monkeypatch):
    # If the PrivTree noise were calibrated for another share (the bug class of issue 7), the
    # guarantee is what that noise gives, not the budget: it is computed, not declared.
    fixed = PrivTreeLaplace.calibrate(0.5)
    monkeypatch.setattr(binagg.PrivTreeLaplace, "calibrate", staticmethod(lambda eps: fixed))
    g = M.get("BinAgg").guarantee(1.0)
    assert g.rho > 0.5  # over budget, and reported


def test_privtree_map_by_hand():
    cal = PrivTreeLaplace.calibrate(0.4)
    t, n = cal.scale, cal.grid_steps
    assert cal.bias == math.ceil(t * math.log(2))
    # The sampler draws the scale the map uses (laplace_mechanism, sensitivity 1 record).
    assert laplace_scale(1.0, cal.argument, 1) * n == pytest.approx(t, rel=1e-12)
    eps = cal.guarantee().epsilon
    assert eps <= 0.4 and eps >= 0.4 * (1 - LOOSE)
    # Band j = 0 alone is the removal direction, N/t; the sum stays below the corollary
    # 2·3/λ (λ = t/N) here, and above N/t doubled.
    assert 2 * n / t < eps < cal.corollary_epsilon()
    # Independent evaluation of the band sum with exact survival probabilities.
    p = math.exp(-1 / t)

    def surv(m):
        return p ** (m + 1) / (1 + p) if m >= 0 else 1 - p ** (-m) / (1 + p)

    total = sum(math.log(surv(cal.bias - 1 - j * cal.bias))
                - math.log(surv(cal.bias - 1 - j * cal.bias + n)) for j in range(400))
    assert eps == pytest.approx(2 * total, rel=1e-9)
    with pytest.raises(ValueError, match="not what the sampler draws"):
        PrivTreeLaplace(n, cal.scale_num - 1, cal.scale_den, cal.bias, 2, cal.argument)
    d = M.get("BinAgg").noise_steps(1.0)[0].as_dict()
    assert d["mechanism"] == "privtree-grid-laplace" and "2 * sum" in d["formula"]


def test_runs_draw_exactly_their_noise_steps(monkeypatch):
    calls = []
    for attr in ("laplace_mechanism", "gaussian_mechanism"):
        original = getattr(binagg, attr)

        def wrapped(rand, values, sens, budget, _original=original, _attr=attr):
            calls.append((_attr, float(budget), np.shape(values)[-1]))
            return _original(rand, values, sens, budget)

        monkeypatch.setattr(binagg, attr, wrapped)
    eps = 3.0
    steps = M.get("BinAgg").noise_steps(eps)
    x, y = line_tract(200, seed=2)
    M.estimate_batch("BinAgg", TractBatch.single(x, y), eps, seed=1)
    lap = [c for c in calls if c[0] == "laplace_mechanism"]
    gau = [c for c in calls if c[0] == "gaussian_mechanism"]
    assert lap and all(c[1:] == (steps[0].noise.argument, 1) for c in lap)
    assert gau == [("gaussian_mechanism", s.noise.argument, 1) for s in steps[1:]]


def test_meter_is_spent_before_each_draw_and_refuses_an_overrun():
    est = M.get("BinAgg")
    eps = 2.0
    x, y = line_tract(100, seed=1)
    batch = TractBatch.single(x, y)
    g = est.guarantee(eps)
    f = M.PrivacyFilter({"binagg": g}, batch.labels)
    M.estimate_batch("BinAgg", batch, eps, seed=1, meter=f.meter("binagg"))
    assert f.spent()["binagg"]["tract"].rho == pytest.approx(g.rho, rel=1e-12)
    short = M.PrivacyFilter({"binagg": ZCDP(g.rho * 0.9)}, batch.labels)
    with pytest.raises(M.BudgetOverrun):
        M.estimate_batch("BinAgg", batch, eps, seed=1, meter=short.meter("binagg"))


# --- 5. failures and bad inputs ---------------------------------------------------------------


def test_singular_design_fails_without_a_value():
    # Every x equal: one bin holds everyone, so there are too few bins for the regression.
    labels = np.repeat([0, 1], [50, 400])
    x = np.r_[np.full(50, 0.5), np.random.default_rng(1).uniform(0, 1, 400)]
    y = np.r_[np.full(50, 0.5), np.random.default_rng(2).uniform(0, 1, 400)]
    res = M.estimate_batch("BinAgg", TractBatch.from_labels(labels, x, y), 5.0, seed=3, reps=5)
    assert res.failed[:, 0].all() and np.isnan(res.p25[:, 0]).all()
    assert np.isnan(res.extras["p25_se"][:, 0]).all()
    assert set(res.reason[:, 0]) <= {"fewer than 3 bins kept", "noisy design is singular"}
    assert not res.failed[:, 1].any() and np.isfinite(res.extras["p75_hi"][:, 1]).all()


def test_bad_inputs_are_refused():
    x, y = line_tract(50)
    with pytest.raises(ValueError, match="unknown hyperparameter"):
        M.estimate("BinAgg", x, y, 1.0, mu=3)
    for hp, match in (({"w_bin": 0.0}, "w_bin must be"), ({"level": 1.0}, "level must"),
                      ({"max_depth": 0}, "max_depth must"), ({"min_count": 0}, "min_count"),
                      ({"theta": float("nan")}, "theta must")):
        with pytest.raises(ValueError, match=match):
            M.estimate("BinAgg", x, y, 1.0, **hp)
    with pytest.raises(ValueError, match="too little for the grid Gaussian"):
        M.get("BinAgg").guarantee(1e-3)
    with pytest.raises(ValueError, match="one run"):
        binagg.synthesize(binagg._release(
            TractBatch.single(x, y),
            binagg.RunBudget(1.0, None, tuple(M.get("BinAgg").noise_steps(1.0))),
            SeededRandomness(1), 2, M.get("BinAgg").hyper({}), M.NO_METER), SeededRandomness(2))


def test_exact_samplers_only_and_evaluation_only_until_reviewed():
    est = M.get("BinAgg")
    # Every draw is exact, but PrivTree's discrete-Laplace guarantee is our own derivation and
    # the release audit cannot recompute it yet: not publishable until both are reviewed.
    assert not est.publishable and "BinAgg" not in M.PUBLISHABLE
    assert "not yet reviewed" in est.not_publishable_reason
    src = open(binagg.__file__).read()
    assert "np.random" not in src and "numpy_generator" not in src


# --- 6. empirical audit: one bin's released count on neighbouring datasets -------------------

PILOT, MAIN, AUDIT_DELTA = 100_000, 300_000, 0.01
# ε such that each bin's count release is ρ_row = 1/2 (μ = 1): ρ_row = (ε²/2)(9/28)/2.
AUDIT_EPS = math.sqrt(56 / 9)
AUDIT_X = np.r_[np.full(9, 0.2), np.full(10, 0.8)]
AUDIT_DATA = [(AUDIT_X, np.full(19, 0.5)),
              (np.r_[np.full(10, 0.2), np.full(9, 0.8)], np.full(19, 0.5))]  # one moved bin


def half_gaussian_noise():
    """Broken variant: the bin statistics get 4ρ (half the noise sd)."""
    return budget_scaled(binagg, "gaussian_mechanism", 4.0)


def count_sample(i, reps, seed):
    batch = TractBatch.single(*AUDIT_DATA[i])
    records = _SortedRecords(batch, 10)
    out = release_bin_stats(batch, records, _fixed_bins(batch, [0.0, 0.5, 1.0], reps),
                            _steps(AUDIT_EPS), SeededRandomness(seed), reps, 1)
    assert out.rep.size == 2 * reps  # counts 9..10 with sd ≈ 1: always kept
    return out.noisy_count[0::2]  # bin [0, 0.5)


def epsilon_lower_bound_at_delta(sample, delta, seed=0, bins=60, alpha=1e-3):
    """tests/audit.py's bound, for (ε, δ):
    P_D(S) ≤ e^ε P_D'(S) + δ  ⇒  ε ≥ ln((P_D(S) − δ)/P_D'(S))."""
    pilot = [sample(i, PILOT, seed + 10 + i) for i in (0, 1)]
    main = [sample(i, MAIN, seed + 20 + i) for i in (0, 1)]
    edges = np.unique(np.quantile(np.concatenate(pilot), np.linspace(0, 1, bins + 1)))
    edges[0], edges[-1] = -np.inf, np.inf
    bound = 0.0
    for a_pilot, b_pilot, a, b in ((pilot[0], pilot[1], main[0], main[1]),
                                   (pilot[1], pilot[0], main[1], main[0])):
        event = _choose_event(a_pilot, b_pilot, edges)
        if event is None:
            continue

        def share(v):
            return np.isin(np.clip(np.searchsorted(edges, v, side="right") - 1, 0,
                                   edges.size - 2), event).sum()

        lo_a, _ = clopper_pearson(int(share(a)), a.size, alpha / 2)
        _, hi_b = clopper_pearson(int(share(b)), b.size, alpha / 2)
        if lo_a > delta:
            bound = max(bound, float(np.log((lo_a - delta) / hi_b)))
    return bound


def test_audit_bin_count():
    row = _steps(AUDIT_EPS)[COUNTS].guarantee
    assert row.rho == pytest.approx(0.5, rel=1e-3)
    claim = to_approx(row, AUDIT_DELTA).epsilon  # one bin's count, one record moved in
    lb = epsilon_lower_bound_at_delta(count_sample, AUDIT_DELTA)
    assert 1.0 < lb <= claim, (lb, claim)
    with half_gaussian_noise():
        assert epsilon_lower_bound_at_delta(count_sample, AUDIT_DELTA) > claim
