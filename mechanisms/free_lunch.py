"""FreeLunchSSP: noisy sufficient statistics under add-remove DP, with n estimated for free.

Under add-remove neighbours the tract size n is private, and a noisy count would normally
cost budget of its own. Kulesza, Suresh & Wang (ICML 2024, "Mean estimation in the add-remove
model of DP") and Fitzsimons et al. (2024) observed that for a variable x on [0, 1] the pair
(x, 1 − x) lies on the simplex: its sum over records is a vector of L1 add-remove sensitivity 1
(one record adds or removes a vector of L1 norm exactly 1), and the coordinates of its noisy sum
add up to a noisy n. One Laplace release at ε gives Σx and n at once, where two releases at ε/2
would be needed otherwise. The DP-RSS paper (shared/papers/dp-rss-free-lunch-review.txt; its
formulas are partly lost in our copy) extends this to the statistics of simple least squares,
(n, Σx, Σy, Σx², Σxy), with multidimensional simplex transformations. What we implement, and
what we assumed where the copy is unreadable:

- **x simplex** (in the paper: the noisy (S_{x²}, S_{x−x²}, S_{1−x}), each coordinate with
  Lap(1/ε₁)): every record maps to u(x) = (x², x(1 − x), 1 − x), nonnegative and summing to 1.
- **xy simplex** (our assumption for the paper's second transformation, whose definition is
  lost): v(x, y) = (xy, (1 − x)y, x(1 − y), (1 − x)(1 − y)), the product of the two
  one-dimensional simplices, nonnegative and summing to 1.
- **Refinement**: the seven released coordinates are linear in θ = (n, Σx, Σy, Σx², Σxy)
  (e.g. Σ(1 − x) = n − Σx); n and Σx appear in both releases. The paper combines duplicate
  estimates by inverse-variance weighting (its Lemma 4.11); we take the generalised least
  squares estimate θ̂ = (MᵀWM)⁻¹MᵀW·s̃ over all seven (W the inverse noise variances, public
  functions of the calibration), the best linear unbiased combination, which contains that
  weighting as a special case. It is post-processing.
- Then OLS on θ̂: nvar = Σx² − (Σx)²/n, ncov = Σxy − ΣxΣy/n, slope = ncov/nvar, ŷ(x*) = ȳ +
  slope·(x* − x̄) at x* = 1/4 (p25) and 3/4 (p75). Failures, decided from the DP outputs only:
  noisy n below ``min_noisy_n``, or noisy nvar ≤ 0. No value is substituted.

Privacy (pure ε, Laplace: chosen over Gaussian noise because (a) the estimator it is compared
with, NoisyStats, is pure ε-DP, so the comparison needs no change of accounting type, (b) the
group-privacy conversion to replace-one is tight for it: a replace-one change moves the
simplex sum by at most 2 in L1 (u(0) = (0, 0, 1) to u(1) = (1, 0, 0)), exactly twice the
add-remove sensitivity, whereas for Gaussian noise the L2 sensitivity grows only by √2 and
the group-privacy factor 4 on ρ would waste half of it, and (c) the exact discrete Laplace of
``mechanisms/noise.py`` draws it):

- each release is the grid Laplace mechanism (``noise.laplace_mechanism``) on a d-coordinate
  sum of L1 add-remove sensitivity 1: ε_i-DP for add-remove neighbours, ε_i the map of its
  calibrated noise (``privacy_maps.GridLaplace``: (4096 + d)/t, Canonne, Kamath & Steinke
  2020); the two releases compose sequentially: ε_AR = ε_x + ε_xy (noise steps stated
  ``Relation.ADD_REMOVE``);
- the guarantee the ledger charges is for replace-one, the project's relation, by the stated
  conversion ``privacy.convert_relation``: group privacy of size 2, ε_RO = 2·ε_AR (Dwork & Roth
  2014, Thm 2.2). So a budget ε (replace-one, what the ledger charges and what NoisyStats gets)
  runs the releases at ε/2 in add-remove terms: ε·x_share/2 and ε·(1 − x_share)/2. At equal
  charged guarantee the comparison with NoisyStats is fair; under replace-one n is public
  anyway, so the lunch is not free here: the factor 2 is its price (docs/relations.md).

The noise is drawn for every tract of the batch, whatever its n: a mechanism that skipped
small tracts would reveal n, which add-remove protects. (The release path suppresses small
tracts by the public n before any estimator runs; that is replace-one's business.)
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch
from .noise import LAPLACE_GRID_STEPS, Randomness, laplace_mechanism
from .privacy import PROJECT_RELATION, Guarantee, Relation
from .privacy_maps import GridLaplace, NoiseStep, compose
from .registry import Estimator, Meter, Outcome, blank, register
from .sensitivity import constant

NAME = "FreeLunchSSP"
X_STEP = "x simplex (x^2, x(1-x), 1-x)"
XY_STEP = "xy simplex (xy, (1-x)y, x(1-y), (1-x)(1-y))"
# A replace-one change is two add-remove changes (remove, then add): the group size of the
# conversion from the steps' relation to the ledger's.
GROUP_SIZE = 2
SIMPLEX_SENSITIVITY = constant(
    1.0, "L1", "1",
    "1 (L1, add-remove: each record adds or removes a vector of nonnegative coordinates "
    "summing to 1; ranks on [0, 1])",
    "for x, y in [0, 1] each of u(x) and v(x, y) has nonnegative coordinates summing to 1, so "
    "adding or removing one record moves a simplex sum by exactly 1 in L1 (the module "
    "docstring, after the DP-RSS paper's simplex transformation)", Relation.ADD_REMOVE)
_DEFAULTS = {"x_share": 0.5, "min_noisy_n": 2.0}
_SAMPLER = ("grid Laplace: exact discrete Laplace (CKS 2020) on a 1/4096-sensitivity grid, "
            "one vector draw per simplex")

# theta = (n, Σx, Σy, Σx², Σxy); each released coordinate is a row of M times theta.
THETA = ("n", "sum_x", "sum_y", "sum_xx", "sum_xy")
_M_X = np.array([[0, 0, 0, 1, 0],     # Σx²
                 [0, 1, 0, -1, 0],    # Σx(1 − x) = Σx − Σx²
                 [1, -1, 0, 0, 0]],   # Σ(1 − x)  = n − Σx
                dtype=np.float64)
_M_XY = np.array([[0, 0, 0, 0, 1],    # Σxy
                  [0, 0, 1, 0, -1],   # Σ(1 − x)y = Σy − Σxy
                  [0, 1, 0, 0, -1],   # Σx(1 − y) = Σx − Σxy
                  [1, -1, -1, 0, 1]],  # Σ(1 − x)(1 − y) = n − Σx − Σy + Σxy
                 dtype=np.float64)

# Peak memory of one _run, reps = 1: tracemalloc measured 96 bytes per record at n = 100,000
# (82.6 kB at n = 800): the four per-record xy-simplex coordinates (32 bytes) and tract_sum's
# zero-padded cumulative sums of them (64 bytes); the x simplex (three) is freed before.
# Rounded up to 200 bytes plus 64 kB; tests/test_privacy_maps.py re-measures at n = 50, 200, 800.
_BYTES_PER_RECORD = 200
_FIXED_BYTES = 64 * 1024


# ---------------------------------------------------------------------------------------------
# The transformations


def x_simplex(x: np.ndarray) -> np.ndarray:
    """u(x) = (x², x(1 − x), 1 − x) per record, shape (3, records): on the simplex for x in
    [0, 1]."""
    return np.stack([x * x, x * (1.0 - x), 1.0 - x])


def xy_simplex(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """v(x, y) = (xy, (1 − x)y, x(1 − y), (1 − x)(1 − y)) per record, shape (4, records)."""
    return np.stack([x * y, (1.0 - x) * y, x * (1.0 - y), (1.0 - x) * (1.0 - y)])


def simplex_sums(batch: TractBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per tract the exact sums of u and v: (tracts, 3) and (tracts, 4)."""
    return (batch.tract_sum(x_simplex(batch.x)).T,
            batch.tract_sum(xy_simplex(batch.x, batch.y)).T)


