"""DP confidence intervals per tract for p25 = ŷ(0.25) and p75 = ŷ(0.75) (issue 8, part 1).

Target: the tract's population regression prediction μ(x*) = α + β·x*, covering both the
sampling error and the privacy noise of the released estimate. The interval is paid from its
own budget step, ``epsilon_interval`` per tract (``interval_noise_steps``); the released point
estimates are reused as post-processing, which is free (Dwork & Roth 2014, Prop. 2.1).

**NoisyStats: parametric bootstrap** (Ferrando, Wang & Sheldon 2022, "Parametric bootstrap for
differentially private confidence intervals", AISTATS). The released noisy statistics fix the
slope s̃ (= (p75 − p25)/0.5) and nvar~; the error of the prediction is
``ȳ − α − βx̄  +  (s̃ − β)(x* − x̄)  +  L3`` with ``s̃ − β = (Σ(x − x̄)e + L2 − βL1)/(nvar + L1)``.
Its law needs two more quantities, released here with grid Laplace noise (exact discrete
Laplace, ``mechanisms/noise.py``), ``epsilon_interval/2`` each:

- x̄, sensitivity 1/n (replace-one, parent ranks on [0, 1]);
- nvar_y = Σ(y − ȳ)², sensitivity 1 − 1/n: the same statistic as nvar on the child ranks
  (the paper's App. C.1 argument applies verbatim to y ∈ [0, 1]).

σ² is bounded above by nvar_y/(n − 1) (= var(y) ≥ the residual variance), taken at a one-sided
90% Laplace upper bound and capped at 1/4 (the largest variance of a variable on [0, 1]): a
conservative plug-in. The bootstrap then simulates the whole release (Gaussian sampling error
given the design, the three Laplace noises with their public scales, the failure event
nvar~ ≤ 0, on which nothing is published, hence conditioned out) with x̄ and nvar themselves
redrawn around their noisy values (so their uncertainty widens the interval), and returns the
basic-bootstrap interval [p̃ − q_{1−a/2}, p̃ − q_{a/2}] of the simulated errors. Its validity is
asymptotic and model-based (Gaussian errors, known design moments); the coverage is measured in
``benchmarks/eval_intervals.py``. The simulation randomness is numpy's, seeded from the
randomness source: it is post-processing of DP releases, so no float-noise attack (Mironov
2012) applies to it; every draw that touches the data uses the exact samplers.

**DPExpTheilSen: DP quantiles of the pairwise predictions** (after Sarathy & Vadhan 2022,
"Analyzing the differentially private Theil-Sen estimator for simple linear regression"). The
ends are exponential-mechanism quantiles of the tract's m pairwise predictions z at x*, at
ranks m/2 ∓ r with a public offset r (depending on n, ε and the level only): r covers

- the sampling error: the rank of μ among the z's, #{z < μ}/M with M = n(n−1)/2, is a
  U-statistic of mean 1/2 whose variance is ≈ 4ζ₁/n, ζ₁ = 1/12 for symmetric i.i.d. errors (as
  for the Hodges–Lehmann estimator; Hoeffding 1948), so z_{1−a/4}·sqrt(1/(3n))·M ranks; and
- the privacy error: the exponential mechanism puts weight ∝ exp(−ε_q·|j − t|/(2k)) on the
  interval with j values below it (k = n − 1), a Laplace law of scale 2k/ε_q in rank when the
  values are evenly spread near the target, so (2k/ε_q)·ln(2/a) ranks leave at most a/4 per side.

The shifted targets need no change to ``mechanisms/median.py``: padding a tract's values with
P = 2r public copies of ``lo`` (or ``hi``) moves the median's target rank m/2 of the original
values to m/2 − r (or m/2 + r). The padding does not depend on the data, so each record still
moves at most k values and m/2 by at most k/2: the utility keeps sensitivity k, and
``exp_median`` at ε_q is exactly (⌊ε_q·2²⁰⌋/2²⁰)-DP (McSherry & Talwar 2007, Thm 6; the exact
sampler of ``median.py``). Four quantiles (lower and upper end of p25 and p75) at
``epsilon_interval/4`` each. An offset r ≥ M/2 (M = n(n−1)/2, the pairs
of a tract with no tied x) gives the trivial end (0 or 1) without a draw: r and M are public,
so skipping the draw leaks nothing, and the step is charged all the same. The decision must
not use m, the pairs with distinct x: m depends on ties (``theil_sen_end_is_drawn``).

**Selection rule**: each tract gets the interval of the mechanism it chose; the interval step
is charged the larger of the two compositions (``worst_alternative`` in dpatlas/selection.py,
adaptive composition since the choice is a DP output).

Every interval is then widened to contain the released point estimate and clipped to [0, 1]
(post-processing: the population mean of a rank lies in [0, 1]); where the mechanism failed
(nothing published) the interval is NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from .batch import X_HIGH, X_LOW, TractBatch, sufficient_stats
from .budget import NO_METER
from .median import Segments, exp_median
from .noise import Randomness, laplace_mechanism, laplace_scale
from .pairs import all_pairs, chunk_tracts, theil_sen_predictions
from .privacy_maps import ExpMedian, GridLaplace, NoiseStep, compose
from .registry import MIN_RECORDS, Meter
from .theil_sen import MAX_PAIRS_PER_CHUNK

NOISY_STATS, EXP_THEIL_SEN, RULE = "NoisyStats", "DPExpTheilSen", "rule"
MECHANISMS = (NOISY_STATS, EXP_THEIL_SEN, RULE)
INTERVAL_STEP = "interval: p25 and p75"
_PREDICTIONS = (("p25", X_LOW), ("p75", X_HIGH))
_TS_LO, _TS_HI = -0.5, 1.5  # DPExpTheilSen's default clipping bounds of the pairwise predictions
BOOTSTRAP_DRAWS = 400  # simulated releases per (rep, tract)
_BOOTSTRAP_ROWS = 2048  # (rep, tract) rows simulated at once: bounds memory at ~50 MB
_SIGMA_UPPER_TAIL = 0.1  # one-sided level of the Laplace upper bound on nvar_y
_HL_ZETA1 = 1.0 / 12.0  # Var of the Hájek projection of 1[z < μ] for symmetric errors


# ---------------------------------------------------------------------------------------------
# Inputs and outputs


@dataclass(frozen=True)
class Released:
    """What the mechanism already published, arrays (reps, tracts); reused for free.

    NoisyStats needs its noisy nvar and the ε of its three steps (the public noise scales);
    the rule needs ``mechanism`` (per rep and tract) and, where NoisyStats ran, the same.
    """

    p25: np.ndarray
    p75: np.ndarray
    noisy_nvar: np.ndarray | None = None
    eps_nvar: float | None = None
    eps_ncov: float | None = None
    eps_intercept: float | None = None
    mechanism: np.ndarray | None = None


@dataclass(frozen=True)
class Intervals:
    """Arrays (reps, tracts); NaN where nothing was published."""

    p25_lo: np.ndarray
    p25_hi: np.ndarray
    p75_lo: np.ndarray
    p75_hi: np.ndarray


# ---------------------------------------------------------------------------------------------
# Budget


def _check_epsilon(epsilon_interval) -> float:
    if isinstance(epsilon_interval, bool) or not isinstance(
            epsilon_interval, (int, float, np.floating, np.integer)) \
            or not (math.isfinite(epsilon_interval) and epsilon_interval > 0):
        raise ValueError(f"epsilon_interval must be a finite number > 0, got {epsilon_interval!r}")
    return float(epsilon_interval)


def _check_mechanism(mechanism: str) -> None:
    if mechanism not in MECHANISMS:
        raise ValueError(f"intervals exist for {', '.join(MECHANISMS)}; got {mechanism!r}")


def _noisy_stats_steps(eps: float) -> list[NoiseStep]:
    return [NoiseStep("interval: mean of x", GridLaplace.calibrate(eps / 2, 1),
                      "1/n (L1, replace-one, parent ranks on [0, 1])"),
            NoiseStep("interval: nvar_y", GridLaplace.calibrate(eps / 2, 1),
                      "1 - 1/n (L1, replace-one, child ranks on [0, 1])")]


def _theil_sen_steps(eps: float) -> list[NoiseStep]:
    sens = ("utility sensitivity k = n - 1 (pairwise predictions one record is in; padding with "
            "public values lo/hi shifts the target rank and changes nothing else)")
    return [NoiseStep(f"interval: {name} {end}", ExpMedian.calibrate(eps / 4), sens)
            for name, _ in _PREDICTIONS for end in ("lower", "upper")]


def interval_noise_steps(mechanism: str, epsilon_interval: float) -> list[NoiseStep]:
    """The noise the interval of ``mechanism`` draws per tract with budget ``epsilon_interval``.

    For the rule: the steps of the costlier alternative (the one whose composition is larger),
    which is what the step must be charged (each tract runs one of them).
    """
    _check_mechanism(mechanism)
    eps = _check_epsilon(epsilon_interval)
    if mechanism == NOISY_STATS:
        return _noisy_stats_steps(eps)
    if mechanism == EXP_THEIL_SEN:
        return _theil_sen_steps(eps)
    alts = [_noisy_stats_steps(eps), _theil_sen_steps(eps)]
    return max(alts, key=lambda steps: compose(steps).epsilon)


def interval_guarantee(mechanism: str, epsilon_interval: float):
    """The interval step's guarantee per tract, derived from its noise steps' privacy maps."""
    return compose(interval_noise_steps(mechanism, epsilon_interval))


# ---------------------------------------------------------------------------------------------
# Entry point


def intervals(mechanism: str, batch: TractBatch, released: Released, epsilon_interval: float,
              rand: Randomness, level: float = 0.95, reps: int = 1, *,
              meter: Meter | None = None) -> Intervals:
    """``level`` confidence intervals of p25 and p75 per tract, arrays (reps, tracts).

    ``released`` is what ``mechanism`` published (same reps); ``meter`` is spent before every
    draw with that draw's privacy map.
    """
    _check_mechanism(mechanism)
    eps = _check_epsilon(epsilon_interval)
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.5 <= level < 1:
        raise ValueError(f"level must lie in [0.5, 1), got {level!r}")
    if isinstance(reps, bool) or int(reps) != reps or reps < 1:
        raise ValueError(f"reps must be an integer >= 1, got {reps!r}")
    shape = (int(reps), batch.n_tracts)
    for name in ("p25", "p75"):
        if np.shape(getattr(released, name)) != shape:
            raise ValueError(f"released.{name} has shape {np.shape(getattr(released, name))}, "
                             f"expected (reps, tracts) = {shape}")
    meter = NO_METER if meter is None else meter
    if mechanism == NOISY_STATS:
        return _noisy_stats_intervals(batch, released, eps, rand, level, meter)
    if mechanism == EXP_THEIL_SEN:
        return _theil_sen_intervals(batch, released, eps, rand, level, meter)
    return _rule_intervals(batch, released, eps, rand, level, meter)


def _finish(lo: np.ndarray, hi: np.ndarray, point: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Widen to contain the released estimate, clip to [0, 1]; NaN where none was released."""
    ok = np.isfinite(point)
    lo = np.clip(np.fmin(lo, point), 0.0, 1.0)
    hi = np.clip(np.fmax(hi, point), 0.0, 1.0)
    return np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)


