"""DP confidence intervals and standard errors per tract for p25 = ŷ(0.25) and p75 = ŷ(0.75)
(issues 8, 18 and 32).

**Estimand** (issue 32; ``mechanisms/estimand.py``, docs/uncertainty.md). Every interval and
standard error is about the tract's *expected outcome*: the population least-squares
prediction at x* of the law that generated the tract's records, clipped to [0, 1]. They cover
the *total error*: the sampling error of the tract's n records about that line, and the
privacy noise of the release. (Until issue 32 they covered the privacy noise only, about the
line of the tract's own records: a reader who took the ± as the tract's expected outcome with
all its error was misled exactly where the intervals were narrowest.)

- NoisyStats rows: privacy noise as below (exact), plus the least-squares prediction's
  sampling error, t_(n−2)·σ·sqrt(1/n + (x* − x̄)²/nvar), with σ² <= RSS/(n − 2) <=
  Σ(y − ȳ)²/(n − 2) bounded by a DP draw of Σ(y − ȳ)²; the two half-widths are added in
  quadrature (exact for two normal errors; the privacy half-width is already a Bonferroni
  bound, so the sum errs wide). The normal sampling law is asymptotic, and the t-quantile with
  the residual spread over-estimated by the slope's share makes it conservative for Gaussian
  errors; heteroskedastic errors are not modelled (docs/uncertainty.md, section 6, measures it).
- DPExpTheilSen rows: the rank offset of the DP quantile ends adds the sampling spread of the
  median of the pairwise predictions (``theil_sen_sampling_offset``, Hoeffding's U-statistic
  variance bound: public, a function of n). The ends then cover the population median of the
  pairwise predictions, which equals the expected outcome where the errors are symmetric and
  differs from it by a gap no public bound makes small where they are skewed or censored; the
  evaluation measures that gap's effect on coverage (docs/uncertainty.md, section 6) rather
  than widen every interval by a worst case.
- the rule's rows: those of the mechanism the tract chose.

**Standard errors** (``p25_se``, ``p75_se``; issue 32). Estimates of the standard deviation of
the published value's total error, from the interval step's DP statistics and the release's
public noise scales only: for NoisyStats, sqrt(sampling² + privacy²) with plug-in x̄, nvar, σ²
and slope (``_SpreadEstimate``); for DPExpTheilSen, the rank error of the published median
(exponential mechanism at ε/2: Laplace-like, scale 2k/(ε/2)) and the sampling rank spread,
turned into values at the rate the interval's DP ends show (``_theil_sen_standard_error``).
Capped at ``SE_CAP`` = 0.5, which is also the value where nothing makes the error estimable
(an end not drawn, nvar not positive, n <= 2): ±1.96·0.5 spans [0, 1] from any value.

The interval is paid from its own budget step, ``epsilon_interval`` per tract
(``interval_noise_steps``); the released point estimates are reused as post-processing, which
is free (Dwork & Roth 2014, Prop. 2.1).

**NoisyStats: Laplace bounds on the unknown statistics, the noise integrated exactly.** The
released slope s̃ = ncov~/nvar~ and prediction p̃ = ȳ + s̃·(x* − x̄) + L3 give, exactly,

    p̃ − p̂ = k·(L2 − β̂·L1) + L3,   k = (x* − x̄)/nvar~,

with L1, L2, L3 the Laplace noises of nvar, ncov and the intercept (public scales; L3's is
(1 + |s̃|)/(n ε3), known from the released s̃) and β̂, x̄ the tract's unknown slope and mean.
The interval step draws three statistics with grid Laplace noise (exact discrete Laplace,
``mechanisms/noise.py``), ``epsilon_interval/3`` each:

- x̄, sensitivity 1/n (replace-one, parent ranks on [0, 1]);
- nvar = Σ(x − x̄)² again, sensitivity 1 − 1/n: its noise is independent of the failure event
  (nothing is published when nvar~ <= 0), which depends on the first draw's;
- Σ(y − ȳ)², sensitivity 1 − 1/n (as nvar with child ranks): the residual spread's upper
  bound (share ``_GAMMA_SYY`` of the miss probability) and its plug-in estimate.

From them and the release, Bonferroni bounds that fail with probability at most a share of
1 − level each: nvar (from both draws; given publication, L1 > −nvar, an event of probability
>= 1/2, so any tail of L1 at most doubles; where the own draw alone does not bound nvar above
0, the bound from nvar~ takes 1/1000 of its share, so that its rare failures do not make narrow
intervals where nothing else would), |β̂| <= (|s̃|·nvar~ + c2)/nvar_lo (|L2| <= c2) and
<= sqrt(n/(4·nvar_lo)), and x̄ (within [0, 1] and within what nvar allows, nvar <= n·x̄(1 − x̄)).
The three noises are then integrated at their largest scales over those bounds: the quantile
of a sum of independent Laplace variables has a closed-form tail (``laplace_sum_quantile``),
taken at half the remaining level per side, divided by 1/P(published) at the lower bound on
nvar (at most 2). Where the lower bound on nvar is not positive the slope is not determined by
anything public or released and the interval is [0, 1]. No model of the errors is needed; the
one approximation is that k (through nvar~ = nvar + L1) and L3's scale (through s̃, i.e. L2)
are taken at their released values while L1 and L2 are integrated over. It
replaces issue 8's parametric bootstrap (Ferrando, Wang & Sheldon 2022), which
plugged the noisy statistics in as if true: a draw that overstated nvar gave a narrow interval
in the wrong place (coverage 0.02–0.06 among the reliable intervals of small tracts at ε = 1,
issue 18).

**DPExpTheilSen: DP quantiles of the pairwise predictions** (after Sarathy & Vadhan 2022,
"Analyzing the differentially private Theil-Sen estimator for simple linear regression"). The
ends are exponential-mechanism quantiles of the tract's m pairwise predictions z at x*, at
ranks m/2 ∓ r with a public offset r (depending on n, ε and the level only). The estimand is
the median of the z's itself, so r covers only the privacy error: the mechanism draws one of
GRID_POINTS + 1 grid points with weight exp(−ε_q·d/(2k)) at rank distance d from its target
(k = n − 1), so the points at distance >= r weigh at most GRID_POINTS·exp(−ε_q·r/(2k)) times the
best one and r = (2k/ε_q)·ln(4·GRID_POINTS/a) misses with probability at most a/4 per end, when
a grid point lies at the target rank. That fails when the target rank falls in a run of tied
predictions: no grid point separates the run, the best point is d0 ranks from the target and
the draw may land d0 + r ranks away. The long runs are the predictions clipped at −0.5 or 1.5
(x in a narrow band: extrapolated pairwise lines), so the interval step first *spreads* them
(``spread_clipped``): a prediction clipped at −0.5 becomes −0.5 + 0.4·u, one clipped at 1.5
becomes 1.5 − 0.4·u, u in (0, 1) a public function of the pair's position in the tract's
enumeration of all n(n−1)/2 pairs (a golden-ratio sequence: distinct, evenly spread). Every
spread value stays below 0 (or above 1), so the values clipped to [0, 1], and with them the
estimand's rank statistics, are unchanged, while the runs are gone; each value still depends on
its own pair only (its position is public), so a record still moves at most k values and the
guarantee is unchanged.

The shifted targets need no change to ``mechanisms/median.py``: padding a tract's values with
P = 2r public copies of ``lo`` (or ``hi``) moves the median's target rank m/2 of the original
values to m/2 − r (or m/2 + r). The padding does not depend on the data, so each record still
moves at most k values and m/2 by at most k/2: the utility keeps sensitivity k, and
``exp_median`` at ε_q is exactly (⌊ε_q·2²⁰⌋/2²⁰)-DP (McSherry & Talwar 2007, Thm 6; the exact
sampler of ``median.py``). Four quantiles (lower and upper end of p25 and p75) at
``epsilon_interval/4`` each. An offset r >= M/2 (M = n(n−1)/2, the pairs
of a tract with no tied x) gives the trivial end (0 or 1) without a draw: r and M are public,
so skipping the draw leaks nothing, and the step is charged all the same. The decision must
not use m, the pairs with distinct x: m depends on ties (``theil_sen_end_is_drawn``).
The interval uses the sorted predictions the point estimate built for the same tracts
(``mechanisms/sorted_predictions.py``; issue 22), and builds none for tracts whose ends are
not drawn: arithmetic shared, not a draw, so the guarantee and every output are unchanged.

**Selection rule**: each tract gets the interval of the mechanism it chose; the interval step
is charged the larger of the two compositions (``worst_alternative`` in dpatlas/release/selection.py,
adaptive composition since the choice is a DP output).

Every interval is then widened to contain the released point estimate and clipped to [0, 1]
(post-processing); where the mechanism failed (nothing published) the interval is NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .batch import X_HIGH, X_LOW, TractBatch, sufficient_stats
from .privacy_filter import NO_METER
from .estimand import SE_CAP
from .median import GRID_POINTS, Segments, exp_median
from .noise import Randomness, laplace_mechanism, laplace_scale
from .pairs import chunk_tracts
from .privacy_maps import ExpMedian, GridLaplace, NoiseStep, compose
from .registry import MIN_RECORDS, Meter
from .sensitivity import Sensitivity
from .sorted_predictions import ClippedEnds, build_sorted_predictions, runs
from .sufficient_stats import one_minus_one_over_n, one_over_n
from .theil_sen import MAX_PAIRS_PER_CHUNK, pairs_per_record

NOISY_STATS, EXP_THEIL_SEN, RULE = "NoisyStats", "DPExpTheilSen", "rule"
MECHANISMS = (NOISY_STATS, EXP_THEIL_SEN, RULE)
INTERVAL_STEP = "interval: p25 and p75"
_PREDICTIONS = (("p25", X_LOW), ("p75", X_HIGH))
_TS_LO, _TS_HI = -0.5, 1.5  # DPExpTheilSen's default clipping bounds of the pairwise predictions


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
    # The public value nvar~ had to reach for a NoisyStats row to be published: 0 for
    # NoisyStats (it fails where nvar~ <= 0), threshold/ε for the dp selection rule (it picks
    # NoisyStats where ε·nvar~ >= threshold). The interval conditions on that event.
    nvar_floor: float = 0.0
    # The budget DPExpTheilSen ran with (public: the plan); its rows' standard errors need it
    # (the exponential mechanism's rank error of the published median has scale 2k/(ε/2)).
    eps_theil_sen: float | None = None


@dataclass(frozen=True)
class Intervals:
    """Arrays (reps, tracts); NaN where nothing was published. ``p25_se``/``p75_se``: the
    estimated standard deviation of the published value's total error (``SE_CAP`` where the
    direct value carries no usable information); None when built from bounds alone."""

    p25_lo: np.ndarray
    p25_hi: np.ndarray
    p75_lo: np.ndarray
    p75_hi: np.ndarray
    p25_se: np.ndarray | None = None
    p75_se: np.ndarray | None = None


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


XBAR_SENSITIVITY = Sensitivity(
    "L1", "1/n", "1/n (L1, replace-one, parent ranks on [0, 1])",
    "the mean of n values in [0, 1] moves by at most 1/n when one is replaced", one_over_n,
    ("n",))
SECOND_NVAR_SENSITIVITY = Sensitivity(
    "L1", "1 - 1/n",
    "1 - 1/n (L1, replace-one, parent ranks on [0, 1]): a second draw of n var(x)",
    "n var(x) = sum x^2 - (sum x)^2/n: replacing one x in [0, 1] moves it by at most 1 - 1/n "
    "(the paper's App. C.1); the same query as the selection's nvar, drawn again",
    one_minus_one_over_n, ("n",))
QUANTILE_UTILITY_SENSITIVITY = Sensitivity(
    "utility", "n - 1",
    "utility sensitivity k = n - 1 (pairwise predictions one record is in; padding with "
    "public values lo/hi shifts the target rank and changes nothing else)",
    "one record is in n - 1 pairwise predictions, each moving the rank utility by at most 1; "
    "the public padding is the same on neighbouring datasets (mechanisms/median.py, "
    "exp_median; McSherry & Talwar 2007, Thm 6)", pairs_per_record, ("n",))


SYY_SENSITIVITY = Sensitivity(
    "L1", "1 - 1/n",
    "1 - 1/n (L1, replace-one, child ranks on [0, 1]): n var(y), the spread of the outcomes",
    "n var(y) = sum y^2 - (sum y)^2/n: replacing one y in [0, 1] moves it by at most 1 - 1/n "
    "(the paper's App. C.1 bound for n var(x), with y for x)", one_minus_one_over_n, ("n",))


def _noisy_stats_steps(eps: float) -> list[NoiseStep]:
    return [NoiseStep("interval: mean of x", GridLaplace.calibrate(eps / 3, 1),
                      XBAR_SENSITIVITY),
            NoiseStep("interval: nvar", GridLaplace.calibrate(eps / 3, 1),
                      SECOND_NVAR_SENSITIVITY),
            NoiseStep("interval: nvar of y", GridLaplace.calibrate(eps / 3, 1),
                      SYY_SENSITIVITY)]


def _theil_sen_steps(eps: float) -> list[NoiseStep]:
    return [NoiseStep(f"interval: {name} {end}", ExpMedian.calibrate(eps / 4),
                      QUANTILE_UTILITY_SENSITIVITY)
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
              meter: Meter | None = None, nvar_from_both_draws: bool = False) -> Intervals:
    """``level`` confidence intervals of p25 and p75 per tract, arrays (reps, tracts).

    ``released`` is what ``mechanism`` published (same reps); ``meter`` is spent before every
    draw with that draw's privacy map. ``nvar_from_both_draws`` (NoisyStats released with no
    selection floor only; the county and state levels use it): the lower bound on nvar comes
    from the two noisy nvar draws averaged, see ``_combined_nvar_lower``.
    """
    _check_mechanism(mechanism)
    if nvar_from_both_draws and (mechanism != NOISY_STATS or released.nvar_floor > 0):
        raise ValueError("nvar_from_both_draws needs NoisyStats released without a selection "
                         f"floor (got {mechanism}, floor {released.nvar_floor})")
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
    if mechanism != NOISY_STATS and released.eps_theil_sen is None:
        # checked before any draw: the rows' standard errors need it (nothing is spent first)
        raise ValueError(f"{mechanism} intervals need released.eps_theil_sen (the budget "
                         "DPExpTheilSen ran with) for their standard errors")
    meter = NO_METER if meter is None else meter
    if mechanism == NOISY_STATS:
        return _noisy_stats_intervals(batch, released, eps, rand, level, meter,
                                      nvar_from_both_draws)
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
    return Intervals(*(np.full(shape, np.nan) for _ in range(6)))


# ---------------------------------------------------------------------------------------------
# NoisyStats: parametric bootstrap


def _noisy_stats_intervals(batch, released, eps, rand, level, meter,
                           nvar_from_both_draws: bool = False) -> Intervals:
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
    x_step, nvar_step_, syy_step = _noisy_stats_steps(eps)
    meter.spend(labels, x_step.guarantee, reps)
    xbar_t = laplace_mechanism(rand, np.broadcast_to(st.xbar[idx], (reps, idx.size))[..., None],
                               x_step.sensitivity.value(n=n), x_step.noise)[..., 0]
    meter.spend(labels, nvar_step_.guarantee, reps)
    nvar2_t = laplace_mechanism(rand, np.broadcast_to(st.nvar[idx], (reps, idx.size))[..., None],
                                nvar_step_.sensitivity.value(n=n), nvar_step_.noise)[..., 0]
    meter.spend(labels, syy_step.guarantee, reps)
    syy_t = laplace_mechanism(rand, np.broadcast_to(st.nvar_y[idx], (reps, idx.size))[..., None],
                              syy_step.sensitivity.value(n=n), syy_step.noise)[..., 0]
    # Everything below is post-processing of DP releases and public scales.
    p25, p75 = released.p25[:, idx], released.p75[:, idx]
    slope = (p75 - p25) / (X_HIGH - X_LOW)
    nvar_t = released.noisy_nvar[:, idx]
    a = 1.0 - level
    b_nvar = _scale(1.0 - 1.0 / n, released.eps_nvar)
    b_ncov = _scale(1.0 - 1.0 / n, released.eps_ncov)
    b_icpt = (1.0 + np.abs(slope)) / n * laplace_scale(1.0, released.eps_intercept)
    # nvar: from the interval's own draw (its noise is independent of the event on which the
    # row was published, nvar~ >= floor), then from the released nvar~ = nvar + L1 given that
    # event: its probability P(L1 >= floor − nvar) is at least p_pub, its value at the lower
    # bound so far, and any event of L1 has at most 1/p_pub times its probability given it.
    floor = max(float(released.nvar_floor), 0.0)
    b_own = _scale(1.0 - 1.0 / n, eps / _NS_DRAWS)
    nvar_lo, nvar_hi = _two_sided(nvar2_t, b_own, _GAMMA_NVAR * a / 2)
    p_pub = _published_probability(floor - np.maximum(nvar_lo, 0.0), b_nvar)
    tail1 = 2 * (_GAMMA_NVAR * a / 4) * p_pub  # P(L1 > c1) must be this: no bound if 0
    if nvar_from_both_draws:
        # the released draw's whole share goes to the lower bound from both draws
        nvar_lo = np.maximum(nvar_lo, _combined_nvar_lower(nvar_t, b_nvar, nvar2_t, b_own,
                                                           tail1))
    else:
        # Where the interval's own draw does not already make the lower bound positive, the
        # released draw's bound takes a tiny part of that share (so is wider): a failure of
        # its bound is what makes an interval narrow where nvar is near 0 (a draw far in its
        # tail, which a selection floor even picks out), and there those failures were most
        # of the map's "reliable" intervals (issue 18: narrow x at ε = 8, small tracts at
        # ε = 1). The two parts sum to tail1, so the level is kept.
        tail_strict = tail1 * _STRICT_SHARE
        c1 = _laplace_tail_bound(b_nvar, tail1 - tail_strict)
        c1_strict = _laplace_tail_bound(b_nvar, tail_strict)
        nvar_lo = np.maximum(nvar_lo, nvar_t - np.where(nvar_lo > 0, c1, c1_strict))
        nvar_hi = np.minimum(nvar_hi, nvar_t + c1)
    nvar_hi = np.minimum(nvar_hi, n / 4)  # n/4: ranks on [0, 1]
    known = (nvar_lo > 0) & (nvar_lo <= nvar_hi)
    safe_lo = np.where(known, nvar_lo, 1.0)
    # |β̂| = |s̃·nvar~ − L2|/nvar with |L2| <= c2, and <= sqrt(nvar_y/nvar) <= sqrt(n/(4 nvar))
    c2 = b_ncov * math.log(1.0 / (_GAMMA_BETA * a))
    beta_max = np.minimum((np.abs(slope) * nvar_t + c2) / safe_lo, np.sqrt(n / (4 * safe_lo)))
    # x̄: from its draw, within [0, 1], and within what nvar >= nvar_lo allows for ranks on
    # [0, 1] (nvar <= n·x̄(1 − x̄)).
    b_xbar = _scale(1.0 / n, eps / _NS_DRAWS)
    xbar_lo, xbar_hi = _two_sided(xbar_t, b_xbar, _GAMMA_XBAR * a)
    room = np.sqrt(np.clip(1.0 - 4.0 * safe_lo / n, 0.0, 1.0)) / 2
    xbar_lo, xbar_hi = np.maximum(xbar_lo, 0.5 - room), np.minimum(xbar_hi, 0.5 + room)
    known &= xbar_lo <= xbar_hi
    # The residual spread, bounded above: the residual sum of squares is at most Σ(y − ȳ)²,
    # which is at most its draw plus a one-sided Laplace bound, and at most n/4.
    # (Σ(y − ȳ)² has the own nvar draw's sensitivity and budget, so its scale b_own)
    rss_hi = np.minimum(syy_t + b_own * math.log(1.0 / (2 * _GAMMA_SYY * a)), n / 4)
    known &= rss_hi > 0
    rest = a * (1.0 - _GAMMA_NVAR - _GAMMA_BETA - _GAMMA_XBAR - _GAMMA_SYY)
    # Given publication (probability >= its value at nvar_lo, on the event nvar >= nvar_lo
    # already paid for), an event of the unconditional law has at most 1/P(published) times
    # its probability.
    inflation = 1.0 / np.maximum(_published_probability(floor - safe_lo, b_nvar), 1e-300)
    known &= rest / (2 * inflation) > 1e-300  # else no usable tail: the trivial interval
    safe_nvar_t = np.where(nvar_t > 0, nvar_t, 1.0)
    t_quantile = _student_quantile(1.0 - a / 2, n - 2)
    spread = _SpreadEstimate.of(n, xbar_t, nvar_t, nvar2_t, b_nvar, b_own, syy_t, slope,
                                floor)
    for name, x_star in _PREDICTIONS:
        # privacy: error = k·(L2 − β̂·L1) + L3 with k = (x* − x̄)/nvar~, exactly: a sum of
        # three independent Laplace noises, at their largest scales over the bounds, each
        # side's tail at rest/2 divided by the inflation for publication.
        dx_max = np.maximum(np.abs(x_star - xbar_lo), np.abs(x_star - xbar_hi))
        k = dx_max / safe_nvar_t
        q_privacy = laplace_sum_quantile((k * b_ncov, beta_max * k * b_nvar, b_icpt),
                                         1.0 - rest / (2 * inflation))
        # sampling: the least-squares prediction's error about the population line,
        # t_(n−2)·σ·sqrt(1/n + (x* − x̄)²/nvar) at the bounds (σ² <= RSS/(n − 2))
        with np.errstate(invalid="ignore"):  # a non-finite bound: the trivial interval below
            q_sampling = t_quantile * np.sqrt(np.maximum(rss_hi, 0.0) / np.maximum(n - 2, 1)
                                              * (1.0 / n + dx_max ** 2 / safe_lo))
        q = np.sqrt(q_privacy ** 2 + q_sampling ** 2)
        point = getattr(released, name)[:, idx]
        q = np.where(known & np.isfinite(q_sampling), q, np.inf)
        lo, hi = _finish(point - q, point + q, point)
        getattr(out, f"{name}_lo")[:, idx] = lo
        getattr(out, f"{name}_hi")[:, idx] = hi
        se = spread.standard_error(x_star, b_ncov, b_icpt)
        getattr(out, f"{name}_se")[:, idx] = np.where(np.isfinite(point), se, np.nan)
    return out


def _student_quantile(p: float, df: np.ndarray) -> np.ndarray:
    """The p-quantile of Student's t with ``df`` degrees of freedom; inf where df < 1."""
    from scipy.stats import t as student_t

    df = np.asarray(df, dtype=float)
    return np.where(df >= 1, student_t.ppf(p, np.maximum(df, 1.0)), np.inf)


