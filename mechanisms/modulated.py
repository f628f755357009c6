"""ModulatedLR: the one-shot modulated protocol for simple regression. NOT differentially
private for this project's privacy unit; evaluation only.

Vepakomma, Reisizadeh, Horváth & Dahleh, "Modulated learning for private and distributed
regression with just a single sample per client device" (shared/papers/
modulated-learning-single-sample-clients.txt): the single-vector client map (Sec. 3.1, Alg. 1)
and the non-iterative moment estimator (Sec. 5). Per tract, each person is a client holding
the features u = (1, x) and the response y:

- client: a phase φ uniform on [0, 2π), ``g = (1 − α)u + λ·cos(ω⟨u, v⟩ + φ)·v`` and
  ``h = g + ξ`` with Gaussian ξ of variance σ² per coordinate; it sends (h, y);
- server: ``Σ̂ = (1/(1 − α)²)·(mean(h hᵀ) − (λ²/2)·v vᵀ − σ²I)`` (eq. 4 with h for g̃),
  ``Γ̂ = mean(y·h)/(1 − α)`` (Sec. 5) and ``β̂ = (Σ̂ + γI)⁻¹Γ̂``, γ = 0 as in Sec. 5 (the
  paper's experiments tune a ridge γ: the ``ridge`` hyperparameter); p25 = β̂₀ + β̂₁/4,
  p75 = β̂₀ + 3β̂₁/4.

Conditionally on the data, E[Σ̂] = (1/n)Σ u uᵀ and E[Γ̂] = (1/n)Σ y u (the paper's eqs. 9 and
10–12: the cosine has mean 0 and mean square 1/2 under a uniform phase, ξ has mean 0 and
variance σ²); ``tests/test_modulated.py`` checks both. β̂ itself is a ratio of noisy moments
and is not unbiased; a tract whose Σ̂ + γI is not positive definite fails (the least-squares
objective has no minimiser), never falling back to a non-noisy value.

Why it is not DP here. The paper's guarantee (Lemma 3.1, Cor. 7.3) is local (ε, δ)-DP for one
client's *features* under ``‖u − u'‖₂ ≤ 1``, with y "non-sensitive/public" and sent in the
clear. This project's unit is a person's (x, y) under replace-one: the estimate uses every y
without noise (one y moves Γ̂ by h·Δy/(n(1 − α)) with nothing calibrated to it), so no
guarantee holds for the unit, and it is ``NotDP``, ``private = False`` and not publishable,
like MOS. Its noise is still the project's exact sampler (so the evaluation compares like
with like), calibrated as the paper's Sec. 4 does: ρ-zCDP for x per client with
σ² = L²/(2ρ), L = (1 − α) + λω the Lipschitz constant of Lemma 3.1 (here the L2 sensitivity
of g: ‖u − u'‖ = |x − x'| ≤ 1 on [0, 1]), ρ the largest zCDP whose (ε, δ) conversion fits.

Assumptions where the paper leaves the simple-regression case open (docs/adassp-modulated.md):
the intercept is the constant feature 1 and is perturbed like any feature (as written); the
modulation direction is v = (0, 1), public (Sec. 5 has no β to be orthogonal to); the phase
is 2π·k/2³² with k an exact uniform integer (E cos = 0 and E cos² = 1/2 hold exactly for a
uniform phase on M ≥ 3 equally spaced points, so the debiasing is unchanged); σ² is the
variance of the grid Gaussian actually drawn; α = 1/2, λ = 0.2, ω = 1 (L = 0.7 < 1, the
contractive regime the paper recommends; the paper gives no values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch
from .noise import Randomness, gaussian_mechanism
from .privacy import NotDP, rho_for_approx
from .privacy_maps import GridGaussian
from .registry import MIN_RECORDS, Estimator, Outcome, blank, register
from .sensitivity import Sensitivity

FEATURES = 2  # u = (1, x)
MODULATION_DIRECTION = np.array([0.0, 1.0])  # v: the x coordinate
PHASE_LEVELS = 2**32  # the phase is 2π·k/2^32, k uniform on {0, …, 2^32 − 1}
DEFAULTS = {"alpha": 0.5, "amplitude": 0.2, "frequency": 1.0, "ridge": 0.0,
            "default_delta": 1e-6}
NOT_DP_REASON = ("local DP for x only, with y sent in the clear (treated as public): no "
                 "guarantee for a person's (x, y)")
# Records × reps handled at once: bounds the phase, message and sampler arrays.
_CHUNK = 1 << 18
# Peak memory of one _run, reps = 1: per record the phase, the 2-d message, the grid integers
# and the discrete Gaussian's rejection-loop arrays, plus tract_sum's cumulative sums of the
# five products: tracemalloc measured 505-565 bytes per record at n = 200-5000; rounded up
# (tests/test_modulated.py re-measures).
_BYTES_PER_RECORD = 768
_FIXED_BYTES = 64 * 1024


# ---------------------------------------------------------------------------------------------
# Hyperparameters and the client's noise


def lipschitz_constant(alpha, amplitude, frequency):
    return abs(1.0 - alpha) + amplitude * frequency


@dataclass(frozen=True)
class Protocol:
    """The public parameters: α, λ (``amplitude``), ω (``frequency``), the ridge γ."""

    alpha: float
    amplitude: float
    frequency: float
    ridge: float

    @staticmethod
    def of(hp: dict) -> "Protocol":
        def number(key: str) -> float:
            v = hp[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"ModulatedLR: {key} must be a finite number, got {v!r}")
            return float(v)

        p = Protocol(number("alpha"), number("amplitude"), number("frequency"), number("ridge"))
        if not 0 < p.alpha < 1:
            raise ValueError(f"ModulatedLR: alpha must lie in (0, 1) (Lemma 3.1), got {p.alpha!r}")
        if p.amplitude <= 0 or p.frequency <= 0:
            raise ValueError("ModulatedLR: amplitude and frequency must be > 0 (Lemma 3.1)")
        if p.ridge < 0:
            raise ValueError(f"ModulatedLR: ridge must be >= 0, got {p.ridge!r}")
        return p

    @property
    def lipschitz(self) -> float:
        """L = |1 − α| + λω (Lemma 3.1): the L2 sensitivity of g for |x − x'| ≤ 1."""
        return lipschitz_constant(self.alpha, self.amplitude, self.frequency)


