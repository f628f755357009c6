"""Empirical privacy audits: a statistical lower bound on ε from samples on neighbouring data.

For neighbouring datasets D, D' and any event S, an ε-DP mechanism has
P_D(S) <= e^ε P_D'(S). With Clopper–Pearson bounds (one-sided, level α each) on both
probabilities, ``ln(lower(P_D(S)) / upper(P_D'(S)))`` is a lower bound on the true ε with
confidence 1 − 2α. The event is chosen on a separate pilot sample (bins ranked by their
likelihood ratio), so the bound computed on the fresh sample stays valid.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
from scipy import stats


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    lo = stats.beta.ppf(alpha, k, n - k + 1) if k > 0 else 0.0
    hi = stats.beta.ppf(1 - alpha, k + 1, n - k) if k < n else 1.0
    return float(lo), float(hi)


def _choose_event(pilot_a, pilot_b, edges):
    ca = np.histogram(pilot_a, edges)[0] + 0.5
    cb = np.histogram(pilot_b, edges)[0] + 0.5
    lr = np.log(ca / ca.sum()) - np.log(cb / cb.sum())
    best, best_bins = -np.inf, None
    order = np.argsort(-lr)
    for top in range(1, order.size + 1):
        bins = order[:top]
        a, b = ca[bins].sum() - 0.5 * top, cb[bins].sum() - 0.5 * top
        lo_a, _ = clopper_pearson(int(a), len(pilot_a), 0.01)
        _, hi_b = clopper_pearson(int(b), len(pilot_b), 0.01)
        if lo_a > 0 and np.log(lo_a / hi_b) > best:
            best, best_bins = np.log(lo_a / hi_b), bins
    return best_bins


PILOT, MAIN = 100_000, 300_000  # draws per dataset: to choose the event, then to bound on


def epsilon_lower_bound(sample_d, sample_d2, pilot_d, pilot_d2, bins: int = 60,
                        alpha: float = 1e-3, delta: float = 0.0, edges=None) -> float:
    """Lower bound on ε at ``delta`` from 1-d outputs on D and D' (both directions tried).

    (ε, δ)-DP gives P_D(S) ≤ e^ε·P_D'(S) + δ for every event S, so
    ε ≥ ln((P_D(S) − δ)/P_D'(S)); δ = 0 is the pure-ε bound. ``edges`` default to ``bins``
    quantiles of the pooled pilots.
    """
    if edges is None:
        pooled = np.concatenate([pilot_d, pilot_d2])
        edges = np.unique(np.quantile(pooled, np.linspace(0, 1, bins + 1)))
        edges[0], edges[-1] = -np.inf, np.inf
    bound = 0.0
    for a_pilot, b_pilot, a, b in ((pilot_d, pilot_d2, sample_d, sample_d2),
                                   (pilot_d2, pilot_d, sample_d2, sample_d)):
        event = _choose_event(a_pilot, b_pilot, edges)
        if event is None:
            continue
        in_a = np.isin(np.clip(np.searchsorted(edges, a, side="right") - 1, 0, edges.size - 2), event)
        in_b = np.isin(np.clip(np.searchsorted(edges, b, side="right") - 1, 0, edges.size - 2), event)
        lo_a, _ = clopper_pearson(int(in_a.sum()), a.size, alpha / 2)  # α/2: two directions
        _, hi_b = clopper_pearson(int(in_b.sum()), b.size, alpha / 2)
        if lo_a > delta:
            bound = max(bound, float(np.log((lo_a - delta) / hi_b)))
    return bound


def audit_sample(sample, seed: int = 0, delta: float = 0.0, discrete: bool = False) -> float:
    """ε lower bound at ``delta`` from ``sample(data_index, reps, seed) -> 1-d outputs``:
    PILOT draws on D (index 0) and D' (index 1) choose the event, MAIN fresh draws bound it.
    ``discrete``: outputs take few distinct values, one histogram bin per value."""
    pilot = [sample(i, PILOT, seed + 10 + i) for i in (0, 1)]
    main = [sample(i, MAIN, seed + 20 + i) for i in (0, 1)]
    edges = None
    if discrete:
        values = np.unique(np.concatenate(pilot + main))
        edges = np.r_[-np.inf, (values[:-1] + values[1:]) / 2, np.inf]
    return epsilon_lower_bound(main[0], main[1], pilot[0], pilot[1], delta=delta, edges=edges)


def budget_scaled_noise(noise, factor: float):
    """The calibrated noise with its budget multiplied by ``factor``: the grid Laplace's scale
    (ε ∝ 1/t) or the grid Gaussian's variance (ρ ∝ 1/σ²) divided by it."""
    name = "scale_num" if hasattr(noise, "scale_num") else "sigma2"
    return dataclasses.replace(noise, **{name: max(1, round(getattr(noise, name) / factor))})


@contextlib.contextmanager
def budget_scaled(module, sampler: str, factor: float):
    """Broken variant for audits: ``module.<sampler>(rand, values, sensitivity, noise)`` runs
    with its noise's budget multiplied by ``factor`` (e.g. 2 × ε for Laplace, 4 × ρ for
    Gaussian: half the noise), so an audit can show it catches a mechanism weaker than
    claimed."""
    original = getattr(module, sampler)

    def broken(rand, values, sens, noise):
        return original(rand, values, sens, budget_scaled_noise(noise, factor))

    setattr(module, sampler, broken)
    try:
        yield
    finally:
        setattr(module, sampler, original)
