"""Model-based tract estimates from published values alone (issue 20, item 2).

``fit_model(tracts, counties, states, boundaries)`` reads the published columns only:
per tract its GEOID, public n, status, mechanism and direct p25/p75; per county and state
their published p25/p75 (and the state's standard errors); the tract boundaries for
positions. It adds ``p25_model``, ``p25_model_lo``, ``p25_model_hi``, ``p25_model_se`` (and
the same for p75): a Fay–Herriot EBLUP (``fay_herriot``) of each quantity whose covariates are
DP or public values (docs/small-area.md):

- Gaussian-kernel means of the neighbours' directs of the quantity and of the midpoint
  (p25 + p75)/2, at two bandwidths (``BANDWIDTHS_KM``), the tract itself left out so that its
  own noise never enters its covariates. The midpoint's noise is far smaller than either
  end's (NoisyStats' slope noise cancels near x = 0.5; Theil–Sen's two draws average) and its
  truth follows p25's closely;
- the county's published p25/p75 and midpoint (when a county table is given), and the
  state's when the release has more than one state (one state's is the intercept).

Robustness. Directs are winsorised symmetrically about the state's median (the clip to
[0, 1] is one-sided: p25's median is near 0.4, so the clip at 0 bites first and biases the
mean upwards). Their bias by mechanism and size (the dp rule publishes NoisyStats where its
noisy nvar came out large, which flattens the slope) is estimated against the county
estimates (NoisyStats on thousands of people, no selection) per size bin and removed, and the
estimates of each state are benchmarked to the state's published value (n-weighted mean).

Sampling variances. At ε = 1 the published interval is [0, 1] for most tracts, so its SE
(0.255) says nothing about the tract. The variances are *generalised variance functions*
fitted to the published directs: the mean squared residual about the covariates, per
mechanism and size bin, is D_i + σ², split by the shape of D in n (docs/small-area.md,
"Which variance"). The intervals use the mechanisms' rates, τ + min(a_m/n² + c_m/n, cap_m)
(``variance_function``), which leave τ to σ²; the point estimate shrinks with a free power
law τ + a_m·n^(−b_m) (``power_law_variance_function``), whose σ̂² is smaller, and its MSE is
that estimator's own under the rate-shaped D and the larger σ̂² (``fay_herriot.mse_of_weights``).
Given the release's plan (``noise``: the ε each mechanism ran with, public), the point
estimate shrinks instead with D known from it (``known_noise``): k_m/(ε_m·n)² + c_m/n, so that
σ̂² is not split from a D fitted to the same residuals.

Heavy-tailed noise. The DP noise is Laplace-like (NoisyStats' standardised directs have excess
kurtosis 2.5–5.4 on the calibration seeds), so the point estimate is Sinha & Rao's bounded-
influence EBLUP (``fay_herriot.robust_fit``, ``robust_eblup``): β by Huber's M-estimator at
REML's σ², and each tract's own-direct term γ·(y − x'β) counted up to b = 1.345 standard
deviations of y − x'β; its MSE is that of the weights actually used (``mse_of_weights``).

Tracts without a direct (suppressed, failed) get the synthetic estimate with its MSE.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import optimize, spatial

from dpatlas.small_area import fay_herriot as fh

QUANTITIES = ("p25", "p75")
# Kernel bandwidths: about one and three tracts apart in an Illinois-sized state; 5/15 and
# 12/40 km scored the same on the calibration seeds 101-103 (docs/small-area.md).
BANDWIDTHS_KM = (8.0, 25.0)
LEVEL = 0.95
_Z = 1.959963984540054
_KM_PER_DEGREE = 111.2
_SIZE_BINS = 10
MIN_RELEASED = 50  # fewer directs cannot fit a variance function and a regression
_MIN_GROUP = 60  # tracts a mechanism needs for a variance function of its own
# The DP noise variance of a mechanism's direct p25/p75 is about k_m/(ε_m·n)², ε_m the budget
# the mechanism ran with (public: the release's plan) and n the tract's public size. k_m was
# fitted on the calibration seeds 101-103 only, as a function of n and ε alone (never of a
# release's data): mean (direct − truth)² by size bin at ε = 1 and 8 (docs/small-area.md,
# "Known noise"). NoisyStats' is small because the dp rule runs it only where the noisy nvar
# is large; DPExpTheilSen's saturates at small n (the cap of ``variance_function``).
NOISE_COEFFICIENTS = {"NoisyStats": 16.0, "DPExpTheilSen": 400.0}
# The 1/n coefficient c_m at the two calibration budgets ε_m (0.4725 and 3.78: the mechanisms'
# share of ε = 1 and 8 per person at split 0.7/0.27/0.03), fitted as above after removing
# each size decile's mean error (as ``_direct_bias`` does). The ε = 8 values are half that
# fit's (0.8, 0.3): with them σ̂² came out ≈ 1e-4 at ε = 8 and over-shrank; halved, the
# calibration seeds' ε = 8 coverage was better in every column (docs/small-area.md).
CALIBRATION_EPSILONS = (0.4725, 3.78)
SAMPLING_COEFFICIENTS = {"NoisyStats": (1.5, 0.4), "DPExpTheilSen": (2.5, 0.15)}


def model_columns(quantity: str) -> list[str]:
    return [f"{quantity}_model", f"{quantity}_model_lo", f"{quantity}_model_hi",
            f"{quantity}_model_se"]


def tract_positions(boundaries) -> pd.DataFrame:
    """(x, y) in km of each tract's representative point, indexed by GEOID: an
    equirectangular projection about the mean latitude (a few % off within a state)."""
    pts = boundaries.geometry.representative_point()
    lon, lat = pts.x.to_numpy(), pts.y.to_numpy()
    x = lon * _KM_PER_DEGREE * np.cos(np.radians(lat.mean()))
    return pd.DataFrame({"x": x, "y": lat * _KM_PER_DEGREE},
                        index=pd.Index(boundaries["geoid"].astype(str), name="geoid"))


class KernelPairs:
    """The pairs of points within 3 bandwidths of each other (both ways) and their Gaussian
    kernel weights: found once per state and bandwidth, then reused by every kernel mean of
    the fit (2 quantities × 2 passes × 2 value columns), which differ only in their values and
    weights. Same pairs in the same order as a fresh query, so the means are bit for bit
    those of ``kernel_mean``."""

    def __init__(self, xy: np.ndarray, bandwidth_km: float):
        tree = spatial.cKDTree(xy)
        pairs = tree.query_pairs(3 * bandwidth_km, output_type="ndarray")
        self.size = len(xy)
        self.i = np.concatenate([pairs[:, 0], pairs[:, 1]])
        self.j = np.concatenate([pairs[:, 1], pairs[:, 0]])
        d2 = np.sum((xy[self.i] - xy[self.j]) ** 2, axis=1)
        self.kernel = np.exp(-0.5 * d2 / bandwidth_km ** 2)
        self._last = None

    def mean(self, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per point, the kernel-weighted mean of the *other* points' values (NaN values and
        zero weights skipped); NaN where no other point is in reach."""
        i, j, w = self._weighted(np.isfinite(values) & (weights > 0), weights)
        num = np.bincount(i, w * values[j], minlength=self.size)
        den = np.bincount(i, w, minlength=self.size)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / den, np.nan)

    def _weighted(self, usable: np.ndarray, weights: np.ndarray):
        """The pairs whose other point is ``usable`` and their weights kernel × weight of the
        other point. The last answer is kept: a fit's design asks it twice in a row with the
        same weights and the same usable points (the quantity's directs, then the midpoint's,
        finite on the same tracts)."""
        last = self._last
        if last is not None and np.array_equal(last[0], usable) and \
                np.array_equal(last[1], weights):
            return last[2]
        ok = usable[self.j]
        i, j = self.i[ok], self.j[ok]
        answer = (i, j, self.kernel[ok] * weights[j])
        self._last = (usable, weights.copy(), answer)
        return answer


