"""Medians of many tracts' values at once: exact, exponential-mechanism, widened, smooth-sensitivity.

All DP medians here take, per tract, the sorted values ``z`` (clipped to a public [lo, hi]) and
``k``, the most values one record can change. Outputs of the exponential mechanisms are points
of a fixed public grid of ``GRID_POINTS + 1`` points on [lo, hi], drawn exactly (see
``exp_median``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .noise import Randomness, geometric

GRID_POINTS = 2**20  # output grid of the exponential-mechanism medians: (hi-lo)/2^20 ≈ 2e-6
EXP_RATE_DENOMINATOR = 2**20  # ε_med is used as the rational rate/2^20, rounded down
_MAX_RATE = 2**40  # ε_med ≤ 2^20: keeps every rate an exact uint64 with room to spare


def exp_median_rate(epsilon_med: float) -> int:
    """The integer rate s = ⌊ε_med · 2^20⌋ the exponential-mechanism median samples with.

    The mechanism run at rate s is exactly (s/2^20)-DP, at most ε_med, whatever k and n are.
    """
    eps = float(epsilon_med)
    if not math.isfinite(eps) or eps <= 0:
        raise ValueError(f"epsilon per median must be a finite number > 0, got {epsilon_med!r}")
    rate = math.floor(eps * EXP_RATE_DENOMINATOR)  # exact: scaling by 2^20 is exact in binary
    if rate < 1:
        raise ValueError(f"epsilon per median {eps:.3g} is below the exponential mechanism's "
                         f"quantum 1/{EXP_RATE_DENOMINATOR}: give the median a larger budget")
    if rate > _MAX_RATE:
        raise ValueError(f"epsilon per median {eps:.3g} is above "
                         f"{_MAX_RATE // EXP_RATE_DENOMINATOR}: no median needs that much "
                         "budget; lower epsilon")
    return rate


def exp_median_epsilon(rate: int) -> float:
    """The ε guaranteed by an exponential-mechanism median at integer rate ``rate``: rate/2^20."""
    return rate / EXP_RATE_DENOMINATOR


@dataclass(frozen=True)
class Segments:
    """Values sorted within each tract: tract t owns ``z[offsets[t]:offsets[t+1]]``."""

    z: np.ndarray
    offsets: np.ndarray

    @property
    def m(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def n_tracts(self) -> int:
        return self.offsets.size - 1

    @classmethod
    def build(cls, tract: np.ndarray, z: np.ndarray, n_tracts: int) -> "Segments":
        """Sort ``z`` within tracts; ``tract`` must be non-decreasing (pairs come grouped)."""
        counts = np.bincount(tract, minlength=n_tracts)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # Pairs arrive grouped by tract, so sorting each slice sorts by (tract, value). A loop
        # of np.sort calls (SIMD sort) beats one lexsort/argsort over everything by ~40x.
        order = np.argsort(tract, kind="stable") if np.any(np.diff(tract) < 0) else None
        out = z[order] if order is not None else z.copy()
        for t in np.nonzero(counts)[0]:
            out[offsets[t]:offsets[t + 1]].sort()
        return cls(out, offsets)


def exact_median(seg: Segments) -> np.ndarray:
    """Non-private median per tract (NaN where a tract has no values)."""
    m = seg.m
    out = np.full(seg.n_tracts, np.nan)
    has = m > 0
    lo_idx = seg.offsets[:-1] + (m - 1) // 2
    hi_idx = seg.offsets[:-1] + m // 2
    out[has] = (seg.z[lo_idx[has]] + seg.z[hi_idx[has]]) / 2.0
    return out


def bookended_median(seg: Segments, hi: float) -> np.ndarray:
    """Element ``(m+2)//2`` of [lo, z_1..z_m, hi] per tract: z_(m//2+1), or hi when m = 0."""
    m = seg.m
    idx = seg.offsets[:-1] + m // 2
    return np.where(m > 0, seg.z[np.minimum(idx, max(seg.z.size - 1, 0))] if seg.z.size else hi,
                    hi)


# ---------------------------------------------------------------------------------------------
# The exponential-mechanism median, sampled exactly
#
# Floats enter in two places only: placing each value on the grid (a fixed function of that
# value alone, so part of the utility's definition; see _Breakpoints) and sizing batches of
# trials. Given the utility, the law of the output depends on integers and exact Bernoullis.

_MAX_K = 2**22  # 4·k·2^20 <= 2^44: the largest scale noise.geometric samples exactly
_ESTIMATE_LEVELS = 16  # stratified geometric quantiles for the acceptance-rate estimate
_MAX_TRIALS_PER_JOB = 2**16  # per (rep, tract) and round
_MAX_TRIALS_PER_ROUND = 2**19  # bounds a round's memory at about 60 MB