# ---------------------------------------------------------------------------------------------
# Calibration


def _hyper(hp: dict) -> tuple[float, float]:
    share, min_n = hp["x_share"], hp["min_noisy_n"]
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1:
        raise ValueError(f"{NAME}: x_share must lie in (0, 1), got {share!r}")
    if isinstance(min_n, bool) or not isinstance(min_n, (int, float)) \
            or not (math.isfinite(min_n) and min_n > 0):
        raise ValueError(f"{NAME}: min_noisy_n must be a finite number > 0, got {min_n!r}")
    return float(share), float(min_n)


def free_lunch_steps(epsilon: float, hp: dict) -> list[NoiseStep]:
    """The two add-remove releases for a replace-one budget ``epsilon``: ε/2 in add-remove
    terms, split ``x_share`` : 1 − ``x_share`` between the x and xy simplices."""
    share, _ = _hyper(hp)
    eps_ar = epsilon / GROUP_SIZE
    return [NoiseStep(X_STEP, GridLaplace.calibrate(share * eps_ar, 3), SIMPLEX_SENSITIVITY),
            NoiseStep(XY_STEP, GridLaplace.calibrate((1.0 - share) * eps_ar, 4),
                      SIMPLEX_SENSITIVITY)]


def discrete_laplace_variance(scale: float) -> float:
    """Variance of the discrete Laplace with P(k) ∝ exp(−|k|/t): 2e^{−1/t}/(1 − e^{−1/t})²."""
    q = math.exp(-1.0 / scale)
    return 2.0 * q / (1.0 - q) ** 2


