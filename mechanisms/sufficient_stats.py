"""Estimators built on per-tract sufficient statistics: OLS, NoisyStats, NoisyIntercept."""

from __future__ import annotations

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch, ols, sufficient_stats
from .privacy_filter import NO_METER
from .noise import Randomness, laplace_mechanism
from .privacy import NotDP
from .privacy_maps import GridLaplace, NoiseStep
from .registry import Estimator, Meter, Outcome, blank, register
from .sensitivity import Sensitivity

_LAPLACE = "grid Laplace: exact discrete Laplace (CKS 2020) on a 1/4096-sensitivity grid"

# Peak memory of one _run, reps = 1: tracemalloc measured 45 bytes per record at n = 1600 for
# OLS, NoisyStats and NoisyIntercept (the centred deviations, their products and tract_sum's
# cumulative sums), plus about 10 kB fixed; rounded up generously since it is O(n).
# tests/test_privacy_maps.py re-measures at n = 50, 200, 800.
_STATS_BYTES_PER_RECORD = 160
_FIXED_BYTES = 64 * 1024


def _usable(batch: TractBatch) -> np.ndarray:
    return np.nonzero(batch.n >= 2)[0]


# ---------------------------------------------------------------------------------------------
# The sensitivities of the noisy statistics (replace-one, records on [0, 1]², n public)


def one_minus_one_over_n(n):
    return 1.0 - 1.0 / n


def one_over_n(n):
    return 1.0 / n


def intercept_sensitivity(n, noisy_slope):
    return (1.0 + np.abs(noisy_slope)) / n


NVAR_SENSITIVITY = Sensitivity(
    "L1", "1 - 1/n", "1 - 1/n (L1, replace-one, parent ranks on [0, 1])",
    "n var(x) = sum x^2 - (sum x)^2/n: replacing one x in [0, 1] moves it by at most 1 - 1/n "
    "(the paper's App. C.1)", one_minus_one_over_n, ("n",))
NCOV_SENSITIVITY = Sensitivity(
    "L1", "1 - 1/n", "1 - 1/n (L1, replace-one, ranks on [0, 1])",
    "n cov(x, y) = sum xy - (sum x)(sum y)/n: replacing one record with both ranks in [0, 1] "
    "moves it by at most 1 - 1/n (the paper's App. C.1)", one_minus_one_over_n, ("n",))
INTERCEPT_SENSITIVITY = Sensitivity(
    "L1", "(1 + |noisy slope|)/n",
    "(1 + |noisy slope|)/n given the released noisy slope (L1, replace-one, ranks on [0, 1])",
    "given the released (DP) slope s, ybar - s*xbar moves by at most 1/n through ybar and "
    "|s|/n through xbar when one record on [0, 1]^2 is replaced (the paper's App. C.1)",
    intercept_sensitivity, ("n", "noisy_slope"))
YBAR_SENSITIVITY = Sensitivity(
    "L1", "1/n", "1/n (L1, replace-one, child ranks on [0, 1])",
    "the mean of n values in [0, 1] moves by at most 1/n when one is replaced",
    one_over_n, ("n",))


# ---------------------------------------------------------------------------------------------
# The noisy statistics as calibrated steps (also used by the selection rule and the plan)


def nvar_step(epsilon: float) -> NoiseStep:
    """Laplace on ``nvar = Σ(x − x̄)²``: sensitivity 1 − 1/n (the paper's App. C.1)."""
    return NoiseStep("nvar", GridLaplace.calibrate(epsilon, 1), NVAR_SENSITIVITY)


def ncov_step(epsilon: float) -> NoiseStep:
    """Laplace on ``ncov = Σ(x − x̄)(y − ȳ)``: sensitivity 1 − 1/n (the paper's App. C.1)."""
    return NoiseStep("ncov", GridLaplace.calibrate(epsilon, 1), NCOV_SENSITIVITY)


def intercept_step(epsilon: float) -> NoiseStep:
    """Laplace on ``ȳ − s̃·x̄`` given the released slope s̃: sensitivity (1 + |s̃|)/n."""
    return NoiseStep("intercept", GridLaplace.calibrate(epsilon, 1), INTERCEPT_SENSITIVITY)


