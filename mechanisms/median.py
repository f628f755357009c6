"""Medians of many tracts' values at once: exact, exponential-mechanism, widened, smooth-sensitivity.

All DP medians here take, per tract, the sorted values ``z`` (clipped to a public [lo, hi]) and
``k``, the most values one record can change. Outputs of the exponential mechanisms are points
of a fixed public grid of ``GRID_POINTS`` points on [lo, hi] (see ``exp_median``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .noise import Randomness

GRID_POINTS = 2**20  # output grid of the exponential-mechanism medians: (hi-lo)/2^20 ≈ 2e-6


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


def exp_median(seg: Segments, epsilon: np.ndarray, k: np.ndarray, lo: float, hi: float,
               rand: Randomness, reps: int = 1, widen: float = 0.0) -> np.ndarray:
    """ε-DP median per tract by the exponential mechanism (McSherry & Talwar 2007).

    Candidates: the grid ``lo + i·(hi−lo)/GRID_POINTS``, i = 0..GRID_POINTS. Utility of a grid
    point r: ``u(r) = −|#{z < r} − m/2|``. With ``widen`` = θ > 0 (DPWideTheilSen) the values
    below the median move down by θ and those above move up by θ, which gives
    ``u(r) = −|min(A, h) + max(B − h, 0) − m/2|`` with ``A = #{z < r+θ}``, ``B = #{z < r−θ}``,
    ``h = ⌊m/2⌋``: every point within θ of the median (or of a run of tied values at it) gets
    the top utility. Changing one record changes, adds or removes at most k values; each moves
    A, B (and the counts below r) by at most 1 and m/2 by at most 1/2, so u moves by at most k
    in total, and sampling r with probability ∝ exp(ε·u(r)/(2k)) is ε-DP (McSherry–Talwar).
    Grid points between consecutive breakpoints share a utility, so we pick an interval with
    weight (grid points in it)·exp(ε·u/(2k)), then a grid point in it uniformly (exact integer
    draw). tests/test_estimators.py checks the output law against this formula point by point.

    ``epsilon``, ``k``: per tract. Returns an array (reps, n_tracts).
    """
    T = seg.n_tracts
    m = seg.m
    eps = np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (T,))
    k = np.broadcast_to(np.asarray(k, dtype=np.float64), (T,))
    step = (hi - lo) / GRID_POINTS
    zoff = seg.offsets
    boff = zoff[:-1] + 2 * np.arange(T)  # start of tract t in the bookended array
    size = int(zoff[-1] + 2 * T)
    # Breakpoints: lo, the sorted values (shifted by θ away from the median when widening), hi.
    tract_of_z = np.repeat(np.arange(T), m)
    rank = np.arange(zoff[-1]) - zoff[tract_of_z] + 1  # 1-based rank within the tract
    z = seg.z
    if widen > 0:
        z = np.clip(np.where(rank <= m[tract_of_z] / 2.0, z - widen, z + widen), lo, hi)
    # Grid points <= v: floor((v - lo)/step) + 1; the lo bookend counts 0, the hi bookend all.
    c = np.empty(size, dtype=np.int64)
    c[np.arange(zoff[-1]) + 2 * tract_of_z + 1] = np.clip(
        np.floor((z - lo) / step).astype(np.int64) + 1, 0, GRID_POINTS + 1)
    c[boff] = 0
    c[boff + m + 1] = GRID_POINTS + 1
    # Interval j of tract t sits at position boff[t] + j, j = 0..m[t].
    n_int = m + 1
    tract_of_int = np.repeat(np.arange(T), n_int)
    pos = np.arange(size - T) + tract_of_int  # skip each tract's hi bookend
    j = pos - boff[tract_of_int]
    count = c[pos + 1] - c[pos]
    utility = -np.abs(j - m[tract_of_int] / 2.0)
    with np.errstate(divide="ignore"):
        logw = np.log(count.astype(np.float64)) + eps[tract_of_int] * utility / (2.0 * k[tract_of_int])
    u = rand.uniform01((reps, T))
    chosen = np.empty((reps, T), dtype=np.int64)
    int_off = np.concatenate([[0], np.cumsum(n_int)])
    for t in range(T):
        lw = logw[int_off[t]:int_off[t + 1]]
        cum = np.cumsum(np.exp(lw - lw.max()))
        # Inversion: the first interval whose cumulative weight exceeds u·total.
        idx = np.searchsorted(cum, u[:, t] * cum[-1], side="right")
        chosen[:, t] = int_off[t] + np.minimum(idx, lw.size - 1)
    start = c[pos[chosen]]
    width = count[chosen]
    grid_index = start + rand.below(width.astype(np.uint64)).astype(np.int64)
    return lo + grid_index * step


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