@dataclass(frozen=True)
class _SpreadEstimate:
    """Plug-in estimates, from DP draws and public scales only, of what a NoisyStats row's
    total error depends on: x̄, nvar, the residual variance σ², the slope, and the size of the
    realised noise L1 of the released nvar~ (which the selection floor picks large).

    The standard error is then sqrt(sampling² + privacy²) with
    sampling² = σ̂²·(1/n + (x* − x̄~)²/nvar^) (the least-squares prediction's variance about
    the population line) and privacy² = k²·(2 b_ncov² + β̂²·E L1²) + 2 b_icpt², k = (x* − x̄~)/nvar~
    (the exact error k·(L2 − β̂·L1) + L3 of the released value; Laplace variance 2b²)."""

    n: np.ndarray
    xbar: np.ndarray
    nvar_released: np.ndarray
    nvar: np.ndarray  # the estimate used for the sampling variance
    sigma2: np.ndarray
    slope: np.ndarray
    l1_square: np.ndarray  # an estimate of L1², at least its variance 2 b_nvar²

    @staticmethod
    def of(n, xbar_t, nvar_t, nvar2_t, b_nvar, b_own, syy_t, slope, floor: float):
        if floor > 0:  # published where nvar~ came out large: only the own draw is unbiased
            nvar = nvar2_t
        else:  # both draws unbiased: their inverse-variance average
            w = b_own ** 2 / (b_nvar ** 2 + b_own ** 2)
            nvar = w * nvar_t + (1.0 - w) * nvar2_t
        slope = np.clip(slope, -1.0, 1.0)
        syy = np.clip(syy_t, 0.0, n / 4)
        # RSS = Σ(y − ȳ)² − β̂²·nvar; at least half of Σ(y − ȳ)² (the slope's share is small
        # for ranks, and a noisy β̂²·nvar must not zero the residual spread)
        rss = np.maximum(syy - slope ** 2 * np.maximum(nvar, 0.0), syy / 2)
        sigma2 = rss / np.maximum(n - 2, 1)
        # L1's variance 2 b_nvar² is E L1² where nothing selected on it; where a floor did
        # (published because nvar~ came out large), nvar~ − nvar2~ = L1 − L1' estimates the
        # realised L1: its square less L1''s variance, at least 2 b_nvar²
        l1_square = np.broadcast_to(2 * b_nvar ** 2, np.shape(nvar_t))
        if floor > 0:
            l1_square = np.maximum(l1_square, (nvar_t - nvar2_t) ** 2 - 2 * b_own ** 2)
        return _SpreadEstimate(n, np.clip(xbar_t, 0.0, 1.0), nvar_t, nvar, sigma2, slope,
                               l1_square)

    def standard_error(self, x_star: float, b_ncov, b_icpt) -> np.ndarray:
        dx = x_star - self.xbar
        usable = (self.nvar > 0) & (self.nvar_released > 0) & (self.n > 2)
        nvar = np.where(usable, self.nvar, 1.0)
        nvar_released = np.where(usable, self.nvar_released, 1.0)
        sampling2 = self.sigma2 * (1.0 / self.n + dx ** 2 / nvar)
        k = dx / nvar_released
        privacy2 = k ** 2 * (2 * b_ncov ** 2 + self.slope ** 2 * self.l1_square) \
            + 2 * b_icpt ** 2
        se = np.sqrt(sampling2 + privacy2)
        return np.where(usable, np.minimum(se, SE_CAP), SE_CAP)