def neighbour_kernels(xy: np.ndarray) -> dict[float, KernelPairs]:
    """The kernel pairs of every bandwidth of the covariates (``BANDWIDTHS_KM``)."""
    return {h: KernelPairs(xy, h) for h in BANDWIDTHS_KM}


def kernel_mean(xy: np.ndarray, values: np.ndarray, weights: np.ndarray,
                bandwidth_km: float) -> np.ndarray:
    """Per point, the Gaussian-kernel weighted mean of the *other* points' values (NaN values
    and zero weights skipped), within 3 bandwidths; NaN where no other point is in reach."""
    return KernelPairs(xy, bandwidth_km).mean(values, weights)


def winsorised(values: np.ndarray, lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """Clipped symmetrically about the median m of the finite values, to [m − h, m + h] with
    h = min(m − lo, hi − m): the widest window inside [lo, hi] that treats both tails alike."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return values
    m = float(np.median(finite))
    h = min(m - lo, hi - m)
    return np.clip(values, m - h, m + h)


def _size_bin_means(resid2: np.ndarray, n: np.ndarray, group: np.ndarray):
    """Per group, its tracts in size bins (quantiles of n): (the sorted groups, each bin's group
    index, mean n, mean squared residual, count). What both variance functions are fitted to."""
    rows = []
    groups = sorted(set(group))
    for k, g in enumerate(groups):
        sel = group == g
        edges = np.unique(np.quantile(n[sel], np.linspace(0, 1, _SIZE_BINS + 1)))
        bins = np.clip(np.searchsorted(edges, n[sel], side="right") - 1, 0, len(edges) - 2)
        for b in np.unique(bins):
            m = bins == b
            rows.append((k, float(np.mean(n[sel][m])), float(np.mean(resid2[sel][m])), m.sum()))
    gk, nb, r2, cnt = (np.array(c, dtype=float) for c in zip(*rows))
    return groups, gk.astype(int), nb, r2, cnt


def variance_function(resid2: np.ndarray, n: np.ndarray, group: np.ndarray,
                      known: dict | None = None):
    """Fit mean(resid²) = τ + min(a_g/n² + c_g/n, cap_g) over size bins per group; returns
    (τ, {g: (a, c, cap)}).

    The two terms are the mechanisms' known rates in n: the DP noise on a tract's line falls
    as 1/(ε·n) (NoisyStats' Laplace noise on the slope is divided by nvar ≈ n/12; Theil–Sen's
    rank offset spans a 1/n share of the slopes), so its variance as 1/n², and the sampling
    error's variance as 1/n. τ, the part no sample size removes, is the model's own error and
    is separated from them by these shapes. cap_g is the largest bin mean: the winsorised
    directs of the smallest tracts cannot vary more than their window allows.

    ``known``: {group: (a, c)} for groups whose coefficients are known from the release's
    plan (``known_noise``); only cap and τ are fitted for them."""
    known = {} if known is None else known
    groups, gk, nb, r2, cnt = _size_bin_means(resid2, n, group)
    caps = np.array([r2[gk == k].max() for k in range(len(groups))])
    fixed = np.array([known[g][0] if g in known else np.nan for g in groups], dtype=float)
    fixed_c = np.array([known[g][1] if g in known else np.nan for g in groups], dtype=float)

    def coefficients(theta):
        return np.where(np.isfinite(fixed), fixed, np.exp(theta[1::2]))

    def c_coefficients(theta):
        return np.where(np.isfinite(fixed_c), fixed_c, np.exp(theta[2::2]))

    def predicted(theta):
        a, c = coefficients(theta)[gk], c_coefficients(theta)[gk]
        return np.exp(theta[0]) + np.minimum(a / nb ** 2 + c / nb, caps[gk])

    def residuals(theta):  # relative errors, each bin weighted by its count
        return np.sqrt(cnt) * (predicted(theta) / r2 - 1.0)

    # start: each term alone explaining half of its group's smallest (1/n²) or largest (1/n)
    # bins, τ a quarter of the smallest bin mean
    start = [np.log(np.min(r2) / 4)]
    for k in range(len(groups)):
        g = gk == k
        start += [np.log(np.max(r2[g] * nb[g] ** 2) / 2), np.log(np.min(r2[g] * nb[g]) / 2)]
    sol = optimize.least_squares(residuals, start, bounds=(-30, 12))
    a, c = coefficients(sol.x), c_coefficients(sol.x)
    return float(np.exp(sol.x[0])), {
        g: (float(a[k]), float(c[k]), float(caps[k]))
        for k, g in enumerate(groups)}


def power_law_variance_function(resid2: np.ndarray, n: np.ndarray, group: np.ndarray):
    """Fit mean(resid²) = τ + a_g·n^(−b_g) over size bins per group; returns (τ, {g: (a, b)}).

    A free exponent follows the winsorised directs' variance well where it flattens (small
    tracts at small budgets) but can mimic τ, so D = a_g·n^(−b_g) may take what is the
    model's own error: the EBLUP's weights use it (the better point estimate on the
    calibration seeds), its intervals do not (``variance_function``)."""
    groups, gk, nb, r2, cnt = _size_bin_means(resid2, n, group)

    def predicted(theta):
        return np.exp(theta[0]) + np.exp(theta[1::2])[gk] * nb ** (-theta[2::2][gk])

    def residuals(theta):  # relative errors, each bin weighted by its count
        return np.sqrt(cnt) * (predicted(theta) / r2 - 1.0)

    start = [np.log(np.min(r2) / 2)] + [v for _ in groups for v in (np.log(np.max(r2)), 0.5)]
    lower = [-30] + [v for _ in groups for v in (-30, 0.0)]
    upper = [5] + [v for _ in groups for v in (10, 3.0)]
    sol = optimize.least_squares(residuals, start, bounds=(lower, upper))
    return float(np.exp(sol.x[0])), {g: (float(np.exp(sol.x[1 + 2 * k])), float(sol.x[2 + 2 * k]))
                                     for k, g in enumerate(groups)}



def power_law_variance(params: tuple, n: np.ndarray) -> np.ndarray:
    """D = a·n^(−b) for one variance group's (a, b)."""
    a, b = params
    return a * n ** (-b)


