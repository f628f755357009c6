"""The estimator registry and its two uniform calls: one tract, or many tracts at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .batch import TractBatch
from .privacy_filter import NO_METER, NoMeter, StepMeter
from .noise import Randomness, default_randomness
from .privacy import PROJECT_RELATION, Guarantee, relation_of
from .privacy_maps import NoiseStep, compose

MIN_RECORDS = 2  # a regression needs two records; smaller tracts fail (n is public)


@dataclass(frozen=True)
class Outcome:
    """What an estimator's batched run returns, arrays shaped (reps, tracts)."""

    p25: np.ndarray
    p75: np.ndarray
    failed: np.ndarray
    reason: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)


class NotPublishable(ValueError):
    """An estimator that is for evaluation only was asked for on the release path."""


@dataclass(frozen=True)
class RunBudget:
    """What ``_run`` draws with: the budget and the calibrated noise steps of that budget.

    ``_run`` takes every noise parameter from ``steps`` (never from ``epsilon`` directly), so
    the guarantee, the composition of the steps' privacy maps, is that of the noise drawn.
    """

    epsilon: float
    delta: float | None
    steps: tuple[NoiseStep, ...]

    def step(self, name: str) -> NoiseStep:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"no noise step {name!r}; steps: {[s.name for s in self.steps]}")


Meter = StepMeter | NoMeter


