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

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize, sparse, spatial

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
# The law of a published direct given its tract's expected outcome θ (docs/small-area.md, "The
# directs' law"): E[direct | θ] = A_q + s·θ and Var[direct | θ] = D_q, with logit s = b·f,
# A_q = a_q·f and log D_q = d_q·f, f = ``law_features`` of (n, ε_m), per mechanism (and for A
# and D per quantity q): n the tract's public size, ε_m the mechanism's budget in the release's
# public plan. At small n·ε a direct is mostly clipped noise or a near-uniform draw (s ≈ 0, A ≈
# 0.5); NoisyStats under the dp rule is shifted (p25 up, p75 down: its slope is flattened where
# the noisy n·var(x) selected it). Fitted on calibration seeds only (never on a release's data)
# by dpatlas/evaluation/small_area_calibration.py: {mechanism: (b, {q: (a_q, d_q)})}.
DIRECT_LAW = {
    "DPExpTheilSen": ((-8.59843, 5.26367, -1.23561, 0.12137, 0.05288, -0.02547),
                      {"p25": ((0.48477, 0.08254, -0.06097, 0.00547, -0.00676, 0.00268),
                               (-1.85496, -0.25419, 0.26119, -0.06139, -0.1595, 0.06025)),
                       "p75": ((0.49525, 0.04737, -0.04865, 0.00444, -0.00417, 0.00234),
                               (-1.62361, -0.52742, 0.35225, -0.06944, -0.04786, 0.0214))}),
    "NoisyStats": ((-2.06145, 1.95819, -0.39078, 0.04866, 0.01195, -0.06719),
                   {"p25": ((0.48645, -0.13874, 0.00627, 0.00053, 0.02708, -0.00498),
                            (-0.00086, -1.69571, 0.29137, -0.02599, 0.095, -0.00265)),
                    "p75": ((0.5561, -0.33129, 0.06375, -0.00394, 0.03155, -0.0051),
                            (-0.05491, -1.64368, 0.27984, -0.02598, 0.07514, 0.01194))})}
# The kernel means' first-pass weights 1/(D + τ0), before σ² is known: a tract effect sd 0.05.
_TAU0 = 0.0025


