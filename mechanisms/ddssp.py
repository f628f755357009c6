"""DDSSP: data-dependent sufficient statistic perturbation from a private two-way marginal.

Ferrando & Sheldon, "Private Regression via Data-Dependent Sufficient Statistic Perturbation"
(shared/papers/data-dependent-ssp-regression.txt): the sufficient statistics of a linear
regression are linear queries of the one- and two-way marginals of the discretised data
(their Prop. 3.2: ZᵀZ block (j, k) = A_j ⟨μ_jk⟩ A_kᵀ for the encoding A), so a marginal
released by a data-dependent query-answering mechanism (they use AIM, McKenna et al. 2022)
gives DP sufficient statistics by post-processing. Per tract, for our simple regression:

1. **Discretise** x and y (ranks on [0, 1]) into ``bins`` equal bins each: bin(v) =
   min(⌊v·bins⌋, bins − 1), a fixed function of one record's value.
2. **Measure** (the select–measure part of AIM, fixed plan, see below) with the exact discrete
   Gaussian on a grid (``gaussian_mechanism``, CKS 2020): the one-way marginal of x-bins, the
   one-way marginal of y-bins (AIM's initialisation: every one-way marginal of the workload's
   closure) and the two-way marginal of (x-bin, y-bin) (the workload itself). Replacing one
   record moves one unit of count from one cell to another in each marginal: L2 sensitivity
   √2 under replace-one (the paper's 1 is for add/remove).
3. **Estimate** the two-way table from the three noisy marginals with Private-PGM, the ``mbi``
   package's ``MirrorDescent`` (McKenna, Sheldon & Miklau 2019, Alg. 1): the non-negative table
   with total n (public) minimising Σ_m ‖Q_m μ − y_m‖²/(2σ_m²). Post-processing: no budget.
   Run batched: mbi's estimator steps are ``jax.vmap``-ed over every (rep, tract) at once.
4. **Regress** on the estimated table (the paper's Sec. 3.2.1 with the scalar encoding of bin
   midpoints): x̄, ȳ, n·var(x), n·cov(x, y) from the table; n·var(x) less Sheppard's
   correction n·h²/12 (h = 1/bins; chosen because it removes the slope's binning bias on
   synthetic states, see ``regression_from_tables``); slope = ncov/nvar, predictions at
   x = 0.25 and 0.75.
   A tract whose corrected n·var(x) is ≤ 0 fails (no fallback): the budget was spent.

What of AIM is kept, and what is not (with a single two-way workload {xy}, AIM's candidate set
is the downward closure {x, y, xy}):

- kept: the initialisation that measures the one-way marginals; measuring the workload
  marginal with Gaussian noise; zCDP accounting of every measurement; Private-PGM estimation
  with the known total; an (ε, δ) target converted to the largest ρ that fits it.
- not kept: the adaptive rounds (exponential-mechanism selection among x, y, xy with the
  quality score, and annealing of σ). Reasons: (a) this project derives every guarantee from
  noise fixed before the run (``noise_steps``); annealing makes σ depend on the data (AIM
  accounts for it with a filter); (b) every draw must come from an exact sampler, and AIM's
  selection scores are real-valued L1 distances that ``mechanisms/median.py``'s integer-utility
  sampler does not cover without a new derivation; (c) with a closure of three marginals and
  a tiny domain (``bins``² cells, far under AIM's model-size cap), AIM's rounds can only
  re-measure x, y or xy; the fixed plan measures each once with public shares ``w_x``, ``w_y``,
  ``w_xy``, and ``bins`` is the knob that trades noise per cell against discretisation.

Privacy (replace-one, per tract; tracts are disjoint): each marginal release is ρ_i-zCDP with
ρ_i the grid Gaussian's map of its parameters, (N + √d)²/(2σ²) (CKS 2020, Thm 4, on the
integer query rounded to the grid); the three compose to Σρ_i (Bun & Steinke 2016, Lemma 2.3),
which is converted to (ε, δ) by dp-accounting's RDP accountant. The shares are
ρ_i = ρ·w_i/Σw with ρ = ``rho_for_approx(ε, δ)``, so the guarantee is at most (ε, δ).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch
from .noise import Randomness, gaussian_mechanism
from .privacy import rho_for_approx, to_approx
from .privacy_maps import GridGaussian, NoiseStep, compose
from .registry import MIN_RECORDS, Estimator, Meter, Outcome, blank, register
from .sensitivity import constant

X_MARGINAL = "x marginal"
Y_MARGINAL = "y marginal"
XY_MARGINAL = "xy marginal"
STEP_NAMES = (X_MARGINAL, Y_MARGINAL, XY_MARGINAL)
# Replace-one moves one record's unit of count from one cell to another: L2 norm √2.
MARGINAL_SENSITIVITY = constant(
    math.sqrt(2.0), "L2", "sqrt(2)",
    "sqrt(2) (L2, replace-one: one record leaves one cell of the marginal and joins another)",
    "replacing one record lowers one cell of a histogram by 1 and raises another by 1 (or "
    "leaves it unchanged): L2 distance at most sqrt(2) (the module docstring)")
COUNT_SENSITIVITY = MARGINAL_SENSITIVITY.value()
DEFAULTS: dict[str, Any] = {
    # Tuned on a synthetic 400-tract state (seed 1, never released data), docs/ddssp.md:
    "bins": 4,  # per axis: the two-way table has bins² cells
    "w_x": 1.0, "w_y": 1.0, "w_xy": 4.0,  # shares of ρ of the three measurements
    "iters": 300,  # Private-PGM mirror-descent steps (mbi's default is 1000; 250 converge)
    "default_delta": 1e-6,
}
MAX_BINS = 64
# The (rep, tract) problems handed to one vmapped mbi call: padded to a power of two (one
# compiled program per size) and at most this many (bounds jax's working set).
_MAX_CHUNK = 4096
# Peak memory of one _run, reps = 1, per tract: the record bin indices (2 × int64 per record)
# plus per tract the counts and the three noisy marginals (about 4·bins² float64) and mbi's
# vmapped state (potentials, marginals, gradients, line-search copies: about 12·bins² float64
# per problem in a chunk). tracemalloc sees only numpy's part; jax's buffers are C++.
_BYTES_PER_RECORD = 64
_FIXED_BYTES = 256 * 1024


# ---------------------------------------------------------------------------------------------
# Hyperparameters and calibration


def _check_hp(hp: dict) -> None:
    b = hp["bins"]
    if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 2 <= b <= MAX_BINS:
        raise ValueError(f"DDSSP: bins must be an integer in [2, {MAX_BINS}], got {b!r}")
    for key in ("w_x", "w_y", "w_xy"):
        v = hp[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                math.isfinite(v) and v > 0):
            raise ValueError(f"DDSSP: {key} must be a finite number > 0, got {v!r}")
    it = hp["iters"]
    if isinstance(it, bool) or not isinstance(it, (int, np.integer)) or not 1 <= it <= 100_000:
        raise ValueError(f"DDSSP: iters must be an integer in [1, 100000], got {it!r}")


def _delta(delta: float | None, hp: dict) -> float:
    d = float(delta) if delta is not None else float(hp["default_delta"])
    if not 0 < d < 1:
        raise ValueError(f"DDSSP: delta must lie in (0, 1), got {d!r}")
    return d


def measurement_rhos(epsilon: float, delta: float, hp: dict) -> dict[str, float]:
    """ρ of each measurement: ρ·w_i/Σw with ρ the largest zCDP whose (ε, δ) conversion fits."""
    rho = rho_for_approx(float(epsilon), float(delta))
    w = {X_MARGINAL: float(hp["w_x"]), Y_MARGINAL: float(hp["w_y"]),
         XY_MARGINAL: float(hp["w_xy"])}
    total = math.fsum(w.values())
    return {name: rho * wi / total for name, wi in w.items()}


def ddssp_steps(epsilon: float, delta: float | None, hp: dict) -> list[NoiseStep]:
    """The three calibrated marginal measurements (grid Gaussian, L2 sensitivity √2)."""
    _check_hp(hp)
    bins = int(hp["bins"])
    dims = {X_MARGINAL: bins, Y_MARGINAL: bins, XY_MARGINAL: bins * bins}
    steps = []
    for name, rho_i in measurement_rhos(epsilon, _delta(delta, hp), hp).items():
        try:
            noise = GridGaussian.calibrate(rho_i, dims[name])
        except ValueError:
            raise ValueError(f"DDSSP: epsilon = {epsilon:g} leaves rho = {rho_i:.3g} for the "
                             f"{name}, too little for the grid Gaussian; use a larger epsilon "
                             "or a larger share for it") from None
        steps.append(NoiseStep(name, noise, MARGINAL_SENSITIVITY))
    return steps


def noise_sd(step: NoiseStep) -> float:
    """Standard deviation parameter of one cell's noise, in counts: √2 · σ/grid_steps."""
    return step.sensitivity.value() * math.sqrt(step.noise.sigma2) / step.noise.grid_steps


