"""A chunk's Theil–Sen predictions sorted within tracts, built once and shared by the point
estimate and its interval (issue 22).

The all-pairs predictions of a tract are a deterministic function of its records, so the
estimate (``theil_sen.py``) and the interval (``intervals.py``) of the same tracts need the
same pairs, the same predictions and the same sort. Inside :func:`sharing_sorted_predictions`
the first to build them for a chunk keeps them; the other finds them by the chunk's records
(compared in full, so a different chunk never matches). Nothing random is shared and nothing
is drawn here: sharing changes no published value, only how often the arithmetic is done.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np

from .batch import TractBatch
from .median import Segments
from .pairs import first_pair_of_tract


@dataclass(frozen=True)
class ClippedEnds:
    """The predictions clipped to an end of [lo, hi], in no set order: their tract, value (lo
    or hi) and place (the pair's index in ``all_pairs`` of the whole chunk, a public function of
    the tract sizes)."""

    tract: np.ndarray
    value: np.ndarray
    place: np.ndarray


@dataclass(frozen=True)
class SortedPredictions:
    """Per x*: the predictions sorted within tracts, and the clipped ones with their places."""

    segments: tuple[Segments, ...]
    clipped: tuple[ClippedEnds, ...]

    def restricted(self, tracts: np.ndarray) -> "SortedPredictions":
        """The same for some tracts only (indices, renumbered 0.. in that order)."""
        tracts = np.asarray(tracts, dtype=np.int64)
        new_index = np.full(self.segments[0].n_tracts, -1, dtype=np.int64)
        new_index[tracts] = np.arange(tracts.size)
        segments, clipped = [], []
        for seg, ends in zip(self.segments, self.clipped):
            m = seg.m[tracts]
            offsets = np.concatenate([[0], np.cumsum(m)]).astype(np.int64)
            segments.append(Segments(seg.z[runs(seg.offsets[:-1][tracts], m)], offsets))
            kept = np.nonzero(new_index[ends.tract] >= 0)[0]
            order = kept[np.argsort(new_index[ends.tract[kept]], kind="stable")]
            clipped.append(ClippedEnds(new_index[ends.tract[order]], ends.value[order],
                                       ends.place[order]))
        return SortedPredictions(tuple(segments), tuple(clipped))


def runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start, start+1, … (length of them) of each run, concatenated."""
    before = np.cumsum(lengths) - lengths  # entries of the earlier runs
    return np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))


def build_sorted_predictions(batch: TractBatch, x_stars: tuple[float, ...], lo: float,
                             hi: float, tracts: np.ndarray | None = None) -> SortedPredictions:
    """The all-pairs predictions of ``batch`` (a chunk) at ``x_stars``, clipped to [lo, hi] and
    sorted within tracts; of the tracts ``tracts`` only if given (their places stay those of
    the whole chunk). Taken from the shared store when the whole chunk is there."""
    key = (tuple(float(x) for x in x_stars), float(lo), float(hi))
    store = _STORE.get()
    if store is not None:
        for (x, y, starts, k), found in store:
            if k == key and _same_records(batch, x, y, starts):
                return found if tracts is None else found.restricted(tracts)
    built = _build(batch, key, tracts)
    if store is not None and tracts is None:
        store.append(((batch.x, batch.y, batch.starts, key), built))
    return built


def _same_records(batch: TractBatch, x, y, starts) -> bool:
    return (batch.starts.shape == starts.shape and np.array_equal(batch.starts, starts)
            and np.array_equal(batch.x, x) and np.array_equal(batch.y, y))