@dataclass(frozen=True)
class _Breakpoints:
    """The breakpoints b_0 = lo, b_1..b_m (the sorted values, widened), b_{m+1} = hi of each tract.

    :meth:`cutoff` gives C_i, the number of grid points ≤ b_i (C_0 = 0, C_{m+1} = grid size),
    reading the values lazily: the sampler needs a few C_i per tract and per trial, never all.
    Interval j (between b_j and b_{j+1}) holds the grid indices [C_j, C_{j+1}), each with exactly
    j breakpoints below it. C_i is a non-decreasing function of the value b_i alone, so one
    changed value still moves the count below any grid point by at most 1.
    """

    seg: Segments
    lo: float
    hi: float
    widen: float

    @property
    def n_grid(self) -> int:
        return GRID_POINTS + 1

    @property
    def step(self) -> float:
        return (self.hi - self.lo) / GRID_POINTS

    def cutoff(self, tract: np.ndarray, i: np.ndarray) -> np.ndarray:
        """C_i of ``tract`` for breakpoint indices ``i`` in [0, m+1] (int64 arrays, same shape)."""
        m = self.seg.m[tract]
        value_rank = np.clip(i, 1, np.maximum(m, 1))  # 1-based rank of the value b_i
        z = self.seg.z
        v = z[np.minimum(self.seg.offsets[tract] + value_rank - 1, z.size - 1)] if z.size \
            else np.full(np.shape(i), self.lo)
        if self.widen > 0:
            # DPWideTheilSen: the lower ⌊m/2⌋ values move down by θ, the others up by θ.
            v = np.clip(np.where(value_rank <= m // 2, v - self.widen, v + self.widen),
                        self.lo, self.hi)
        c = np.clip(np.floor((v - self.lo) / self.step).astype(np.int64) + 1, 0, self.n_grid)
        return np.where(i <= 0, 0, np.where(i > m, self.n_grid, c))

    def level_range(self, tract: np.ndarray, level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, size): the grid indices [start, start+size) of the points with D ≤ ``level``.

        D = |2j − m| for a point of interval j. The intervals with D ≤ g are the contiguous run
        j = ⌈(m−g)/2⌉ … ⌊(m+g)/2⌋ (clipped to 0 … m), so their points are one index range.
        """
        m = self.seg.m[tract]
        first = np.maximum((m - level + 1) // 2, 0)
        last = np.minimum((m + level) // 2, m)
        start = self.cutoff(tract, first)
        return start, self.cutoff(tract, last + 1) - start

    def first_cutoff_above(self, tract: np.ndarray, first: np.ndarray, last: np.ndarray,
                           threshold: np.ndarray) -> np.ndarray:
        """Least i in [first, last] with C_i > threshold, else last + 1 (C is sorted: bisect)."""
        lo, hi = first.copy(), last + 1
        while True:
            active = np.nonzero(lo < hi)[0]
            if not active.size:
                return lo
            mid = (lo[active] + hi[active]) // 2
            above = self.cutoff(tract[active], mid) > threshold[active]
            hi[active[above]] = mid[above]
            lo[active[~above]] = mid[~above] + 1

    def nearest_occupied_distance(self) -> np.ndarray:
        """D_min per tract: the least D = |2j − m| over intervals j holding a grid point."""
        tract = np.arange(self.seg.n_tracts)
        m = self.seg.m
        none = np.iinfo(np.int64).max
        # At or below the middle: the last occupied interval j <= ⌊m/2⌋ is the last j with
        # C_j < C_{⌊m/2⌋+1} (-1 if that count is 0: nothing below the middle).
        mid_low = m // 2
        j_low = self.first_cutoff_above(tract, np.zeros_like(m), mid_low + 1,
                                        self.cutoff(tract, mid_low + 1) - 1) - 1
        # At or above it: the first j >= ⌈m/2⌉ with C_{j+1} > C_{⌈m/2⌉} (m+1 if none).
        mid_high = (m + 1) // 2
        j_high = self.first_cutoff_above(tract, mid_high + 1, m + 1,
                                         self.cutoff(tract, mid_high)) - 1
        return np.minimum(np.where(j_low >= 0, m - 2 * j_low, none),
                          np.where(j_high <= m, 2 * j_high - m, none))


def _checked_rates(epsilon, T: int) -> np.ndarray:
    """exp_median_rate of each tract's ε_med (validated once per distinct value)."""
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (T,))
    values, where = np.unique(eps, return_inverse=True)
    return np.array([exp_median_rate(e) for e in values], dtype=np.int64)[where.reshape(T)]


