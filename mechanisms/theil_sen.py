"""The Theil–Sen family: medians of pairwise predictions, private and not.

Each record lies in at most k pairs (k = n−1 for all pairs), so a DP median of the pairwise
predictions z with utility sensitivity k is DP for the records. The budget is split ε/2 for the
p25 median and ε/2 for the p75 median (sequential composition on the same people).
"""

from __future__ import annotations

import math

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch
from .median import Segments, bookended_median, exact_median, exp_median, smooth_sensitivity
from .noise import Randomness
from .pairs import all_pairs, chunk_tracts, k_matchings, theil_sen_points
from .privacy import NotDP, PureDP, sequential
from .registry import Estimator, Outcome, blank, register

# Pairs per chunk: bounds memory at about 0.5 GB whatever the number of tracts.
MAX_PAIRS_PER_CHUNK = 4_000_000
_EXP_SAMPLER = ("exponential mechanism on a 2^20-point output grid: interval chosen by "
                "inversion of float64 weights, grid point by an exact integer draw")


class _TheilSenBase(Estimator):
    """Shared driver: pairs → z at x=0.25 and x=0.75 → a median per tract, chunk by chunk."""

    pairing = "all"  # "all" or "matchings"
    base_defaults = {"lo": -0.5, "hi": 1.5}

    def _pairs(self, batch: TractBatch, rand: Randomness, hp: dict):
        if self.pairing == "all":
            return all_pairs(batch)
        return k_matchings(batch, int(hp["k"]), rand)

    def _median(self, seg: Segments, k: np.ndarray, eps_med: float, rand: Randomness,
                reps: int, hp: dict) -> tuple[np.ndarray, np.ndarray]:
        """(values (reps, T), failed (reps, T))."""
        raise NotImplementedError

    def _run(self, batch, epsilon, delta, rand, reps, hp):
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        lo, hi = float(hp["lo"]), float(hp["hi"])
        if not lo < hi:
            raise ValueError(f"{self.name}: need lo < hi, got [{lo}, {hi}]")
        # All-pairs z are deterministic: compute once, reuse across reps. Sampled matchings
        # are part of the randomness: draw them afresh for every rep.
        rep_groups = [range(reps)] if self.pairing == "all" else [[r] for r in range(reps)]
        for chunk in chunk_tracts(batch, MAX_PAIRS_PER_CHUNK):
            sub = batch.subset(chunk)
            for reps_here in rep_groups:
                rows = np.asarray(list(reps_here))
                pairs = self._pairs(sub, rand, hp)
                for x_star, out in ((X_LOW, p25), (X_HIGH, p75)):
                    tract, z = theil_sen_points(sub, pairs, x_star, lo, hi)
                    seg = Segments.build(tract, z, sub.n_tracts)
                    vals, fail = self._median(seg, pairs.k, epsilon / 2.0, rand, rows.size, hp)
                    out[np.ix_(rows, chunk)] = vals
                    failed[np.ix_(rows, chunk)] |= fail
        reason[failed] = "no pairs with distinct x"
        return Outcome(p25, p75, failed, reason)


@register
class TheilSen(_TheilSenBase):
    name = "TheilSen"
    private = False
    defaults = dict(_TheilSenBase.base_defaults)
    summary = "Median of all pairwise predictions (non-private baseline, evaluation only)"
    sampler = "none"

    def guarantee(self, epsilon, delta=None, **hp):
        return NotDP("non-private baseline")

    def _median(self, seg, k, eps_med, rand, reps, hp):
        med = exact_median(seg)
        return np.broadcast_to(med, (reps, med.size)), np.broadcast_to(seg.m == 0, (reps, med.size))


class _ExpBase(_TheilSenBase):
    """Exponential-mechanism median of the pairwise predictions: pure ε/2 per prediction."""

    widen_key: str | None = None
    sampler = _EXP_SAMPLER

    def guarantee(self, epsilon, delta=None, **hp):
        return sequential([PureDP(epsilon / 2.0), PureDP(epsilon / 2.0)])

    def _median(self, seg, k, eps_med, rand, reps, hp):
        widen = float(hp[self.widen_key]) if self.widen_key else 0.0
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


@register
class DPWideTheilSen(_ExpBase):
    name = "DPWideTheilSen"
    widen_key = "theta"
    defaults = {**_TheilSenBase.base_defaults, "theta": 0.01}
    summary = "Widened exponential-mechanism median (top utility within theta of the median)"


@register
class DPSSTheilSen(_TheilSenBase):
    """Median plus Student's t noise scaled by a β-smooth sensitivity bound.

    Guarantee: for t noise with d degrees of freedom, ``f(z) + S_β(z)/s · T_d`` is ε-DP with
    ``ε = (d+1)·(β + s/(2√d))`` (Bun & Steinke 2019, "Average-Case Averages", Thm 31 bound on
    the max-divergence of shifted/scaled t distributions; the paper's Appendix E, Lemma 1).
    With a share ``p`` of ε on β (reference p = 1/2): ``β = p·ε/(d+1)``,
    ``s = 2(1−p)·ε·√d/(d+1)``. This is a *pure* ε-DP bound (hence also ε²/2-zCDP), which
    is why we record it as pure; ``estimators.md`` calls it concentrated DP, but the cited
    theorem gives the stronger pure bound.
    """

    name = "DPSSTheilSen"
    defaults = {**_TheilSenBase.base_defaults, "d": 3, "beta_share": 0.5}
    summary = "Median plus Student's t noise scaled by the smooth sensitivity (Bun-Steinke)"
    sampler = ("Student's t from float64 (numpy PCG64 seeded from the randomness source); "
               "output rounded to a 2e-6 grid. Not float-attack-safe: see README")

    def guarantee(self, epsilon, delta=None, **hp):
        return sequential([PureDP(epsilon / 2.0), PureDP(epsilon / 2.0)])

    @staticmethod
    def noise_parameters(eps_med: float, d: float, beta_share: float) -> tuple[float, float]:
        """(β, s) so that the t-noise median is ``eps_med``-DP."""
        if not 0 < beta_share < 1 or d <= 0:
            raise ValueError("DPSSTheilSen needs 0 < beta_share < 1 and d > 0")
        beta = beta_share * eps_med / (d + 1)
        s = 2.0 * (1.0 - beta_share) * eps_med * math.sqrt(d) / (d + 1)
        return beta, s

    def _median(self, seg, k, eps_med, rand, reps, hp):
        d = float(hp["d"])
        beta, s = self.noise_parameters(eps_med, d, float(hp["beta_share"]))
        lo, hi = float(hp["lo"]), float(hp["hi"])
        sens = smooth_sensitivity(seg, k, beta, lo, hi)
        # The centre is the median element of the bookended values, the function whose
        # smooth sensitivity S_β bounds; it is defined even with no values (then it is hi
        # and S_β = hi − lo), so this mechanism never fails.
        centre = bookended_median(seg, hi)
        t_noise = rand.numpy_generator().standard_t(d, size=(reps, seg.n_tracts))
        vals = centre + sens / s * t_noise
        grid = (hi - lo) / 2**20
        vals = lo + np.round((vals - lo) / grid) * grid
        return vals, np.zeros(vals.shape, dtype=bool)
