"""The Theil–Sen family: medians of pairwise predictions, private and not.

Each record lies in at most k pairs (k = n−1 for all pairs), so a DP median of the pairwise
predictions z with utility sensitivity k is DP for the records. The budget is split ε/2 for the
p25 median and ε/2 for the p75 median (sequential composition on the same people).
"""

from __future__ import annotations

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch
from .median import Segments, bookended_median, exact_median, exp_median, smooth_sensitivity
from .noise import Randomness
from .pairs import all_pairs, chunk_tracts, k_matchings, theil_sen_predictions
from .privacy import NotDP
from .privacy_maps import ExpMedian, NoiseStep, StudentTSmooth
from .registry import Estimator, Outcome, blank, register
from .sensitivity import Sensitivity
from .sorted_predictions import build_sorted_predictions

# Pairs per chunk: bounds memory at about 0.5 GB (BYTES_PER_PAIR each) whatever the number of
# tracts; a single tract with more pairs is its own chunk.
MAX_PAIRS_PER_CHUNK = 4_000_000
_EXP_SAMPLER = ("exponential mechanism on a 2^20-point output grid, sampled exactly at the "
                "integer rate s/2^20 (exact geometric levels and integer grid draws; "
                "mechanisms/median.py)")

# Peak memory of one _run with reps = 1, from tracemalloc over one tract of n = 50, 200, 800
# and 1600 records (tests/test_privacy_maps.py re-measures n = 50, 200, 800). Bytes per pair
# at n = 1600: 100 for every all-pairs estimator (TheilSen, DPExpTheilSen, DPWideTheilSen,
# DPSSTheilSen; 105 at n = 200): the pair indices (int32 tract, int64 i and j, with the triu
# and argsort temporaries) and the float64 predictions with their sorted copy dominate.
# Matchings: about 110 bytes per record for one matching, 580 for k = 10 (about 100 per pair
# plus the relabelling keys and permutation). Rounded up:
BYTES_PER_PAIR = 128
BYTES_PER_RECORD = 256
_FIXED_BYTES = 256 * 1024
_MEDIANS = (("p25 median", X_LOW), ("p75 median", X_HIGH))


# ---------------------------------------------------------------------------------------------
# Sensitivities: how many pairwise predictions one record is in (public: n and k)


def pairs_per_record(n):
    """k = n − 1 (at least 1): the pairs one record is in when all pairs are used."""
    return np.maximum(n - 1, 1)


def matched_pairs_per_record(n, k):
    """min(k, n − 1): the pairs one record is in over k perfect matchings."""
    return np.minimum(np.full(np.shape(n), k), np.maximum(n - 1, 1))


_EXP_SENSITIVITY = ("utility sensitivity k = the most pairwise predictions one record is in "
                    "({k}) (replace-one; predictions clipped to [lo, hi])")
_EXP_DERIVATION = ("replacing one record changes at most the k pairwise predictions it is in, "
                   "each moving the rank utility by at most 1, so the utility moves by at most "
                   "k (mechanisms/median.py, exp_median; McSherry & Talwar 2007, Thm 6)")


def exp_utility_sensitivity(k_text: str, matchings: int | None = None) -> Sensitivity:
    """The exponential-mechanism median's utility sensitivity k, for all pairs
    (``matchings`` None) or ``matchings`` random perfect matchings."""
    statement = _EXP_SENSITIVITY.format(k=k_text)
    if matchings is None:
        return Sensitivity("utility", "n - 1", statement, _EXP_DERIVATION, pairs_per_record,
                           ("n",))
    return Sensitivity("utility", "min(k, n - 1)", statement, _EXP_DERIVATION,
                       matched_pairs_per_record, ("n",), (("k", int(matchings)),))


SMOOTH_SENSITIVITY = Sensitivity(
    "values moved", "n - 1",
    "beta-smooth upper bound S_beta on the local sensitivity of the median of the pairwise "
    "predictions when one record changes k = n - 1 of them (replace-one; predictions clipped "
    "to [lo, hi]); noise S_beta/s * T_d",
    "one record is in n - 1 of the pairwise predictions, so replacing it moves at most k = n - 1 "
    "of the median's values; S_beta bounds the local sensitivity under k moved values "
    "(Nissim, Raskhodnikova & Smith 2007, Prop. 3.4; the paper's Appendix E)",
    pairs_per_record, ("n",))


def _utility_k(step: NoiseStep | None, n: np.ndarray, pairs_k: np.ndarray) -> np.ndarray:
    """k per tract for a draw: the step's sensitivity at the public n, checked against the
    pairs actually formed (a record in more pairs would void the derivation)."""
    if step is None:
        return pairs_k
    k = step.sensitivity.value(n=n)
    if not np.array_equal(k, pairs_k):
        raise ValueError(f"{step.name}: the pairs formed put a record in up to {pairs_k} pairs, "
                         f"the sensitivity was derived for {k}")
    return k