def _combined_nvar_lower(nvar_t, b_released, nvar2_t, b_own, tail):
    """A lower bound on nvar from both noisy draws, for units published with no floor.

    The inverse-variance average w·nvar~ + (1 − w)·nvar2~ (w = b_own²/(b_released² + b_own²))
    is nvar + w·L1 + (1 − w)·L2 with independent Laplace L1, L2 of public scales; its bound
    fails with probability ``tail`` for the unconditional law, and ``tail`` carries the factor
    p_pub (the chance of publication at the own draw's lower bound, >= 1/2 with no floor), so
    given publication it fails with probability <= tail/p_pub: the share γ·(1 − level)/2 the
    released draw's two sides had. The lower bound alone: nvar's upper bound keeps the own
    draw's.

    Conditional coverage (issue 18): where the true nvar is near 0, a published nvar~ is
    overstated and the average with it too; so the bound is used only where the own draw,
    which is independent of publication, passes a lax gate (nvar2~ > b_own·ln 20: probability
    <= 1/40 at nvar = 0). A narrow interval from an overstated nvar~ then needs both events,
    as the single-draw scheme's strict share makes it need a far tail.
    """
    w = b_own ** 2 / (b_released ** 2 + b_own ** 2)
    average = w * nvar_t + (1.0 - w) * nvar2_t
    scales = np.broadcast_arrays(w * b_released, (1.0 - w) * b_own, tail)[:2]
    c = laplace_sum_quantile(scales, 1.0 - tail)
    gate = nvar2_t > b_own * math.log(20.0)
    return np.where(gate & (tail > 1e-300), average - c, -np.inf)