# ---------------------------------------------------------------------------------------------
# Discretisation and measurement


def bin_index(values: np.ndarray, bins: int) -> np.ndarray:
    """min(⌊v·bins⌋, bins − 1) for ranks v in [0, 1] (1.0 goes to the top bin)."""
    return np.minimum(np.floor(np.asarray(values) * bins).astype(np.int64), bins - 1)


def two_way_counts(batch: TractBatch, tracts: np.ndarray, bins: int) -> np.ndarray:
    """Counts of (x-bin, y-bin) per tract in ``tracts``: integer array (len(tracts), bins, bins)."""
    tracts = np.asarray(tracts, dtype=np.int64)
    sub = batch.subset(tracts)
    cell = bin_index(sub.x, bins) * bins + bin_index(sub.y, bins)
    flat = sub.tract_of_record * (bins * bins) + cell
    counts = np.bincount(flat, minlength=tracts.size * bins * bins)
    return counts.reshape(tracts.size, bins, bins)


@dataclass(frozen=True)
class NoisyMarginals:
    """The released measurements of the measured tracts, per rep: x (reps, T, bins), y (reps,
    T, bins), xy (reps, T, bins, bins), with each measurement's noise sd in counts."""

    tracts: np.ndarray  # indices into the batch
    x: np.ndarray
    y: np.ndarray
    xy: np.ndarray
    sd: dict[str, float]