def _build(batch: TractBatch, key: tuple, tracts: np.ndarray | None) -> SortedPredictions:
    """All pairs, their predictions and the sort, one group of equal-size tracts at a time: a
    group's records form a (tracts, n) matrix, its pairs the columns ``triu_indices(n, 1)``,
    and each row is sorted in place. The floats are those of ``theil_sen_predictions`` (the
    same operations on the same values) and sorted rows are the sorted values, so the result
    is what ``all_pairs``, ``theil_sen_predictions`` and ``Segments.build`` give, without
    their pair index arrays or a sort call per tract."""
    x_stars, lo, hi = key
    first = first_pair_of_tract(batch.n)  # places are those of the whole chunk's all_pairs
    if tracts is not None:
        tracts = np.asarray(tracts, dtype=np.int64)
        first, batch = first[tracts], batch.subset(tracts)
    # the kept pairs (distinct x) per tract, counted from the records, so that each group's
    # sorted rows go straight to their place in the output
    kept = _pairs_with_distinct_x(batch)
    offsets = np.concatenate([[0], np.cumsum(kept)]).astype(np.int64)
    values = [np.empty(int(offsets[-1])) for _ in x_stars]
    ends: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in x_stars]
    for size in np.unique(batch.n[batch.n >= 2]):
        group = np.nonzero(batch.n == size)[0]
        for z, found, out in zip(_group_predictions(batch, group, int(size), x_stars, lo, hi),
                                 ends, values):
            # a dropped pair's prediction is NaN: no comparison holds, and it sorts last
            row, col = np.nonzero((z <= lo) | (z >= hi))
            found.append((group[row], z[row, col], first[group][row] + col))
            z.sort(axis=1)
            _copy_row_prefixes(z, kept[group], offsets[group], out)
    clipped = tuple(ClippedEnds(*(np.concatenate([p[i] for p in found]) if found
                                  else np.zeros(0, dtype=np.int64 if i != 1 else float)
                                  for i in range(3)))
                    for found in ends)
    return SortedPredictions(tuple(Segments(v, offsets) for v in values), clipped)


# Rows at least this long are copied one slice each (a Python step per tract, then a copy at
# memory speed); shorter ones by one gather and scatter for the whole group, which costs an
# index per value. The two cross near 55 values (benchmarks/bench_sorted_predictions.py).
_SLICE_ROW_LENGTH = 64


def _copy_row_prefixes(z: np.ndarray, lengths: np.ndarray, starts: np.ndarray,
                       out: np.ndarray) -> None:
    """``out[starts[r]:starts[r] + lengths[r]] = z[r, :lengths[r]]`` for every row r."""
    if z.shape[1] >= _SLICE_ROW_LENGTH:
        for row, start, length in zip(z, starts.tolist(), lengths.tolist()):
            out[start:start + length] = row[:length]
    else:
        out[runs(starts, lengths)] = z[np.arange(z.shape[1]) < lengths[:, None]]


def _pairs_with_distinct_x(batch: TractBatch) -> np.ndarray:
    """Per tract, its pairs of records whose x differ: n(n − 1)/2 less C(c, 2) for every value
    of x that c of its records share."""
    n = batch.n.astype(np.int64)
    tract = np.repeat(np.arange(n.size), n)
    order = np.lexsort((batch.x, tract))
    x, tract = batch.x[order], tract[order]
    new_run = np.ones(x.size, dtype=bool)
    new_run[1:] = (x[1:] != x[:-1]) | (tract[1:] != tract[:-1])
    run_start = np.flatnonzero(new_run)
    run_length = np.diff(np.append(run_start, x.size))
    tied = np.bincount(tract[run_start], weights=run_length * (run_length - 1) // 2,
                       minlength=n.size).astype(np.int64)
    return n * (n - 1) // 2 - tied


def _group_predictions(batch: TractBatch, group: np.ndarray, size: int,
                       x_stars: tuple[float, ...], lo: float, hi: float
                       ) -> list[np.ndarray]:
    """The predictions at each x* of the tracts ``group``, all of ``size`` records: matrices
    (tracts, size·(size − 1)/2), pairs in ``triu_indices`` order; NaN where a pair's x are
    equal (the pair is dropped: its prediction is meaningless)."""
    a, b = np.triu_indices(size, 1)
    records = batch.starts[group][:, None] + np.arange(size)
    x, y = batch.x[records], batch.y[records]
    xi, xj, yi, yj = x[:, a], x[:, b], y[:, a], y[:, b]
    # the expression of theil_sen_predictions, operation for operation: identical floats
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = (yj - yi) / (xj - xi)
    slope[xi == xj] = np.nan  # a pair of equal x is dropped: its predictions are NaN
    x_mid = (xi + xj) / 2.0
    y_mid = (yi + yj) / 2.0
    del xi, xj, yi, yj
    return [np.clip(slope * (x_star - x_mid) + y_mid, lo, hi) for x_star in x_stars]


_STORE: ContextVar[list | None] = ContextVar("shared_sorted_predictions", default=None)


@contextmanager
def sharing_sorted_predictions():
    """Within the block, the sorted predictions of a chunk are built once (module docstring).
    They are held until the block ends: about 16 bytes per pair."""
    token = _STORE.set([])
    try:
        yield
    finally:
        _STORE.reset(token)
