"""DPGradDescent: noisy gradient descent on (p25, p75), in three privacy variants.

Model ``ŷ(x) = 2[p25·(3/4 − x) + p75·(x − 1/4)]``, start (0.5, 0.5), T steps. Each record's
gradient ``2(ŷ − y)·(3/4 − x, x − 1/4)`` is clipped coordinate-wise to [−τ, τ] and summed over
the tract; noise goes on the sum; the step size ``1/sqrt(Σ_{s≤t} ‖g̃_s‖²)`` and the average of
the last half of the iterates are post-processing.

Sensitivity of the clipped sum under replace-one: one record's clipped gradient lies in
[−τ, τ]², so replacing it moves the sum by at most 2τ per coordinate: L1 ``4τ``, L2 ``2√2·τ``.

- DPGDPure: Laplace, ε/T per step: ε-DP by sequential composition.
- DPGDzCDP: Gaussian, ρ/T per step with ρ = ε²/2 (the paper's comparison point): ρ-zCDP.
- DPGDApprox: the largest ρ whose zCDP→(ε, δ) conversion (dp-accounting, RDP) stays within
  (ε, δ), run as DPGDzCDP: (ε, δ)-DP.
"""

from __future__ import annotations

import math

import numpy as np

from .batch import X_HIGH, X_LOW
from .noise import gaussian_mechanism, laplace_mechanism
from .privacy import ZCDP, PureDP, rho_for_approx, sequential, to_approx
from .registry import Estimator, Outcome, blank, register

_DEFAULTS = {"steps": 80, "tau": 1.0}


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


class _GradientDescent(Estimator):
    defaults = _DEFAULTS

    def _noisy_sum(self, rand, grad_sum, epsilon, delta, hp):
        raise NotImplementedError

    def _run(self, batch, epsilon, delta, rand, reps, hp):
        steps, tau = int(hp["steps"]), float(hp["tau"])
        if steps < 1 or tau <= 0:
            raise ValueError(f"{self.name}: steps must be >= 1 and tau > 0")
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        theta = np.full((reps, batch.n_tracts, 2), 0.5)
        sq_norms = np.zeros((reps, batch.n_tracts))
        kept = np.zeros_like(theta)
        first_kept = steps // 2
        for t in range(steps):
            gsum = clipped_gradient_sum(batch, theta, tau)
            noisy = self._noisy_sum(rand, gsum, epsilon, delta, hp)
            sq_norms += np.sum(noisy**2, axis=-1)
            theta = theta - noisy / np.sqrt(np.maximum(sq_norms, 1e-300))[..., None]
            if t >= first_kept:
                kept += theta
        mean = kept / (steps - first_kept)
        p25[:] = mean[..., 0]
        p75[:] = mean[..., 1]
        return Outcome(p25, p75, failed, reason)


@register
class DPGDPure(_GradientDescent):
    name = "DPGDPure"
    summary = "Noisy gradient descent, Laplace noise (pure epsilon-DP)"
    sampler = "grid Laplace: exact discrete Laplace (CKS 2020), L1 sensitivity 4*tau"

    def guarantee(self, epsilon, delta=None, **hp):
        steps = int(self.hyper(hp)["steps"])
        return sequential([PureDP(epsilon / steps)] * steps)

    def _noisy_sum(self, rand, grad_sum, epsilon, delta, hp):
        return laplace_mechanism(rand, grad_sum, 4.0 * float(hp["tau"]),
                                 epsilon / int(hp["steps"]))


@register
class DPGDzCDP(_GradientDescent):
    name = "DPGDzCDP"
    summary = "Noisy gradient descent, Gaussian noise, rho = epsilon^2/2 (zCDP)"
    sampler = "grid Gaussian: exact discrete Gaussian (CKS 2020), L2 sensitivity 2*sqrt(2)*tau"

    def total_rho(self, epsilon: float, delta: float | None, hp: dict) -> float:
        return epsilon**2 / 2.0

    def guarantee(self, epsilon, delta=None, **hp):
        hp = self.hyper(hp)
        steps = int(hp["steps"])
        return sequential([ZCDP(self.total_rho(epsilon, delta, hp) / steps)] * steps)

    def _noisy_sum(self, rand, grad_sum, epsilon, delta, hp):
        return gaussian_mechanism(rand, grad_sum, 2.0 * math.sqrt(2.0) * float(hp["tau"]),
                                  hp["_rho_step"])

    def _run(self, batch, epsilon, delta, rand, reps, hp):
        rho_step = self.total_rho(epsilon, delta, hp) / int(hp["steps"])  # once, not per step
        return super()._run(batch, epsilon, delta, rand, reps, {**hp, "_rho_step": rho_step})


@register
class DPGDApprox(DPGDzCDP):
    name = "DPGDApprox"
    needs_delta = True
    defaults = {**_DEFAULTS, "default_delta": 1e-6}
    summary = "Noisy gradient descent, Gaussian noise calibrated to (epsilon, delta)"

    @staticmethod
    def _delta(delta: float | None, hp: dict) -> float:
        return float(delta) if delta is not None else float(hp["default_delta"])

    def total_rho(self, epsilon, delta, hp):
        return rho_for_approx(epsilon, self._delta(delta, hp))

    def guarantee(self, epsilon, delta=None, **hp):
        hp = self.hyper(hp)
        concentrated = super().guarantee(epsilon, delta, **hp)
        return to_approx(concentrated, self._delta(delta, hp))