def measure_marginals(batch: TractBatch, tracts: np.ndarray, steps: dict[str, NoiseStep],
                      rand: Randomness, reps: int, bins: int, meter: Meter) -> NoisyMarginals:
    """Release the three marginals of each tract in ``tracts`` with the steps' noise.

    Each draw first spends its step's map for those tracts (``meter.spend``), then draws with
    exactly that step's calibrated noise and sensitivity (the sampler checks the coordinate
    count against the calibration).
    """
    counts = two_way_counts(batch, tracts, bins).astype(np.float64)
    queries = {X_MARGINAL: counts.sum(axis=2), Y_MARGINAL: counts.sum(axis=1),
               XY_MARGINAL: counts.reshape(tracts.size, bins * bins)}
    labels = batch.labels[tracts]
    out = {}
    for name in STEP_NAMES:
        step = steps[name]
        values = np.broadcast_to(queries[name], (reps,) + queries[name].shape)
        meter.spend(labels, step.guarantee, reps)
        out[name] = gaussian_mechanism(rand, values, step.sensitivity.value(), step.noise)
    return NoisyMarginals(tracts, out[X_MARGINAL], out[Y_MARGINAL],
                          out[XY_MARGINAL].reshape(reps, tracts.size, bins, bins),
                          {name: noise_sd(steps[name]) for name in STEP_NAMES})


# ---------------------------------------------------------------------------------------------
# Private-PGM (mbi) estimation, vmapped over problems


class MbiUnavailable(RuntimeError):
    """The ``mbi`` package (Private-PGM) that DDSSP post-processes with is not installed."""


