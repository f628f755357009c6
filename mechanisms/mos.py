"""Opportunity Insights' "maximum observed sensitivity" (MOS) heuristic. NOT differentially private.

Chetty & Friedman (2019), "A Practical Method to Reduce Privacy Loss when Disclosing Statistics
Based on Small Samples". Per tract: the OLS predictions; a lower bound on their local
sensitivity, the largest change when one point from a grid over [0,1]² is added; the state's
MOS is the largest ``n_t × local sensitivity_t`` over its eligible tracts; each eligible tract
gets ``Lap(MOS/(n_t·ε/2))`` on p25 and on p75. Eligible: at least 20 people, and at least 10%
of parent ranks above and 10% below the state's median parent rank.

The noise is calibrated to sensitivities *observed on the data*, not to worst-case ones, and
the MOS itself is computed from the data without noise: there is no DP guarantee. It is here
only to compare with the DP estimators, labelled as such everywhere.
"""

from __future__ import annotations

import numpy as np

from .batch import X_HIGH, X_LOW, sufficient_stats
from .noise import laplace_mechanism
from .privacy import NotDP
from .privacy_maps import GridLaplace
from .registry import Estimator, Outcome, blank, register
from .sensitivity import Sensitivity


# Peak memory of one _run, reps = 1: tracemalloc measured 43 bytes per record at n = 1600 (the
# state median's sorted copy, the eligibility sums, the sufficient statistics); the grid
# terms are grid² floats per tract. Rounded up (tests/test_privacy_maps.py re-measures).
_BYTES_PER_RECORD = 160
_FIXED_BYTES = 64 * 1024


def mos_over_n(mos, n):
    return mos / n


# Not a worst-case sensitivity: MOS is read off the data without noise (module docstring).
OBSERVED_SENSITIVITY = Sensitivity(
    "L1", "MOS/n", "MOS/n (L1, observed on the data: NOT a worst-case sensitivity)",
    "MOS = the largest n_t x the local sensitivity of the OLS prediction to adding one grid "
    "point, over the state's eligible tracts, computed without noise: no DP guarantee "
    "(Chetty & Friedman 2019)", mos_over_n, ("mos", "n"))


@register
class MOS(Estimator):
    name = "MOS"
    private = False
    publishable = False
    not_publishable_reason = "not differentially private (noise scaled to observed sensitivity)"
    defaults = {"grid": 5, "min_n": 20, "min_share": 0.10}
    summary = "Opportunity Insights maximum-observed-sensitivity heuristic (NOT DP)"
    sampler = "grid Laplace (same sampler as the DP estimators); the calibration is not DP"

    def guarantee(self, epsilon, delta=None, **hp):
        return NotDP("Opportunity Insights MOS heuristic: noise scaled to observed sensitivity")

    def peak_bytes(self, n, **hp):
        grid = int(self.hyper(hp)["grid"])
        return (_FIXED_BYTES + 64 * grid * grid
                + _BYTES_PER_RECORD * np.asarray(n, dtype=np.int64))

    def _run(self, batch, budget, rand, reps, hp, meter):
        epsilon = budget.epsilon
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        st = sufficient_stats(batch)
        n = st.n.astype(np.float64)
        ok_fit = (st.n >= 2) & (st.nvar > 0)
        med = np.median(batch.x) if batch.x.size else 0.5
        above = batch.tract_sum((batch.x > med).astype(np.float64))
        below = batch.tract_sum((batch.x < med).astype(np.float64))
        with np.errstate(invalid="ignore", divide="ignore"):
            eligible = (ok_fit & (st.n >= int(hp["min_n"]))
                        & (above >= hp["min_share"] * n) & (below >= hp["min_share"] * n))
        reason[:, ~eligible] = "MOS: not eligible (n < 20 or parent ranks one-sided)"
        failed[:, ~eligible] = True
        idx = np.nonzero(eligible)[0]
        if idx.size == 0:
            return Outcome(p25, p75, failed, reason)
        g = np.linspace(0.0, 1.0, int(hp["grid"]))
        ga, gb = (a.ravel() for a in np.meshgrid(g, g))
        nn, xb, yb = n[idx, None], st.xbar[idx, None], st.ybar[idx, None]
        nvar, ncov = st.nvar[idx, None], st.ncov[idx, None]
        slope = ncov / nvar
        # Add one point (a, b): updated centred statistics in closed form.
        w = nn / (nn + 1.0)
        nvar2 = nvar + w * (ga - xb) ** 2
        ncov2 = ncov + w * (ga - xb) * (gb - yb)
        xb2, yb2 = (nn * xb + ga) / (nn + 1.0), (nn * yb + gb) / (nn + 1.0)
        slope2 = ncov2 / nvar2
        for x_star, out in ((X_LOW, p25), (X_HIGH, p75)):
            pred = yb + slope * (x_star - xb)
            pred2 = yb2 + slope2 * (x_star - xb2)
            local = np.max(np.abs(pred2 - pred), axis=1)
            mos = float(np.max(n[idx] * local))
            values = np.broadcast_to(pred[:, 0], (reps, idx.size))[..., None]
            # No privacy map exists for this draw: a real meter refuses it (never published).
            meter.spend(batch.labels[idx], self.guarantee(epsilon), reps)
            out[:, idx] = laplace_mechanism(
                rand, values, OBSERVED_SENSITIVITY.value(mos=mos, n=n[idx]),
                GridLaplace.calibrate(epsilon / 2.0, 1))[..., 0]
        return Outcome(p25, p75, failed, reason)
