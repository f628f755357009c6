"""Issue 32, "done when": on a stress scenario of the repository (``large``: tracts of 500 to
2,000 records, dpatlas/evaluation/stress.py, scored against its expected outcome) the direct
intervals of today cover the tract's expected outcome and those of issue 18 (the privacy noise
of the tract's own line only) do not: they covered it 0.64 of the time at ε = 8."""

import numpy as np

from dpatlas.evaluation.interval_eval import released_by
from dpatlas.evaluation.stress import scenario_state
from mechanisms.intervals import intervals
from mechanisms.noise import SeededRandomness

REPS = 20


def test_large_tracts_at_epsilon_8_cover_their_expected_outcome_with_calibrated_se():
    state = scenario_state("large", 40, 32)
    rand = SeededRandomness(33)
    rel = released_by("NoisyStats", state.batch, 0.75 * 8.0, rand, REPS, 0.0)
    iv = intervals("NoisyStats", state.batch, rel, 0.25 * 8.0, rand, 0.95, REPS)
    for q in ("p25", "p75"):
        truth, point = state.truth[q][None, :], getattr(rel, q)
        ok = np.isfinite(point) & np.isfinite(truth)
        assert ok.mean() > 0.95
        lo, hi = getattr(iv, f"{q}_lo"), getattr(iv, f"{q}_hi")
        covered = ((lo <= truth) & (truth <= hi))[ok]
        assert covered.mean() >= 0.93, (q, covered.mean())
        assert np.median((hi - lo)[ok]) < 0.1  # not bought by width: sampling-sized
        se = getattr(iv, f"{q}_se")
        within = (np.abs(np.clip(point, 0, 1) - truth) <= 1.959964 * se)[ok]
        assert 0.9 <= within.mean() <= 0.99, (q, within.mean())