# Shares of the miss probability 1 − level spent on the bounds of the unknown statistics
# (Bonferroni); the rest goes to the three Laplace noises the interval integrates over.
_GAMMA_NVAR, _GAMMA_BETA, _GAMMA_XBAR, _GAMMA_SYY = 0.1, 0.05, 0.05, 0.05
_NS_DRAWS = 3  # the NoisyStats interval's draws (x̄, nvar, nvar of y), ε/3 each
_STRICT_SHARE = 1e-3  # of the released nvar~ bound's tail, where the own draw alone is not > 0
_SCALE_SEPARATION = 1.02  # scales of a Laplace sum kept this far apart (rounded up: wider)


def _laplace_tail_bound(scale, tail):
    """c = −scale·ln(tail), so P(L > c) = tail/2 <= tail for a Laplace L of ``scale``; inf
    where tail is 0 (no bound)."""
    tail = np.asarray(tail, dtype=float)
    return np.where(tail > 1e-300, scale * -np.log(np.maximum(tail, 1e-300)), np.inf)


def _published_probability(gap, scale):
    """P(L >= gap) for a Laplace L of scale ``scale``: the chance that nvar~ = nvar + L
    reaches a floor ``gap`` above nvar."""
    gap = np.asarray(gap, dtype=float)
    with np.errstate(over="ignore"):
        return np.where(gap <= 0, 1.0 - 0.5 * np.exp(np.minimum(gap, 0.0) / scale),
                        0.5 * np.exp(-np.maximum(gap, 0.0) / scale))


