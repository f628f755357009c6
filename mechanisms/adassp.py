"""AdaSSP: adaptive sufficient-statistic perturbation (Wang 2018), for one regressor.

Y.-X. Wang, "Revisiting differentially private linear regression: optimal and adaptive
prediction & estimation in unbounded domain" (UAI 2018), Algorithm 2 (restated in
shared/papers/data-dependent-ssp-regression.txt, Appendix B). Per tract, features
``u = (1, x)`` with x ∈ [0, 1] and response y ∈ [0, 1]:

1. release the smallest eigenvalue of ``XᵀX`` with Gaussian noise, and lower it by
   ``√log(6/δ)`` noise standard deviations (a high-probability lower bound, floored at 0):
   ``λ̃_min = max(λ_min + σ_λ·Z − σ_λ·√log(6/δ), 0)``;
2. choose the ridge ``λ = max(0, σ_XX·√(d·log(2d²/p)) − λ̃_min)`` (d = 2, p = ``fail_prob``,
   Wang's ρ = 0.05): the bound that w.p. 1 − p dominates the spectral norm of the noise
   added to ``XᵀX`` in step 3, less what the data's own curvature already provides;
3. release ``XᵀX`` with Gaussian noise: its entries ``Σx`` and ``Σx²`` (the entry n is public
   under this project's relation, so it is not noised, unlike Wang's add/remove setting);
4. release ``Xᵀy = (Σy, Σxy)`` with Gaussian noise;
5. ``θ = (XᵀX~ + λI)⁻¹ Xᵀy~`` (2×2, closed form), ``p25 = θ₀ + θ₁/4``, ``p75 = θ₀ + 3θ₁/4``.
   Predictions are not clipped (as NoisyStats). If ``XᵀX~ + λI`` is not positive definite the
   ridge objective has no minimiser and the tract fails with that reason (never a
   non-private fallback): the budget was spent.

Steps 2 and 5 are post-processing of the three releases (their inputs are the noisy values and
public numbers: n, δ, p and the noise scales).

Sensitivities under replace-one (n public; u = (1, x) with x, y ∈ [0, 1]); Wang's bounds are
for add/remove (‖𝒳‖² = 2 and ‖𝒳‖‖𝒴‖ = √2 here):

- ``λ_min(XᵀX)``: **1**. Replacing record a by b turns A = XᵀX into A' = A − u_a u_aᵀ + u_b u_bᵀ.
  By Courant–Fischer λ_min(A) = min_{‖w‖=1} wᵀAw, so for w a unit eigenvector of λ_min(A),
  λ_min(A') ≤ wᵀA'w = λ_min(A) + (w·u_b)² − (w·u_a)² ≤ λ_min(A) + (w·u_b)². The off-diagonal
  entry Σx of A is ≥ 0 and λ_min(A) ≤ A₁₁ = n, so (A₁₁ − λ_min)w₀ + Σx·w₁ = 0 makes w₀ and
  w₁ of opposite signs (or one zero): w = ±(c, −s) with c, s ≥ 0, c² + s² = 1. Then
  w·u_b = ±(c − s·x_b) with c − s·x_b ∈ [c − s, c] ⊂ [−s, c], so (w·u_b)² ≤ max(c², s²) ≤ 1.
  The same argument from A' bounds λ_min(A) − λ_min(A') ≤ 1. It is tight: n − 1 records at
  x = 0 and one moved from x = 0 to x = 1 moves λ_min from 0 to 1 − O(1/n).
- ``(Σx, Σx²)``: **√2**. The change is (d, d·s) with d = x_b − x_a, s = x_b + x_a; its squared
  norm d²(1 + s²) ≤ d²(1 + (2 − |d|)²), increasing in |d| ≤ 1: at most 2 (x: 0 → 1).
- ``(Σy, Σxy)``: **√2**. Each coordinate changes by at most 1 (values in [0, 1]); (0, 0) → (1, 1)
  attains it.

Privacy (per tract; tracts are disjoint, so parallel composition gives the batch's guarantee):
each release is the grid Gaussian (``gaussian_mechanism``: the query rounded to a grid of
``grid_steps`` units per unit of sensitivity, plus exact discrete Gaussian noise of variance
``sigma2`` units), ρ_i-zCDP with ρ_i = (grid_steps + √dims)²/(2·sigma2) (Canonne, Kamath &
Steinke 2020, Thm 4, on the rounded integer query). The three compose to Σρ_i (Bun & Steinke
2016, Lemma 2.3), converted to (ε, δ) with dp-accounting's RDP accountant. Wang splits (ε, δ)
into three equal parts; here the zCDP budget ρ = ``rho_for_approx(ε, δ)`` is split into three
equal parts, so the guarantee is at most (ε, δ) and is *computed* from the calibrated noise
(``noise_steps``), with which every draw is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch, sufficient_stats
from .noise import Randomness, gaussian_mechanism
from .privacy import rho_for_approx, to_approx
from .privacy_maps import GridGaussian, NoiseStep, compose
from .registry import MIN_RECORDS, Estimator, Meter, Outcome, blank, register
from .sensitivity import constant

LAMBDA_MIN = "min eigenvalue of X'X"
GRAM = "X'X"
MOMENT = "X'y"
STEP_NAMES = (LAMBDA_MIN, GRAM, MOMENT)
FEATURES = 2  # d: the features (1, x)
# The three releases' sensitivities, derived in the module docstring.
STEP_SENSITIVITY = {
    LAMBDA_MIN: constant(
        1.0, "L2", "1",
        "1 (replace-one, n public, features (1, x) with x in [0, 1]: Courant-Fischer, see "
        "mechanisms/adassp.py)",
        "replacing one row u = (1, x) moves the smallest eigenvalue of X'X by at most 1, by "
        "Courant-Fischer with its eigenvector's coordinates of opposite signs (module "
        "docstring; Wang 2018, AdaSSP, for add/remove)"),
    GRAM: constant(
        math.sqrt(2.0), "L2", "sqrt(2)",
        "sqrt(2) (L2 of (sum x, sum x^2), replace-one, x in [0, 1]; n is public, not noised)",
        "replacing x_a by x_b moves (sum x, sum x^2) by d(1, s), d = x_b - x_a, s = x_b + x_a, "
        "of squared norm at most 2 for x in [0, 1] (module docstring)"),
    MOMENT: constant(
        math.sqrt(2.0), "L2", "sqrt(2)",
        "sqrt(2) (L2 of (sum y, sum x*y), replace-one, x and y in [0, 1])",
        "each of sum y and sum xy moves by at most 1 when one record on [0, 1]^2 is replaced "
        "(module docstring)"),
}
SENSITIVITY = {name: s.value() for name, s in STEP_SENSITIVITY.items()}
DIMS = {LAMBDA_MIN: 1, GRAM: 2, MOMENT: 2}
DEFAULTS = {"fail_prob": 0.05, "default_delta": 1e-6}
# Peak memory of one _run, reps = 1: the tract subset's copy, sufficient_stats' centred
# deviations, their products and tract_sum's cumulative sums: tracemalloc measured 66-78 bytes
# per record at n = 800-5000 plus about 20 kB fixed; rounded up (tests/test_adassp.py
# re-measures).
_BYTES_PER_RECORD = 160
_FIXED_BYTES = 64 * 1024


# ---------------------------------------------------------------------------------------------
# Hyperparameters and calibration


def _delta(delta: float | None, hp: dict) -> float:
    d = float(delta) if delta is not None else float(hp["default_delta"])
    if not 0 < d < 1:
        raise ValueError(f"AdaSSP: delta must lie in (0, 1), got {d!r}")
    return d


def _fail_prob(hp: dict) -> float:
    p = hp["fail_prob"]
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
        raise ValueError(f"AdaSSP: fail_prob must lie in (0, 1), got {p!r}")
    return float(p)


def adassp_steps(epsilon: float, delta: float | None, hp: dict) -> list[NoiseStep]:
    """The three releases, each a grid Gaussian with a third of ρ = rho_for_approx(ε, δ)."""
    _fail_prob(hp)
    rho_each = rho_for_approx(float(epsilon), _delta(delta, hp)) / len(STEP_NAMES)
    steps = []
    for name in STEP_NAMES:
        try:
            noise = GridGaussian.calibrate(rho_each, DIMS[name])
        except ValueError:
            raise ValueError(f"AdaSSP: epsilon = {epsilon:g} leaves rho = {rho_each:.3g} for "
                             f"the {name} release, too little for the grid Gaussian; use a "
                             "larger epsilon") from None
        steps.append(NoiseStep(name, noise, STEP_SENSITIVITY[name]))
    return steps


def noise_sd(step: NoiseStep) -> float:
    """Standard deviation (parameter) of the step's noise per coordinate, in data units:
    sensitivity · √sigma2 / grid_steps (the grid unit is sensitivity/grid_steps)."""
    return step.sensitivity.value() * math.sqrt(step.noise.sigma2) / step.noise.grid_steps


# ---------------------------------------------------------------------------------------------
# The statistics and their releases


@dataclass(frozen=True)
class Gram:
    """Per tract: n, the smallest eigenvalue of XᵀX and the entries Σx, Σx², Σy, Σxy."""

    n: np.ndarray
    lambda_min: np.ndarray
    sum_x: np.ndarray
    sum_xx: np.ndarray
    sum_y: np.ndarray
    sum_xy: np.ndarray


def gram(batch: TractBatch, tracts: np.ndarray) -> Gram:
    """XᵀX and Xᵀy of the features (1, x) for the tracts ``tracts`` (indices into ``batch``).

    From the centred statistics (no cancellation): Σx² = nvar + n·x̄², Σxy = ncov + n·x̄·ȳ, and
    λ_min = det/λ_max with det = n·nvar (exact) and λ_max the larger root, so a nearly
    singular XᵀX still gets an accurate small eigenvalue.
    """
    st = sufficient_stats(batch.subset(tracts))
    n = st.n.astype(np.float64)
    sum_x, sum_y = n * st.xbar, n * st.ybar
    sum_xx = st.nvar + n * st.xbar**2
    sum_xy = st.ncov + n * st.xbar * st.ybar
    lambda_max = (n + sum_xx) / 2.0 + np.hypot((n - sum_xx) / 2.0, sum_x)
    return Gram(n, n * st.nvar / lambda_max, sum_x, sum_xx, sum_y, sum_xy)


def release(step: NoiseStep, labels: np.ndarray, values: np.ndarray, rand: Randomness,
            reps: int, meter: Meter) -> np.ndarray:
    """Spend ``step``'s map for ``labels``, then release ``values`` (tracts, dims), ``reps``
    times, with the step's grid Gaussian: (reps, tracts, dims)."""
    values = np.broadcast_to(values, (reps,) + values.shape)
    meter.spend(labels, step.guarantee, reps)
    # The sampler checks the coordinate count against the calibration.
    return gaussian_mechanism(rand, values, step.sensitivity.value(), step.noise)


