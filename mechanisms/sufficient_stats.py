"""Estimators built on per-tract sufficient statistics: OLS, NoisyStats, NoisyIntercept."""

from __future__ import annotations

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch, ols, sufficient_stats
from .noise import Randomness, laplace_mechanism
from .privacy import NotDP, PureDP, sequential
from .registry import Estimator, Outcome, blank, register

_LAPLACE = "grid Laplace: exact discrete Laplace (CKS 2020) on a 1/4096-sensitivity grid"


def _usable(batch: TractBatch) -> np.ndarray:
    return np.nonzero(batch.n >= 2)[0]


@register
class OLS(Estimator):
    name = "OLS"
    private = False
    summary = "Ordinary least squares (non-private baseline, evaluation only)"
    sampler = "none"

    def guarantee(self, epsilon, delta=None, **hp):
        return NotDP("non-private baseline")

    def _run(self, batch, epsilon, delta, rand, reps, hp):
        fit = ols(sufficient_stats(batch))
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        p25[:], p75[:] = fit.p25, fit.p75
        failed[:] = ~fit.ok
        reason[:] = np.where(fit.ok, "", "x has no variance")
        return Outcome(p25, p75, failed, reason,
                       {"se25": np.broadcast_to(fit.se25, p25.shape).copy(),
                        "se75": np.broadcast_to(fit.se75, p25.shape).copy()})


@register
class NoisyStats(Estimator):
    """Pure ε-DP: Laplace noise on ncov and nvar (ε/3 each), then on the intercept (ε/3).

    Sensitivities under replace-one on [0,1]²: ncov and nvar each ``Δ = 1 − 1/n`` (the paper's
    Appendix C.1); given the released noisy slope s̃, ``ȳ − s̃·x̄`` has sensitivity
    ``(1 + |s̃|)/n``. Three ε/3 steps compose to ε (sequential composition). If the noisy nvar
    is ≤ 0 the mechanism fails; the noisy ncov/nvar are still valid DP releases.
    """

    name = "NoisyStats"
    summary = "Laplace noise on the sufficient statistics (ncov, nvar) and the intercept"
    sampler = _LAPLACE

    def guarantee(self, epsilon, delta=None, **hp):
        return sequential([PureDP(epsilon / 3.0)] * 3)

    def _run(self, batch, epsilon, delta, rand, reps, hp):
        third = epsilon / 3.0
        return noisy_stats_release(batch, third, third, third, rand, reps)


def noisy_nvar(batch: TractBatch, epsilon: float, rand: Randomness, reps: int) -> np.ndarray:
    """ε-DP noisy ``nvar = n·var(x)`` per tract (NaN for tracts with n < 2): (reps, tracts)."""
    out = np.full((reps, batch.n_tracts), np.nan)
    idx = _usable(batch)
    if idx.size:
        st = sufficient_stats(batch)
        values = np.broadcast_to(st.nvar[idx], (reps, idx.size))[..., None]
        out[:, idx] = laplace_mechanism(rand, values, 1.0 - 1.0 / st.n[idx], epsilon)[..., 0]
    return out


def noisy_stats_release(batch: TractBatch, eps_nvar: float, eps_ncov: float,
                        eps_intercept: float, rand: Randomness, reps: int,
                        nvar_released: np.ndarray | None = None) -> Outcome:
    """NoisyStats with its own budget split, optionally reusing an already released noisy nvar.

    Guarantee: sequential composition of the three pure steps, eps_nvar + eps_ncov +
    eps_intercept (the nvar step is paid once, wherever it was released).
    """
    p25, p75, failed, reason = blank(reps, batch.n_tracts)
    if nvar_released is None:
        nvar_released = noisy_nvar(batch, eps_nvar, rand, reps)
    extras = {"noisy_ncov": np.full((reps, batch.n_tracts), np.nan),
              "noisy_nvar": np.array(nvar_released, dtype=float, copy=True)}
    idx = _usable(batch)
    if idx.size == 0:
        return Outcome(p25, p75, failed, reason, extras)
    st = sufficient_stats(batch)
    n = st.n[idx].astype(np.float64)
    ncov_t = laplace_mechanism(rand, np.broadcast_to(st.ncov[idx], (reps, idx.size))[..., None],
                               1.0 - 1.0 / n, eps_ncov)[..., 0]
    nvar_t = nvar_released[:, idx]
    ok = nvar_t > 0
    slope = np.where(ok, ncov_t / np.where(ok, nvar_t, 1.0), 0.0)
    centre = st.ybar[idx] - slope * st.xbar[idx]
    intercept = laplace_mechanism(rand, centre[..., None], (1.0 + np.abs(slope)) / n,
                                  eps_intercept)[..., 0]
    p25[:, idx] = np.where(ok, slope * X_LOW + intercept, np.nan)
    p75[:, idx] = np.where(ok, slope * X_HIGH + intercept, np.nan)
    failed[:, idx] = ~ok
    reason[:, idx] = np.where(ok, "", "noisy nvar <= 0")
    extras["noisy_ncov"][:, idx] = ncov_t
    return Outcome(p25, p75, failed, reason, extras)


@register
class NoisyIntercept(Estimator):
    """Pure ε-DP: ``ȳ + Lap(1/(nε))`` (sensitivity of ȳ is 1/n), used for both p25 and p75."""

    name = "NoisyIntercept"
    summary = "Noisy mean of y, used as both predictions (slope taken as 0)"
    sampler = _LAPLACE

    def guarantee(self, epsilon, delta=None, **hp):
        return PureDP(epsilon)

    def _run(self, batch, epsilon, delta, rand, reps, hp):
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        idx = _usable(batch)
        if idx.size:
            st = sufficient_stats(batch)
            ybar = np.broadcast_to(st.ybar[idx], (reps, idx.size))
            noisy = laplace_mechanism(rand, ybar[..., None], 1.0 / st.n[idx], epsilon)[..., 0]
            p25[:, idx] = noisy
            p75[:, idx] = noisy
        return Outcome(p25, p75, failed, reason)
