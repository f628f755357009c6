"""The Fay–Herriot area-level model with known sampling variances (Fay & Herriot 1979).

    y_i = θ_i + e_i,   e_i ~ N(0, D_i), D_i known;      θ_i = x_i'β + u_i,   u_i ~ N(0, σ²)

Fitted by the *adjusted* residual likelihood of Li & Lahiri (2010): REML's likelihood times σ²,
maximised over σ² > 0 with scipy. Plain REML returns σ² = 0 whenever the directs are noisier
than the spread they share (at ε = 1 most tract directs are), and the EBLUP's intervals would
then shrink to the regression's own error; the adjustment keeps σ² strictly positive at the
price of an O(1/m) bias, negligible with thousands of areas.

EBLUP: θ̂_i = γ_i·y_i + (1 − γ_i)·x_i'β̂, γ_i = σ²/(σ² + D_i). Its mean squared error by
Prasad & Rao (1990) with Datta & Lahiri's (2000) term for a REML-type σ̂²:
mse_i = g1 + g2 + 2·g3, g1 = γ_i·D_i, g2 = (1 − γ_i)²·x_i'(X'V⁻¹X)⁻¹x_i,
g3 = D_i²/(σ² + D_i)³ · V(σ̂²), V(σ̂²) = 2/Σ(σ² + D_j)⁻² (the inverse information).
An area without a direct (D = ∞) gets the synthetic x'β̂ with mse σ² + x'(X'V⁻¹X)⁻¹x.

Bounded influence (``robust_beta``, ``robust_eblup``): where the sampling errors are
heavy-tailed (DP Laplace noise), a few areas' outlying directs move β̂ and the EBLUP's own-direct
term. Huber's ψ_b(z) = max(−b, min(b, z)) on the standardised residual z = (y − x'β)/√(σ² + D)
bounds both, as Sinha & Rao's (2009) robust EBLUP does: β by the M-estimating equation
Σ x_i ψ_b(z_i)/√V_i = 0 (iteratively reweighted least squares), and
θ̂_i = x_i'β̂ + γ_i·√V_i·ψ_b(z_i), i.e. the EBLUP's weight γ_i times min(1, b/|z_i|).
σ² stays REML's here (see docs/small-area.md for why not Sinha–Rao's robust σ²).

numpy and scipy only: this package imports nothing of ours (docs/small-area.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize


# Huber's tuning constant: 95% efficiency at the normal (Huber 1964), Sinha & Rao's default.
HUBER_B = 1.345


@dataclass(frozen=True)
class FayHerriotFit:
    beta: np.ndarray          # regression coefficients
    beta_cov: np.ndarray      # (X'V⁻¹X)⁻¹ at σ̂²
    sigma2: float             # the model variance σ̂² of the area effects u
    sigma2_var: float         # its asymptotic variance 2/Σ(σ̂² + D)⁻²
    areas: int                # areas with a direct estimate (m)


def _gls(y: np.ndarray, X: np.ndarray, D: np.ndarray, sigma2: float):
    """β̂, (X'V⁻¹X)⁻¹ and the pieces of the residual log-likelihood at ``sigma2``."""
    w = 1.0 / (sigma2 + D)
    xtwx = X.T @ (X * w[:, None])
    cov = np.linalg.pinv(xtwx)
    beta = cov @ (X.T @ (w * y))
    resid = y - X @ beta
    return beta, cov, w, resid, xtwx


def residual_loglik(sigma2: float, y: np.ndarray, X: np.ndarray, D: np.ndarray) -> float:
    """REML log-likelihood of σ² (up to a constant): −½[Σ log(σ² + D) + log|X'V⁻¹X| + y'Py]."""
    _, _, w, resid, xtwx = _gls(y, X, D, sigma2)
    sign, logdet = np.linalg.slogdet(xtwx)
    return -0.5 * (-np.log(w).sum() + logdet + float(np.sum(w * resid ** 2)))


def fit(y, X, D, adjusted: bool = True) -> FayHerriotFit:
    """Fit on the areas with a direct: ``y`` (m,), ``X`` (m, p), ``D`` (m,) sampling variances.

    ``adjusted``: maximise REML × σ² (Li & Lahiri 2010); otherwise plain REML (σ² may be 0).
    """
    y, X, D = (np.asarray(a, dtype=float) for a in (y, X, D))
    if X.ndim != 2 or len(y) != len(X) or len(y) != len(D):
        raise ValueError(f"y, X and D must have one row per area: {y.shape}, {X.shape}, {D.shape}")
    if not (np.all(np.isfinite(y)) and np.all(np.isfinite(X)) and np.all(D > 0)):
        raise ValueError("y and X must be finite and D > 0")
    if len(y) <= X.shape[1]:
        raise ValueError(f"{len(y)} areas cannot fit {X.shape[1]} coefficients")

    def objective(log_s2: float) -> float:
        s2 = float(np.exp(log_s2))
        return -(residual_loglik(s2, y, X, D) + (np.log(s2) if adjusted else 0.0))

    spread = max(float(np.var(y)), 1e-12)
    lo, hi = np.log(spread * 1e-8), np.log(spread * 10)
    # A grid first (the likelihood can be flat over decades), then a bounded refinement.
    grid = np.linspace(lo, hi, 61)
    values = [objective(g) for g in grid]
    k = int(np.argmin(values))
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    best = optimize.minimize_scalar(objective, bounds=(a, b), method="bounded",
                                    options={"xatol": 1e-6})
    sigma2 = float(np.exp(best.x))
    if not adjusted and k == 0:
        sigma2 = 0.0  # REML at its boundary
    beta, cov, w, _, _ = _gls(y, X, D, sigma2)
    return FayHerriotFit(beta, cov, sigma2, float(2.0 / np.sum(w ** 2)), len(y))


def synthetic_variance(fitted: FayHerriotFit, X) -> np.ndarray:
    """g2's core per area: x_i'(X'V⁻¹X)⁻¹x_i, the variance of the synthetic estimate x_i'β̂."""
    X = np.asarray(X, dtype=float)
    return np.einsum("ij,jk,ik->i", X, fitted.beta_cov, X)


def mse_of_weights(gamma, D, g2, sigma2: float, sigma2_var: float) -> np.ndarray:
    """MSE of θ̂_i = γ_i·y_i + (1 − γ_i)·x_i'β̂ for *given* weights γ_i when the area effects
    have variance ``sigma2``: γ²·D + (1 − γ)²·(σ² + g2) + 2·g3, g3 = D²/(σ² + D)³·V(σ̂²).

    With γ_i = σ²/(σ² + D_i) it is Prasad–Rao's g1 + g2 + 2·g3; with weights from another σ̂²
    (or other D) it is the MSE of the estimator actually used, so an estimate can shrink with
    one variance split and be bounded with a more conservative one. An area without a direct
    has γ = 0 and D = 0: σ² + g2."""
    gamma, D, g2 = (np.asarray(a, dtype=float) for a in (gamma, D, g2))
    g3 = np.where(D > 0, D ** 2 / (sigma2 + D) ** 3, 0.0) * sigma2_var
    return gamma ** 2 * D + (1 - gamma) ** 2 * (sigma2 + g2) + 2 * g3


def eblup(fitted: FayHerriotFit, X, y=None, D=None) -> tuple[np.ndarray, np.ndarray]:
    """EBLUP and its Prasad–Rao MSE for areas with covariates ``X``; ``y``, ``D`` their
    directs and sampling variances, NaN/inf where an area has none (then: the synthetic)."""
    X = np.asarray(X, dtype=float)
    m = len(X)
    y = np.full(m, np.nan) if y is None else np.asarray(y, dtype=float)
    D = np.full(m, np.inf) if D is None else np.asarray(D, dtype=float)
    has = np.isfinite(y) & np.isfinite(D)
    s2 = fitted.sigma2
    synthetic = X @ fitted.beta
    g2_full = np.einsum("ij,jk,ik->i", X, fitted.beta_cov, X)
    estimate, mse = synthetic.copy(), s2 + g2_full
    Dh = D[has]
    gamma = s2 / (s2 + Dh) if s2 > 0 else np.zeros_like(Dh)
    estimate[has] = gamma * y[has] + (1 - gamma) * synthetic[has]
    g1 = gamma * Dh
    g2 = (1 - gamma) ** 2 * g2_full[has]
    g3 = Dh ** 2 / (s2 + Dh) ** 3 * fitted.sigma2_var
    mse[has] = g1 + g2 + 2 * g3
    return estimate, mse


def huber_weights(z: np.ndarray, b: float = HUBER_B) -> np.ndarray:
    """ψ_b(z)/z: 1 inside [−b, b], b/|z| beyond (the share of a residual that counts)."""
    a = np.abs(np.asarray(z, dtype=float))
    return np.where(a <= b, 1.0, b / np.maximum(a, 1e-300))


def robust_beta(y, X, V, b: float = HUBER_B, start=None, tol: float = 1e-10,
                max_iter: int = 100) -> np.ndarray:
    """β solving Σ x_i·ψ_b((y_i − x_i'β)/√V_i)/√V_i = 0 for total variances ``V`` = σ² + D,
    by iteratively reweighted least squares (weights ψ_b(z)/z / V) from ``start`` (default:
    GLS). With b = ∞ it is GLS."""
    y, X, V = (np.asarray(a, dtype=float) for a in (y, X, V))
    beta = (np.linalg.pinv(X.T @ (X / V[:, None])) @ (X.T @ (y / V)) if start is None
            else np.asarray(start, dtype=float))
    for _ in range(max_iter):
        w = huber_weights((y - X @ beta) / np.sqrt(V), b) / V
        new = np.linalg.pinv(X.T @ (X * w[:, None])) @ (X.T @ (w * y))
        done = np.max(np.abs(new - beta)) < tol
        beta = new
        if done:
            break
    return beta


def robust_fit(y, X, D, b: float = HUBER_B) -> FayHerriotFit:
    """``fit`` (adjusted REML σ²), then β by ``robust_beta`` at that σ²; ``beta_cov`` stays
    GLS's (X'V⁻¹X)⁻¹, the M-estimator's asymptotic variance up to its efficiency (95% at
    b = 1.345 under normal errors)."""
    gls = fit(y, X, D)
    V = gls.sigma2 + np.asarray(D, dtype=float)
    beta = robust_beta(y, X, V, b, start=gls.beta)
    return FayHerriotFit(beta, gls.beta_cov, gls.sigma2, gls.sigma2_var, gls.areas)


def robust_eblup(fitted: FayHerriotFit, X, y, D, b: float = HUBER_B):
    """(estimate, weight on the direct) per area: x'β̂ + γ·min(1, b/|z|)·(y − x'β̂), the
    bounded-influence EBLUP (Sinha & Rao 2009), z = (y − x'β̂)/√(σ̂² + D); areas without a
    direct (y NaN or D infinite) get the synthetic estimate and weight 0."""
    X = np.asarray(X, dtype=float)
    y, D = np.asarray(y, dtype=float), np.asarray(D, dtype=float)
    synthetic = X @ fitted.beta
    has = np.isfinite(y) & np.isfinite(D)
    s2 = fitted.sigma2
    weight = np.zeros(len(X))
    if s2 > 0:
        V = s2 + D[has]
        resid = y[has] - synthetic[has]
        weight[has] = s2 / V * huber_weights(resid / np.sqrt(V), b)
    estimate = synthetic + weight * np.where(has, y - synthetic, 0.0)
    return estimate, weight
