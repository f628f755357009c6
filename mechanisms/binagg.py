"""BinAgg: DP binning–aggregation regression with CLT intervals and synthetic data.

Lin, Slavković & Bhoomireddy, "Differentially Private Linear Regression and Synthetic Data
Generation with Statistical Guarantees" (shared/papers/binagg-dp-linear-regression-synthetic-
data.txt), for our simple regression y = a + b·x, per tract, x and y ranks on [0, 1]:

1. **Bins** (Alg. 1 line 2, App. C): PrivTree (Zhang, Xiao & Xie 2016) splits [0, 1] into
   dyadic intervals. A node at depth d with count c has biased count
   b = max(c − d·δ, θ − δ); it is split when b + Lap(λ) > θ. Here the count is in units of
   1/N (N = 4096, the grid of ``laplace_mechanism``), δ is a whole number of units and the
   noise is the exact discrete Laplace of scale t = λ·N units, so the query is an integer
   lattice walk that moves by exactly N units per record: no rounding slack.
2. **Bin statistics** (Alg. 1 lines 3–11, Alg. 2 line 3): per bin the count c_k, the sum of x
   s_k (each x confined to its bin [L_k, U_k]: sensitivity U_k, the paper's max(|L|, |U|)) and
   the sum of y t_k (sensitivity B_y = 1), each with the exact discrete Gaussian on a grid
   (``gaussian_mechanism``). Bins whose rounded noisy count is below 2 are discarded before the
   sums are released.
3. **Estimate** (Alg. 2): the bias-corrected weighted least squares on z_k = (c̃_k, s̃_k),
   w_k = 1/c̃_k: β̃ = (Σ w z zᵀ − Σ w D_k)⁻¹ Σ w z t̃, D_k = diag(0, Var ξ_s,k). The intercept
   column is the released count itself (no extra budget; the averaged model of Remark 3.1);
   its own noise is not corrected (a second-order bias, σ_c²/c_k² relative).
4. **Interval** (Thm 4.2): Σ̃ = M̃⁻¹ H̃ M̃⁻¹ = K/(K − 2) · A⁻¹ (Σ Q̃_k Q̃_kᵀ) A⁻¹ with A the
   corrected design, Q̃_k = z̃_k w_k (t̃_k − z̃_kᵀβ̃) + w_k D_k β̃; by the delta method
   Var ŷ(x*) = gᵀ Σ̃ g, g = (1, x*). Asymptotic in the number of bins K: see the coverage
   figures in the report (tests/test_binagg.py), they are not nominal for small tracts.
5. **Synthetic data** (Alg. 3, Cor. 3.1): c̃_k rows per kept bin whose x and y sum exactly to
   the released s̃_k, t̃_k: post-processing, no budget.

Privacy (replace-one neighbours, the project's relation; the paper states add/remove):

- PrivTree is pure DP. Its map (:class:`PrivTreeLaplace`, kind "privtree-grid-laplace",
  declared with the other maps in privacy_maps.py) is
  derived for the discrete Laplace we draw, by the argument of Zhang et al.'s Thm 3.1, and
  proved in docs/binagg.md (reviewed; checked against exact output probabilities on small
  trees in tests/test_binagg.py): adding a record changes only the nodes on its root-to-leaf
  path; a node clamped on both datasets costs nothing; the unclamped biased counts along the
  path fall by at least δ per level, so each band (θ − δ + jδ, θ + jδ] holds at most one of
  them; a split at biased count x costs at most ρ(x) = ln S(θ − x) − ln S(θ − x + N), S the
  discrete Laplace survival function, non-increasing in x (S is log-concave), so the band sum
  A = Σ_j ρ(x_j), x_j the band's lowest lattice point, bounds the gaining path. A path that
  loses a record costs at most N/t, at its one leaf. Replace-one is one path of each kind:
  ε = N/t + A (below 2·A, the group-privacy bound). With δ = ⌈t·ln 2⌉ this is 3.6–3.8 N/t,
  against the corollary's 2·3/λ = 6N/t doubled for replace-one (the lattice sum exceeds the
  corollary's 3/λ per add/remove only for large ε, where the corollary is not proven for a
  lattice). The calibration takes the smallest scale whose derived map fits the budget share.
- Each Gaussian statistic: one bin's release with noise calibrated to that bin's sensitivity is
  ρ_row-zCDP in that bin's records (Canonne, Kamath & Steinke 2020, Thm 4: exact for the
  discrete Gaussian); replacing a record changes at most two bins (the one it leaves, the one
  it joins), so each statistic is a step of ``repeat = 2`` draws of the row map. The bins are
  the PrivTree output, already released: adaptive composition.
- Why zCDP and not the paper's μ-GDP: GDP is a statement about the whole trade-off function of
  a continuous Gaussian shift; the discrete Gaussian's privacy-loss distribution is not that of
  a continuous Gaussian, so μ-GDP is not exactly claimable for it. What CKS 2020 prove exactly
  is a bound on every Rényi divergence, i.e. zCDP. PrivTree's pure ε gives ρ = ε²/2 (Bun &
  Steinke 2016, Prop. 1.4) and zCDP composes additively: the guarantee is
  ZCDP(ε_bin²/2 + 2ρ_count + 2ρ_x + 2ρ_y), the composition of the steps' maps.

Budget: as DPGDzCDP, a budget ε means ρ = ε²/2 per tract. The shares follow the paper's μ
ratios μ_bin : μ_c : μ_s : μ_t = 1 : 3 : 3 : 3 (its Appendix A): step i gets
ρ_i = ρ · w_i² / Σ w² (so ε_bin = ε·w_bin/‖w‖).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .batch import X_HIGH, X_LOW, TractBatch
from .privacy_filter import NO_METER
from .noise import Randomness, gaussian_mechanism, laplace_mechanism
# PrivTree's map and its ε functions are declared with the other maps; named here too, as
# BinAgg's (tests and callers import them from mechanisms.binagg).
from .privacy_maps import (BRANCHING, GridGaussian, NoiseStep, PrivTreeLaplace,  # noqa: F401
                           privtree_add_remove_epsilon, privtree_replace_one_epsilon)
from .registry import (MIN_RECORDS, Estimator, Meter, Outcome, RunBudget, blank, get,
                       register)
from .sensitivity import Sensitivity, constant

PRIVTREE = "privtree bins"
COUNTS = "bin counts"
SUMS_X = "bin sums of x"
SUMS_Y = "bin sums of y"
DEFAULTS: dict[str, Any] = {
    "w_bin": 1.0, "w_count": 3.0, "w_sum_x": 3.0, "w_sum_y": 3.0,  # the paper's μ ratios
    "theta": 0.0,  # PrivTree split threshold, in records (the paper's default)
    "max_depth": 10,  # bins no narrower than 2^-10: x is reported to 0.01
    "min_count": 2,  # discard bins whose rounded noisy count is below this (Alg. 1 line 6)
    "level": 0.95,  # confidence level of the CLT intervals
}
N_PARAMS = 2  # intercept and slope
# Peak memory of one _run, reps = 1: tracemalloc measured 28 kB at n = 50 and 119 kB at
# n = 2000 (about 46 bytes per record: sort keys, cumulative sums, per-bin arrays, plus a fixed
# ~26 kB); rounded up generously (tests/test_privacy_maps.py re-measures at n = 50, 200, 800).
_BYTES_PER_RECORD = 160
_FIXED_BYTES = 128 * 1024


# ---------------------------------------------------------------------------------------------
# Calibration of the four steps


def _shares(hp: dict) -> dict[str, float]:
    names = {"w_bin": PRIVTREE, "w_count": COUNTS, "w_sum_x": SUMS_X, "w_sum_y": SUMS_Y}
    w = {}
    for key in names:
        v = hp[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                math.isfinite(v) and v > 0):
            raise ValueError(f"BinAgg: {key} must be a finite number > 0, got {v!r}")
        w[names[key]] = float(v) ** 2
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def _check_hp(hp: dict) -> None:
    d = hp["max_depth"]
    if isinstance(d, bool) or int(d) != d or not 1 <= d <= 30:
        raise ValueError(f"BinAgg: max_depth must be an integer in [1, 30], got {d!r}")
    m = hp["min_count"]
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise ValueError(f"BinAgg: min_count must be an integer >= 1, got {m!r}")
    lv = hp["level"]
    if isinstance(lv, bool) or not isinstance(lv, (int, float)) or not 0 < lv < 1:
        raise ValueError(f"BinAgg: level must lie in (0, 1), got {lv!r}")
    th = hp["theta"]
    if isinstance(th, bool) or not isinstance(th, (int, float)) or not math.isfinite(th):
        raise ValueError(f"BinAgg: theta must be a finite number, got {th!r}")


def bin_upper_edge(bin_hi):
    """U_k: the sensitivity of a bin's sum of x is its (released, public) upper edge."""
    return bin_hi