class Estimator:
    """Base class. Subclasses set the class attributes and implement ``_run`` and, if they
    draw noise, ``_noise_steps`` (the calibration); ``guarantee`` is derived from it."""

    name: str = ""
    private: bool = True
    needs_delta: bool = False
    defaults: Mapping[str, Any] = {}
    summary: str = ""
    sampler: str = ""
    # May a release publish it? Not-DP baselines and float-noise mechanisms may not.
    publishable: bool = True
    not_publishable_reason: str = ""

    def hyper(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(overrides) - set(self.defaults)
        if unknown:
            allowed = ", ".join(sorted(self.defaults)) or "none"
            raise ValueError(f"{self.name}: unknown hyperparameter(s) {sorted(unknown)}; "
                             f"allowed: {allowed}")
        return {**self.defaults, **overrides}

    # -- calibration and its privacy map ----------------------------------------------------

    def noise_steps(self, epsilon: float, delta: float | None = None,
                    **hp: Any) -> list[NoiseStep]:
        """The noise a run with budget ``epsilon`` (and ``delta``) draws per tract."""
        _check_budget(self, epsilon, delta)
        return self._noise_steps(float(epsilon), delta, self.hyper(hp))

    def _noise_steps(self, epsilon: float, delta: float | None,
                     hp: dict[str, Any]) -> list[NoiseStep]:
        return []  # no noise (non-private baselines)

    def guarantee(self, epsilon: float, delta: float | None = None, **hp: Any) -> Guarantee:
        """Per tract: the sequential composition of the privacy maps of ``noise_steps``,
        stated for the project's relation (replace-one: what the ledger charges)."""
        hp = self.hyper(hp)
        _check_budget(self, epsilon, delta)
        return self._project_guarantee(self._noise_steps(float(epsilon), delta, hp), delta, hp)

    def _compose(self, steps: list[NoiseStep], delta: float | None,
                 hp: dict[str, Any]) -> Guarantee:
        """The steps composed. An estimator whose steps are stated for another relation
        converts here, by name (``compose(steps, relation=PROJECT_RELATION)``)."""
        return compose(steps)

    def _project_guarantee(self, steps: list[NoiseStep], delta: float | None,
                           hp: dict[str, Any]) -> Guarantee:
        g = self._compose(steps, delta, hp)
        if relation_of(g) not in (None, PROJECT_RELATION):
            # A guarantee for another relation would be charged as if it were replace-one.
            raise ValueError(f"{self.name}: its guarantee {g.describe()} is stated for "
                             f"{relation_of(g).value}, the ledger charges "
                             f"{PROJECT_RELATION.value}: convert it in _compose with "
                             "privacy.convert_relation (a bug in the estimator)")
        return g

    # -- running ----------------------------------------------------------------------------

    def _run(self, batch: TractBatch, budget: RunBudget, rand: Randomness, reps: int,
             hp: dict[str, Any], meter: Meter) -> Outcome:
        """Draw exactly ``budget.steps``; call ``meter.spend(labels, g, reps)`` before each draw."""
        raise NotImplementedError

    def peak_bytes(self, n: np.ndarray, **hp: Any) -> np.ndarray:
        """Peak memory (bytes) one ``_run`` needs for a tract of ``n`` records, per tract
        (reps = 1). Subclasses state the measured constants."""
        raise NotImplementedError


REGISTRY: dict[str, Estimator] = {}


def register(cls: type[Estimator]) -> type[Estimator]:
    REGISTRY[cls.name] = cls()
    return cls


def get(name: str) -> Estimator:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown estimator {name!r}; known: {', '.join(REGISTRY)}") from None


@dataclass(frozen=True)
class BatchEstimate:
    """Results for many tracts. Arrays are (tracts,) or, with ``reps``, (reps, tracts).

    ``guarantee`` is what each tract's people get; tracts hold disjoint people, so it is also
    the guarantee of the whole batch (parallel composition).
    """

    estimator: str
    labels: np.ndarray
    n: np.ndarray
    p25: np.ndarray
    p75: np.ndarray
    failed: np.ndarray
    reason: np.ndarray
    guarantee: Guarantee
    extras: dict[str, np.ndarray]


@dataclass(frozen=True)
class TractEstimate:
    """Result for one tract. ``p25``/``p75`` are None when the mechanism failed."""

    estimator: str
    p25: float | None
    p75: float | None
    failed: bool
    reason: str
    guarantee: Guarantee
    extras: dict[str, float]


def _check_budget(est: Estimator, epsilon: float, delta: float | None) -> None:
    if isinstance(epsilon, bool) or not (isinstance(epsilon, (int, float, np.floating))
                                         and np.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if delta is not None and not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")


def estimate_batch(name: str, batch: TractBatch, epsilon: float, delta: float | None = None, *,
                   rand: Randomness | None = None, seed: int | None = None,
                   reps: int | None = None, meter: Meter | None = None,
                   publishable_only: bool = False, **hyper: Any) -> BatchEstimate:
    """Run estimator ``name`` on every tract of ``batch`` with per-tract budget ``epsilon``.

    Noise comes from ``rand``, else from a seeded source if ``seed`` is given (tests,
    evaluation), else from the operating system's CSPRNG. ``reps`` repeats the noisy part
    (for evaluation) and adds a leading axis to every array. ``meter`` (release path) is
    spent from before every draw (``mechanisms/privacy_filter.py``); ``publishable_only`` refuses an
    estimator that is for evaluation only.
    """
    est = get(name)
    if publishable_only and not est.publishable:
        raise NotPublishable(f"{name} cannot be published: {est.not_publishable_reason}; "
                             "remove it from profile.suite")
    _check_budget(est, epsilon, delta)
    hp = est.hyper(hyper)
    rand = rand if rand is not None else default_randomness(seed)
    r = 1 if reps is None else int(reps)
    if r < 1:
        raise ValueError("reps must be >= 1")
    # Calibrate first (it refuses an infeasible budget before any draw), then draw with it.
    steps = est._noise_steps(float(epsilon), delta, hp)
    # A non-private baseline draws no noise: its guarantee is its own NotDP, not an empty
    # composition (which would read as 0-DP).
    g = (est._project_guarantee(steps, delta, hp) if est.private
         else est.guarantee(float(epsilon), delta, **hp))
    out = est._run(batch, RunBudget(float(epsilon), delta, tuple(steps)), rand, r, hp,
                   meter if meter is not None else NO_METER)
    small = batch.n < MIN_RECORDS
    failed = out.failed | small[None, :]
    reason = np.where(small[None, :], f"fewer than {MIN_RECORDS} records", out.reason)
    p25 = np.where(failed, np.nan, out.p25)
    p75 = np.where(failed, np.nan, out.p75)
    squeeze = (lambda a: a[0]) if reps is None else (lambda a: a)
    return BatchEstimate(est.name, batch.labels, batch.n, squeeze(p25), squeeze(p75),
                         squeeze(failed), squeeze(reason), g,
                         {k: squeeze(v) for k, v in out.extras.items()})


def estimate(name: str, x, y, epsilon: float, delta: float | None = None, *,
             rand: Randomness | None = None, seed: int | None = None,
             **hyper: Any) -> TractEstimate:
    """Run estimator ``name`` on one tract's records ``x``, ``y`` (ranks on [0, 1])."""
    res = estimate_batch(name, TractBatch.single(x, y), epsilon, delta, rand=rand, seed=seed,
                         **hyper)
    failed = bool(res.failed[0])
    return TractEstimate(
        res.estimator,
        None if failed else float(res.p25[0]),
        None if failed else float(res.p75[0]),
        failed, str(res.reason[0]), res.guarantee,
        {k: float(v[0]) for k, v in res.extras.items()})


def blank(reps: int, n_tracts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fresh (p25, p75, failed, reason) arrays: NaN, NaN, False, ''."""
    shape = (reps, n_tracts)
    return (np.full(shape, np.nan), np.full(shape, np.nan), np.zeros(shape, dtype=bool),
            np.full(shape, "", dtype=object))