def sampling_variance(params: tuple, n: np.ndarray) -> np.ndarray:
    """D = min(a/n² + c/n, cap) for one variance group's (a, c, cap)."""
    a, c, cap = params
    return np.minimum(a / n ** 2 + c / n, cap)


def _groups(tracts: pd.DataFrame, has: np.ndarray) -> np.ndarray:
    """The variance group of each tract: its mechanism if enough tracts share it, else 'all'."""
    mech = (tracts["mechanism"].astype(str).to_numpy() if "mechanism" in tracts
            else np.full(len(tracts), "all"))
    counts = pd.Series(mech[has]).value_counts()
    small = [m for m, c in counts.items() if c < _MIN_GROUP]
    return np.where(np.isin(mech, small), "all", mech)


def _design(tracts, quantity, y, mid, precision, kernels: dict[float, KernelPairs], counties,
            states) -> tuple[np.ndarray, list]:
    """The covariates: the neighbours' directs of ``quantity`` and of the midpoint (kernel
    means without the tract itself, ``kernels``: ``neighbour_kernels`` of the tracts), the
    county's estimates, the state's (several states)."""
    cols, names = [np.ones(len(tracts))], ["intercept"]
    for values, label in ((y, quantity), (mid, "mid")):
        for h in BANDWIDTHS_KM:
            cols.append(kernels[h].mean(values, precision))
            names.append(f"neighbours' {label}, {h:g} km")
    fallback = cols[-1]
    if counties is not None:
        for col in (quantity, "mid"):
            c = (tracts["geoid"].str[:5].map(counties.set_index("geoid")[col])
                 .to_numpy(dtype=float))
            cols.append(np.where(np.isfinite(c), c, fallback))
            names.append(f"county {col}")
    if states is not None and tracts["geoid"].str[:2].nunique() > 1:
        s = tracts["geoid"].str[:2].map(states.set_index("geoid")[quantity]).to_numpy(float)
        cols.append(np.where(np.isfinite(s), s, fallback))
        names.append("state estimate")
    X = np.column_stack(cols)
    # a tract with no neighbour in reach: the column's mean; a column that is empty or
    # constant (one county) adds nothing to the intercept and is dropped
    keep = [0]
    for k in range(1, X.shape[1]):
        finite = np.isfinite(X[:, k])
        if finite.sum() < 2 or np.ptp(X[finite, k]) == 0:
            continue
        X[~finite, k] = X[finite, k].mean()
        keep.append(k)
    return X[:, keep], [names[k] for k in keep]