_TWO_BINS = "; replace-one changes 2 bins (repeat = 2)"
SENSITIVITIES = {
    PRIVTREE: constant(
        1.0, "L1", "1 record",
        "1 record = grid_steps units of a node's count; replace-one: one path gains a record, "
        "one loses it (docs/binagg.md, Theorem 1)",
        "a record adds 1 to the count of each node on its root-to-leaf path; replacing it "
        "raises the counts on one path and lowers them on another (docs/binagg.md, Theorem 1, "
        "after Zhang, Xiao & Xie 2016)"),
    COUNTS: constant(
        1.0, "L2", "1 per bin",
        "1 per bin (L2, a record is in one bin); replace-one changes 2 bins",
        "a record is counted in exactly one bin, so a bin's count moves by at most 1" + _TWO_BINS
        + " (the paper's Alg. 1; docs/binagg.md)"),
    SUMS_X: Sensitivity(
        "L2", "U_k",
        "U_k = the bin's upper edge, per bin (x confined to [L_k, U_k]); replace-one changes 2 "
        "bins",
        "a record in bin k has x in [L_k, U_k] with L_k >= 0, so the bin's sum of x moves by at "
        "most U_k, the released (public) upper edge" + _TWO_BINS
        + " (the paper's Alg. 1; docs/binagg.md)", bin_upper_edge, ("bin_hi",)),
    SUMS_Y: constant(
        1.0, "L2", "B_y = 1 per bin",
        "B_y = 1 per bin (y on [0, 1]); replace-one changes 2 bins",
        "a record's y lies in [0, 1], so a bin's sum of y moves by at most B_y = 1" + _TWO_BINS
        + " (the paper's Alg. 1; docs/binagg.md)"),
}