def _empty(shape) -> Intervals:
    return Intervals(*(np.full(shape, np.nan) for _ in range(4)))


# ---------------------------------------------------------------------------------------------
# NoisyStats: parametric bootstrap


def _noisy_stats_intervals(batch, released, eps, rand, level, meter) -> Intervals:
    for f in ("noisy_nvar", "eps_nvar", "eps_ncov", "eps_intercept"):
        if getattr(released, f) is None:
            raise ValueError(f"NoisyStats intervals need released.{f} (the noisy nvar and the "
                             "epsilon of each of its steps)")
    reps, T = released.p25.shape
    out = _empty((reps, T))
    idx = np.nonzero(batch.n >= MIN_RECORDS)[0]
    if idx.size == 0:
        return out
    st = sufficient_stats(batch)
    n = st.n[idx].astype(np.float64)
    labels = batch.labels[idx]
    x_step, y_step = _noisy_stats_steps(eps)
    meter.spend(labels, x_step.guarantee, reps)
    xbar_t = laplace_mechanism(rand, np.broadcast_to(st.xbar[idx], (reps, idx.size))[..., None],
                               1.0 / n, x_step.noise.epsilon_for(np.zeros(1)))[..., 0]
    meter.spend(labels, y_step.guarantee, reps)
    nvar_y_t = laplace_mechanism(rand, np.broadcast_to(st.nvar_y[idx], (reps, idx.size))[..., None],
                                 1.0 - 1.0 / n, y_step.noise.epsilon_for(np.zeros(1)))[..., 0]
    # Everything below is post-processing of DP releases and public scales.
    b_x = _scale(1.0 / n, eps / 2)
    b_y = _scale(1.0 - 1.0 / n, eps / 2)
    sigma2 = np.minimum(0.25, np.maximum(nvar_y_t + b_y * math.log(0.5 / _SIGMA_UPPER_TAIL), 0.0)
                        / np.maximum(n - 1, 1))
    p25, p75 = released.p25[:, idx], released.p75[:, idx]
    plug = dict(n=np.broadcast_to(n, p25.shape), xbar=xbar_t, b_x=np.broadcast_to(b_x, p25.shape),
                nvar=released.noisy_nvar[:, idx], sigma2=sigma2,
                slope=(p75 - p25) / (X_HIGH - X_LOW),
                b_nvar=np.broadcast_to(_scale(1 - 1 / n, released.eps_nvar), p25.shape),
                b_ncov=np.broadcast_to(_scale(1 - 1 / n, released.eps_ncov), p25.shape))
    gen = rand.numpy_generator()
    alpha = 1.0 - level
    for name, x_star in _PREDICTIONS:
        point = getattr(released, name)[:, idx]
        q_lo, q_hi = _bootstrap_error_quantiles(plug, x_star, released.eps_intercept, alpha, gen)
        lo, hi = _finish(point - q_hi, point - q_lo, point)
        getattr(out, f"{name}_lo")[:, idx] = lo
        getattr(out, f"{name}_hi")[:, idx] = hi
    return out


