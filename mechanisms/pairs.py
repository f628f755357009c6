"""Pairs of records within each tract, and their Theil–Sen predictions, vectorised over tracts.

Pairs come from the round-robin decomposition of the complete graph on a tract's records into
perfect matchings (n even: n−1 matchings; n odd: add a dummy record and drop its pairs, n
matchings). *All pairs* uses every matching; *k matchings* samples k of them without
replacement after a random relabelling of the records. Either way a record lies in at most k
pairs (k = n−1 for all pairs): this bounds the sensitivity of every median of the pairs.

Tracts of equal size share one index table, so the work is a handful of numpy calls per
distinct tract size, not per tract.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .batch import TractBatch
from .noise import Randomness


@dataclass(frozen=True)
class Pairs:
    """Record index pairs (global indices into the batch), grouped by tract in tract order."""

    tract: np.ndarray  # int32, tract index of each pair, non-decreasing
    i: np.ndarray  # int64 global record index
    j: np.ndarray
    k: np.ndarray  # per tract: the most pairs any one record lies in


def _round_robin(n_even: int, rounds: np.ndarray | None = None) -> np.ndarray:
    """Matchings of the circle method: array (..., n_even/2, 2) of record indices.

    Round r pairs (r, n_even−1) and ((r+o) mod (n_even−1), (r−o) mod (n_even−1)) for
    o = 1 … n_even/2 − 1. ``rounds`` (any shape) selects rounds; default all n_even − 1 of them.
    Building only the chosen rounds keeps k matchings at O(k·n) memory, not O(n²).
    """
    r = n_even - 1
    rounds = np.arange(r) if rounds is None else np.asarray(rounds, dtype=np.int64)
    rr = rounds[..., None]
    offs = np.arange(1, n_even // 2)
    fixed = np.stack([rounds, np.full(rounds.shape, r)], axis=-1)[..., None, :]
    a = (rr + offs) % r
    b = (rr - offs) % r
    return np.concatenate([fixed, np.stack([a, b], axis=-1)], axis=-2)


def _sorted_by_tract(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple:
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty.astype(np.int32), empty, empty
    tract = np.concatenate([p[0] for p in parts])
    i = np.concatenate([p[1] for p in parts])
    j = np.concatenate([p[2] for p in parts])
    order = np.argsort(tract, kind="stable")
    return tract[order].astype(np.int32), i[order], j[order]


def all_pairs(batch: TractBatch) -> Pairs:
    """Every unordered pair of records within each tract: tract by tract, and within a tract
    in ``numpy.triu_indices`` order.

    Each tract's pairs go straight to their place (the running sum of n(n−1)/2 before it),
    one group of equal-size tracts at a time, so no sort over all pairs is needed.
    """
    n = batch.n.astype(np.int64)
    per_tract = np.where(n >= 2, n * (n - 1) // 2, 0)
    first = np.concatenate([[0], np.cumsum(per_tract)])
    total = int(first[-1])
    tract = np.empty(total, dtype=np.int32)
    i = np.empty(total, dtype=np.int64)
    j = np.empty(total, dtype=np.int64)
    for size in np.unique(n[n >= 2]):
        tracts = np.nonzero(n == size)[0]
        a, b = np.triu_indices(int(size), 1)
        at = (first[tracts][:, None] + np.arange(a.size)).ravel()
        base = batch.starts[tracts][:, None]
        tract[at] = np.repeat(tracts, a.size)
        i[at] = (base + a).ravel()
        j[at] = (base + b).ravel()
    return Pairs(tract, i, j, np.maximum(batch.n - 1, 1))


def k_matchings(batch: TractBatch, k: int, rand: Randomness) -> Pairs:
    """Pairs of k round-robin matchings per tract, chosen uniformly without replacement."""
    if k < 1:
        raise ValueError("k must be >= 1")
    n = batch.n
    parts = []
    for size in np.unique(n[n >= 2]):
        size = int(size)
        tracts = np.nonzero(n == size)[0]
        n_even = size + (size % 2)
        rounds = n_even - 1
        kk = min(k, rounds)
        # Uniform random choices from uniform random 64-bit keys (ties have probability ~2^-64).
        pick = np.argsort(rand.words(tracts.size * rounds).reshape(tracts.size, rounds),
                          axis=1)[:, :kk]
        perm = np.argsort(rand.words(tracts.size * n_even).reshape(tracts.size, n_even), axis=1)
        chosen = _round_robin(n_even, pick)  # (tracts, kk, n_even/2, 2), relabelled order
        rec = np.take_along_axis(perm, chosen.reshape(tracts.size, -1), axis=1)
        rec = rec.reshape(tracts.size, -1, 2)
        keep = (rec < size).all(axis=2)  # drop pairs with the dummy record
        base = batch.starts[tracts][:, None]
        t_idx = np.broadcast_to(tracts[:, None], keep.shape)[keep]
        parts.append((t_idx, (base + rec[..., 0])[keep], (base + rec[..., 1])[keep]))
    tract, i, j = _sorted_by_tract(parts)
    return Pairs(tract, i, j, np.minimum(np.full(n.shape, k), np.maximum(n - 1, 1)))


def theil_sen_predictions(batch: TractBatch, pairs: Pairs, x_stars: tuple[float, ...],
                          lo: float, hi: float) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per-pair predictions at each of ``x_stars``, clipped to [lo, hi]; pairs with equal x
    are dropped. The pairs' slopes and midpoints are computed once for all ``x_stars``.

    Returns (tract index, [z at each x_star]) for the kept pairs, still grouped by tract.
    """
    tract, z, _ = theil_sen_predictions_and_places(batch, pairs, x_stars, lo, hi)
    return tract, z