class _TheilSenBase(Estimator):
    """Shared driver: pairs → z at x=0.25 and x=0.75 → a median per tract, chunk by chunk."""

    pairing = "all"  # "all" or "matchings"
    base_defaults = {"lo": -0.5, "hi": 1.5}

    @staticmethod
    def _bounds(name: str, hp: dict) -> tuple[float, float]:
        lo, hi = float(hp["lo"]), float(hp["hi"])
        if not lo < hi:
            raise ValueError(f"{name}: need lo < hi, got [{lo}, {hi}]")
        return lo, hi

    def _pairs(self, batch: TractBatch, rand: Randomness, hp: dict):
        if self.pairing == "all":
            return all_pairs(batch)
        return k_matchings(batch, int(hp["k"]), rand)

    def _sorted_predictions(self, sub: TractBatch, rand: Randomness, hp: dict, lo: float,
                            hi: float) -> tuple[list[Segments], np.ndarray]:
        """(the pairwise predictions at each x*, sorted within tracts; k per tract). All
        pairs are shared with the interval of the same tracts (sorted_predictions.py)."""
        x_stars = tuple(x for _, x in _MEDIANS)
        if self.pairing == "all":
            found = build_sorted_predictions(sub, x_stars, lo, hi)
            return list(found.segments), np.maximum(sub.n - 1, 1)
        pairs = self._pairs(sub, rand, hp)
        tract, zs = theil_sen_predictions(sub, pairs, x_stars, lo, hi)
        k = pairs.k
        del pairs  # the index arrays are the largest thing held; free them early
        return [Segments.build(tract, z, sub.n_tracts) for z in zs], k

    def _median(self, seg: Segments, k: np.ndarray, step: NoiseStep | None, labels: np.ndarray,
                rand: Randomness, reps: int, hp: dict, meter) -> tuple[np.ndarray, np.ndarray]:
        """(values (reps, T), failed (reps, T)); spends ``step`` for ``labels`` first."""
        raise NotImplementedError

    def _run(self, batch, budget, rand, reps, hp, meter):
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        lo, hi = self._bounds(self.name, hp)
        steps = {name: (budget.step(name) if budget.steps else None) for name, _ in _MEDIANS}
        # All-pairs z are deterministic: compute once, reuse across reps. Sampled matchings
        # are part of the randomness: draw them afresh for every rep.
        rep_groups = [range(reps)] if self.pairing == "all" else [[r] for r in range(reps)]
        for chunk in chunk_tracts(batch, MAX_PAIRS_PER_CHUNK):
            sub = batch.subset(chunk)
            for reps_here in rep_groups:
                rows = np.asarray(list(reps_here))
                segments, k = self._sorted_predictions(sub, rand, hp, lo, hi)
                for (name, _), seg, out in zip(_MEDIANS, segments, (p25, p75)):
                    vals, fail = self._median(seg, _utility_k(steps[name], sub.n, k),
                                              steps[name], sub.labels, rand, rows.size, hp,
                                              meter)
                    out[np.ix_(rows, chunk)] = vals
                    failed[np.ix_(rows, chunk)] |= fail
        reason[failed] = "no pairs with distinct x"
        return Outcome(p25, p75, failed, reason)

    def _pairs_per_tract(self, n: np.ndarray, hp: dict) -> np.ndarray:
        all_ = n * (n - 1) // 2
        if self.pairing == "all":
            return all_
        return np.minimum(int(hp["k"]) * ((n + 1) // 2), all_)

    def peak_bytes(self, n, **hp):
        hp = self.hyper(hp)
        n = np.asarray(n, dtype=np.int64)
        return (_FIXED_BYTES + BYTES_PER_RECORD * n
                + BYTES_PER_PAIR * self._pairs_per_tract(n, hp))


@register
class TheilSen(_TheilSenBase):
    name = "TheilSen"
    private = False
    publishable = False
    not_publishable_reason = "not differentially private (non-private baseline)"
    defaults = dict(_TheilSenBase.base_defaults)
    summary = "Median of all pairwise predictions (non-private baseline, evaluation only)"
    sampler = "none"

    def guarantee(self, epsilon, delta=None, **hp):
        return NotDP("non-private baseline")

    def _median(self, seg, k, step, labels, rand, reps, hp, meter):
        med = exact_median(seg)
        return np.broadcast_to(med, (reps, med.size)), np.broadcast_to(seg.m == 0, (reps, med.size))


class _ExpBase(_TheilSenBase):
    """Exponential-mechanism median of the pairwise predictions: ε/2 per prediction."""

    widen_key: str | None = None
    sampler = _EXP_SAMPLER
    k_text = "k = n - 1 for all pairs"

    def _noise_steps(self, epsilon, delta, hp):
        self._bounds(self.name, hp)
        sens = exp_utility_sensitivity(self.k_text,
                                       int(hp["k"]) if self.pairing == "matchings" else None)
        return [NoiseStep(name, ExpMedian.calibrate(epsilon / 2.0), sens) for name, _ in _MEDIANS]

    def _median(self, seg, k, step, labels, rand, reps, hp, meter):
        widen = float(hp[self.widen_key]) if self.widen_key else 0.0
        eps_med = step.noise.argument
        meter.spend(labels, step.guarantee, reps)
        vals = exp_median(seg, eps_med, k, float(hp["lo"]), float(hp["hi"]), rand, reps, widen)
        return vals, np.zeros(vals.shape, dtype=bool)


@register
class DPExpTheilSen(_ExpBase):
    name = "DPExpTheilSen"
    defaults = dict(_TheilSenBase.base_defaults)
    summary = "Exponential-mechanism median of all pairwise predictions (k = n-1)"


@register
class DPExpTheilSenMatch(_ExpBase):
    name = "DPExpTheilSenMatch"
    pairing = "matchings"
    defaults = {**_TheilSenBase.base_defaults, "k": 1}
    summary = "Exponential-mechanism median over one random perfect matching (k = 1)"
    k_text = "k = 1 matching"

    def hyper(self, overrides):
        hp = super().hyper(overrides)
        if hp["k"] != 1:
            raise ValueError("DPExpTheilSenMatch uses exactly one matching; use "
                             "DPExpTheilSenkMatch for k > 1")
        return hp


@register
class DPExpTheilSenkMatch(_ExpBase):
    name = "DPExpTheilSenkMatch"
    pairing = "matchings"
    defaults = {**_TheilSenBase.base_defaults, "k": 10}
    summary = "Exponential-mechanism median over k random perfect matchings (default k = 10)"
    k_text = "k = min(k matchings, n - 1)"

    def hyper(self, overrides):
        hp = super().hyper(overrides)
        if isinstance(hp["k"], bool) or int(hp["k"]) != hp["k"] or hp["k"] < 1:
            raise ValueError(f"DPExpTheilSenkMatch: k must be an integer >= 1, got {hp['k']!r}")
        return hp


@register
class DPWideTheilSen(_ExpBase):
    name = "DPWideTheilSen"
    widen_key = "theta"
    defaults = {**_TheilSenBase.base_defaults, "theta": 0.01}
    summary = "Widened exponential-mechanism median (top utility within theta of the median)"

    def hyper(self, overrides):
        hp = super().hyper(overrides)
        if not float(hp["theta"]) >= 0:
            raise ValueError(f"DPWideTheilSen: theta must be >= 0, got {hp['theta']!r}")
        return hp


@register
class DPSSTheilSen(_TheilSenBase):
    """Median plus Student's t noise scaled by a β-smooth sensitivity bound. Evaluation only.

    Guarantee: for t noise with d degrees of freedom, ``f(z) + S_β(z)/s · T_d`` is ε-DP with
    ``ε = (d+1)·(β + s/(2√d))`` (Bun & Steinke 2019, "Average-Case Averages", Thm 31 bound on
    the max-divergence of shifted/scaled t distributions; the paper's Appendix E, Lemma 1).
    The guarantee is computed by that map from the (d, β, s) the run draws with, per median.
    With a share ``p`` of ε_med on β: ``β = p·ε_med/(d+1)``, ``s = 2(1−p)·ε_med·√d/(d+1)``.

    Not publishable: the t noise is sampled in floating point (numpy), which is not proven
    safe against floating-point attacks (Mironov 2012).
    """

    name = "DPSSTheilSen"
    defaults = {**_TheilSenBase.base_defaults, "d": 3, "beta_share": 0.5}
    summary = "Median plus Student's t noise scaled by the smooth sensitivity (Bun-Steinke)"
    sampler = ("Student's t from float64 (numpy PCG64 seeded from the randomness source); "
               "output rounded to a 2e-6 grid. Not float-attack-safe: evaluation only")
    publishable = False
    not_publishable_reason = ("its Student's t noise is sampled in floating point, which is not "
                              "proven safe against floating-point attacks (Mironov 2012); "
                              "evaluation only")

    @staticmethod
    def noise_parameters(eps_med: float, d: float, beta_share: float) -> tuple[float, float]:
        """(β, s) so that the t-noise median is at most ``eps_med``-DP."""
        cal = StudentTSmooth.calibrate(eps_med, d, beta_share)
        return cal.beta, cal.s

    def _noise_steps(self, epsilon, delta, hp):
        self._bounds(self.name, hp)
        return [NoiseStep(name, StudentTSmooth.calibrate(epsilon / 2.0, float(hp["d"]),
                                                         hp["beta_share"]), SMOOTH_SENSITIVITY)
                for name, _ in _MEDIANS]

    def _median(self, seg, k, step, labels, rand, reps, hp, meter):
        noise = step.noise
        lo, hi = float(hp["lo"]), float(hp["hi"])
        sens = smooth_sensitivity(seg, k, noise.beta, lo, hi)
        # The centre is the median element of the bookended values, the function whose
        # smooth sensitivity S_β bounds; it is defined even with no values (then it is hi
        # and S_β = hi − lo), so this mechanism never fails.
        centre = bookended_median(seg, hi)
        meter.spend(labels, step.guarantee, reps)
        t_noise = rand.numpy_generator().standard_t(noise.d, size=(reps, seg.n_tracts))
        vals = centre + sens / noise.s * t_noise
        grid = (hi - lo) / 2**20
        vals = lo + np.round((vals - lo) / grid) * grid
        return vals, np.zeros(vals.shape, dtype=bool)