def binagg_steps(epsilon: float, hp: dict) -> list[NoiseStep]:
    """The four calibrated steps of a run with budget ρ = ε²/2 split by the μ weights."""
    _check_hp(hp)
    rho = epsilon**2 / 2.0
    share = _shares(hp)
    steps = [NoiseStep(PRIVTREE, PrivTreeLaplace.calibrate(math.sqrt(2.0 * rho * share[PRIVTREE])),
                       SENSITIVITIES[PRIVTREE])]
    for name in (COUNTS, SUMS_X, SUMS_Y):
        rho_row = rho * share[name] / 2.0
        try:
            noise = GridGaussian.calibrate(rho_row, 1)
        except ValueError as err:
            raise ValueError(f"BinAgg: epsilon = {epsilon:g} leaves rho = {rho_row:.3g} per bin "
                             f"for {name}, too little for the grid Gaussian ({err}); use a "
                             "larger epsilon") from None
        steps.append(NoiseStep(name, noise, SENSITIVITIES[name], repeat=2))
    return steps


# ---------------------------------------------------------------------------------------------
# Step 1: PrivTree bins


@dataclass(frozen=True)
class Bins:
    """PrivTree leaves of every (rep, tract), sorted by (rep, tract, lower edge).

    ``lo_code``/``hi_code``: edges in units of 2^-max_depth (x·2^D, integers)."""

    rep: np.ndarray
    tract: np.ndarray
    lo_code: np.ndarray
    hi_code: np.ndarray
    max_depth: int

    @property
    def lo(self) -> np.ndarray:
        return self.lo_code / float(1 << self.max_depth)

    @property
    def hi(self) -> np.ndarray:
        return self.hi_code / float(1 << self.max_depth)