def theil_sen_predictions_and_places(batch: TractBatch, pairs: Pairs,
                                     x_stars: tuple[float, ...], lo: float, hi: float
                                     ) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """``theil_sen_predictions`` and the kept pairs' places in ``pairs`` (int64)."""
    xi, xj = batch.x[pairs.i], batch.x[pairs.j]
    keep = xi != xj
    place = np.flatnonzero(keep)
    xi, xj = xi[keep], xj[keep]
    yi, yj = batch.y[pairs.i[keep]], batch.y[pairs.j[keep]]
    slope = (yj - yi) / (xj - xi)
    x_mid = (xi + xj) / 2.0
    y_mid = (yi + yj) / 2.0
    del xi, xj, yi, yj
    # The same expression, operation for operation, as one prediction at a time: identical
    # floats, so the medians (and their noise) do not depend on how many x_stars are asked.
    z = [np.clip(slope * (x_star - x_mid) + y_mid, lo, hi) for x_star in x_stars]
    return pairs.tract[keep], z, place


def theil_sen_points(batch: TractBatch, pairs: Pairs, x_star: float, lo: float, hi: float
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per-pair predictions at ``x_star``, clipped to [lo, hi]; pairs with equal x are dropped.

    Returns (tract index, z) for the kept pairs, still grouped by tract.
    """
    tract, (z,) = theil_sen_predictions(batch, pairs, (x_star,), lo, hi)
    return tract, z


def first_pair_of_tract(n: np.ndarray) -> np.ndarray:
    """Where each tract's pairs start in ``all_pairs`` of a batch of tract sizes ``n``."""
    n = np.asarray(n, dtype=np.int64)
    per_tract = np.where(n >= 2, n * (n - 1) // 2, 0)
    return np.concatenate([[0], np.cumsum(per_tract)[:-1]]).astype(np.int64)


def chunk_tracts(batch: TractBatch, max_pairs: int) -> list[np.ndarray]:
    """Consecutive groups of tracts whose all-pairs counts sum to about ``max_pairs`` at most."""
    cost = batch.n * (batch.n - 1) // 2
    chunks, start, acc = [], 0, 0
    for t, c in enumerate(cost):
        if acc and acc + c > max_pairs:
            chunks.append(np.arange(start, t))
            start, acc = t, 0
        acc += int(c)
    chunks.append(np.arange(start, batch.n_tracts))
    return [c for c in chunks if c.size]