def client_sensitivity(protocol: Protocol) -> Sensitivity:
    """L = |1 − α| + λω, the L2 sensitivity of a client's g in its x (public α, λ, ω)."""
    return Sensitivity(
        "L2", "|1 - alpha| + amplitude*frequency",
        f"|1 - alpha| + amplitude*frequency = {protocol.lipschitz:g} (L2, one client's x "
        "replaced, |x - x'| <= 1; y is sent in the clear: NOT DP for a person's (x, y))",
        "g = (1 - alpha) u + amplitude cos(frequency <u, v> + phase) v is L-Lipschitz in u "
        "with L = |1 - alpha| + amplitude * frequency, and |u - u'| = |x - x'| <= 1 "
        "(Vepakomma et al., Lemma 3.1)", lipschitz_constant, (),
        (("alpha", protocol.alpha), ("amplitude", protocol.amplitude),
         ("frequency", protocol.frequency)))


def _delta(delta: float | None, hp: dict) -> float:
    d = float(delta) if delta is not None else float(hp["default_delta"])
    if not 0 < d < 1:
        raise ValueError(f"ModulatedLR: delta must lie in (0, 1), got {d!r}")
    return d


def client_noise(epsilon: float, delta: float, protocol: Protocol) -> GridGaussian:
    """The grid Gaussian each client adds to its 2-d message: ρ-zCDP *for x only* (the
    paper's Sec. 4 calibration σ² = L²/(2ρ)), ρ the largest zCDP whose (ε, δ) conversion fits.
    Not a guarantee for this project's relation (module docstring)."""
    rho = rho_for_approx(float(epsilon), float(delta))
    try:
        return GridGaussian.calibrate(rho, FEATURES)
    except ValueError:
        raise ValueError(f"ModulatedLR: epsilon = {epsilon:g} leaves rho = {rho:.3g}, too "
                         "little for the grid Gaussian; use a larger epsilon") from None


def noise_variance(noise: GridGaussian, protocol: Protocol) -> float:
    """σ² per coordinate in data units: (L/grid_steps)²·sigma2 (grid unit L/grid_steps)."""
    return (protocol.lipschitz / noise.grid_steps) ** 2 * noise.sigma2


# ---------------------------------------------------------------------------------------------
# Client and server


def client_messages(x: np.ndarray, protocol: Protocol, noise: GridGaussian, rand: Randomness,
                    reps: int) -> np.ndarray:
    """Algorithm 1 for every record, ``reps`` times: h, shape (reps, records, 2)."""
    k = rand.below(np.full((reps, x.size), PHASE_LEVELS, dtype=np.uint64))
    phase = (2.0 * math.pi / PHASE_LEVELS) * k.astype(np.float64)
    u = np.stack([np.ones_like(x), x], axis=-1)  # (records, 2)
    g = (1.0 - protocol.alpha) * u[None, :, :] + (
        protocol.amplitude * np.cos(protocol.frequency * (u @ MODULATION_DIRECTION)[None, :]
                                    + phase))[..., None] * MODULATION_DIRECTION
    return gaussian_mechanism(rand, g, client_sensitivity(protocol).value(), noise)


@dataclass(frozen=True)
class Moments:
    """Per (rep, tract): the debiased Σ̂ (entries 11, 12, 22) and Γ̂ (entries 1, 2)."""

    cov_11: np.ndarray
    cov_12: np.ndarray
    cov_22: np.ndarray
    moment_1: np.ndarray
    moment_2: np.ndarray