class _SortedRecords:
    """Records sorted by (tract, dyadic code of x): exact integer keys for bin membership."""

    def __init__(self, batch: TractBatch, max_depth: int):
        scale = 1 << max_depth
        # code = ⌊x·2^D⌋, x = 1 joins the top cell: bins are [L, U) except the last, [L, 1].
        code = np.minimum(np.floor(batch.x * scale).astype(np.int64), scale - 1)
        self.keys_unsorted = batch.tract_of_record.astype(np.int64) * scale + code
        order = np.argsort(self.keys_unsorted, kind="stable")
        self.keys = self.keys_unsorted[order]
        self.cum_x = np.concatenate([[0.0], np.cumsum(batch.x[order])])
        self.cum_y = np.concatenate([[0.0], np.cumsum(batch.y[order])])
        self.scale = scale

    def positions(self, tract: np.ndarray, lo_code: np.ndarray, hi_code: np.ndarray):
        base = tract.astype(np.int64) * self.scale
        return (np.searchsorted(self.keys, base + lo_code, side="left"),
                np.searchsorted(self.keys, base + hi_code, side="left"))

    def count(self, tract, lo_code, hi_code) -> np.ndarray:
        a, b = self.positions(tract, lo_code, hi_code)
        return b - a


def privtree_bins(batch: TractBatch, records: _SortedRecords, tracts: np.ndarray,
                  step: NoiseStep, rand: Randomness, reps: int, hp: dict,
                  meter: Meter = NO_METER) -> Bins:
    """PrivTree (App. C, Alg. 4) on x ∈ [0, 1], binary splits, all (rep, tract) at once, one
    depth level per iteration. Nodes at ``max_depth`` are leaves without a decision (no draw,
    data-independent), so the cap only removes terms from the privacy-loss sum."""
    noise: PrivTreeLaplace = step.noise
    depth_cap = int(hp["max_depth"])
    n_units = noise.grid_steps
    theta_u = int(round(float(hp["theta"]) * n_units))
    floor_u = theta_u - noise.bias
    rep = np.repeat(np.arange(reps), tracts.size)
    tract = np.tile(tracts, reps)
    j = np.zeros(rep.size, dtype=np.int64)
    leaves = []
    if rep.size:
        meter.spend(batch.labels[tracts], step.guarantee, reps)
    for depth in range(depth_cap + 1):
        if rep.size == 0:
            break
        width = 1 << (depth_cap - depth)
        lo_code = j * width
        if depth == depth_cap:
            leaves.append((rep, tract, lo_code, lo_code + width))
            break
        count = records.count(tract, lo_code, lo_code + width)
        # Biased count in grid units, an exact integer; /N (a power of two) is exact, so the
        # sampler's rounding to its 1/N grid returns this very integer.
        biased = np.maximum(count * n_units - depth * noise.bias, floor_u)
        values = (biased / n_units)[:, None]
        noisy = laplace_mechanism(rand, values, step.sensitivity.value(), noise)[:, 0]
        split = np.rint(noisy * n_units) > theta_u
        keep = ~split
        leaves.append((rep[keep], tract[keep], lo_code[keep], lo_code[keep] + width))
        rep, tract = np.repeat(rep[split], 2), np.repeat(tract[split], 2)
        j = (np.repeat(j[split], 2) * 2 + np.tile([0, 1], int(split.sum()))).astype(np.int64)
    parts = [np.concatenate([leaf[i] for leaf in leaves]) if leaves else np.zeros(0, np.int64)
             for i in range(4)]
    order = np.lexsort((parts[2], parts[1], parts[0]))
    return Bins(*(p[order].astype(np.int64) for p in parts), depth_cap)


# ---------------------------------------------------------------------------------------------
# Step 2: the bin statistics


@dataclass(frozen=True)
class BinSummary:
    """The DP release of one run: every kept bin of every (rep, tract), in order.

    ``count`` is the rounded noisy count c̃_k (post-processing of ``noisy_count``); ``var_x``
    and ``var_y`` the variances of the Gaussian noise on s̃_k and t̃_k (public: bin edge and
    calibration). ``noise_x``/``noise_y`` (the sums' calibrated noise) are kept for Algorithm
    3's spread.
    """

    labels: np.ndarray
    n_reps: int
    n_tracts: int
    rep: np.ndarray
    tract: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    noisy_count: np.ndarray
    count: np.ndarray
    sum_x: np.ndarray
    sum_y: np.ndarray
    var_x: np.ndarray
    var_y: np.ndarray
    noise_x: GridGaussian
    noise_y: GridGaussian

    @property
    def group(self) -> np.ndarray:
        return self.rep * self.n_tracts + self.tract