def model_columns(quantity: str) -> list[str]:
    """The estimate, its interval and SE, and the check of the direct against the model."""
    return [f"{quantity}_model", f"{quantity}_model_lo", f"{quantity}_model_hi",
            f"{quantity}_model_se", f"{quantity}_model_z"]


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
    kernel weights, as a sparse matrix K (row: the point, column: its neighbour; the point
    itself is not its own neighbour): found once per state and bandwidth, then reused by every
    kernel mean of the fit (2 quantities × 2 passes × 2 value columns), which differ only in
    their values and weights. A mean is then two products of K with a vector (its numerator
    and denominator), not a selection of the pairs and two sums over them: a fit's kernel
    means 9 times faster on California's 8,161 tracts (``benchmarks/bench_model_cells.py``)."""

    def __init__(self, xy: np.ndarray, bandwidth_km: float):
        tree = spatial.cKDTree(xy)
        pairs = tree.query_pairs(3 * bandwidth_km, output_type="ndarray")
        self.size = len(xy)
        i = np.concatenate([pairs[:, 0], pairs[:, 1]])
        j = np.concatenate([pairs[:, 1], pairs[:, 0]])
        d2 = np.sum((xy[i] - xy[j]) ** 2, axis=1)
        self.matrix = sparse.csr_array((np.exp(-0.5 * d2 / bandwidth_km ** 2), (i, j)),
                                       shape=(self.size, self.size))

    def mean(self, values: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """Per point, the kernel-weighted mean of the *other* points' values (NaN values and
        zero weights skipped); NaN where no other point is in reach."""
        usable = np.isfinite(values) & (weights > 0)
        with np.errstate(invalid="ignore"):  # NaN values × their weights: not used
            num = self.matrix @ np.where(usable, weights * values, 0.0)
        den = self.matrix @ np.where(usable, weights, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / den, np.nan)


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


def variance_function(resid2: np.ndarray, n: np.ndarray, group: np.ndarray):
    """Fit mean(resid²) = τ + min(a_g/n² + c_g/n, cap_g) over size bins per group; returns
    (τ, {g: (a, c, cap)}).

    The two terms are the mechanisms' known rates in n: the DP noise on a tract's line falls
    as 1/(ε·n) (NoisyStats' Laplace noise on the slope is divided by nvar ≈ n/12; Theil–Sen's
    rank offset spans a 1/n share of the slopes), so its variance as 1/n², and the sampling
    error's variance as 1/n. τ, the part no sample size removes, is the model's own error and
    is separated from them by these shapes. cap_g is the largest bin mean: the winsorised
    directs of the smallest tracts cannot vary more than their window allows. (Used where
    the release's plan is not given: with it, ``direct_law`` gives D.)"""
    groups, gk, nb, r2, cnt = _size_bin_means(resid2, n, group)
    caps = np.array([r2[gk == k].max() for k in range(len(groups))])
    def predicted(theta):
        a, c = np.exp(theta[1::2])[gk], np.exp(theta[2::2])[gk]
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
    a, c = np.exp(sol.x[1::2]), np.exp(sol.x[2::2])
    return float(np.exp(sol.x[0])), {
        g: (float(a[k]), float(c[k]), float(caps[k]))
        for k, g in enumerate(groups)}


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
    # the tract's public size: outcomes may depend on it (docs/small-area.md, "Size")
    cols.append(np.log(np.maximum(tracts["n"].to_numpy(dtype=float), 1.0)))
    names.append("log n")
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


def law_features(log_n: np.ndarray, log_epsilon: np.ndarray) -> np.ndarray:
    """f = (1, u, u², u³, log ε, u·log ε), u = log(n·ε): the terms of ``DIRECT_LAW``'s logit s
    and log D (the mechanisms' noise falls with n·ε; the other terms let sampling error and
    ε act apart)."""
    u = log_n + log_epsilon
    return np.column_stack([np.ones_like(u), u, u ** 2, u ** 3, log_epsilon, log_epsilon * u])


def direct_law(quantity: str, mechanism: np.ndarray, n: np.ndarray,
               noise: dict | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(s, A, D) per tract: the slope, offset and noise variance of its direct of ``quantity``
    (``DIRECT_LAW``) from its mechanism, public n and ``noise`` = {mechanism: ε_m} (the
    public plan); NaN where the mechanism has no law or no ε."""
    s, A, D = (np.full(len(n), np.nan) for _ in range(3))
    for m, eps in (noise or {}).items():
        if m not in DIRECT_LAW or not eps or float(eps) <= 0:
            continue
        sel = mechanism == m
        b, per_quantity = DIRECT_LAW[m]
        a, d = per_quantity[quantity]
        f = law_features(np.log(n[sel]), np.full(int(sel.sum()), np.log(float(eps))))
        s[sel] = 1.0 / (1.0 + np.exp(-(f @ np.asarray(b))))
        A[sel] = f @ np.asarray(a)
        D[sel] = np.exp(f @ np.asarray(d))
    return s, A, D


def model_z(direct, synthetic, direct_variance, sigma2: float, synthetic_variance,
            slope=1.0, offset=0.0) -> np.ndarray:
    """The standardised difference of a tract's direct from the model's prediction without
    it: (direct − A − s·x'β̂) / √(D + s²·(σ² + g2)), s and A the direct's slope and offset on
    the truth (1 and 0: unbiased), D its variance (``direct_variance``: the law's, or a
    published direct's se² in its place), g2 the synthetic part's variance. N(0, 1) where the
    model applies; NaN where there is no direct."""
    direct, synthetic, s, offset = (np.asarray(a, dtype=float)
                                    for a in (direct, synthetic, slope, offset))
    variance = np.asarray(direct_variance, dtype=float) + s ** 2 * (sigma2 + synthetic_variance)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (direct - offset - s * synthetic) / np.sqrt(variance)


def fit_quantity(tracts: pd.DataFrame, quantity: str, xy: np.ndarray, counties, states,
                 noise: dict | None = None, kernels: dict[float, KernelPairs] | None = None):
    """(estimate, se, z, details) of one quantity for every tract. ``kernels``: the tracts'
    ``neighbour_kernels(xy)`` when the caller already has them (one per state for both
    quantities)."""
    kernels = neighbour_kernels(xy) if kernels is None else kernels
    has = (tracts["status"].astype(str).to_numpy() == "released") & \
        np.isfinite(tracts[quantity].to_numpy(dtype=float))
    n = np.maximum(tracts["n"].to_numpy(dtype=float), 1.0)
    group = _groups(tracts, has)
    direct = np.where(has, tracts[quantity].to_numpy(dtype=float), np.nan)
    mid = np.where(has, tracts["mid"].to_numpy(dtype=float), np.nan)
    mechanism = (tracts["mechanism"].astype(str).to_numpy() if "mechanism" in tracts
                 else np.full(len(tracts), ""))
    s, offset, d_direct = direct_law(quantity, mechanism, n, noise)
    if np.all(np.isfinite(s[has])):
        # the directs' law (docs/small-area.md): ỹ = (direct − A)/s is unbiased for θ with
        # variance D/s²; the midpoint's law is the mean of its ends'
        _, offset_other, _ = direct_law("p75" if quantity == "p25" else "p25", mechanism, n,
                                        noise)
        y = (direct - offset) / s
        mid = (mid - (offset + offset_other) / 2) / s
        D = d_direct / s ** 2
    else:
        # no plan (or a mechanism without a law): winsorised directs, D from a variance
        # function of their residuals about an equal-weight fit
        s, offset = np.ones(len(n)), np.zeros(len(n))
        y, mid = winsorised(direct), winsorised(mid)
        X, _ = _design(tracts, quantity, y, mid, np.ones(len(y)), kernels, counties, states)
        D = _variances(y, X, n, group, has)
        d_direct = D
    # two passes: the kernel means weight the neighbours by 1/(D + σ²), σ² from the first
    sigma2 = _TAU0
    for _ in range(2):
        X, names = _design(tracts, quantity, y, mid, 1.0 / (D + sigma2), kernels, counties,
                           states)
        # bounded influence (docs/small-area.md, "Heavy-tailed noise"): β and each tract's
        # own-direct term are Huber M-estimates (Sinha & Rao 2009)
        point = fh.robust_fit(y[has], X[has], D[has])
        sigma2 = point.sigma2
    estimate, gamma = fh.robust_eblup(point, X, np.where(has, y, np.nan),
                                      np.where(has, D, np.inf))
    g2 = fh.synthetic_variance(point, X)
    mse = fh.mse_of_weights(gamma, np.where(has, D, 0.0), g2, sigma2, point.sigma2_var)
    z = np.where(has, model_z(direct, X @ point.beta, d_direct, sigma2, g2, s, offset),
                 np.nan)
    return estimate, np.sqrt(mse), z, {"covariates": names, "beta": point.beta.tolist(),
                                       "sigma2": sigma2}


def _variances(y, X, n, group, has) -> np.ndarray:
    """D per tract from the rate-shaped variance function fitted to the squared residuals
    of the directs about their least-squares fit on ``X``."""
    beta, *_ = np.linalg.lstsq(X[has], y[has], rcond=None)
    resid2 = (y - X @ beta) ** 2
    _, params = variance_function(resid2[has], n[has], group[has])
    D = np.full(len(n), np.nan)
    for g, p in params.items():
        D[group == g] = sampling_variance(p, n[group == g])
    return D


def _with_mid(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with ``mid`` = (p25 + p75)/2 (GEOIDs as strings)."""
    out = table.copy()
    out["geoid"] = out["geoid"].astype(str)
    out["mid"] = (out["p25"] + out["p75"]) / 2
    return out


@dataclass(frozen=True)
class Neighbours:
    """Where a state's tracts are (``xy``, km, in the order of ``geoids``) and their kernel
    pairs per bandwidth: the same for every cell of the state, so a release of several cells
    finds them once per state (``fit_published``), not once per fit."""

    geoids: tuple[str, ...]
    xy: np.ndarray
    kernels: dict[float, KernelPairs]


def tract_neighbours(boundaries, geoids) -> Neighbours:
    """The :class:`Neighbours` of the tracts ``geoids`` (in that order), from ``boundaries``
    (geoid, geometry); refused when a tract has no boundary."""
    geoids = pd.Index(pd.Series(geoids).astype(str), name="geoid")
    pos = tract_positions(boundaries).reindex(geoids)
    if pos.isna().any().any():
        raise ValueError("some tracts have no boundary: "
                         f"{list(geoids[pos['x'].isna().to_numpy()][:5])}")
    xy = pos[["x", "y"]].to_numpy()
    return Neighbours(tuple(geoids), xy, neighbour_kernels(xy))


def fit_model(tracts: pd.DataFrame, counties: pd.DataFrame | None = None,
              states: pd.DataFrame | None = None, boundaries=None,
              noise: dict | None = None, neighbours: Neighbours | None = None) -> pd.DataFrame:
    """``tracts`` with the model columns of p25 and p75 added (``model_columns``).

    ``tracts``: the published tract table (geoid, n, status, mechanism, p25, p75; one cell);
    ``counties``/``states``: the published level tables (geoid of 5/2 digits, p25, p75,
    p25_se, p75_se) or None; ``boundaries``: the published tract geometries (geoid, geometry),
    or ``neighbours`` already found from them for these tracts in this order.
    """
    out = tracts.copy()
    out["geoid"] = out["geoid"].astype(str)
    if "cell" in out.columns and out["cell"].nunique() > 1:
        raise ValueError("fit_model takes one cell's tracts: fit each cell's table separately")
    released = int((out["status"].astype(str) == "released").sum())
    if released < MIN_RELEASED:
        raise ValueError(f"the model needs at least {MIN_RELEASED} tracts with a direct "
                         f"estimate to fit its variances, got {released}")
    if neighbours is None:
        if boundaries is None:
            raise ValueError("fit_model needs the tract boundaries (neighbours come from them)")
        neighbours = tract_neighbours(boundaries, out["geoid"])
    elif neighbours.geoids != tuple(out["geoid"]):
        raise ValueError("the neighbours given are not of these tracts in this order")
    xy = neighbours.xy
    derived = [_with_mid(t) if t is not None else None for t in (out, counties, states)]
    out.attrs["fits"] = {}  # per quantity: covariates, β and σ² (the release's manifest)
    kernels = neighbours.kernels  # the neighbour pairs: the same for both quantities
    for q in QUANTITIES:
        est, se, z, out.attrs["fits"][q] = fit_quantity(derived[0], q, xy, derived[1],
                                                        derived[2], noise, kernels)
        est = np.clip(est, 0.0, 1.0)
        model, lo, hi, model_se, model_z_column = model_columns(q)
        out[model] = est
        out[lo] = np.clip(est - _Z * se, 0.0, 1.0)
        out[hi] = np.clip(est + _Z * se, 0.0, 1.0)
        out[model_se] = se
        out[model_z_column] = z
    return out
