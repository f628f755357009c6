"""The sorted pairwise predictions shared by the Theil-Sen estimate and its interval (issue 22):
the same values, to the bit, as the pair-by-pair path they replace."""

from __future__ import annotations

import numpy as np
import pytest

from mechanisms import intervals as CI
from mechanisms import sorted_predictions as SP
from mechanisms.batch import TractBatch
from mechanisms.median import Segments
from mechanisms.pairs import all_pairs, theil_sen_predictions

X_STARS = (0.25, 0.75)
LO, HI = CI._TS_LO, CI._TS_HI


def batch_of_shapes(seed: int = 7) -> TractBatch:
    """Sizes 0 to 90 (several tracts per size), x spread, narrow (many clipped predictions)
    or on the 0.01 grid (tied x, pairs dropped)."""
    rng = np.random.default_rng(seed)
    labels, xs, ys = [], [], []
    for t, n in enumerate([0, 1, 2, 3, 5, 9, 9, 9, 30, 30, 31, 64, 90, 2, 5, 30]):
        centre = rng.uniform(0.3, 0.7)
        x = (centre + rng.uniform(-0.004, 0.004, n)) if t % 3 == 1 else rng.uniform(0, 1, n)
        if t % 3 == 2:
            x = np.round(x, 2)
        y = np.clip(0.2 + 0.5 * x + rng.normal(0, 0.25, n), 0, 1)
        labels += [f"t{t:02d}"] * n
        xs.append(np.clip(x, 0, 1))
        ys.append(y)
    batch = TractBatch.from_labels(np.array(labels), np.concatenate(xs), np.concatenate(ys))
    # from_labels drops empty tracts; put one (n = 0) back in the middle
    starts = np.insert(batch.starts, 3, batch.starts[3])
    return TractBatch(batch.x, batch.y, starts, np.insert(batch.labels, 3, "empty"))


def pair_by_pair(batch):
    """The path before issue 22: all_pairs, theil_sen_predictions, Segments.build."""
    pairs = all_pairs(batch)
    tract, zs = theil_sen_predictions(batch, pairs, X_STARS, LO, HI)
    place = np.flatnonzero(batch.x[pairs.i] != batch.x[pairs.j])
    return tract, zs, place


def test_the_grouped_build_gives_the_pair_by_pair_values_bit_for_bit():
    batch = batch_of_shapes()
    tract, zs, place = pair_by_pair(batch)
    got = SP.build_sorted_predictions(batch, X_STARS, LO, HI)
    for z, seg, ends in zip(zs, got.segments, got.clipped):
        want = Segments.build(tract, z, batch.n_tracts)
        assert np.array_equal(seg.offsets, want.offsets)
        assert np.array_equal(seg.z, want.z)
        at_end = (z <= LO) | (z >= HI)
        assert at_end.sum() > 100  # the narrow tracts clip many predictions
        order = np.argsort(ends.place)
        assert np.array_equal(ends.place[order], place[at_end])
        assert np.array_equal(ends.value[order], z[at_end])
        assert np.array_equal(ends.tract[order], tract[at_end])