def _gauss_variance(noise: GridGaussian, sensitivity: np.ndarray) -> np.ndarray:
    """Variance of ``gaussian_mechanism``'s noise: (Δ/steps)²·σ² (the discrete Gaussian's
    variance is below σ² by less than 1e-100 relative at these σ², CKS 2020 Prop. 19)."""
    return (np.asarray(sensitivity, dtype=float) / noise.grid_steps) ** 2 * float(noise.sigma2)


def release_bin_stats(batch: TractBatch, records: _SortedRecords, bins: Bins,
                      steps: dict[str, NoiseStep], rand: Randomness, reps: int, min_count: int,
                      meter: Meter = NO_METER) -> BinSummary:
    """Alg. 1 lines 3–11 and Alg. 2 line 3 for the given bins (already released)."""
    cnt_step, x_step, y_step = steps[COUNTS], steps[SUMS_X], steps[SUMS_Y]
    a, b = records.positions(bins.tract, bins.lo_code, bins.hi_code)
    labels = batch.labels[np.unique(bins.tract)]
    noisy_count = np.zeros(bins.rep.size)
    if bins.rep.size:
        values = (b - a).astype(float)[:, None]
        meter.spend(labels, cnt_step.guarantee, cnt_step.repeat * reps)
        noisy_count = gaussian_mechanism(rand, values, cnt_step.sensitivity.value(),
                                         cnt_step.noise)[:, 0]
    count = np.rint(noisy_count).astype(np.int64)
    kept = count >= min_count
    a, b, hi = a[kept], b[kept], bins.hi[kept]
    sum_x, sum_y = np.zeros(hi.size), np.zeros(hi.size)
    if hi.size:
        kept_labels = batch.labels[np.unique(bins.tract[kept])]
        sx = (records.cum_x[b] - records.cum_x[a])[:, None]
        meter.spend(kept_labels, x_step.guarantee, x_step.repeat * reps)
        sum_x = gaussian_mechanism(rand, sx, x_step.sensitivity.value(bin_hi=hi),
                                   x_step.noise)[:, 0]
        sy = (records.cum_y[b] - records.cum_y[a])[:, None]
        meter.spend(kept_labels, y_step.guarantee, y_step.repeat * reps)
        sum_y = gaussian_mechanism(rand, sy, y_step.sensitivity.value(), y_step.noise)[:, 0]
    return BinSummary(batch.labels, reps, batch.n_tracts, bins.rep[kept], bins.tract[kept],
                      bins.lo[kept], hi, noisy_count[kept], count[kept], sum_x, sum_y,
                      _gauss_variance(x_step.noise, x_step.sensitivity.value(bin_hi=hi)),
                      _gauss_variance(y_step.noise,
                                      np.full(hi.size, y_step.sensitivity.value())),
                      x_step.noise, y_step.noise)


# ---------------------------------------------------------------------------------------------
# Step 3: Algorithm 2's bias-corrected estimator and Theorem 4.2's interval