def coordinate_variance(step: NoiseStep) -> float:
    """Noise variance of one released coordinate of ``step`` (sensitivity 1: grid unit
    1/4096), from the calibrated parameters the sampler draws with."""
    t = step.noise.scale_num / step.noise.scale_den
    return discrete_laplace_variance(t) / LAPLACE_GRID_STEPS**2


@lru_cache(maxsize=64)
def _gls(var_x: float, var_xy: float) -> tuple[np.ndarray, np.ndarray]:
    """(G, Σ): θ̂ = G·s̃ (G = (MᵀWM)⁻¹MᵀW, 5 × 7) and θ̂'s covariance Σ = (MᵀWM)⁻¹."""
    m = np.vstack([_M_X, _M_XY])
    w = np.r_[np.full(3, 1.0 / var_x), np.full(4, 1.0 / var_xy)]
    cov = np.linalg.inv(m.T @ (w[:, None] * m))
    return cov @ (m.T * w), cov


def statistics_covariance(steps: list[NoiseStep]) -> np.ndarray:
    """Covariance (5 × 5, order ``THETA``) of the noise in θ̂ for these calibrated steps."""
    return _gls(coordinate_variance(steps[0]), coordinate_variance(steps[1]))[1].copy()


# ---------------------------------------------------------------------------------------------
# Drawing


def release_simplex_sums(batch: TractBatch, step: NoiseStep, sums: np.ndarray,
                         rand: Randomness, reps: int, meter: Meter) -> np.ndarray:
    """Spend ``step``'s map for every tract, then release ``sums`` (tracts, d) with its noise:
    (reps, tracts, d). L1 add-remove sensitivity 1, whatever the tract's n."""
    values = np.broadcast_to(sums, (reps,) + sums.shape)
    meter.spend(batch.labels, step.guarantee, reps)  # converted to the charge's relation
    return laplace_mechanism(rand, values, step.sensitivity.value(), step.noise)