@dataclass(frozen=True)
class Released:
    """The three noisy releases, (reps, tracts) each."""

    lambda_min: np.ndarray
    sum_x: np.ndarray
    sum_xx: np.ndarray
    sum_y: np.ndarray
    sum_xy: np.ndarray


def release_all(g: Gram, labels: np.ndarray, steps: dict[str, NoiseStep], rand: Randomness,
                reps: int, meter: Meter) -> Released:
    """Wang's three releases, in his order."""
    lam = release(steps[LAMBDA_MIN], labels, g.lambda_min[:, None], rand, reps, meter)
    xx = release(steps[GRAM], labels, np.stack([g.sum_x, g.sum_xx], axis=1), rand, reps, meter)
    xy = release(steps[MOMENT], labels, np.stack([g.sum_y, g.sum_xy], axis=1), rand, reps,
                 meter)
    return Released(lam[..., 0], xx[..., 0], xx[..., 1], xy[..., 0], xy[..., 1])


# ---------------------------------------------------------------------------------------------
# Post-processing: the adaptive ridge and the 2×2 solve


def ridge(noisy_lambda_min: np.ndarray, steps: dict[str, NoiseStep], delta: float,
          fail_prob: float) -> np.ndarray:
    """Wang's steps 2–3 with the noise actually drawn: λ̃_min = max(λ̂ − σ_λ√log(6/δ), 0),
    λ = max(0, σ_XX·√(d·log(2d²/p)) − λ̃_min)."""
    log_term = math.log(6.0 / delta)
    lower = np.maximum(noisy_lambda_min - noise_sd(steps[LAMBDA_MIN]) * math.sqrt(log_term), 0)
    bound = noise_sd(steps[GRAM]) * math.sqrt(FEATURES * math.log(2 * FEATURES**2 / fail_prob))
    return np.maximum(0.0, bound - lower)