def bias_corrected_fit(summary: BinSummary, level: float = 0.95) -> Outcome:
    """β̃ = (Σ w z zᵀ − Σ w D)⁻¹ Σ w z t̃ per (rep, tract), z = (c̃, s̃), w = 1/c̃; p25/p75 with
    Thm 4.2's sandwich standard errors. Fails (no value) with fewer than 3 kept bins (Thm 4.2
    needs K > d = 2) or when the corrected design is not positive definite."""
    R, T = summary.n_reps, summary.n_tracts
    g, size = summary.group, R * T
    c = summary.count.astype(float)
    s, t, v = summary.sum_x, summary.sum_y, summary.var_x
    w = 1.0 / c

    def total(values):
        return np.bincount(g, weights=values, minlength=size)

    k = np.bincount(g, minlength=size).astype(float)
    a00, a01, a11 = total(c), total(s), total(w * s * s - w * v)  # w·c² = c, w·c·s = s
    r0, r1 = total(t), total(w * s * t)
    det = a00 * a11 - a01 * a01
    ok = (k > N_PARAMS) & (a00 > 0) & (det > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.stack([a11, -a01, a00]) / np.where(ok, det, np.nan)  # (i00, i01, i11)
        icpt = inv[0] * r0 + inv[1] * r1
        slope = inv[1] * r0 + inv[2] * r1
        resid = t - icpt[g] * c - slope[g] * s
        q0 = resid  # c̃·w·resid
        q1 = w * s * resid + w * v * slope[g]
        h00, h01, h11 = total(q0 * q0), total(q0 * q1), total(q1 * q1)
        factor = k / (k - N_PARAMS)
        # Σ̃ = factor · A⁻¹ H A⁻¹ (A symmetric), entries of the 2×2 product by hand.
        m00 = inv[0] * h00 + inv[1] * h01
        m01 = inv[0] * h01 + inv[1] * h11
        m10 = inv[1] * h00 + inv[2] * h01
        m11 = inv[1] * h01 + inv[2] * h11
        cov00 = factor * (m00 * inv[0] + m01 * inv[1])
        cov01 = factor * (m00 * inv[1] + m01 * inv[2])
        cov11 = factor * (m10 * inv[1] + m11 * inv[2])
    z = float(stats.norm.ppf(0.5 + level / 2.0))
    p25, p75, failed, reason = blank(R, T)
    extras = {}
    for name, xs in (("p25", X_LOW), ("p75", X_HIGH)):
        pred = icpt + slope * xs
        se = np.sqrt(np.maximum(cov00 + 2 * xs * cov01 + xs * xs * cov11, 0.0))
        pred, se = np.where(ok, pred, np.nan), np.where(ok, se, np.nan)
        (p25 if name == "p25" else p75)[:] = pred.reshape(R, T)
        extras[f"{name}_se"] = se.reshape(R, T)
        extras[f"{name}_lo"] = (pred - z * se).reshape(R, T)
        extras[f"{name}_hi"] = (pred + z * se).reshape(R, T)
    extras["bins"] = k.reshape(R, T)
    failed[:] = ~ok.reshape(R, T)
    few = (k <= N_PARAMS).reshape(R, T)
    reason[:] = np.where(few, f"fewer than {N_PARAMS + 1} bins kept",
                         np.where(failed, "noisy design is singular", ""))
    return Outcome(p25, p75, failed, reason, extras)


# ---------------------------------------------------------------------------------------------
# Step 4: Algorithm 3's synthetic data


def synthesize(summary: BinSummary, rand: Randomness) -> pd.DataFrame:
    """Synthetic rows (columns tract, bin, bin_lo, bin_hi, x, y) from one run's bin summary,
    no extra budget.

    Per kept bin, c̃_k rows with x_i = s̃_k/c̃_k + (ξ_i − ξ̄)/c̃_k, ξ_i of variance c̃_k·Var ξ_s,k
    (Alg. 3 line 4), likewise y: the rows' sums are exactly s̃_k and t̃_k (Cor. 3.1: the
    aggregated model on them is the estimate), and given those sums the rows have Alg. 3's
    law. ξ is drawn with the exact sampler on zeros: independent of the data, so it costs no
    budget. ``bin`` numbers the kept bins of a tract from 0 (by lower edge); ``bin_lo``/``bin_hi``
    are its released edges (the bias correction D_k needs them); x and y are not clipped
    (clipping would break Cor. 3.1).
    """
    if summary.n_reps != 1:
        raise ValueError("synthesize takes the summary of one run (reps = 1)")
    c = summary.count
    rows = np.repeat(np.arange(c.size), c)
    first = np.r_[0, np.flatnonzero(np.diff(summary.tract)) + 1]
    bin_no = np.arange(c.size) - np.repeat(first, np.diff(np.r_[first, c.size]))

    def spread(var_sum: np.ndarray, noise: GridGaussian, total: np.ndarray) -> np.ndarray:
        if rows.size == 0:
            return np.zeros(0)
        # gaussian_mechanism's sd for sensitivity Δ is Δ·σ/steps: choose Δ for sd √(c̃·var).
        sens = np.sqrt(c * var_sum)[rows] * noise.grid_steps / math.sqrt(noise.sigma2)
        xi = gaussian_mechanism(rand, np.zeros((rows.size, 1)), sens, noise)[:, 0]
        xi_bar = np.bincount(rows, weights=xi, minlength=c.size) / c
        return (total / c)[rows] + (xi - xi_bar[rows]) / c[rows]

    return pd.DataFrame({"tract": summary.labels[summary.tract[rows]],
                         "bin": bin_no[rows].astype(np.int64),
                         "bin_lo": summary.lo[rows], "bin_hi": summary.hi[rows],
                         "x": spread(summary.var_x, summary.noise_x, summary.sum_x),
                         "y": spread(summary.var_y, summary.noise_y, summary.sum_y)})


# ---------------------------------------------------------------------------------------------
# The estimator


def _release(batch: TractBatch, budget: RunBudget, rand: Randomness, reps: int, hp: dict,
             meter: Meter) -> BinSummary:
    _check_hp(hp)
    steps = {s.name: s for s in budget.steps}
    tracts = np.flatnonzero(batch.n >= MIN_RECORDS)
    records = _SortedRecords(batch, int(hp["max_depth"]))
    bins = privtree_bins(batch, records, tracts, steps[PRIVTREE], rand, reps, hp, meter)
    return release_bin_stats(batch, records, bins, steps, rand, reps, int(hp["min_count"]),
                             meter)


@register
class BinAgg(Estimator):
    """Lin, Slavković & Bhoomireddy's BinAgg (Alg. 1–2, Thm 4.2) per tract; see the module doc.

    Guarantee: ZCDP, the composition of PrivTree's derived pure ε (ρ = ε²/2) and the three
    discrete-Gaussian bin statistics (2 bins per replace-one change each), ≤ ε²/2.
    """

    name = "BinAgg"
    defaults = DEFAULTS
    # Publishable: every draw is exact (grid Laplace and grid Gaussian), PrivTree's
    # discrete-Laplace map is proved in docs/binagg.md and recomputed by the release audit.
    publishable = True
    # Not in the default full suite: like DPGDzCDP its budget means rho = epsilon^2/2, and a
    # suite holds at most one zCDP estimator (dpatlas/release/allocate.py). Name it in profile.suite.
    in_default_suite = False
    summary = ("PrivTree bins, Gaussian bin counts and sums, bias-corrected weighted regression "
               "with CLT intervals (zCDP, rho = epsilon^2/2)")
    sampler = ("grid Laplace (PrivTree) and grid Gaussian (bin statistics): exact discrete "
               "samplers (CKS 2020)")

    def _noise_steps(self, epsilon, delta, hp):
        return binagg_steps(epsilon, hp)

    def _run(self, batch, budget, rand, reps, hp, meter):
        return bias_corrected_fit(_release(batch, budget, rand, reps, hp, meter),
                                  float(hp["level"]))

    def peak_bytes(self, n, **hp):
        return _FIXED_BYTES + _BYTES_PER_RECORD * np.asarray(n, dtype=np.int64)


def binagg_synthetic(batch: TractBatch, epsilon: float, rand: Randomness, *,
                     meter: Meter = NO_METER, **hyper: Any) -> tuple[Outcome, pd.DataFrame]:
    """One BinAgg run: its estimate (Outcome, arrays (1, tracts)) and Alg. 3's synthetic rows
    (columns tract, bin, bin_lo, bin_hi, x, y) from the same released bin summary: no extra
    budget. Tracts with fewer than 2 records draw nothing and are marked failed."""
    est = get(BinAgg.name)
    hp = est.hyper(hyper)
    steps = est.noise_steps(epsilon, None, **hp)
    summary = _release(batch, RunBudget(float(epsilon), None, tuple(steps)), rand, 1, hp, meter)
    out = bias_corrected_fit(summary, float(hp["level"]))
    small = (batch.n < MIN_RECORDS)[None, :]
    out.failed[:] |= small
    out.reason[:] = np.where(small, f"fewer than {MIN_RECORDS} records", out.reason)
    return out, synthesize(summary, rand)