def ybar_step(epsilon: float) -> NoiseStep:
    """Laplace on ``ȳ``: sensitivity 1/n."""
    return NoiseStep("mean of y", GridLaplace.calibrate(epsilon, 1), YBAR_SENSITIVITY)


def _draw_scalar(rand: Randomness, step: NoiseStep, labels: np.ndarray, values: np.ndarray,
                 reps: int, meter: Meter, **public) -> np.ndarray:
    """Spend ``step`` for ``labels``, then release ``values`` (reps, tracts) with its noise,
    scaled to its sensitivity at the ``public`` inputs (n, the released slope)."""
    values = values[..., None]
    sensitivity = step.sensitivity.value(**public)
    meter.spend(labels, step.guarantee, reps)
    return laplace_mechanism(rand, values, sensitivity, step.noise)[..., 0]


class _StatsEstimator(Estimator):
    def peak_bytes(self, n, **hp):
        return _FIXED_BYTES + _STATS_BYTES_PER_RECORD * np.asarray(n, dtype=np.int64)


@register
class OLS(_StatsEstimator):
    name = "OLS"
    private = False
    publishable = False
    not_publishable_reason = "not differentially private (non-private baseline)"
    summary = "Ordinary least squares (non-private baseline, evaluation only)"
    sampler = "none"

    def guarantee(self, epsilon, delta=None, **hp):
        return NotDP("non-private baseline")

    def _run(self, batch, budget, rand, reps, hp, meter):
        fit = ols(sufficient_stats(batch))
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        p25[:], p75[:] = fit.p25, fit.p75
        failed[:] = ~fit.ok
        reason[:] = np.where(fit.ok, "", "x has no variance")
        return Outcome(p25, p75, failed, reason,
                       {"se25": np.broadcast_to(fit.se25, p25.shape).copy(),
                        "se75": np.broadcast_to(fit.se75, p25.shape).copy()})


def noisy_stats_split(epsilon: float, nvar_drawn: bool = False) -> tuple[float, float, float]:
    """NoisyStats' budget per statistic, (ε_nvar, ε_ncov, ε_intercept): thirds of ``epsilon``;
    where a selection already drew nvar (``nvar_drawn``: the dp rule reuses its noisy nvar,
    paid by the selection), ε_nvar is 0 and ``epsilon`` (the rest) halves between ncov and the
    intercept. The one place the split is decided: the mechanism, the rule's alternatives,
    the interval step and the evaluations read it here."""
    if nvar_drawn:
        return 0.0, epsilon / 2, epsilon / 2
    third = epsilon / 3.0
    return third, third, third


@register
class NoisyStats(_StatsEstimator):
    """Pure ε-DP: Laplace noise on nvar and ncov (ε/3 each), then on the intercept (ε/3).

    Sensitivities under replace-one on [0,1]²: ncov and nvar each ``Δ = 1 − 1/n`` (the paper's
    Appendix C.1); given the released noisy slope s̃, ``ȳ − s̃·x̄`` has sensitivity
    ``(1 + |s̃|)/n``. The guarantee is the sequential composition of the three steps' maps
    (each ≤ ε/3). If the noisy nvar is ≤ 0 the mechanism fails; the noisy ncov/nvar are still
    valid DP releases.
    """

    name = "NoisyStats"
    summary = "Laplace noise on the sufficient statistics (ncov, nvar) and the intercept"
    sampler = _LAPLACE

    def _noise_steps(self, epsilon, delta, hp):
        eps_nvar, eps_ncov, eps_intercept = noisy_stats_split(epsilon)
        return [nvar_step(eps_nvar), ncov_step(eps_ncov), intercept_step(eps_intercept)]

    def _run(self, batch, budget, rand, reps, hp, meter):
        return _noisy_stats(batch, budget.step("nvar"), budget.step("ncov"),
                            budget.step("intercept"), rand, reps, None, meter)


def noisy_nvar(batch: TractBatch, epsilon: float, rand: Randomness, reps: int, *,
               meter: Meter = NO_METER) -> np.ndarray:
    """ε-DP noisy ``nvar = n·var(x)`` per tract (NaN for tracts with n < 2): (reps, tracts).

    The draw is ``nvar_step(epsilon)``: its map is what ``meter`` is charged.
    """
    return _draw_nvar(batch, nvar_step(epsilon), rand, reps, meter)


