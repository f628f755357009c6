"""The small-area model's kernel mean as it was before issue 22 (main at de13102: the
neighbour pairs queried afresh on every call), frozen as a reference: the golden test checks
the shared ``KernelPairs`` against it (to 1e-12: a sparse product sums in another order), and ``benchmarks/bench_levels.py`` times it
as its "before" path. Not for the release."""

from __future__ import annotations

import numpy as np
from scipy import spatial


def reference_kernel_mean(xy, values, weights, bandwidth_km):
    pairs = spatial.cKDTree(xy).query_pairs(3 * bandwidth_km, output_type="ndarray")
    i = np.concatenate([pairs[:, 0], pairs[:, 1]])
    j = np.concatenate([pairs[:, 1], pairs[:, 0]])
    ok = np.isfinite(values[j]) & (weights[j] > 0)
    i, j = i[ok], j[ok]
    d2 = np.sum((xy[i] - xy[j]) ** 2, axis=1)
    w = np.exp(-0.5 * d2 / bandwidth_km ** 2) * weights[j]
    num = np.bincount(i, w * values[j], minlength=len(xy))
    den = np.bincount(i, w, minlength=len(xy))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)