def _two_sided(noisy, scale, gamma):
    """[v − c, v + c] holding the true value unless |Laplace(scale)| > c: probability γ."""
    c = scale * math.log(1.0 / gamma)
    return noisy - c, noisy + c


def laplace_sum_quantile(scales, p) -> np.ndarray:
    """The p-quantile (p > 1/2, a number or an array like the scales) of Σ a_i·U_i for independent standard Laplace U_i and scales
    a_i >= 0 (a tuple of arrays), by bisection on the closed-form tail. For distinct scales
    the density is Σ_i w_i·e^(−|x|/a_i)/(2a_i) with w_i = Π_{j≠i} a_i²/(a_i² − a_j²) (partial
    fractions of the characteristic function Π 1/(1 + a_i² t²)), so
    P(X > x) = Σ_i w_i·e^(−x/a_i)/2. Scales closer than a factor 1.02 are first pushed up
    apart (each at most 2% per neighbour): a larger scale only widens the quantile."""
    arrs = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in scales))
    a = np.sort(np.stack(arrs), axis=0)  # (k, ...), ascending
    top = a[-1]
    floor = np.maximum(top, 1e-300) * 1e-9
    a = np.maximum(a, floor)
    for i in range(1, a.shape[0]):
        a[i] = np.maximum(a[i], a[i - 1] * _SCALE_SEPARATION)
    w = np.ones_like(a)
    for i in range(a.shape[0]):
        for j in range(a.shape[0]):
            if i != j:
                w[i] *= a[i] ** 2 / (a[i] ** 2 - a[j] ** 2)
    # p: one level, or one per element; a tail below 1e-300 is taken as 1e-300 (callers
    # treat such rows as having no usable tail)
    tail = np.maximum(1.0 - np.asarray(p, dtype=float), 1e-300)

    def upper(x):
        return (w * np.exp(-x[None] / a)).sum(axis=0) / 2

    left = np.zeros_like(top)
    right = a.sum(axis=0) * np.log(1.0 / tail) + 1e-12  # P(X > Σa·ln(1/t)) <= t
    for _ in range(60):
        mid = (left + right) / 2
        above = upper(mid) > tail
        left, right = np.where(above, mid, left), np.where(above, right, mid)
    return np.where(top > 0, right, 0.0)


