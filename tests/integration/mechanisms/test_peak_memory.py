"""Memory: each estimator's declared peak (``peak_bytes``, what ``limits.memory_gib`` is checked
against before a charge) bounds the peak tracemalloc measures for one tract of 50, 200 and 800
records. Moved from tests/unit/mechanisms/test_privacy_maps.py (it runs every estimator three
times under tracemalloc: too slow for the unit tier)."""

import gc
import tracemalloc

import numpy as np
import pytest

import mechanisms as M
from mechanisms.batch import TractBatch

from tests.support.inputs import line_tract


def _measured_peak(name, n, tries: int = 3):
    """The estimator's peak traced allocation: the least of a few runs, because tracemalloc
    also counts what other threads of the test process allocate meanwhile (once, under xdist,
    DPGDzCDP measured 287 kB against its 105 kB bound, and within it when run alone)."""
    x, y = line_tract(n, seed=3)
    batch = TractBatch.single(x, y)
    M.estimate_batch(name, batch, 1.0, seed=1)  # warm caches
    peaks = []
    for _ in range(tries):
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            M.estimate_batch(name, batch, 1.0, seed=1)
            peaks.append(tracemalloc.get_traced_memory()[1] - base)
        finally:
            tracemalloc.stop()
    return min(peaks)


@pytest.mark.parametrize("name", list(M.REGISTRY))
def test_peak_bytes_bounds_the_measured_peak(name):
    est = M.get(name)
    sizes = np.array([50, 200, 800])
    bound = est.peak_bytes(sizes)
    assert bound.shape == sizes.shape
    for n, b in zip(sizes, bound):
        peak = _measured_peak(name, int(n))
        assert peak <= b, (name, n, peak, b)
        if name in ("TheilSen", "DPExpTheilSen", "DPWideTheilSen", "DPSSTheilSen") and n == 800:
            assert b <= 2.5 * peak, (name, peak, b)  # quadratic, and not absurdly loose