@dataclass(frozen=True)
class RidgeFit:
    intercept: np.ndarray
    slope: np.ndarray
    ok: np.ndarray  # XᵀX~ + λI positive definite


def solve_ridge(n: np.ndarray, sum_x: np.ndarray, sum_xx: np.ndarray, sum_y: np.ndarray,
                sum_xy: np.ndarray, lam: np.ndarray) -> RidgeFit:
    """θ = (M)⁻¹b for M = [[n + λ, Σx], [Σx, Σx² + λ]], b = (Σy, Σxy), elementwise (closed
    form); ``ok`` where M is positive definite (n + λ > 0 and det M > 0), NaN elsewhere."""
    a, c = n + lam, sum_xx + lam
    det = a * c - sum_x**2
    ok = (a > 0) & (det > 0) & np.isfinite(det)
    safe = np.where(ok, det, 1.0)
    intercept = np.where(ok, (c * sum_y - sum_x * sum_xy) / safe, np.nan)
    slope = np.where(ok, (a * sum_xy - sum_x * sum_y) / safe, np.nan)
    return RidgeFit(intercept, slope, ok)


# ---------------------------------------------------------------------------------------------
# The estimator


@register
class AdaSSP(Estimator):
    """AdaSSP (Wang 2018, Alg. 2) for p25/p75; see the module docstring for the derivation.

    Guarantee: (ε, δ)-DP, the RDP conversion at δ of Σρ_i, ρ_i the grid Gaussian maps of the
    λ_min (sensitivity 1), XᵀX (√2) and Xᵀy (√2) releases under replace-one, n public.
    """

    name = "AdaSSP"
    needs_delta = True
    defaults = DEFAULTS
    # Exact samplers and a derived guarantee: publishable, but not in the default suite
    # (a third (epsilon, delta) estimator beside DPGDApprox and DDSSP).
    in_default_suite = False
    summary = ("Adaptive sufficient-statistic perturbation (Wang 2018): Gaussian noise on "
               "lambda_min(X'X), X'X and X'y, ridge from the private lambda_min ((epsilon, delta))")
    sampler = ("grid Gaussian: exact discrete Gaussian (CKS 2020); L2 sensitivities 1 "
               "(lambda_min), sqrt(2) (X'X), sqrt(2) (X'y)")

    def _noise_steps(self, epsilon, delta, hp):
        return adassp_steps(epsilon, delta, hp)

    def _compose(self, steps, delta, hp):
        # The steps compose to ρ-zCDP (their maps), converted to (ε, δ) by dp-accounting.
        return to_approx(compose(steps), _delta(delta, hp))

    def _run(self, batch, budget, rand, reps, hp, meter):
        steps = {name: budget.step(name) for name in STEP_NAMES}
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        extras = {k: np.full((reps, batch.n_tracts), np.nan) for k in (
            "noisy_lambda_min", "noisy_sum_x", "noisy_sum_xx", "noisy_sum_y", "noisy_sum_xy",
            "ridge")}
        tracts = np.flatnonzero(batch.n >= MIN_RECORDS)
        if tracts.size == 0:
            return Outcome(p25, p75, failed, reason, extras)
        g = gram(batch, tracts)
        noisy = release_all(g, batch.labels[tracts], steps, rand, reps, meter)
        lam = ridge(noisy.lambda_min, steps, _delta(budget.delta, hp), _fail_prob(hp))
        fit = solve_ridge(g.n, noisy.sum_x, noisy.sum_xx, noisy.sum_y, noisy.sum_xy, lam)
        p25[:, tracts] = fit.intercept + fit.slope * X_LOW
        p75[:, tracts] = fit.intercept + fit.slope * X_HIGH
        failed[:, tracts] = ~fit.ok
        reason[:, tracts] = np.where(fit.ok, "", "noisy X'X + ridge is not positive definite")
        for key, value in (("noisy_lambda_min", noisy.lambda_min), ("noisy_sum_x", noisy.sum_x),
                           ("noisy_sum_xx", noisy.sum_xx), ("noisy_sum_y", noisy.sum_y),
                           ("noisy_sum_xy", noisy.sum_xy), ("ridge", lam)):
            extras[key][:, tracts] = value
        return Outcome(p25, p75, failed, reason, extras)

    def peak_bytes(self, n, **hp):
        return _FIXED_BYTES + _BYTES_PER_RECORD * np.asarray(n, dtype=np.int64)