def _scale(sensitivity, epsilon: float):
    """The Laplace scale ``laplace_mechanism`` draws with (per unit of sensitivity, times it)."""
    return np.asarray(sensitivity, dtype=np.float64) * laplace_scale(1.0, epsilon)


def theil_sen_rank_offset(n: np.ndarray, epsilon_quantile: float, level: float) -> np.ndarray:
    """Public rank offset r(n) of the interval's ends from the median: the privacy error of
    the exponential-mechanism quantile plus the sampling error of the tract's median of
    pairwise predictions about its population value (``theil_sen_sampling_offset``)."""
    n = np.asarray(n, dtype=np.float64)
    a = 1.0 - level
    # The exponential mechanism draws one of GRID_POINTS + 1 grid points, each with weight
    # exp(−ε·d/(2k)) at rank distance d from its target: whatever the values, the points at
    # distance >= r weigh at most GRID_POINTS·exp(−ε·r/(2k)) times the best point, so
    # r = (2k/ε)·ln(GRID_POINTS·4/a) misses by r with probability at most a/4 per end.
    privacy = 2 * np.maximum(n - 1, 1) / epsilon_quantile * math.log(GRID_POINTS * 4 / a)
    return np.ceil(privacy).astype(np.int64) + theil_sen_sampling_offset(n, level)