def _checked_k(k, T: int) -> np.ndarray:
    kf = np.broadcast_to(np.asarray(k, dtype=np.float64), (T,))
    if np.any(~np.isfinite(kf)) or np.any(kf != np.floor(kf)) or np.any(kf < 1) \
            or np.any(kf > _MAX_K):
        raise ValueError(f"exp_median needs integer k (values one record moves) in [1, {_MAX_K}]")
    return kf.astype(np.int64)


def exp_median(seg: Segments, epsilon: np.ndarray, k: np.ndarray, lo: float, hi: float,
               rand: Randomness, reps: int = 1, widen: float = 0.0) -> np.ndarray:
    """Exactly (s/2^20)-DP median per tract, s = ⌊ε_med·2^20⌋: the exponential mechanism.

    Candidates: the grid ``lo + i·(hi−lo)/GRID_POINTS``, i = 0..GRID_POINTS. Utility of a grid
    point r: ``u(r) = −|#{z < r} − m/2|``. With ``widen`` = θ > 0 (DPWideTheilSen) the values
    below the median move down by θ and those above move up by θ, which gives
    ``u(r) = −|min(A, h) + max(B − h, 0) − m/2|`` with ``A = #{z < r+θ}``, ``B = #{z < r−θ}``,
    ``h = ⌊m/2⌋``: every point within θ of the median (or of a run of tied values at it) gets
    the top utility. Changing one record changes, adds or removes at most k values; each moves
    A, B (and the counts below r) by at most 1 and m/2 by at most 1/2, so u moves by at most k
    in total, and sampling r with probability ∝ exp(ε·u(r)/(2k)) is ε-DP (McSherry & Talwar
    2007, Thm 6) for ε = s/2^20 ≤ ε_med (:func:`exp_median_rate`).

    Sampling, exactly: a point of interval j (j breakpoints below it) has D = |2j − m| and
    target weight ρ^D, ρ = exp(−s/(4k·2^20)). Let G be geometric, P(G ≥ g) = ρ^g (CKS 2020
    Alg. 2's inner loop, ``noise.geometric``), D_min the least D of an occupied interval, and
    N(L), start(L) the size and first index of the run of grid points with D ≤ L. A trial draws
    G, L = G + D_min and R uniform on the whole grid; it accepts iff R < N(L) and outputs
    start(L) + R. Proof: P(trial outputs r) = Σ_g P(G = g)·1[D(r) ≤ g + D_min]/(grid size)
    = ρ^(D(r) − D_min)/(grid size) ∝ ρ^D(r); trials are independent, so the first accepted
    trial has exactly the target law. Integers and exact Bernoullis only; an empty interval has
    no index in any run, so it can never be output; a trial accepts with probability at least
    1/(grid size), so the loop ends.

    ``epsilon`` (ε_med), ``k``: per tract (broadcast). Returns an array (reps, n_tracts).
    """
    T = seg.n_tracts
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"exp_median needs finite bounds lo < hi, got [{lo}, {hi}]")
    if not (math.isfinite(widen) and widen >= 0):
        raise ValueError(f"exp_median needs a widening θ >= 0, got {widen}")
    if int(reps) < 1:
        raise ValueError(f"exp_median needs reps >= 1, got {reps}")
    rate = _checked_rates(epsilon, T)
    k = _checked_k(k, T)
    bp = _Breakpoints(seg, float(lo), float(hi), float(widen))
    d_min = bp.nearest_occupied_distance()
    # ρ = exp(−rate/(4k·2^20)): levels are geometric with P(G >= g) = exp(−g·rate/(4k·2^20)).
    level_scale = (4 * k * EXP_RATE_DENOMINATOR).astype(np.uint64)
    accept = _acceptance_estimate(bp, d_min, rate / level_scale.astype(np.float64))
    # About 1/a trials per job and round: one expected hit, few rounds, little waste.
    trials = np.clip(np.floor(1.0 / accept), 1, _MAX_TRIALS_PER_JOB).astype(np.int64)
    index = _sample_grid_indices(bp, d_min, level_scale, rate.astype(np.uint64), trials, rand,
                                 int(reps))
    return lo + index.reshape(int(reps), T) * bp.step


