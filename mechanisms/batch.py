"""Records grouped by tract, and per-tract sufficient statistics, vectorised across tracts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

X_LOW = 0.25  # the parent rank at which p25 is predicted
X_HIGH = 0.75  # ... and p75


@dataclass(frozen=True)
class TractBatch:
    """Records of many tracts, contiguous by tract: tract t owns ``x[starts[t]:starts[t+1]]``.

    Ranks must already be clipped to the public bounds [0, 1]; the constructor checks it,
    because every sensitivity in this package assumes it.
    """

    x: np.ndarray
    y: np.ndarray
    starts: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        x, y, s = self.x, self.y, self.starts
        if x.shape != y.shape or x.ndim != 1:
            raise ValueError("x and y must be 1-d arrays of equal length")
        if s.ndim != 1 or s.size < 1 or s[0] != 0 or s[-1] != x.size or np.any(np.diff(s) < 0):
            raise ValueError("starts must run from 0 to len(x), non-decreasing")
        if self.labels.size != s.size - 1:
            raise ValueError("one label per tract")
        if x.size and (not np.all(np.isfinite(x)) or not np.all(np.isfinite(y))):
            raise ValueError("x and y must be finite")
        if x.size and (x.min() < 0 or x.max() > 1 or y.min() < 0 or y.max() > 1):
            raise ValueError("x and y must lie in [0, 1] (clip to the public bounds first)")

    @classmethod
    def from_labels(cls, labels, x, y) -> "TractBatch":
        """Group records by tract label (any order); tracts come out in sorted label order."""
        labels = np.asarray(labels)
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        order = np.argsort(labels, kind="stable")
        sorted_labels = labels[order]
        uniq, first = np.unique(sorted_labels, return_index=True)
        starts = np.append(first, labels.size).astype(np.int64)
        return cls(x[order], y[order], starts, uniq)

    @classmethod
    def single(cls, x, y) -> "TractBatch":
        x = np.asarray(x, dtype=np.float64).ravel()
        y = np.asarray(y, dtype=np.float64).ravel()
        return cls(x, y, np.array([0, x.size], dtype=np.int64), np.array(["tract"]))

    @property
    def n_tracts(self) -> int:
        return self.starts.size - 1

    @cached_property
    def n(self) -> np.ndarray:
        return np.diff(self.starts)

    @cached_property
    def tract_of_record(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_tracts), self.n)

    def tract_sum(self, values: np.ndarray) -> np.ndarray:
        """Per-tract sums of a per-record array (last axis = records); empty tracts give 0.

        Each tract's sum is computed from its own records alone (``np.add.reduceat`` over its
        segment), so its floating-point bits cannot depend on any other tract. Differences of
        one running sum over the batch would round each tract's sum at the magnitude of the
        records before it: another tract's data could then move the value by an ulp, and the
        grid rounding before the noise by one unit, outside parallel composition.
        """
        values = np.asarray(values, dtype=np.float64)
        out = np.zeros(values.shape[:-1] + (self.n_tracts,))
        filled = np.nonzero(self.n > 0)[0]
        if filled.size:
            out[..., filled] = np.add.reduceat(values, self.starts[filled], axis=-1)
        return out

    def subset(self, tracts: np.ndarray) -> "TractBatch":
        """The batch restricted to some tracts (indices), keeping their order."""
        tracts = np.asarray(tracts, dtype=np.int64)
        n = self.n[tracts]
        starts = np.concatenate([[0], np.cumsum(n)]).astype(np.int64)
        idx = np.repeat(self.starts[tracts] - starts[:-1], n) + np.arange(starts[-1])
        return TractBatch(self.x[idx], self.y[idx], starts, self.labels[tracts])


@dataclass(frozen=True)
class SufficientStats:
    n: np.ndarray
    xbar: np.ndarray
    ybar: np.ndarray
    nvar: np.ndarray  # Σ (x - x̄)²
    ncov: np.ndarray  # Σ (x - x̄)(y - ȳ)
    nvar_y: np.ndarray  # Σ (y - ȳ)²


def sufficient_stats(batch: TractBatch) -> SufficientStats:
    """Centred per-tract statistics (two passes, so no catastrophic cancellation)."""
    n = batch.n.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        xbar = batch.tract_sum(batch.x) / n
        ybar = batch.tract_sum(batch.y) / n
    dx = batch.x - xbar[batch.tract_of_record]
    dy = batch.y - ybar[batch.tract_of_record]
    return SufficientStats(batch.n, xbar, ybar, batch.tract_sum(dx * dx),
                           batch.tract_sum(dx * dy), batch.tract_sum(dy * dy))


@dataclass(frozen=True)
class OLSFit:
    slope: np.ndarray
    intercept: np.ndarray
    p25: np.ndarray
    p75: np.ndarray
    se25: np.ndarray  # standard error of the prediction at x = 0.25
    se75: np.ndarray
    ok: np.ndarray  # n >= 2 and nvar > 0


def ols(stats: SufficientStats) -> OLSFit:
    n = stats.n.astype(np.float64)
    ok = (stats.n >= 2) & (stats.nvar > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(ok, stats.ncov / stats.nvar, np.nan)
        intercept = stats.ybar - slope * stats.xbar
        rss = np.maximum(stats.nvar_y - slope * stats.ncov, 0.0)
        sigma2 = np.where(stats.n > 2, rss / (n - 2), np.nan)

        def se(xs: float) -> np.ndarray:
            return np.sqrt(sigma2 * (1.0 / n + (xs - stats.xbar) ** 2 / stats.nvar))

        return OLSFit(slope, intercept, slope * X_LOW + intercept, slope * X_HIGH + intercept,
                      se(X_LOW), se(X_HIGH), ok)