def _pairwise_rank_sd(n: np.ndarray) -> np.ndarray:
    """An upper bound on the standard deviation, in ranks, of where the population median of a
    tract's pairwise predictions falls among its M = n(n − 1)/2 pairs' values.

    The share F_m(θ) of the pairwise predictions below the population median θ is a
    U-statistic of order 2 with mean 1/2; its variance is 4ζ₁/n + 2ζ₂/(n(n − 1)) to first
    order (Hoeffding 1948), ζ₁ <= ζ₂ <= 1/4 for an indicator kernel, so its standard deviation
    is at most sqrt(1/n + 1/(2n(n − 1))); times M pairs (>= m, the pairs with distinct x)."""
    n = np.maximum(np.asarray(n, dtype=np.float64), 2.0)
    return n * (n - 1) / 2 * np.sqrt(1.0 / n + 1.0 / (2 * n * (n - 1)))


def theil_sen_sampling_offset(n: np.ndarray, level: float) -> np.ndarray:
    """The rank offset covering the sampling error (``_pairwise_rank_sd``) with probability
    1 − a/4 per end (a = 1 − level), by the normal approximation of the U-statistic: public,
    a function of n and the level only."""
    from scipy.stats import norm

    z = float(norm.ppf(1.0 - (1.0 - level) / 4))
    return np.ceil(z * _pairwise_rank_sd(n)).astype(np.int64)


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
    x_stars = tuple(x for _, x in _PREDICTIONS)
    for chunk in chunk_tracts(batch, MAX_PAIRS_PER_CHUNK):
        sub = batch.subset(chunk)
        usable = sub.n >= MIN_RECORDS
        r = offset[chunk]
        draw = np.nonzero(usable & theil_sen_end_is_drawn(sub.n, r))[0]
        if draw.size:
            # The drawn tracts' sorted predictions: those the point estimate built when it ran
            # on the same tracts (mechanisms/sorted_predictions.py), else built here for them
            # alone. Both x* and both ends use them; the other tracts' ends are trivial.
            found = build_sorted_predictions(sub, x_stars, _TS_LO, _TS_HI, draw)
            segments = [spread_segments(seg, ends)
                        for seg, ends in zip(found.segments, found.clipped)]
            del found
        for (name, _), i in zip(_PREDICTIONS, range(len(x_stars))):
            for end, pad_value, trivial in (("lower", _TS_LO, 0.0), ("upper", _TS_HI, 1.0)):
                step = step_of[(name, end)]
                meter.spend(sub.labels[usable], step.guarantee, reps)  # charged, drawn or not
                vals = np.full((reps, sub.n_tracts), trivial)
                if draw.size:
                    padded = _padded(segments[i], np.arange(draw.size), 2 * r[draw],
                                     pad_value)
                    vals[:, draw] = exp_median(padded, eps_q,
                                               step.sensitivity.value(n=sub.n[draw]),
                                               _TS_LO, _TS_HI, rand, reps)
                getattr(out, f"{name}_{'lo' if end == 'lower' else 'hi'}")[:, chunk] = vals
    drawn_ends = theil_sen_end_is_drawn(batch.n, offset) & (batch.n >= MIN_RECORDS)
    for name, _ in _PREDICTIONS:
        point = getattr(released, name)
        getattr(out, f"{name}_se")[:] = _theil_sen_standard_error(
            getattr(out, f"{name}_lo"), getattr(out, f"{name}_hi"), point, batch.n, offset,
            drawn_ends, released.eps_theil_sen)
        lo, hi = _finish(getattr(out, f"{name}_lo"), getattr(out, f"{name}_hi"), point)
        getattr(out, f"{name}_lo")[:] = lo
        getattr(out, f"{name}_hi")[:] = hi
    return out


