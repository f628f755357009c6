"""Noise that is safe against floating-point attacks, vectorised over arrays.

Why not ``numpy.random.laplace``: textbook Laplace sampling ``f(D) - b·sign(U)·ln(1-2|U|)`` in
floating point produces outputs whose low-order bits depend on ``f(D)``; Mironov (CCS 2012)
showed this lets an attacker tell neighbouring datasets apart, breaking the guarantee
completely. The defence used here is the one OpenDP uses for its float Laplace and Gaussian
mechanisms: every released value lies on a data-independent grid, and the noise on that grid is
an *integer* drawn exactly.

For a query ``f`` with sensitivity ``Δ`` (L1 for Laplace, L2 for Gaussian) over ``d`` coordinates:

1. choose the grid unit ``u = Δ / N`` (public: it depends on Δ and the budget only; N = 4096
   for Laplace, about 4096·sqrt(2ρ) for Gaussian so σ is about 4096 units);
2. round each coordinate to the grid: ``q = round(f(D) / u)``, an integer vector whose
   sensitivity is at most ``N + d`` (L1) or ``N + sqrt(d)`` (L2), because rounding moves each
   coordinate by at most 1/2;
3. add integer noise ``K`` drawn *exactly* from the discrete Laplace (scale ``t``) or discrete
   Gaussian (variance ``σ²``) by the algorithms of Canonne, Kamath & Steinke (NeurIPS 2020,
   Algorithms 1–3), using only integer arithmetic on uniformly random bits;
4. release ``u · (q + K)``: a deterministic function of the integer ``q + K``.

Guarantees (CKS 2020): discrete Laplace with scale ``t`` on an integer query of L1 sensitivity
``k`` is ``k/t``-DP (pure); discrete Gaussian with variance ``σ²`` on an integer query of L2
sensitivity ``k`` is ``k²/(2σ²)``-zCDP (Thm 4). We set ``t`` (rounded *up* to a multiple of 1/256)
and ``σ²`` (rounded *up* to an integer) so the guarantee is at least the one asked for. The price
is noise larger by a factor ``1 + d/N`` (0.02% for Laplace with d = 1).

The integer parameters (grid steps, ``t`` as scale_num/scale_den, ``σ²``) are calibrated from the
budget once, in ``mechanisms/privacy_maps.py`` (``GridLaplace``, ``GridGaussian``, with the
functions below); the samplers take that calibrated object and draw with its numbers, so the
numbers the privacy map reads are the numbers drawn with. No ε or ρ reaches a sampler.

Random bits come from a :class:`Randomness`: :class:`OSRandomness` (``os.urandom``, the kernel
CSPRNG) in production, :class:`SeededRandomness` (PCG64) in tests and evaluation, where runs must
be repeatable. The samplers consume bits identically from either.
"""

from __future__ import annotations

import math
import os

import numpy as np

LAPLACE_GRID_STEPS = 4096  # grid units per unit of L1 sensitivity
_SCALE_DENOMINATOR = 256  # discrete Laplace scales are rationals A / 256, rounded up
_U64_MAX = np.uint64(0xFFFFFFFFFFFFFFFF)
# Largest t of geometric(): t·K (Alg. 1's products) and t·V stay below 2^64 unless K or V
# exceed 2^19, whose probabilities (1/(2^19)! and e^-(2^19)) are zero for any practical purpose.
_MAX_GEOMETRIC_SCALE_NUM = 2**44


# ---------------------------------------------------------------------------------------------
# Sources of random bits