@lru_cache(maxsize=32)
def _pgm_solver(bins: int, sd_x: float, sd_y: float, sd_xy: float, iters: int):
    """A jitted, vmapped function (y_x, y_y, y_xy, total) -> estimated tables, for problems
    stacked on the first axis; mbi's MirrorDescent, ``iters`` steps from uniform potentials.

    The estimator's own steps (``_init``, ``_step``, ``_finalize``: mbi's documented interface
    for ``Estimator`` subclasses) are run under ``jax.vmap``: one compiled program solves many
    tracts at once, where ``Estimator.estimate`` solves one (its Python loop cannot be vmapped).
    The measurements' σ are public, so the loss's Lipschitz constant (step size) is computed
    once, concretely, by mbi (``from_linear_measurements``).
    """
    try:
        import jax

        # mbi's advice: its many small programs make jax's persistent cache counterproductive.
        jax.config.update("jax_enable_compilation_cache", False)
        with jax.enable_x64(True):
            from mbi import Domain, LinearMeasurement, estimation, marginal_loss
    except ImportError as err:  # pragma: no cover - environment
        raise MbiUnavailable(f"DDSSP needs the mbi package (Private-PGM) and jax: {err}; "
                             "install the versions pinned in requirements.lock") from None

    domain = Domain(["x", "y"], [bins, bins])
    template = marginal_loss.from_linear_measurements([
        LinearMeasurement(np.zeros(bins), ("x",), stddev=sd_x),
        LinearMeasurement(np.zeros(bins), ("y",), stddev=sd_y),
        LinearMeasurement(np.zeros(bins * bins), ("x", "y"), stddev=sd_xy)], domain)
    estimator = estimation.MirrorDescent()

    def solve(y_x, y_y, y_xy, total):
        data = tuple(dataclasses.replace(m, noisy_measurement=v)
                     for m, v in zip(template.data, (y_x, y_y, y_xy)))
        loss = dataclasses.replace(template, data=data)
        state = estimator._init(domain, loss, total)
        state = jax.lax.fori_loop(0, iters, lambda _, s: estimator._step(s, loss, total), state)
        model = estimator._finalize(state, total)
        return model.project(("x", "y")).datavector(flatten=False)

    return jax, jax.jit(jax.vmap(solve))


def estimate_tables(noisy: NoisyMarginals, n: np.ndarray, iters: int) -> np.ndarray:
    """Private-PGM's estimate of each (rep, tract)'s two-way table (reps, T, bins, bins), with
    the tract's public n as the known total. Post-processing of ``noisy`` only."""
    reps, T, bins = noisy.x.shape[0], noisy.x.shape[1], noisy.x.shape[2]
    jax, solve = _pgm_solver(bins, noisy.sd[X_MARGINAL], noisy.sd[Y_MARGINAL],
                             noisy.sd[XY_MARGINAL], int(iters))
    y_x = noisy.x.reshape(reps * T, bins)
    y_y = noisy.y.reshape(reps * T, bins)
    y_xy = noisy.xy.reshape(reps * T, bins * bins)
    total = np.broadcast_to(np.asarray(n, dtype=np.float64), (reps, T)).reshape(-1)
    out = np.empty((reps * T, bins, bins))
    problems = reps * T
    for start in range(0, problems, _MAX_CHUNK):
        stop = min(start + _MAX_CHUNK, problems)
        size = 1 << max(0, (stop - start - 1).bit_length())  # padded: few compiled shapes
        idx = np.minimum(np.arange(start, start + size), stop - 1)  # pad by repeating the last
        with jax.enable_x64(True):
            tables = solve(y_x[idx], y_y[idx], y_xy[idx], total[idx])
        out[start:stop] = np.asarray(tables)[: stop - start]
    return out.reshape(reps, T, bins, bins)


# ---------------------------------------------------------------------------------------------
# Sufficient statistics and the regression, from a table


@dataclass(frozen=True)
class TableFit:
    """Regression on (reps, T) tables: statistics and predictions, ``ok`` where nvar > 0."""

    xbar: np.ndarray
    ybar: np.ndarray
    nvar: np.ndarray  # n·var(x) of the table at bin midpoints, less Sheppard's n·h²/12
    ncov: np.ndarray
    slope: np.ndarray
    p25: np.ndarray
    p75: np.ndarray
    ok: np.ndarray