def _draw_nvar(batch: TractBatch, step: NoiseStep, rand: Randomness, reps: int,
               meter: Meter) -> np.ndarray:
    out = np.full((reps, batch.n_tracts), np.nan)
    idx = _usable(batch)
    if idx.size:
        st = sufficient_stats(batch)
        values = np.broadcast_to(st.nvar[idx], (reps, idx.size))
        out[:, idx] = _draw_scalar(rand, step, batch.labels[idx], values, reps, meter,
                                   n=st.n[idx])
    return out


def noisy_stats_release(batch: TractBatch, eps_nvar: float, eps_ncov: float,
                        eps_intercept: float, rand: Randomness, reps: int,
                        nvar_released: np.ndarray | None = None, *,
                        meter: Meter = NO_METER) -> Outcome:
    """NoisyStats with its own budget split, optionally reusing an already released noisy nvar.

    Guarantee: sequential composition of the maps of ``nvar_step(eps_nvar)`` (unless
    ``nvar_released`` is given: then it was paid where it was released and ``eps_nvar`` is
    ignored), ``ncov_step(eps_ncov)`` and ``intercept_step(eps_intercept)``.
    """
    nvar = nvar_step(eps_nvar) if nvar_released is None else None
    return _noisy_stats(batch, nvar, ncov_step(eps_ncov), intercept_step(eps_intercept), rand,
                        reps, nvar_released, meter)


def _noisy_stats(batch: TractBatch, nvar: NoiseStep | None, ncov: NoiseStep,
                 intercept: NoiseStep, rand: Randomness, reps: int,
                 nvar_released: np.ndarray | None, meter: Meter) -> Outcome:
    p25, p75, failed, reason = blank(reps, batch.n_tracts)
    if nvar_released is None:
        nvar_released = _draw_nvar(batch, nvar, rand, reps, meter)
    extras = {"noisy_ncov": np.full((reps, batch.n_tracts), np.nan),
              "noisy_nvar": np.array(nvar_released, dtype=float, copy=True)}
    idx = _usable(batch)
    if idx.size == 0:
        return Outcome(p25, p75, failed, reason, extras)
    st = sufficient_stats(batch)
    n = st.n[idx].astype(np.float64)
    labels = batch.labels[idx]
    ncov_t = _draw_scalar(rand, ncov, labels, np.broadcast_to(st.ncov[idx], (reps, idx.size)),
                          reps, meter, n=n)
    nvar_t = nvar_released[:, idx]
    ok = nvar_t > 0
    slope = np.where(ok, ncov_t / np.where(ok, nvar_t, 1.0), 0.0)
    centre = st.ybar[idx] - slope * st.xbar[idx]
    icpt = _draw_scalar(rand, intercept, labels, centre, reps, meter, n=n, noisy_slope=slope)
    p25[:, idx] = np.where(ok, slope * X_LOW + icpt, np.nan)
    p75[:, idx] = np.where(ok, slope * X_HIGH + icpt, np.nan)
    failed[:, idx] = ~ok
    reason[:, idx] = np.where(ok, "", "noisy nvar <= 0")
    extras["noisy_ncov"][:, idx] = ncov_t
    return Outcome(p25, p75, failed, reason, extras)


@register
class NoisyIntercept(_StatsEstimator):
    """Pure ε-DP: ``ȳ + Lap(1/(nε))`` (sensitivity of ȳ is 1/n), used for both p25 and p75."""

    name = "NoisyIntercept"
    summary = "Noisy mean of y, used as both predictions (slope taken as 0)"
    sampler = _LAPLACE

    def _noise_steps(self, epsilon, delta, hp):
        return [ybar_step(epsilon)]

    def _run(self, batch, budget, rand, reps, hp, meter):
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        idx = _usable(batch)
        if idx.size:
            st = sufficient_stats(batch)
            ybar = np.broadcast_to(st.ybar[idx], (reps, idx.size))
            noisy = _draw_scalar(rand, budget.step("mean of y"), batch.labels[idx], ybar, reps,
                                 meter, n=st.n[idx])
            p25[:, idx] = noisy
            p75[:, idx] = noisy
        return Outcome(p25, p75, failed, reason)
