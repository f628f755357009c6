"""DPGradDescent: noisy gradient descent on (p25, p75), in three privacy variants.

Model ``ŷ(x) = 2[p25·(3/4 − x) + p75·(x − 1/4)]``, start (0.5, 0.5), T steps. Each record's
gradient ``2(ŷ − y)·(3/4 − x, x − 1/4)`` is clipped coordinate-wise to [−τ, τ] and summed over
the tract; noise goes on the sum; the step size ``1/sqrt(Σ_{s≤t} ‖g̃_s‖²)`` and the average of
the last half of the iterates are post-processing.

Sensitivity of the clipped sum under replace-one: one record's clipped gradient lies in
[−τ, τ]², so replacing it moves the sum by at most 2τ per coordinate: L1 ``4τ``, L2 ``2√2·τ``.

- DPGDPure: Laplace calibrated to ε/T per step: ε-DP by sequential composition.
- DPGDzCDP: Gaussian calibrated to ρ/T per step with ρ = ε²/2 (the paper's comparison
  point): ρ-zCDP.
- DPGDApprox: the largest ρ whose zCDP→(ε, δ) conversion (dp-accounting, RDP) stays within
  (ε, δ), run as DPGDzCDP: (ε, δ)-DP.

Each guarantee is T times the privacy map of the calibrated step (``noise_steps``: one
"gradient step" with repeat = T), never more than the budget; every iteration spends one
step's map from the run's meter before it draws.
"""

from __future__ import annotations

import math

import numpy as np

from .noise import gaussian_mechanism, laplace_mechanism
from .privacy import rho_for_approx, to_approx
from .privacy_maps import GridGaussian, GridLaplace, NoiseStep, compose
from .registry import Estimator, Outcome, blank, register
from .sensitivity import Sensitivity

_DEFAULTS = {"steps": 80, "tau": 1.0}
# Peak memory of one _run with reps = 1: tracemalloc measured 111 bytes per record at n = 1600
# (the (reps, 2, records) clipped gradients, per-record predictions and residuals, tract_sum's
# cumulative sums), plus about 20 kB fixed; rounded up (tests/test_privacy_maps.py re-measures).
_BYTES_PER_RECORD = 200
_FIXED_BYTES = 64 * 1024
STEP = "gradient step"


def clipped_gradient_sum(batch, theta: np.ndarray, tau: float) -> np.ndarray:
    """Per tract, the sum of records' gradients clipped to [−τ, τ]²: (reps, tracts, 2).

    ``theta``: current (p25, p75) per tract, shape (reps, tracts, 2).
    """
    x, y = batch.x, batch.y
    feat = np.stack([0.75 - x, x - 0.25])  # (2, records)
    th = theta[:, batch.tract_of_record, :]  # (reps, records, 2)
    yhat = 2.0 * (th[..., 0] * feat[0] + th[..., 1] * feat[1])
    resid = 2.0 * (yhat - y)  # (reps, records)
    grad = np.clip(resid[:, None, :] * feat[None, :, :], -tau, tau)  # (reps, 2, records)
    return np.moveaxis(batch.tract_sum(grad), 1, 2)


def clipped_sum_l1(tau):
    return 4.0 * float(tau)


def clipped_sum_l2(tau):
    return 2.0 * math.sqrt(2.0) * float(tau)


_CLIPPED = ("one record's clipped gradient lies in [-tau, tau]^2, so replacing it moves the "
            "tract's sum by at most 2 tau per coordinate")


def l1_sensitivity(tau: float) -> Sensitivity:
    """4τ: the L1 sensitivity of the clipped gradient sum (τ a public hyperparameter)."""
    return Sensitivity("L1", "4*tau",
                       f"4*tau = {4 * tau:g} (L1, replace-one: each record's gradient is "
                       "clipped to [-tau, tau]^2)",
                       _CLIPPED + ": L1 distance 4 tau (module docstring)", clipped_sum_l1,
                       fixed=(("tau", tau),))


def l2_sensitivity(tau: float) -> Sensitivity:
    """2√2·τ: the L2 sensitivity of the clipped gradient sum."""
    return Sensitivity("L2", "2*sqrt(2)*tau",
                       f"2*sqrt(2)*tau = {2 * math.sqrt(2) * tau:g} (L2, replace-one: each "
                       "record's gradient is clipped to [-tau, tau]^2)",
                       _CLIPPED + ": L2 distance 2 sqrt(2) tau (module docstring)",
                       clipped_sum_l2, fixed=(("tau", tau),))


def _steps_and_tau(name: str, hp: dict) -> tuple[int, float]:
    steps, tau = hp["steps"], hp["tau"]
    if isinstance(steps, bool) or int(steps) != steps or steps < 1:
        raise ValueError(f"{name}: steps must be an integer >= 1, got {steps!r}")
    if isinstance(tau, bool) or not (math.isfinite(float(tau)) and float(tau) > 0):
        raise ValueError(f"{name}: tau must be a finite number > 0, got {tau!r}")
    return int(steps), float(tau)