def regression_from_tables(tables: np.ndarray) -> TableFit:
    """OLS on a two-way table of counts (…, bins, bins) encoded at the bin midpoints.

    Sheppard's correction (Sheppard 1898): n·h²/12 (h = 1/bins) is subtracted from n·var(x), as
    if each midpoint were the value plus an independent uniform rounding error. It is exact for
    neither error model here (for x uniform within bins aligned to [0, 1] the midpoint variance
    is *below* the true one), but it is what makes the slope right: the midpoint covariance is
    attenuated too, and the smaller nvar offsets it. On noiseless tables of 400 synthetic
    tracts of 3,000 records (``oi_like_state``, seed 1; tract sd of x 0.26) the mean slope
    bias with bins = 3, 4, 6, 10 is +0.012, −0.002, −0.006, −0.005 subtracted, against −0.044,
    −0.030, −0.018, −0.010 uncorrected (docs/ddssp.md). The covariance is used as it is.
    """
    bins = tables.shape[-1]
    mid = (np.arange(bins) + 0.5) / bins
    total = tables.sum(axis=(-2, -1))
    px = tables.sum(axis=-1)  # x-bin counts
    py = tables.sum(axis=-2)
    with np.errstate(invalid="ignore", divide="ignore"):
        xbar = px @ mid / total
        ybar = py @ mid / total
        dx = mid - xbar[..., None]
        dy = mid - ybar[..., None]
        nvar = np.einsum("...i,...i->...", px, dx * dx) - total / (12.0 * bins * bins)
        ncov = np.einsum("...ij,...i,...j->...", tables, dx, dy)
        ok = np.isfinite(nvar) & (nvar > 0)
        slope = np.where(ok, ncov / np.where(ok, nvar, 1.0), np.nan)
        icpt = ybar - slope * xbar
    return TableFit(xbar, ybar, nvar, ncov, slope, slope * X_LOW + icpt, slope * X_HIGH + icpt,
                    ok)


# ---------------------------------------------------------------------------------------------
# The estimator


@register
class DDSSP(Estimator):
    """Data-dependent SSP (Ferrando & Sheldon) on a Private-PGM two-way marginal; module doc.

    Guarantee: (ε, δ)-DP, the RDP conversion at δ of Σρ_i, ρ_i the grid Gaussian maps of the x,
    y and xy marginal measurements (each of L2 sensitivity √2 under replace-one).
    """

    name = "DDSSP"
    needs_delta = True
    defaults = DEFAULTS
    # Publishable: every draw is the exact grid Gaussian, whose map the release audit already
    # recomputes; mbi only post-processes. Not in the default full suite: it brings jax in
    # (a compile of a few seconds per process) for a method still under evaluation; name it
    # in profile.suite.
    publishable = True
    in_default_suite = False
    summary = ("Gaussian-noised one- and two-way marginals of binned (x, y), Private-PGM (mbi) "
               "estimate of the table, OLS from its sufficient statistics ((epsilon, delta))")
    sampler = ("grid Gaussian: exact discrete Gaussian (CKS 2020) on the marginal counts, "
               "L2 sensitivity sqrt(2); post-processing by mbi (Private-PGM)")

    def _noise_steps(self, epsilon, delta, hp):
        return ddssp_steps(epsilon, delta, hp)

    def _compose(self, steps, delta, hp):
        # The steps compose to ρ-zCDP (their maps), converted to (ε, δ) by dp-accounting.
        return to_approx(compose(steps), _delta(delta, hp))

    def _run(self, batch, budget, rand, reps, hp, meter):
        _check_hp(hp)
        bins = int(hp["bins"])
        steps = {name: budget.step(name) for name in STEP_NAMES}
        p25, p75, failed, reason = blank(reps, batch.n_tracts)
        extras = {"table_nvar": np.full((reps, batch.n_tracts), np.nan),
                  "table_ncov": np.full((reps, batch.n_tracts), np.nan)}
        tracts = np.flatnonzero(batch.n >= MIN_RECORDS)
        if tracts.size == 0:
            return Outcome(p25, p75, failed, reason, extras)
        noisy = measure_marginals(batch, tracts, steps, rand, reps, bins, meter)
        fit = regression_from_tables(estimate_tables(noisy, batch.n[tracts], int(hp["iters"])))
        p25[:, tracts] = np.where(fit.ok, fit.p25, np.nan)
        p75[:, tracts] = np.where(fit.ok, fit.p75, np.nan)
        failed[:, tracts] = ~fit.ok
        reason[:, tracts] = np.where(fit.ok, "", "n*var(x) of the estimated marginal <= 0")
        extras["table_nvar"][:, tracts] = fit.nvar
        extras["table_ncov"][:, tracts] = fit.ncov
        return Outcome(p25, p75, failed, reason, extras)

    def peak_bytes(self, n, **hp):
        bins = int(self.hyper(hp)["bins"])
        per_tract = 16 * bins * bins * 8
        return _FIXED_BYTES + per_tract + _BYTES_PER_RECORD * np.asarray(n, dtype=np.int64)