def test_both_ways_of_copying_sorted_rows_are_exercised_and_agree(monkeypatch):
    """Groups of rows shorter than ``_SLICE_ROW_LENGTH`` are copied by one gather and
    scatter, longer ones a slice per row: the fixture has both, and moving the threshold to
    either end (every group one way) gives the same values."""
    batch = batch_of_shapes()
    row_lengths = {int(n * (n - 1) // 2) for n in batch.n if n >= 2}
    assert min(row_lengths) < SP._SLICE_ROW_LENGTH <= max(row_lengths)
    built = {}
    for threshold in (SP._SLICE_ROW_LENGTH, 1, max(row_lengths) + 1):
        monkeypatch.setattr(SP, "_SLICE_ROW_LENGTH", threshold)
        built[threshold] = SP.build_sorted_predictions(batch, X_STARS, LO, HI)
    first, *others = built.values()
    for other in others:
        for a, b in zip(first.segments, other.segments):
            assert np.array_equal(a.z, b.z) and np.array_equal(a.offsets, b.offsets)


def test_pairs_with_distinct_x_are_counted_from_the_records():
    """The kept pairs per tract, counted from runs of tied x, are the pairs whose x differ,
    counted pair by pair (including a tract of one value repeated: none kept)."""
    batch = batch_of_shapes()
    x = np.concatenate([batch.x, np.full(6, 0.5)])
    y = np.concatenate([batch.y, np.linspace(0, 1, 6)])
    batch = TractBatch(x, y, np.append(batch.starts, x.size), np.append(batch.labels, "tied"))
    pairs = all_pairs(batch)
    distinct = batch.x[pairs.i] != batch.x[pairs.j]
    want = np.bincount(pairs.tract[distinct], minlength=batch.n_tracts)
    got = SP._pairs_with_distinct_x(batch)
    assert np.array_equal(got, want)
    assert got[-1] == 0 and (want < batch.n * (batch.n - 1) // 2).sum() >= 3  # ties dropped


def test_spread_segments_are_the_sorted_spread_predictions():
    """The interval's values: spreading the clipped predictions then sorting every tract
    (before issue 22) and re-placing only the spread ones in the sorted values (now)."""
    batch = batch_of_shapes()
    tract, zs, place = pair_by_pair(batch)
    got = SP.build_sorted_predictions(batch, X_STARS, LO, HI)
    for z, seg, ends in zip(zs, got.segments, got.clipped):
        want = Segments.build(tract, CI.spread_clipped(z, place), batch.n_tracts)
        spread = CI.spread_segments(seg, ends)
        assert np.array_equal(spread.z, want.z) and np.array_equal(spread.offsets,
                                                                   want.offsets)
        assert not np.array_equal(spread.z, seg.z)  # something was spread


@pytest.mark.parametrize("tracts", [[12, 1, 4], [0, 3], [15]])
def test_some_tracts_alone_keep_the_places_of_the_whole_chunk(tracts):
    batch = batch_of_shapes()
    whole = SP.build_sorted_predictions(batch, X_STARS, LO, HI).restricted(np.array(tracts))
    alone = SP.build_sorted_predictions(batch, X_STARS, LO, HI, np.array(tracts))
    for a, b, ea, eb in zip(whole.segments, alone.segments, whole.clipped, alone.clipped):
        assert np.array_equal(a.z, b.z) and np.array_equal(a.offsets, b.offsets)
        oa, ob = np.argsort(ea.place), np.argsort(eb.place)
        for f in ("tract", "value", "place"):
            assert np.array_equal(getattr(ea, f)[oa], getattr(eb, f)[ob]), f


def test_inside_the_block_a_chunk_is_built_once_and_only_for_the_same_records(monkeypatch):
    batch = batch_of_shapes()
    built = []
    real = SP._build
    monkeypatch.setattr(SP, "_build", lambda *a: built.append(1) or real(*a))
    same = TractBatch(batch.x.copy(), batch.y.copy(), batch.starts.copy(), batch.labels)
    other_y = batch.y.copy()
    other_y[5] = 1.0 - other_y[5]
    other = TractBatch(batch.x, other_y, batch.starts, batch.labels)
    with SP.sharing_sorted_predictions():
        first = SP.build_sorted_predictions(batch, X_STARS, LO, HI)
        again = SP.build_sorted_predictions(same, X_STARS, LO, HI)
        SP.build_sorted_predictions(same, X_STARS, LO, HI, np.array([12]))
        assert len(built) == 1 and again is first
        SP.build_sorted_predictions(other, X_STARS, LO, HI)  # one record differs
        SP.build_sorted_predictions(batch, X_STARS, LO, 1.4)  # other bounds
        assert len(built) == 3
    SP.build_sorted_predictions(batch, X_STARS, LO, HI)  # nothing kept after the block
    assert len(built) == 4