def _theil_sen_standard_error(lo, hi, point, n, offset, drawn, eps_theil_sen: float):
    """A DPExpTheilSen row's standard error, from its interval's DP ends and public values.

    The published median is an exponential-mechanism draw at ε/2 (``theil_sen.py``): its rank
    error is about Laplace with scale 2k/(ε/2), k = n − 1 (variance 2·scale²); the sampling
    error of the median in ranks is at most ``_pairwise_rank_sd``. Ranks become values at the
    rate the interval's ends show, (hi − lo)/(2r) for ends r ranks either side of the median
    (the pairwise predictions' spread there: wider in the tails, so this errs large).
    ``SE_CAP`` where an end was not drawn (no spread is known)."""
    n = np.asarray(n, dtype=np.float64)
    scale = 2 * np.maximum(n - 1, 1) / (eps_theil_sen / 2)
    rank_sd = np.sqrt(2 * scale ** 2 + _pairwise_rank_sd(n) ** 2)
    per_rank = (hi - lo) / (2 * np.maximum(offset, 1))
    se = np.minimum(per_rank * rank_sd, SE_CAP)
    se = np.where(drawn[None, :] & np.isfinite(se), se, SE_CAP)
    return np.where(np.isfinite(point), se, np.nan)


# The spread of clipped predictions: inside (−0.5, −0.1] and [1.1, 1.5), never reaching [0, 1].
_SPREAD = 0.4
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def spread_clipped(z: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The pairwise predictions with the runs at the clipping ends spread out (module docstring).

    ``position`` is each value's pair index in the enumeration of all pairs of its chunk (public:
    it depends on the tract sizes only). A value at _TS_LO moves up, one at _TS_HI down, by
    _SPREAD·u with u = frac((position + 1)·φ), φ the golden ratio's fraction: values of distinct
    pairs differ, and every moved value stays outside [0, 1], so clipping to [0, 1] gives what
    it gave before.
    """
    u = np.modf((np.asarray(position, dtype=np.float64) + 1.0) * _GOLDEN)[0]
    u = np.where(u > 0.0, u, 0.5)  # u = 0 would leave the value on the end
    out = np.where(z <= _TS_LO, _TS_LO + _SPREAD * u, z)
    return np.where(z >= _TS_HI, _TS_HI - _SPREAD * u, out)


def spread_segments(seg: Segments, ends: ClippedEnds) -> Segments:
    """``seg`` (sorted predictions) with its clipped values ``ends`` spread (``spread_clipped``),
    sorted again: the segments sorting the spread values would give, without sorting every
    tract.

    In a sorted tract the clipped values are a run at each end. The spread low values lie in
    (_TS_LO, _TS_LO + _SPREAD], the high ones in [_TS_HI − _SPREAD, _TS_HI), so only the values
    up to the highest spread low value and from the lowest spread high value (the clipped ones
    and the few unclipped ones they pass) change places: those slots, which are the first and
    last places of the tract, get those values sorted; every other value keeps its place.
    """
    if ends.tract.size == 0:
        return seg
    spread = spread_clipped(ends.value, ends.place)
    low = ends.value <= _TS_LO
    top_of_low = np.full(seg.n_tracts, -np.inf)
    np.maximum.at(top_of_low, ends.tract[low], spread[low])
    bottom_of_high = np.full(seg.n_tracts, np.inf)
    np.minimum.at(bottom_of_high, ends.tract[~low], spread[~low])
    if np.any(top_of_low >= bottom_of_high):  # cannot happen: _SPREAD < (_TS_HI - _TS_LO)/2
        raise AssertionError("spread low and high values overlap")
    tract_of = np.repeat(np.arange(seg.n_tracts), seg.m)
    z = seg.z
    moving = (z <= top_of_low[tract_of]) | (z >= bottom_of_high[tract_of])
    slots = np.flatnonzero(moving)
    passed = slots[(z[slots] > _TS_LO) & (z[slots] < _TS_HI)]  # unclipped values passed
    values = np.concatenate([spread, z[passed]])
    tracts = np.concatenate([ends.tract, tract_of[passed]])
    out = z.copy()
    out[slots] = values[np.lexsort((values, tracts))]
    return Segments(out, seg.offsets)


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
    z[runs(first, m)] = seg.z[runs(seg.offsets[:-1][keep], m)]
    return Segments(z, offsets)


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
                        released.eps_nvar, released.eps_ncov, released.eps_intercept,
                        nvar_floor=released.nvar_floor,
                        eps_theil_sen=released.eps_theil_sen)
        res = (_noisy_stats_intervals if name == NOISY_STATS else _theil_sen_intervals)(
            sub, part, eps, rand, level, meter)
        pick = chosen[:, tracts]
        for f in ("p25_lo", "p25_hi", "p75_lo", "p75_hi", "p25_se", "p75_se"):
            block = getattr(out, f)[:, tracts]
            block[pick] = getattr(res, f)[pick]
            getattr(out, f)[:, tracts] = block
    return out