def estimate_statistics(noisy_x: np.ndarray, noisy_xy: np.ndarray,
                        steps: list[NoiseStep]) -> dict[str, np.ndarray]:
    """θ̂ (post-processing): the GLS combination of the seven noisy coordinates."""
    g, _ = _gls(coordinate_variance(steps[0]), coordinate_variance(steps[1]))
    s = np.concatenate([noisy_x, noisy_xy], axis=-1)  # (reps, tracts, 7)
    theta = s @ g.T
    return {name: theta[..., i] for i, name in enumerate(THETA)}


def regression(theta: dict[str, np.ndarray], min_noisy_n: float) -> Outcome:
    """p25, p75 by OLS on the noisy statistics; failures with their reasons."""
    n, sx, sy = theta["n"], theta["sum_x"], theta["sum_y"]
    n_ok = n >= min_noisy_n
    safe_n = np.where(n_ok, n, 1.0)
    nvar = np.where(n_ok, theta["sum_xx"] - sx * sx / safe_n, np.nan)
    ncov = np.where(n_ok, theta["sum_xy"] - sx * sy / safe_n, np.nan)
    ok = n_ok & (nvar > 0)
    slope = np.where(ok, ncov / np.where(ok, nvar, 1.0), np.nan)
    xbar, ybar = sx / safe_n, sy / safe_n
    p25 = np.where(ok, ybar + slope * (X_LOW - xbar), np.nan)
    p75 = np.where(ok, ybar + slope * (X_HIGH - xbar), np.nan)
    reason = np.where(~n_ok, f"noisy n < {min_noisy_n:g}",
                      np.where(ok, "", "noisy nvar <= 0")).astype(object)
    extras = {"noisy_n": n, "noisy_nvar": nvar, "noisy_ncov": ncov,
              **{f"noisy_{k}": theta[k] for k in ("sum_x", "sum_y", "sum_xx", "sum_xy")}}
    return Outcome(p25, p75, ~ok, reason, extras)


# ---------------------------------------------------------------------------------------------
# The estimator


@register
class FreeLunchSSP(Estimator):
    """Add-remove pure-DP sufficient statistics through simplex transformations (n for free),
    charged for replace-one by group privacy of size 2; p25/p75 by OLS on them."""

    name = NAME
    summary = ("Noisy least-squares statistics from two simplex sums (n for free under "
               "add-remove), charged for replace-one by group privacy")
    sampler = _SAMPLER
    defaults = _DEFAULTS
    # Its noise steps are add-remove; the release plan (dpatlas/release/allocate.py, selection.py)
    # and the release audit (dpatlas/audit/noise.py, check "relations") apply the stated conversion,
    # and the ledger refuses any guarantee not stated for replace-one.
    publishable = True
    # Not in the default suite: it is one more pure-ε estimator of the same statistics as
    # NoisyStats, and every suite member halves the others' shares.
    in_default_suite = False

    def _noise_steps(self, epsilon, delta, hp):
        _hyper(hp)
        return free_lunch_steps(epsilon, hp)

    def _compose(self, steps, delta, hp):
        # The stated conversion: add-remove → replace-one, group privacy of size 2.
        return compose(steps, relation=PROJECT_RELATION)

    def add_remove_guarantee(self, epsilon: float, **hp) -> Guarantee:
        """What the same run guarantees for add-remove neighbours (n protected): ε/2 at most."""
        return compose(self.noise_steps(epsilon, **hp))

    def _run(self, batch, budget, rand, reps, hp, meter):
        _, min_n = _hyper(hp)
        steps = [budget.step(X_STEP), budget.step(XY_STEP)]
        if batch.n_tracts == 0:
            p25, p75, failed, reason = blank(reps, 0)
            return Outcome(p25, p75, failed, reason)
        sums_x, sums_xy = simplex_sums(batch)
        noisy_x = release_simplex_sums(batch, steps[0], sums_x, rand, reps, meter)
        noisy_xy = release_simplex_sums(batch, steps[1], sums_xy, rand, reps, meter)
        return regression(estimate_statistics(noisy_x, noisy_xy, steps), min_n)

    def peak_bytes(self, n, **hp):
        return _FIXED_BYTES + _BYTES_PER_RECORD * np.asarray(n, dtype=np.int64)