def _acceptance_estimate(bp: _Breakpoints, d_min: np.ndarray, decay: np.ndarray) -> np.ndarray:
    """Float estimate of a trial's acceptance probability E[N(G + D_min)]/(grid size) per tract.

    Averages N over the midpoints of ``_ESTIMATE_LEVELS`` equal-probability strata of G
    (P(G >= g) = exp(−decay·g)). It only sizes batches: it never changes the output law.
    """
    T = bp.seg.n_tracts
    survival = (np.arange(_ESTIMATE_LEVELS) + 0.5) / _ESTIMATE_LEVELS
    g = np.floor(-np.log(survival)[None, :] / decay[:, None])
    g = np.minimum(g, bp.seg.m[:, None]).astype(np.int64)  # N stops growing at g = m
    tract = np.repeat(np.arange(T), _ESTIMATE_LEVELS)
    _, size = bp.level_range(tract, (g + d_min[:, None]).ravel())
    return size.reshape(T, _ESTIMATE_LEVELS).mean(axis=1) / bp.n_grid


def _trials(bp: _Breakpoints, tract: np.ndarray, level: np.ndarray, rand: Randomness
            ) -> tuple[np.ndarray, np.ndarray]:
    """One trial per entry at level L = G + D_min: (accepted, grid index where accepted).

    R is uniform on the whole grid; the trial accepts iff R < N(L), and then R is uniform on
    [0, N(L)), so start(L) + R is a uniform point of the run with D ≤ L (no second draw needed).
    """
    start, size = bp.level_range(tract, level)
    r = rand.below(np.full(tract.size, np.uint64(bp.n_grid))).astype(np.int64)
    return r < size, start + r


def _sample_grid_indices(bp: _Breakpoints, d_min: np.ndarray, level_scale: np.ndarray,
                         rate: np.ndarray, trials: np.ndarray, rand: Randomness,
                         reps: int) -> np.ndarray:
    """Grid index per job (rep, tract) = rep·T + tract, by the level rejection of exp_median.

    Rounds: each pending job gets ``trials[tract]`` independent trials (at most
    ``_MAX_TRIALS_PER_ROUND`` in all); a job takes its first accepted trial in trial order, and
    jobs with none go round again. Which trial is taken depends only on acceptance, not on the
    output, so the taken output has the law of one accepted trial.
    """
    T = bp.seg.n_tracts
    out = np.empty(reps * T, dtype=np.int64)
    pending = np.arange(reps * T)
    while pending.size:
        per_job = trials[pending % T]
        take = max(1, int(np.searchsorted(np.cumsum(per_job), _MAX_TRIALS_PER_ROUND, "right")))
        jobs, per_job = pending[:take], per_job[:take]
        job_of_trial = np.repeat(np.arange(take), per_job)
        tract = jobs[job_of_trial] % T
        level = geometric(rand, level_scale[tract], rate[tract]) + d_min[tract]
        accepted, index = _trials(bp, tract, level, rand)
        hit = np.nonzero(accepted)[0]
        # Trials of a job are contiguous and in order: its first hit starts a new job id.
        first = hit[np.r_[True, job_of_trial[hit[1:]] != job_of_trial[hit[:-1]]]] \
            if hit.size else hit
        out[jobs[job_of_trial[first]]] = index[first]
        missed = np.ones(take, dtype=bool)
        missed[job_of_trial[first]] = False
        pending = np.concatenate([pending[take:], jobs[missed]])
    return out


def smooth_sensitivity(seg: Segments, k: np.ndarray, beta: np.ndarray, lo: float, hi: float
                       ) -> np.ndarray:
    """β-smooth upper bound on the local sensitivity of the median when a record moves k values.

    ``S_β(z) = max_{l≥0} e^{−βl} · max_{0≤t≤(l+1)k} (z_(c+t) − z_(c+t−(l+1)k))`` over the values
    bookended by lo and hi (indices clamped to the bookends), c the median index
    (Nissim, Raskhodnikova & Smith 2007, Prop. 3.4, generalised to k changed values as in the
    paper's Appendix E). The window is inclusive of t = (l+1)k, as in the paper's proof.
    """
    T = seg.n_tracts
    k = np.broadcast_to(np.asarray(k, dtype=np.int64), (T,))
    beta = np.broadcast_to(np.asarray(beta, dtype=np.float64), (T,))
    out = np.empty(T)
    span = hi - lo
    for t in range(T):
        zb = np.concatenate([[lo], seg.z[seg.offsets[t]:seg.offsets[t + 1]], [hi]])
        top = zb.size - 1
        c = zb.size // 2
        best = 0.0
        l = 0
        while True:
            w = (l + 1) * int(k[t])
            decay = np.exp(-beta[t] * l)
            if decay * span <= best:
                break  # no later l can beat the current bound
            a = np.arange(c - w, c + 1)
            d = zb[np.minimum(a + w, top)] - zb[np.maximum(a, 0)]
            best = max(best, decay * float(d.max()))
            if w >= top:
                break  # the window spans [lo, hi]: later terms are span·e^{-βl}, smaller
            l += 1
        out[t] = best
    return out