def _benchmark(tracts, estimate, mse, states, quantity):
    """Shift each state's estimates so their n-weighted mean is the state's published value."""
    if states is None:
        return estimate, mse
    st = states.set_index("geoid")
    code = tracts["geoid"].str[:2].to_numpy()
    n = tracts["n"].to_numpy(dtype=float)
    estimate, mse = estimate.copy(), mse.copy()
    for s in np.unique(code):
        if s not in st.index or not np.isfinite(st.loc[s, quantity]):
            continue
        sel = (code == s) & (n > 0)
        shift = st.loc[s, quantity] - np.average(estimate[sel], weights=n[sel])
        estimate[code == s] += shift
        se = st.loc[s, f"{quantity}_se"] if f"{quantity}_se" in st.columns else 0.0
        mse[code == s] += float(se) ** 2 if np.isfinite(se) else 0.0
    return estimate, mse


def known_noise(noise: dict | None) -> dict:
    """{mechanism: (a, c)}: the 1/n² and 1/n coefficients of its directs' variance at the
    budget it ran with, from ``noise`` = {mechanism: ε_m} (public: the release's plan).

    a = k_m/ε_m² (``NOISE_COEFFICIENTS``); c, the 1/n term (sampling error, and the part of
    the selection's bias that a size bin's mean does not remove), from
    ``SAMPLING_COEFFICIENTS``, interpolated on log ε between the two calibration budgets and
    held constant beyond them."""
    out = {}
    lo, hi = np.log(CALIBRATION_EPSILONS)
    for m, eps in (noise or {}).items():
        if m not in NOISE_COEFFICIENTS or not eps or float(eps) <= 0:
            continue
        t = float(np.clip((np.log(float(eps)) - lo) / (hi - lo), 0.0, 1.0))
        c_lo, c_hi = SAMPLING_COEFFICIENTS[m]
        out[m] = (NOISE_COEFFICIENTS[m] / float(eps) ** 2,
                  float(np.exp((1 - t) * np.log(c_lo) + t * np.log(c_hi))))
    return out