def _scale(sensitivity, epsilon: float):
    """The Laplace scale ``laplace_mechanism`` draws with (per unit of sensitivity, times it)."""
    return np.asarray(sensitivity, dtype=np.float64) * laplace_scale(1.0, epsilon)


def _bootstrap_error_quantiles(plug: dict, x_star: float, eps_intercept: float, alpha: float,
                               gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(a/2, 1 − a/2) quantiles of the simulated error p̃* − μ̂ per (rep, tract)."""
    flat = {k: np.asarray(v, dtype=np.float64).ravel() for k, v in plug.items()}
    rows = flat["n"].size
    q_lo, q_hi = np.full(rows, np.nan), np.full(rows, np.nan)
    ok = np.nonzero(np.isfinite(flat["slope"]) & (flat["nvar"] > 0))[0]
    unit = laplace_scale(1.0, eps_intercept)
    B = BOOTSTRAP_DRAWS
    for start in range(0, ok.size, _BOOTSTRAP_ROWS):
        r = ok[start:start + _BOOTSTRAP_ROWS]
        c = {k: v[r][:, None] for k, v in flat.items()}
        size = (r.size, B)
        xbar = np.clip(c["xbar"] - gen.laplace(0.0, 1.0, size) * c["b_x"], 0.0, 1.0)
        nvar = np.clip(c["nvar"] - gen.laplace(0.0, 1.0, size) * c["b_nvar"], 1e-9, c["n"] / 4)
        sigma = np.sqrt(c["sigma2"])
        beta = c["slope"]
        ebar = gen.standard_normal(size) * sigma / np.sqrt(c["n"])
        score = gen.standard_normal(size) * sigma * np.sqrt(nvar)  # Σ(x − x̄)e given the design
        nvar_t = nvar + gen.laplace(0.0, 1.0, size) * c["b_nvar"]
        ncov_t = beta * nvar + score + gen.laplace(0.0, 1.0, size) * c["b_ncov"]
        published = nvar_t > 0  # the release fails (publishes nothing) otherwise
        slope_t = np.where(published, ncov_t / np.where(published, nvar_t, 1.0), 0.0)
        b3 = (1.0 + np.abs(slope_t)) / c["n"] * unit
        err = ebar + (slope_t - beta) * (x_star - xbar) + gen.laplace(0.0, 1.0, size) * b3
        err = np.where(published, err, np.nan)
        with np.errstate(all="ignore"):
            q = _row_nanquantiles(err, (alpha / 2, 1 - alpha / 2))
        # A row whose simulated release almost never publishes has no usable law: trivial ends.
        few = published.sum(axis=1) < 20
        q_lo[r] = np.where(few, -np.inf, q[0])
        q_hi[r] = np.where(few, np.inf, q[1])
    shape = np.shape(plug["n"])
    return q_lo.reshape(shape), q_hi.reshape(shape)


def _row_nanquantiles(values: np.ndarray, probs: tuple[float, ...]) -> np.ndarray:
    """``np.nanquantile(values, probs, axis=1)`` (method "linear"), bit for bit, shape
    (len(probs), rows): one sort of each row instead of numpy's Python-level call per row
    (``apply_along_axis``, about half the bootstrap's time).

    The arithmetic is numpy's own, operation for operation (numpy 2.x ``_quantile``: virtual
    index ``(k − 1)·p`` over the row's k non-NaN values, both neighbours the last value at or
    beyond the end, and ``_lerp``), so the intervals are those numpy's call gave. A row with no
    value gives NaN.
    """
    ordered = np.sort(values, axis=1)  # NaN sorts last: the row's k values come first
    k = np.count_nonzero(~np.isnan(values), axis=1)
    index = (k - 1) * np.asarray(probs, dtype=np.float64)[:, None]  # (probs, rows)
    below = np.floor(index)
    above = below + 1
    at_end = index >= k - 1
    below[at_end] = above[at_end] = -1  # numpy's "last value", for the gamma below
    gamma = index - below
    last = np.broadcast_to(k - 1, index.shape)
    lo = np.take_along_axis(ordered, np.where(at_end, last, below).astype(np.intp).T, axis=1).T
    hi = np.take_along_axis(ordered, np.where(at_end, last, above).astype(np.intp).T, axis=1).T
    diff = hi - lo
    out = lo + diff * gamma
    upper_half = gamma >= 0.5
    out[upper_half] = (hi - diff * (1 - gamma))[upper_half]
    out[:, k == 0] = np.nan
    return out


# ---------------------------------------------------------------------------------------------
# DPExpTheilSen: exponential-mechanism quantiles of the pairwise predictions


def theil_sen_rank_offset(n: np.ndarray, epsilon_quantile: float, level: float) -> np.ndarray:
    """Public rank offset r(n) of the interval's ends from the median (see module docstring)."""
    n = np.asarray(n, dtype=np.float64)
    a = 1.0 - level
    pairs = n * (n - 1) / 2
    sampling = norm.ppf(1 - a / 4) * np.sqrt(4 * _HL_ZETA1 / np.maximum(n, 1)) * pairs
    privacy = 2 * np.maximum(n - 1, 1) / epsilon_quantile * math.log(2 / a)
    return np.ceil(sampling + privacy).astype(np.int64)


def theil_sen_end_is_drawn(n: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Whether a tract's interval ends are drawn (else published as the trivial 0 and 1).

    Decided on public values only: n and the public offset r, against M = n(n − 1)/2, the
    number of pairs the tract would have with no tied x. The number m of pairs actually used
    (pairs with distinct x) depends on ties in the data, so a decision on m leaks: moving one
    record onto a tie moves m across 2r (issue 17). m ≤ M, so where 2r ≥ M the target rank is
    in the padding for every dataset of that n and the end is trivial whatever the data; where
    m ≤ 2r < M the draw still happens, and the padded sampler's target simply lies among the
    pads (the output is then near the trivial end, at the mechanism's own guarantee).
    """
    n = np.asarray(n, dtype=np.int64)
    return 2 * np.asarray(r, dtype=np.int64) < n * (n - 1) // 2


def _theil_sen_intervals(batch, released, eps, rand, level, meter) -> Intervals:
    reps, T = released.p25.shape
    out = _empty((reps, T))
    steps = _theil_sen_steps(eps)
    eps_q = steps[0].noise.argument
    offset = theil_sen_rank_offset(batch.n, eps_q, level)
    step_of = {(s.name.split()[1], s.name.split()[2]): s for s in steps}
    for chunk in chunk_tracts(batch, MAX_PAIRS_PER_CHUNK):
        sub = batch.subset(chunk)
        usable = sub.n >= MIN_RECORDS
        # Slopes and midpoints of the pairs once for both x* (the floats of one prediction at
        # a time: mechanisms/pairs.py), and each x*'s values sorted once for both ends.
        tract, zs = theil_sen_predictions(sub, all_pairs(sub), tuple(x for _, x in _PREDICTIONS),
                                          _TS_LO, _TS_HI)
        r = offset[chunk]
        draw = np.nonzero(usable & theil_sen_end_is_drawn(sub.n, r))[0]
        for (name, _), z in zip(_PREDICTIONS, zs):
            seg = Segments.build(tract, z, sub.n_tracts)
            for end, pad_value, trivial in (("lower", _TS_LO, 0.0), ("upper", _TS_HI, 1.0)):
                step = step_of[(name, end)]
                meter.spend(sub.labels[usable], step.guarantee, reps)  # charged, drawn or not
                vals = np.full((reps, sub.n_tracts), trivial)
                if draw.size:
                    padded = _padded(seg, draw, 2 * r[draw], pad_value)
                    vals[:, draw] = exp_median(padded, eps_q, np.maximum(sub.n[draw] - 1, 1),
                                               _TS_LO, _TS_HI, rand, reps)
                getattr(out, f"{name}_{'lo' if end == 'lower' else 'hi'}")[:, chunk] = vals
    for name, _ in _PREDICTIONS:
        point = getattr(released, name)
        lo, hi = _finish(getattr(out, f"{name}_lo"), getattr(out, f"{name}_hi"), point)
        getattr(out, f"{name}_lo")[:] = lo
        getattr(out, f"{name}_hi")[:] = hi
    return out


def _padded(seg: Segments, keep: np.ndarray, pad: np.ndarray, pad_value: float) -> Segments:
    """The tracts ``keep`` of ``seg`` (renumbered 0..), each with ``pad`` copies of
    ``pad_value`` added: a public, data-independent change that shifts the median's target.

    ``pad_value`` is an end of the clipping range (every value lies in [_TS_LO, _TS_HI]), so
    the copies go before (``_TS_LO``) or after (``_TS_HI``) the sorted values, and the result
    is sorted without sorting again: the segments sorting the padded values would give.
    """
    if pad_value not in (_TS_LO, _TS_HI):
        raise ValueError(f"padding goes at an end of [{_TS_LO}, {_TS_HI}], got {pad_value}")
    m = seg.m[keep]
    offsets = np.concatenate([[0], np.cumsum(m + pad)]).astype(np.int64)
    z = np.full(int(offsets[-1]), pad_value)
    first = offsets[:-1] + (pad if pad_value == _TS_LO else 0)  # where each tract's values go
    z[_runs(first, m)] = seg.z[_runs(seg.offsets[:-1][keep], m)]
    return Segments(z, offsets)


def _runs(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The indices start, start+1, … (length of them) of each run, concatenated."""
    before = np.cumsum(lengths) - lengths  # entries of the earlier runs
    return np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()))


# ---------------------------------------------------------------------------------------------
# The selection rule: the chosen mechanism's interval


def _rule_intervals(batch, released, eps, rand, level, meter) -> Intervals:
    if released.mechanism is None:
        raise ValueError("rule intervals need released.mechanism (the choice per rep and tract)")
    reps, T = released.p25.shape
    out = _empty((reps, T))
    chose_ns = np.asarray(released.mechanism) == NOISY_STATS
    for name, chosen in ((NOISY_STATS, chose_ns), (EXP_THEIL_SEN, ~chose_ns)):
        tracts = np.nonzero(chosen.any(axis=0))[0]
        if tracts.size == 0:
            continue
        sub = batch.subset(tracts)
        part = Released(released.p25[:, tracts], released.p75[:, tracts],
                        None if released.noisy_nvar is None else released.noisy_nvar[:, tracts],
                        released.eps_nvar, released.eps_ncov, released.eps_intercept)
        res = (_noisy_stats_intervals if name == NOISY_STATS else _theil_sen_intervals)(
            sub, part, eps, rand, level, meter)
        pick = chosen[:, tracts]
        for f in ("p25_lo", "p25_hi", "p75_lo", "p75_hi"):
            block = getattr(out, f)[:, tracts]
            block[pick] = getattr(res, f)[pick]
            getattr(out, f)[:, tracts] = block
    return out