class _GradientDescent(Estimator):
    defaults = _DEFAULTS

    def _gradient_step(self, epsilon: float, delta: float | None, hp: dict) -> NoiseStep:
        """The calibrated noise of one gradient step (repeat = T)."""
        raise NotImplementedError

    def _noise_steps(self, epsilon, delta, hp):
        return [self._gradient_step(epsilon, delta, hp)]

    def _noisy_sum(self, rand, grad_sum, epsilon, delta, hp, step: NoiseStep | None = None):
        """One noisy release of the clipped gradient sums, with ``step``'s calibrated noise
        (by default the calibration for ``epsilon``)."""
        raise NotImplementedError

    def _run(self, batch, budget, rand, reps, hp, meter):
        steps, tau = _steps_and_tau(self.name, hp)
        step = budget.step(STEP)
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        theta = np.full((reps, batch.n_tracts, 2), 0.5)
        sq_norms = np.zeros((reps, batch.n_tracts))
        kept = np.zeros_like(theta)
        first_kept = steps // 2
        for t in range(steps):
            gsum = clipped_gradient_sum(batch, theta, tau)
            # Every iteration is a release on the same people: each spends one step's map.
            meter.spend(batch.labels, step.guarantee, reps)
            noisy = self._noisy_sum(rand, gsum, budget.epsilon, budget.delta, hp, step)
            sq_norms += np.sum(noisy**2, axis=-1)
            theta = theta - noisy / np.sqrt(np.maximum(sq_norms, 1e-300))[..., None]
            if t >= first_kept:
                kept += theta
        mean = kept / (steps - first_kept)
        p25[:] = mean[..., 0]
        p75[:] = mean[..., 1]
        return Outcome(p25, p75, failed, reason)

    def peak_bytes(self, n, **hp):
        return _FIXED_BYTES + _BYTES_PER_RECORD * np.asarray(n, dtype=np.int64)


@register
class DPGDPure(_GradientDescent):
    name = "DPGDPure"
    summary = "Noisy gradient descent, Laplace noise (pure epsilon-DP)"
    sampler = "grid Laplace: exact discrete Laplace (CKS 2020), L1 sensitivity 4*tau"

    def _gradient_step(self, epsilon, delta, hp):
        steps, tau = _steps_and_tau(self.name, hp)
        return NoiseStep(STEP, GridLaplace.calibrate(epsilon / steps, 2), l1_sensitivity(tau),
                         repeat=steps)

    def _noisy_sum(self, rand, grad_sum, epsilon, delta, hp, step=None):
        step = step or self._gradient_step(epsilon, delta, hp)
        return laplace_mechanism(rand, grad_sum, step.sensitivity.value(), step.noise)


@register
class DPGDzCDP(_GradientDescent):
    name = "DPGDzCDP"
    summary = "Noisy gradient descent, Gaussian noise, rho = epsilon^2/2 (zCDP)"
    sampler = "grid Gaussian: exact discrete Gaussian (CKS 2020), L2 sensitivity 2*sqrt(2)*tau"

    def total_rho(self, epsilon: float, delta: float | None, hp: dict) -> float:
        return epsilon**2 / 2.0

    def _gradient_step(self, epsilon, delta, hp):
        steps, tau = _steps_and_tau(self.name, hp)
        rho_step = self.total_rho(epsilon, delta, hp) / steps
        try:
            noise = GridGaussian.calibrate(rho_step, 2)
        except ValueError as err:
            raise ValueError(f"{self.name}: epsilon = {epsilon:g} over {steps} steps leaves "
                             f"rho = {rho_step:.3g} per step, too little for the grid Gaussian "
                             f"({err}); use fewer steps or a larger epsilon") from None
        return NoiseStep(STEP, noise, l2_sensitivity(tau), repeat=steps)

    def _noisy_sum(self, rand, grad_sum, epsilon, delta, hp, step=None):
        step = step or self._gradient_step(epsilon, delta, hp)
        return gaussian_mechanism(rand, grad_sum, step.sensitivity.value(), step.noise)


@register
class DPGDApprox(DPGDzCDP):
    name = "DPGDApprox"
    needs_delta = True
    defaults = {**_DEFAULTS, "default_delta": 1e-6}
    summary = "Noisy gradient descent, Gaussian noise calibrated to (epsilon, delta)"

    @staticmethod
    def _delta(delta: float | None, hp: dict) -> float:
        d = float(delta) if delta is not None else float(hp["default_delta"])
        if not 0 < d < 1:
            raise ValueError(f"DPGDApprox: delta must lie in (0, 1), got {d!r}")
        return d

    def total_rho(self, epsilon, delta, hp):
        return rho_for_approx(epsilon, self._delta(delta, hp))

    def _compose(self, steps, delta, hp):
        # The steps compose to ρ-zCDP (their maps); converted to (ε, δ) by dp-accounting.
        return to_approx(compose(steps), self._delta(delta, hp))