def fit_quantity(tracts: pd.DataFrame, quantity: str, xy: np.ndarray, counties, states,
                 noise: dict | None = None, kernels: dict[float, KernelPairs] | None = None):
    """(estimate, se, details) of one quantity for every tract. ``kernels``: the tracts'
    ``neighbour_kernels(xy)`` when the caller already has them (one per state for both
    quantities)."""
    kernels = neighbour_kernels(xy) if kernels is None else kernels
    has = (tracts["status"].astype(str).to_numpy() == "released") & \
        np.isfinite(tracts[quantity].to_numpy(dtype=float))
    y = np.where(has, winsorised(tracts[quantity].to_numpy(dtype=float)), np.nan)
    mid = np.where(has, winsorised(tracts["mid"].to_numpy(dtype=float)), np.nan)
    n = np.maximum(tracts["n"].to_numpy(dtype=float), 1.0)
    group = _groups(tracts, has)
    bins = _size_bins(n, group, has)
    y = y - _direct_bias(tracts, quantity, y, bins, has, counties, states)
    # first pass: equal weights, to find the variance function; second: weights 1/D
    X, names = _design(tracts, quantity, y, mid, np.ones(len(y)), kernels, counties,
                       states)
    known = known_noise(noise)
    D = _variances(y, X, n, group, has)
    X, names = _design(tracts, quantity, y, mid, 1.0 / D, kernels, counties, states)
    d_error = _variances(y, X, n, group, has)
    # Two variance splits (docs/small-area.md, "Which variance"): the point estimate shrinks
    # with D known from the plan (``noise``; without it, a power law fitted to the
    # residuals); its MSE is that estimator's own, under the rate-shaped D fitted to the
    # residuals and the larger of the two σ̂².
    error = fh.fit(y[has], X[has], d_error[has])
    if known:
        # D from the plan (docs/small-area.md, "Known noise"): σ̂² is then what REML finds
        # beyond a D that was not fitted to these residuals
        d_shrink = _variances(y, X, n, group, has, known=known)
    else:
        d_shrink = _variances(y, X, n, group, has, power_law_variance_function,
                              power_law_variance)
    # bounded influence (docs/small-area.md, "Heavy-tailed noise"): the DP noise is Laplace, so
    # β and each tract's own-direct term are Huber M-estimates (Sinha & Rao 2009)
    point = fh.robust_fit(y[has], X[has], d_shrink[has])
    y_has = np.where(has, y, np.nan)
    estimate, gamma = fh.robust_eblup(point, X, y_has, np.where(has, d_shrink, np.inf))
    sigma2 = max(point.sigma2, error.sigma2)
    mse = fh.mse_of_weights(gamma, np.where(has, d_error, 0.0), fh.synthetic_variance(point, X),
                            sigma2, error.sigma2_var)
    estimate, mse = _benchmark(tracts, estimate, mse, states, quantity)
    return estimate, np.sqrt(mse), {"covariates": names, "beta": point.beta.tolist(),
                                    "sigma2_shrink": point.sigma2, "sigma2_error": sigma2}