def server_moments(batch: TractBatch, h: np.ndarray, protocol: Protocol,
                   variance: float) -> Moments:
    """Eq. (4) with h for g̃, and Γ̂ = mean(y·h)/(1 − α) (Sec. 5), per tract of ``batch``."""
    n = batch.n.astype(np.float64)
    scale = (1.0 - protocol.alpha) ** 2
    v = MODULATION_DIRECTION
    shift = 0.5 * protocol.amplitude**2 * np.outer(v, v) + variance * np.eye(FEATURES)

    def mean(values: np.ndarray) -> np.ndarray:
        return batch.tract_sum(values) / n

    h1, h2 = h[..., 0], h[..., 1]
    return Moments((mean(h1 * h1) - shift[0, 0]) / scale, (mean(h1 * h2) - shift[0, 1]) / scale,
                   (mean(h2 * h2) - shift[1, 1]) / scale,
                   mean(batch.y * h1) / (1.0 - protocol.alpha),
                   mean(batch.y * h2) / (1.0 - protocol.alpha))


@dataclass(frozen=True)
class Solution:
    intercept: np.ndarray
    slope: np.ndarray
    ok: np.ndarray  # Σ̂ + γI positive definite


def solve(m: Moments, ridge: float) -> Solution:
    """β̂ = (Σ̂ + γI)⁻¹Γ̂ in closed form; ``ok`` where Σ̂ + γI is positive definite."""
    a, b, c = m.cov_11 + ridge, m.cov_12, m.cov_22 + ridge
    det = a * c - b * b
    ok = (a > 0) & (det > 0) & np.isfinite(det)
    safe = np.where(ok, det, 1.0)
    intercept = np.where(ok, (c * m.moment_1 - b * m.moment_2) / safe, np.nan)
    slope = np.where(ok, (a * m.moment_2 - b * m.moment_1) / safe, np.nan)
    return Solution(intercept, slope, ok)


# ---------------------------------------------------------------------------------------------
# The estimator


@register
class ModulatedLR(Estimator):
    """The modulated one-shot estimator (module docstring). NOT DP for a person's (x, y)."""

    name = "ModulatedLR"
    private = False  # no DP guarantee for the project's unit (it draws noise, as MOS does)
    publishable = False
    not_publishable_reason = "not differentially private for a person's (x, y): " + NOT_DP_REASON
    needs_delta = True
    defaults = DEFAULTS
    summary = ("Modulated one-shot moments (Vepakomma et al.): cosine-modulated, Gaussian-"
               "noised features per person, y in the clear (NOT DP for (x, y))")
    sampler = ("grid Gaussian per record (exact discrete Gaussian, CKS 2020), L2 sensitivity "
               "(1 - alpha) + amplitude*frequency for x only; exact uniform phase")

    def guarantee(self, epsilon, delta=None, **hp):
        hp = self.hyper(hp)
        Protocol.of(hp)
        _delta(delta, hp)
        return NotDP(NOT_DP_REASON)

    def _run(self, batch, budget, rand, reps, hp, meter):
        protocol = Protocol.of(hp)
        noise = client_noise(budget.epsilon, _delta(budget.delta, hp), protocol)
        variance = noise_variance(noise, protocol)
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        names = ("cov_11", "cov_12", "cov_22", "moment_1", "moment_2")
        extras = {k: np.full((reps, batch.n_tracts), np.nan) for k in names}
        tracts = np.flatnonzero(batch.n >= MIN_RECORDS)
        if tracts.size == 0:
            return Outcome(p25, p75, failed, reason, extras)
        sub = batch.subset(tracts)
        # No privacy map exists for this draw: a real meter refuses it (never published).
        meter.spend(sub.labels, self.guarantee(budget.epsilon, budget.delta, **hp), reps)
        per_chunk = max(1, _CHUNK // max(sub.x.size, 1))
        for start in range(0, reps, per_chunk):
            rows = slice(start, min(start + per_chunk, reps))
            h = client_messages(sub.x, protocol, noise, rand, rows.stop - rows.start)
            m = server_moments(sub, h, protocol, variance)
            fit = solve(m, protocol.ridge)
            p25[rows, tracts] = fit.intercept + fit.slope * X_LOW
            p75[rows, tracts] = fit.intercept + fit.slope * X_HIGH
            failed[rows, tracts] = ~fit.ok
            reason[rows, tracts] = np.where(fit.ok, "", "debiased covariance (+ ridge) is not "
                                                        "positive definite")
            for k in names:
                extras[k][rows, tracts] = getattr(m, k)
        return Outcome(p25, p75, failed, reason, extras)

    def peak_bytes(self, n, **hp):
        return _FIXED_BYTES + _BYTES_PER_RECORD * np.asarray(n, dtype=np.int64)