class Randomness:
    """A source of uniformly random 64-bit words, with exact derived samplers."""

    name = "abstract"

    def words(self, n: int) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    # -- exact integer samplers -------------------------------------------------------------

    def below(self, m: np.ndarray) -> np.ndarray:
        """Uniform integers in ``[0, m)`` for each entry of ``m`` (exact, by rejection)."""
        m = np.asarray(m, dtype=np.uint64)
        flat_m = m.ravel()
        if flat_m.size and flat_m.min() == 0:
            raise ValueError("below(m) needs m >= 1")
        # Accept r < limit, where limit is the largest multiple of m that fits: r % m is uniform.
        limit = (_U64_MAX // flat_m) * flat_m
        r = self.words(flat_m.size)
        out = r % flat_m
        pending = np.nonzero(r >= limit)[0]  # almost always empty: redraw those
        while pending.size:
            r = self.words(pending.size)
            ok = r < limit[pending]
            out[pending[ok]] = r[ok] % flat_m[pending[ok]]
            pending = pending[~ok]
        return out.reshape(m.shape)

    def coin(self, n: int) -> np.ndarray:
        """Fair coins."""
        return (self.words(n) & np.uint64(1)).astype(bool)

    def numpy_generator(self) -> np.random.Generator:
        """A numpy generator seeded from 128 bits of this source (for float-only samplers)."""
        w = self.words(2)
        return np.random.Generator(np.random.PCG64(int(w[0]) << 64 | int(w[1])))


class OSRandomness(Randomness):
    """Bits from the operating system's CSPRNG (``os.urandom``): the production source."""

    name = "os.urandom"

    def words(self, n: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()


class SeededRandomness(Randomness):
    """Repeatable bits from PCG64 with a seed: for tests and evaluation only, never releases."""

    name = "pcg64-seeded"

    def __init__(self, seed: int):
        self.seed = seed
        self._bits = np.random.PCG64(seed)

    def words(self, n: int) -> np.ndarray:
        return self._bits.random_raw(n).astype(np.uint64)


def default_randomness(seed: int | None = None) -> Randomness:
    return OSRandomness() if seed is None else SeededRandomness(seed)


# ---------------------------------------------------------------------------------------------
# Exact discrete samplers (Canonne, Kamath & Steinke 2020), vectorised with masks


def bernoulli_exp(rand: Randomness, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Exact Bernoulli(exp(-num/den)) for integer arrays ``num >= 0``, ``den >= 1`` (CKS Alg. 1)."""
    num = np.asarray(num, dtype=np.uint64).ravel()
    den = np.asarray(den, dtype=np.uint64).ravel()
    whole = num // den
    frac = num - whole * den
    result = np.ones(num.size, dtype=bool)
    # exp(-γ) = exp(-1)^floor(γ) · exp(-(γ - floor γ)): one Bernoulli(exp(-1)) per whole unit.
    idx = np.nonzero(whole)[0]
    left = whole[idx].copy()
    while idx.size:
        b = _bernoulli_inv_e(rand, idx.size)
        result[idx[~b]] = False
        left -= np.uint64(1)
        keep = b & (left > 0)
        idx, left = idx[keep], left[keep]
    alive = np.nonzero(result & (frac > 0))[0]  # exp(-0) = 1: no draw needed
    if alive.size:
        result[alive] = _bernoulli_exp_le1(rand, frac[alive], den[alive])
    return result


def _bernoulli_exp_le1(rand: Randomness, num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Bernoulli(exp(-γ)) for γ = num/den in [0, 1]: K=1; while Bernoulli(γ/K): K+=1; odd K."""
    k = np.ones(num.size, dtype=np.uint64)
    active = np.arange(num.size)
    while active.size:
        a = rand.below(den[active] * k[active]) < num[active]
        k[active[a]] += np.uint64(1)
        active = active[a]
    return (k % np.uint64(2)) == 1


def _bernoulli_inv_e(rand: Randomness, n: int) -> np.ndarray:
    """n draws of Bernoulli(e^-1): Algorithm 1 with γ = 1, whose first Bernoulli(γ/1) is
    certain, so K starts at 2 (same law, one random word fewer)."""
    k = np.full(n, 2, dtype=np.uint64)
    active = np.arange(n)
    while active.size:
        a = rand.below(k[active]) == 0  # Bernoulli(1/K)
        k[active[a]] += np.uint64(1)
        active = active[a]
    return (k % np.uint64(2)) == 1


def geometric(rand: Randomness, scale_num: np.ndarray, scale_den: np.ndarray | int) -> np.ndarray:
    """Exact geometric Y >= 0 with P(Y = y) ∝ exp(-y·den/num), i.e. P(Y >= y) = exp(-y·den/num).

    The inner loop of CKS 2020 Algorithm 2 with t = ``scale_num``, s = ``scale_den`` (integer
    arrays, broadcast together): U uniform in [0, t), kept with probability exp(-U/t) (Alg. 1);
    V ~ Geometric(1 - e^-1) by repeated Bernoulli(e^-1); X = U + t·V has P(X = x) ∝ exp(-x/t),
    and Y = ⌊X/s⌋ sums s consecutive terms, so P(Y = y) ∝ exp(-y·s/t). Integer arithmetic only.
    Needs t <= 2**44 so that t·V and the Bernoulli products stay far inside 64 bits.
    """
    t = np.asarray(scale_num, dtype=np.uint64)
    s = np.asarray(scale_den, dtype=np.uint64)
    t, s = (a.ravel() for a in np.broadcast_arrays(t, s))
    if np.any(t < 1) or np.any(s < 1) or np.any(t > _MAX_GEOMETRIC_SCALE_NUM):
        raise ValueError("exact geometric noise needs integer scales 1 <= num <= 2**44 and "
                         "den >= 1 (a scale above 2**44 means the budget is far too small)")
    u = np.empty(t.size, dtype=np.uint64)
    pending = np.arange(t.size)
    while pending.size:
        tp = t[pending]
        draw = rand.below(tp)
        kept = _bernoulli_exp_le1(rand, draw, tp)  # exp(-U/t), U/t < 1
        u[pending[kept]] = draw[kept]
        pending = pending[~kept]
    # V is independent of U: one vectorised draw for all entries, after every U is kept.
    v = _geometric_1_minus_inv_e(rand, t.size)
    return ((u + t * v) // s).astype(np.int64)


def _geometric_1_minus_inv_e(rand: Randomness, n: int) -> np.ndarray:
    """V ~ Geometric(1 - e^-1) on {0, 1, ...}: successes of Bernoulli(e^-1) before a failure."""
    v = np.zeros(n, dtype=np.uint64)
    go = np.arange(n)
    while go.size:
        b = _bernoulli_inv_e(rand, go.size)
        v[go[b]] += np.uint64(1)
        go = go[b]
    return v


def discrete_laplace(rand: Randomness, scale_num: np.ndarray, scale_den: int) -> np.ndarray:
    """Exact discrete Laplace with scale ``scale_num/scale_den``: P(k) ∝ exp(-|k|·den/num).

    CKS Algorithm 2 with t = scale_num, s = scale_den: a geometric magnitude Y (:func:`geometric`)
    and a fair sign, rejecting "negative zero" so that 0 is not counted twice.
    """
    t = np.asarray(scale_num, dtype=np.uint64).ravel()
    out = np.zeros(t.size, dtype=np.int64)
    pending = np.arange(t.size)
    while pending.size:
        y = geometric(rand, t[pending], scale_den)
        neg = rand.coin(pending.size)
        accept = ~(neg & (y == 0))
        signed = np.where(neg, -y, y)
        out[pending[accept]] = signed[accept]
        pending = pending[~accept]
    return out


def discrete_gaussian(rand: Randomness, sigma2: np.ndarray) -> np.ndarray:
    """Exact discrete Gaussian with integer variance parameter ``sigma2`` (CKS Algorithm 3)."""
    s2 = np.asarray(sigma2, dtype=np.uint64).ravel()
    if np.any(s2 < 1) or np.any(s2 > 2**28):
        raise ValueError("discrete_gaussian needs 1 <= sigma2 <= 2**28 (64-bit exact arithmetic)")
    t = (np.floor(np.sqrt(s2.astype(np.float64))) + 1).astype(np.uint64)
    out = np.zeros(s2.size, dtype=np.int64)
    pending = np.arange(s2.size)
    while pending.size:
        tp, sp = t[pending], s2[pending]
        y = discrete_laplace(rand, tp, 1)
        ay = np.abs(y).astype(np.uint64)
        # Accept with probability exp(-(|y| - σ²/t)² / (2σ²)) = exp(-(|y|t - σ²)² / (2σ²t²)).
        diff = np.abs(ay.astype(np.float64) * tp - sp)  # float only to screen for overflow
        safe = diff < 3.0e9  # (3e9)² < 2**63; beyond it exp(-γ) < exp(-1e5): never accepted
        gap = np.where(safe, np.where(ay * tp >= sp, ay * tp - sp, sp - ay * tp), 0)
        num = gap * gap
        den = np.uint64(2) * sp * tp * tp
        c = np.zeros(pending.size, dtype=bool)
        if safe.any():
            c[safe] = bernoulli_exp(rand, num[safe], den[safe])
        out[pending[c]] = y[c]
        pending = pending[~c]
    return out


# ---------------------------------------------------------------------------------------------
# Grid ("snapped") mechanisms on float queries


def _checked(values, sensitivity, noise, kind: str, needs: tuple[str, ...]):
    """(values, sensitivity broadcast to values' leading shape, the noise's integer parameters
    by name), after checking that ``noise`` was calibrated for values' coordinate count."""
    values = np.asarray(values, dtype=np.float64)
    missing = [name for name in needs if not hasattr(noise, name)]
    if missing:
        raise ValueError(f"the {kind} sampler draws with calibrated noise (attributes "
                         f"{', '.join(needs)}); got {noise!r}")
    params = {name: int(getattr(noise, name)) for name in needs}
    if values.shape[-1] != params["dims"]:
        raise ValueError(f"{kind} noise calibrated for {params['dims']} coordinate(s) would "
                         f"draw {values.shape[-1]}: the guarantee would not be that of the "
                         "noise drawn")
    sens = np.broadcast_to(np.asarray(sensitivity, dtype=np.float64), values.shape[:-1])
    if np.any(~np.isfinite(values)):
        raise ValueError("a noise mechanism got a non-finite value")
    if np.any(sens <= 0) or min(params.values()) < 1:
        raise ValueError("sensitivity and the noise parameters must be > 0")
    return values, sens, params


_LAPLACE_PARAMETERS = ("grid_steps", "dims", "scale_num", "scale_den")
_GAUSSIAN_PARAMETERS = ("grid_steps", "dims", "sigma2")


def laplace_mechanism(rand: Randomness, values: np.ndarray, l1_sensitivity: np.ndarray,
                      noise) -> np.ndarray:
    """Release of ``values`` (shape (..., d)), each row of L1 sensitivity ``l1_sensitivity``,
    with the calibrated grid Laplace ``noise`` (``privacy_maps.GridLaplace`` or
    ``PrivTreeLaplace``: its integer ``grid_steps``, ``dims``, ``scale_num``, ``scale_den``).

    The query is rounded to units of sensitivity/grid_steps and discrete Laplace noise of scale
    scale_num/scale_den units is added: the very numbers the privacy map reads. ``noise.dims``
    must be d. ``l1_sensitivity`` broadcasts against ``values.shape[:-1]``.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 0:
        return laplace_mechanism(rand, values[None], l1_sensitivity, noise)[0]
    values, sens, p = _checked(values, l1_sensitivity, noise, "grid Laplace",
                               _LAPLACE_PARAMETERS)
    unit = sens / p["grid_steps"]
    q = np.rint(values / unit[..., None]).astype(np.int64)
    scale_num = np.full(values.size, p["scale_num"], dtype=np.uint64)
    k = discrete_laplace(rand, scale_num, p["scale_den"]).reshape(values.shape)
    return (q + k) * unit[..., None]


def laplace_scale_num(epsilon, d: int) -> np.ndarray:
    """The grid Laplace's scale numerator over ``_SCALE_DENOMINATOR``: the scale in grid units
    t = (grid_steps + d)/ε (the integer L1 sensitivity of d rounded coordinates over ε),
    rounded up to a multiple of 1/256 (more noise, safe). The one copy of the formula: the
    calibration (``privacy_maps.GridLaplace``, whose numbers the sampler draws with) and
    :func:`laplace_scale` use it."""
    return np.ceil((LAPLACE_GRID_STEPS + d) / np.asarray(epsilon, dtype=np.float64)
                   * _SCALE_DENOMINATOR)


def laplace_scale(l1_sensitivity: float, epsilon: float, d: int = 1) -> float:
    """The Laplace scale :func:`laplace_mechanism` draws with for the noise calibrated to
    ``epsilon`` (``privacy_maps.GridLaplace.calibrate``): for tests, docs and public scales."""
    unit = l1_sensitivity / LAPLACE_GRID_STEPS
    t = int(laplace_scale_num(epsilon, d)) / _SCALE_DENOMINATOR
    return unit * t


def _gauss_grid(rho: np.ndarray, d: int) -> tuple[np.ndarray, np.ndarray]:
    """Grid steps per unit of L2 sensitivity, and the integer σ² of the discrete Gaussian.

    The grid is tied to the noise level (about 4096 grid units per standard deviation) so that
    rounding costs at most a factor (1 + sqrt(d)/steps) of extra noise; for very small ρ the
    grid is coarsened so σ² stays at most 2**28, where the CKS integers still fit in 64 bits.
    """
    root = np.sqrt(2.0 * rho)
    steps = np.floor(np.minimum(4096.0 * root, 16384.0 * root - math.sqrt(d)))
    if np.any(steps < 4):
        raise ValueError("rho is too small for the discrete Gaussian grid (fewer than 4 grid "
                         "steps per unit of sensitivity)")
    sigma2 = np.ceil((steps + math.sqrt(d)) ** 2 / (2.0 * rho))
    return steps, sigma2.astype(np.uint64)


def gaussian_mechanism(rand: Randomness, values: np.ndarray, l2_sensitivity: np.ndarray,
                       noise) -> np.ndarray:
    """Release of ``values`` (shape (..., d)), each row of L2 sensitivity ``l2_sensitivity``,
    with the calibrated grid Gaussian ``noise`` (``privacy_maps.GridGaussian``: its integer
    ``grid_steps``, ``dims``, ``sigma2``): rounded to units of sensitivity/grid_steps, plus
    discrete Gaussian noise of variance parameter sigma2 units. ``noise.dims`` must be d."""
    values, sens, p = _checked(values, l2_sensitivity, noise, "grid Gaussian",
                               _GAUSSIAN_PARAMETERS)
    unit = sens / p["grid_steps"]
    q = np.rint(values / unit[..., None]).astype(np.int64)
    sigma2 = np.full(values.size, p["sigma2"], dtype=np.uint64)
    k = discrete_gaussian(rand, sigma2).reshape(values.shape)
    return (q + k) * unit[..., None]


def gaussian_sigma(l2_sensitivity: float, rho: float, d: int = 1) -> float:
    """The standard deviation parameter :func:`gaussian_mechanism` draws with for the noise
    calibrated to ``rho`` (``privacy_maps.GridGaussian.calibrate``)."""
    steps, sigma2 = _gauss_grid(np.asarray(rho, dtype=np.float64), d)
    return float(l2_sensitivity / steps * math.sqrt(float(sigma2)))