def _size_bins(n: np.ndarray, group: np.ndarray, has: np.ndarray) -> np.ndarray:
    """A label per tract: its variance group and its size decile within the group."""
    out = np.full(len(n), "", dtype=object)
    for g in np.unique(group):
        sel = group == g
        if not (sel & has).any():
            out[sel] = f"{g}/none"
            continue
        edges = np.unique(np.quantile(n[sel & has], np.linspace(0, 1, _SIZE_BINS + 1)))
        k = np.clip(np.searchsorted(edges, n[sel], side="right") - 1, 0, max(len(edges) - 2, 0))
        out[sel] = [f"{g}/{v}" for v in k]
    return out


def _direct_bias(tracts, quantity, y, bins, has, counties, states) -> np.ndarray:
    """Per tract, the mean of (direct − its county's estimate) over its size bin: the bias the
    directs share by mechanism and size (the level estimates have no selection and thousands
    of people, so they anchor the level; tract effects average out over a bin). Zero without
    a county or state table."""
    anchor = None
    for table, digits in ((counties, 5), (states, 2)):
        if table is not None:
            anchor = (tracts["geoid"].str[:digits].map(table.set_index("geoid")[quantity])
                      .to_numpy(dtype=float))
            break
    if anchor is None:
        return np.zeros(len(y))
    diff = pd.Series(np.where(has & np.isfinite(anchor), y - anchor, np.nan))
    return diff.groupby(bins).transform("mean").fillna(0.0).to_numpy()


def _variances(y, X, n, group, has, fit_function=None, evaluate=None,
               known: dict | None = None) -> np.ndarray:
    """D per tract from a variance function (default: the rate-shaped one) fitted to the
    squared residuals of the directs about their least-squares fit on ``X``."""
    fit_function = variance_function if fit_function is None else fit_function
    evaluate = sampling_variance if evaluate is None else evaluate
    beta, *_ = np.linalg.lstsq(X[has], y[has], rcond=None)
    resid2 = (y - X @ beta) ** 2
    extra = {"known": known} if known else {}
    _, params = fit_function(resid2[has], n[has], group[has], **extra)
    D = np.full(len(n), np.nan)
    for g, p in params.items():
        D[group == g] = evaluate(p, n[group == g])
    return D


def _with_mid(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``mid`` = (p25 + p75)/2 (GEOIDs as strings)."""
    out = table.copy()
    out["geoid"] = out["geoid"].astype(str)
    out["mid"] = (out["p25"] + out["p75"]) / 2
    return out


def fit_model(tracts: pd.DataFrame, counties: pd.DataFrame | None = None,
              states: pd.DataFrame | None = None, boundaries=None,
              noise: dict | None = None) -> pd.DataFrame:
    """``tracts`` with the model columns of p25 and p75 added (``model_columns``).

    ``tracts``: the published tract table (geoid, n, status, mechanism, p25, p75; one cell);
    ``counties``/``states``: the published level tables (geoid of 5/2 digits, p25, p75,
    p25_se, p75_se) or None; ``boundaries``: the published tract geometries (geoid, geometry).
    """
    out = tracts.copy()
    out["geoid"] = out["geoid"].astype(str)
    if "cell" in out.columns and out["cell"].nunique() > 1:
        raise ValueError("fit_model takes one cell's tracts: fit each cell's table separately")
    released = int((out["status"].astype(str) == "released").sum())
    if released < MIN_RELEASED:
        raise ValueError(f"the model needs at least {MIN_RELEASED} tracts with a direct "
                         f"estimate to fit its variances, got {released}")
    if boundaries is None:
        raise ValueError("fit_model needs the tract boundaries (neighbours come from them)")
    pos = tract_positions(boundaries).reindex(out["geoid"])
    if pos.isna().any().any():
        raise ValueError("some tracts have no boundary: "
                         f"{list(out['geoid'][pos['x'].isna().to_numpy()][:5])}")
    xy = pos[["x", "y"]].to_numpy()
    derived = [_with_mid(t) if t is not None else None for t in (out, counties, states)]
    out.attrs["fits"] = {}  # per quantity: covariates, β and σ² (the release's manifest)
    kernels = neighbour_kernels(xy)  # the neighbour pairs: the same for both quantities
    for q in QUANTITIES:
        est, se, out.attrs["fits"][q] = fit_quantity(derived[0], q, xy, derived[1], derived[2],
                                                     noise, kernels)
        est = np.clip(est, 0.0, 1.0)
        model, lo, hi, model_se = model_columns(q)
        out[model] = est
        out[lo] = np.clip(est - _Z * se, 0.0, 1.0)
        out[hi] = np.clip(est + _Z * se, 0.0, 1.0)
        out[model_se] = se
    return out
