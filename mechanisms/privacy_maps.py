"""Privacy maps: each guarantee is *computed* from the noise parameters a mechanism draws with.

OpenDP's model of a measurement is a function plus a privacy map, from the input distance to
the output privacy loss (Gaboardi, Hay & Vadhan 2020, "A Programming Framework for OpenDP").
Here the input distance is one record under a neighbouring relation that each
:class:`NoiseStep` names (``relation``: replace-one, the project's, unless the step says
add-remove): the step's sensitivity is computed for that relation, so a map takes the
calibrated noise parameters to a typed guarantee stated for it. An
estimator lists, as :class:`NoiseStep` values, the noise it will draw for a budget; its
guarantee is the sequential composition of the maps of those steps, and it draws with exactly
those parameters (the samplers in ``mechanisms/noise.py`` take the calibrated object and read
its numbers). Each step carries its :class:`~mechanisms.sensitivity.Sensitivity`: the number a
draw scales the noise to, with its formula and derivation. Nothing is declared beside the
mechanism.

The four maps, in the numbers a manifest lists (an auditor recomputes them without the code):

- ``grid-laplace`` {grid_steps, dims, scale_num, scale_den}: the query, in units of
  1/grid_steps of its L1 sensitivity, is rounded to integers (L1 sensitivity grid_steps + dims)
  and discrete Laplace noise of scale t = scale_num/scale_den is added. Discrete Laplace with
  scale t on an integer query of L1 sensitivity k is (k/t)-DP (Canonne, Kamath & Steinke 2020,
  Sec. 2.2), so ε = (grid_steps + dims)·scale_den/scale_num.
- ``grid-gaussian`` {grid_steps, dims, sigma2}: the same rounding (L2 sensitivity
  grid_steps + √dims) and discrete Gaussian noise of variance parameter sigma2: ρ-zCDP with
  ρ = (grid_steps + √dims)²/(2·sigma2) (Canonne, Kamath & Steinke 2020, Thm 4).
- ``exponential-median`` {rate, rate_den}: the exponential mechanism (McSherry & Talwar 2007)
  sampling r with probability ∝ exp(rate/rate_den · u(r)/(2Δu)), Δu the utility sensitivity:
  ε = rate/rate_den (the sampler in ``mechanisms/median.py`` uses the integer rate exactly).
- ``students-t-smooth-sensitivity`` {d, beta, s}: median + S_β/s·T_d with S_β a β-smooth upper
  bound on the local sensitivity and T_d Student's t with d degrees of freedom:
  ε = (d + 1)(β + s/(2√d)) (Bun & Steinke 2019, "Average-Case Averages", Thm 31; the paper's
  Appendix E).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Any, ClassVar, Iterable, Mapping, Union

import numpy as np

from . import median
from .noise import _SCALE_DENOMINATOR, LAPLACE_GRID_STEPS, _gauss_grid, laplace_scale_num
from .privacy import (PROJECT_RELATION, ZCDP, Guarantee, PureDP, Relation, as_dict,
                      convert_relation, sequential, with_relation)
from .sensitivity import Sensitivity

# The exact geometric sampler behind discrete_laplace takes scale numerators up to 2**44
# (mechanisms/noise.py: products of the scale and small counters stay inside 64 bits). A
# calibration beyond it is refused here, before anything is charged or spent.
MAX_SCALE_NUM = 2**44


def _positive_finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


# ---------------------------------------------------------------------------------------------
# Calibrated noise, one class per primitive


def _laplace_scale_num(epsilon: float, dims: int) -> int:
    """The scale numerator ``laplace_mechanism`` computes: ceil((N + d)/ε · 256), by its own
    function (``noise.laplace_scale_num``)."""
    return int(laplace_scale_num(epsilon, dims))


@dataclass(frozen=True)
class GridLaplace:
    """Discrete Laplace of scale scale_num/scale_den grid units on a 1/grid_steps grid.

    :func:`mechanisms.noise.laplace_mechanism` draws with exactly these numbers (it takes this
    object), on ``dims`` coordinates.
    """

    grid_steps: int
    dims: int
    scale_num: int
    scale_den: int

    kind: ClassVar[str] = "grid-laplace"
    formula: ClassVar[str] = "epsilon = (grid_steps + dims) * scale_den / scale_num"

    def __post_init__(self) -> None:
        for f in ("grid_steps", "dims", "scale_num", "scale_den"):
            _positive_int(f"grid-laplace {f}", getattr(self, f))

    @staticmethod
    def calibrate(epsilon: float, dims: int = 1) -> "GridLaplace":
        """The grid Laplace on ``dims`` coordinates whose map is at most ``epsilon``: scale
        numerator ceil((N + dims)/ε · 256) over 256 (``noise.laplace_scale_num``)."""
        eps = _positive_finite("epsilon", epsilon)
        dims = _positive_int("dims", dims)
        num = _laplace_scale_num(eps, dims)
        if num > MAX_SCALE_NUM:
            raise ValueError(f"epsilon = {eps:.3g} is too small for the grid Laplace (scale "
                             "numerator over 2**44); use a larger budget")
        return GridLaplace(LAPLACE_GRID_STEPS, dims, num, _SCALE_DENOMINATOR)

    def parameters(self) -> dict:
        return {"grid_steps": self.grid_steps, "dims": self.dims, "scale_num": self.scale_num,
                "scale_den": self.scale_den}

    def guarantee(self) -> PureDP:
        return PureDP((self.grid_steps + self.dims) * self.scale_den / self.scale_num)


@dataclass(frozen=True)
class GridGaussian:
    """Discrete Gaussian of variance parameter sigma2 grid units on a 1/grid_steps grid.

    :func:`mechanisms.noise.gaussian_mechanism` draws with exactly these numbers (it takes this
    object), on ``dims`` coordinates.
    """

    grid_steps: int
    dims: int
    sigma2: int

    kind: ClassVar[str] = "grid-gaussian"
    formula: ClassVar[str] = "rho = (grid_steps + sqrt(dims))**2 / (2 * sigma2)"

    def __post_init__(self) -> None:
        for f in ("grid_steps", "dims", "sigma2"):
            _positive_int(f"grid-gaussian {f}", getattr(self, f))

    @staticmethod
    def calibrate(rho: float, dims: int = 1) -> "GridGaussian":
        """The grid Gaussian on ``dims`` coordinates whose map is at most ``rho``
        (``noise._gauss_grid``: about 4096 grid units per standard deviation)."""
        rho = _positive_finite("rho", rho)
        dims = _positive_int("dims", dims)
        steps, sigma2 = _gauss_params(rho, dims)
        return GridGaussian(steps, dims, sigma2)

    def parameters(self) -> dict:
        return {"grid_steps": self.grid_steps, "dims": self.dims, "sigma2": self.sigma2}

    def guarantee(self) -> ZCDP:
        return ZCDP((self.grid_steps + math.sqrt(self.dims)) ** 2 / (2.0 * self.sigma2))


def _gauss_params(rho: float, dims: int) -> tuple[int, int]:
    """(grid steps, σ²) for ``rho`` on ``dims`` coordinates (``noise._gauss_grid``)."""
    steps, sigma2 = _gauss_grid(np.asarray(rho, dtype=np.float64), dims)
    return int(steps), int(sigma2)


@dataclass(frozen=True)
class ExpMedian:
    """The exponential-mechanism median at the integer rate ``rate``/``rate_den`` (= ε_med)."""

    rate: int
    rate_den: int

    kind: ClassVar[str] = "exponential-median"
    formula: ClassVar[str] = "epsilon = rate / rate_den"

    def __post_init__(self) -> None:
        _positive_int("exponential-median rate", self.rate)
        _positive_int("exponential-median rate_den", self.rate_den)

    @staticmethod
    def calibrate(epsilon_med: float) -> "ExpMedian":
        """The rate ``exp_median(..., epsilon_med)`` samples with: floor(ε_med · 2^20)."""
        eps = _positive_finite("epsilon", epsilon_med)
        rate = int(median.exp_median_rate(eps))
        if rate < 1:
            raise ValueError(f"epsilon = {eps:.3g} per median is below the exponential "
                             f"mechanism's rate quantum 1/{median.EXP_RATE_DENOMINATOR}; use a "
                             "larger budget")
        return ExpMedian(rate, int(median.EXP_RATE_DENOMINATOR))

    def parameters(self) -> dict:
        return {"rate": self.rate, "rate_den": self.rate_den}

    def guarantee(self) -> PureDP:
        return PureDP(self.rate / self.rate_den)

    @property
    def argument(self) -> float:
        """The ε_med handed to ``exp_median``: exactly rate/2^20, which maps back to ``rate``."""
        if self.rate_den != median.EXP_RATE_DENOMINATOR:
            raise ValueError(f"the sampler's rate denominator is {median.EXP_RATE_DENOMINATOR}, "
                             f"not {self.rate_den}")
        eps = float(median.exp_median_epsilon(self.rate))
        if median.exp_median_rate(eps) != self.rate:
            raise ValueError(f"exp_median would not sample at rate {self.rate}")
        return eps


@dataclass(frozen=True)
class StudentTSmooth:
    """Student's t (d degrees of freedom) scaled by S_β/s, S_β a β-smooth sensitivity bound."""

    d: float
    beta: float
    s: float

    kind: ClassVar[str] = "students-t-smooth-sensitivity"
    formula: ClassVar[str] = "epsilon = (d + 1) * (beta + s / (2 * sqrt(d)))"

    def __post_init__(self) -> None:
        for f in ("d", "beta", "s"):
            _positive_finite(f"students-t {f}", getattr(self, f))

    @staticmethod
    def calibrate(epsilon_med: float, d: float, beta_share: float) -> "StudentTSmooth":
        """(β, s) spending ``epsilon_med``: a share ``p`` on β = p·ε/(d+1), the rest on
        s = 2(1−p)·ε·√d/(d+1); s is then lowered by ulps until the map is ≤ ε (float)."""
        eps = _positive_finite("epsilon", epsilon_med)
        d = _positive_finite("DPSSTheilSen d", d)
        if isinstance(beta_share, bool) or not 0 < float(beta_share) < 1:
            raise ValueError(f"DPSSTheilSen beta_share must lie in (0, 1), got {beta_share!r}")
        p = float(beta_share)
        beta = p * eps / (d + 1)
        s = 2.0 * (1.0 - p) * eps * math.sqrt(d) / (d + 1)
        cal = StudentTSmooth(d, beta, s)
        while cal.guarantee().epsilon > eps:
            cal = StudentTSmooth(d, beta, math.nextafter(cal.s, 0.0))
        return cal

    def parameters(self) -> dict:
        return {"d": self.d, "beta": self.beta, "s": self.s}

    def guarantee(self) -> PureDP:
        return PureDP((self.d + 1) * (self.beta + self.s / (2.0 * math.sqrt(self.d))))


# ---------------------------------------------------------------------------------------------
# PrivTree's privacy map (BinAgg's split decisions; the audit, dpatlas/audit/noise.py,
# recomputes this kind with its own code)

BRANCHING = 2  # PrivTree's fan-out: each split halves a bin


def _log_survival(m: int, t: float) -> float:
    """ln P(K > m) for K discrete Laplace, P(K = k) ∝ exp(−|k|/t)."""
    log_p = -1.0 / t
    log1p_p = math.log1p(math.exp(log_p))
    if m >= 0:
        return (m + 1) * log_p - log1p_p
    return math.log1p(-math.exp(-m * log_p - log1p_p))  # 1 − p^|m|/(1 + p)


# The band sum is evaluated until its remaining tail is provably below this share of the sum
# (the tail bound is then added, so the result is an upper bound whatever the cut-off), or for
# at most _MAX_BANDS bands (reached only for a bias far below t·ln 2: the bound stays valid).
_TAIL_SHARE = 1e-16
_MAX_BANDS = 200_000


def privtree_add_remove_epsilon(grid_steps: int, t: float, bias: int) -> float:
    """PrivTree's add/remove ε for discrete Laplace scale ``t`` units, ``grid_steps`` units per
    record and ``bias`` units per level (docs/binagg.md, Lemma 3): an upper bound on
    A = Σ_{j≥0} ρ(x_j), ρ(x) = ln S(θ − x) − ln S(θ − x + N), x_j the lowest lattice point of
    the j-th band (θ − δ + jδ, θ + jδ], so θ − x_j = m_j = δ − 1 − jδ (θ cancels).

    Once m_j + N < 0 the terms fall at least geometrically with ratio r = e^{−δ/t} (Lemma 4),
    so the tail after term j is at most term_j·r/(1 − r); that bound is added where the loop
    stops, which makes the result an upper bound for any ``bias`` ≥ 1 (not only δ ≥ t·ln 2).
    """
    if bias < 1 or grid_steps < 1 or not (math.isfinite(t) and t > 0):
        raise ValueError("PrivTree needs grid_steps >= 1, bias >= 1 grid unit and a scale > 0")
    ratio = math.exp(-bias / t)
    tail_factor = ratio / -math.expm1(-bias / t)  # r/(1 − r)
    total = 0.0
    for j in range(_MAX_BANDS):
        m = bias - 1 - j * bias
        term = _log_survival(m, t) - _log_survival(m + grid_steps, t)
        total += term
        if m + grid_steps < 0 and term * tail_factor <= _TAIL_SHARE * total:
            break
    return total + term * tail_factor


def privtree_replace_one_epsilon(grid_steps: int, t: float, bias: int) -> float:
    """PrivTree's ε under replace-one (docs/binagg.md, Theorem 1): N/t + A.

    Replacing record r by r' raises the counts on r'\'s path below the common ancestor (at
    most A, the add/remove band sum) and lowers them on r's (split decisions only become less
    likely; the one leaf of that path costs at most ln max_m F(m + N)/F(m) = N/t for the
    discrete Laplace CDF F). Tighter than 2·A, the group-privacy bound.
    """
    return grid_steps / t + privtree_add_remove_epsilon(grid_steps, t, bias)


@dataclass(frozen=True)
class PrivTreeLaplace:
    """PrivTree's split decisions with discrete Laplace noise on biased counts in grid units.

    ``laplace_mechanism`` draws with these numbers (sensitivity 1 record, so the grid unit is
    1/grid_steps record and the scale is scale_num/scale_den units), one coordinate per node.
    """

    grid_steps: int
    scale_num: int
    scale_den: int
    bias: int
    branching: int

    dims: ClassVar[int] = 1  # one noisy count per node
    kind: ClassVar[str] = "privtree-grid-laplace"
    formula: ClassVar[str] = (
        "epsilon = grid_steps/t + sum_{j>=0} [lnS(m_j) - lnS(m_j + grid_steps)], "
        "m_j = bias - 1 - j*bias, t = scale_num/scale_den, S(m) = P(K > m) for K discrete "
        "Laplace of scale t: S(m) = p^(m+1)/(1+p) if m >= 0 else 1 - p^(-m)/(1+p), "
        "p = exp(-1/t); the tail after a term j with m_j + grid_steps < 0 is at most "
        "term_j * r/(1-r), r = exp(-bias/t) (replace-one: the band sum for the path that "
        "gains the record, grid_steps/t for the one leaf of the path that loses it; "
        "docs/binagg.md, after Zhang, Xiao & Xie 2016 Thm 3.1)")

    def __post_init__(self) -> None:
        for f in ("grid_steps", "scale_num", "scale_den", "bias", "branching"):
            _positive_int(f"privtree {f}", getattr(self, f))

    @property
    def scale(self) -> float:
        """λ·N: the Laplace scale in grid units."""
        return self.scale_num / self.scale_den

    @staticmethod
    def at(argument: float) -> "PrivTreeLaplace":
        """The grid Laplace a plain ``GridLaplace.calibrate(argument)`` would draw (scale t
        units), with the bias δ = ⌈t·ln 2⌉ units: the calibration's search variable."""
        num = _laplace_scale_num(argument, 1)
        if num > MAX_SCALE_NUM:
            raise ValueError("BinAgg: the PrivTree budget share is too small for the grid "
                             "Laplace (scale numerator over 2**44); use a larger epsilon or "
                             "w_bin")
        t = num / _SCALE_DENOMINATOR
        return PrivTreeLaplace(LAPLACE_GRID_STEPS, num, _SCALE_DENOMINATOR,
                               math.ceil(t * math.log(BRANCHING)), BRANCHING)

    @staticmethod
    def calibrate(epsilon_bin: float) -> "PrivTreeLaplace":
        """The least noise whose derived map is ≤ ``epsilon_bin`` (replace-one)."""
        return _calibrate_privtree(float(epsilon_bin))

    def parameters(self) -> dict:
        return {"grid_steps": self.grid_steps, "scale_num": self.scale_num,
                "scale_den": self.scale_den, "bias": self.bias, "branching": self.branching}

    def guarantee(self) -> PureDP:
        """Replace-one ε of the split decisions (docs/binagg.md, Theorem 1)."""
        return PureDP(privtree_replace_one_epsilon(self.grid_steps, self.scale, self.bias))

    def corollary_epsilon(self) -> float:
        """The paper's App. C corollary for the same λ (continuous Laplace), replace-one."""
        k = self.branching
        return 2.0 * (2 * k - 1) / (k - 1) * self.grid_steps / self.scale


@lru_cache(maxsize=256)
def _calibrate_privtree(epsilon_bin: float) -> PrivTreeLaplace:
    if not (math.isfinite(epsilon_bin) and epsilon_bin > 0):
        raise ValueError(f"BinAgg: the PrivTree budget must be > 0, got {epsilon_bin!r}")

    def fits(arg: float) -> bool:
        return PrivTreeLaplace.at(arg).guarantee().epsilon <= epsilon_bin

    # Start near λ = 4/ε_bin records (the replace-one map is about 4N/t for δ = t·ln 2); the
    # argument that gives scale t units is about (N + 1)/t. Bisect on the argument (noise
    # falls as it rises); only arguments whose map fits are ever kept.
    start = (LAPLACE_GRID_STEPS + 1) / (4.0 / epsilon_bin * LAPLACE_GRID_STEPS)
    lo, hi = start / 4.0, start * 4.0
    while not fits(lo):
        lo /= 2.0
    while fits(hi):
        lo, hi = hi, hi * 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return PrivTreeLaplace.at(lo)


Noise = Union[GridLaplace, GridGaussian, ExpMedian, StudentTSmooth, PrivTreeLaplace]
# Every privacy map, declared here (no module registers one as a side effect of its import).
MAPS: dict[str, type] = {c.kind: c for c in (GridLaplace, GridGaussian, ExpMedian, StudentTSmooth,
                                             PrivTreeLaplace)}


def privacy_map(mechanism: str, parameters: Mapping[str, Any],
                relation: Relation | str = PROJECT_RELATION) -> Guarantee:
    """The guarantee of one draw from its published description (what an auditor computes),
    stated for the relation its sensitivity was computed for."""
    try:
        cls = MAPS[mechanism]
    except KeyError:
        raise ValueError(f"unknown mechanism {mechanism!r}; known: {', '.join(MAPS)}") from None
    want = {f.name for f in fields(cls)}
    if set(parameters) != want:
        raise ValueError(f"{mechanism} needs parameters {sorted(want)}, got {sorted(parameters)}")
    return with_relation(cls(**parameters).guarantee(), Relation.parse(relation))


# ---------------------------------------------------------------------------------------------
# Steps


@dataclass(frozen=True)
class NoiseStep:
    """One noisy release of an estimator: what is drawn, on what sensitivity, how many times.

    ``guarantee`` is the map of ONE draw (per tract: tracts hold disjoint people), stated for
    ``relation``, the neighbouring relation ``sensitivity`` was derived for; the step costs
    ``repeat`` draws in sequence (e.g. T gradient steps). A draw reads its sensitivity's
    number from ``sensitivity.value(...)``.
    """

    name: str
    noise: Noise
    sensitivity: Sensitivity
    repeat: int = 1

    def __post_init__(self) -> None:
        _positive_int(f"noise step {self.name!r} repeat", self.repeat)
        if not isinstance(self.sensitivity, Sensitivity):
            raise ValueError(f"noise step {self.name!r}: sensitivity must be a Sensitivity "
                             f"(a number with its derivation), got {self.sensitivity!r}")

    @property
    def relation(self) -> Relation:
        """The neighbouring relation the step's sensitivity was derived for."""
        return self.sensitivity.relation

    @property
    def mechanism(self) -> str:
        return self.noise.kind

    @property
    def parameters(self) -> dict:
        return self.noise.parameters()

    @property
    def guarantee(self) -> Guarantee:
        # The map's numbers hold for the relation the sensitivity was computed for.
        return with_relation(self.noise.guarantee(), self.relation)

    def total(self) -> Guarantee:
        """All ``repeat`` draws composed."""
        return sequential([self.guarantee] * self.repeat)

    def as_dict(self) -> dict:
        return {"name": self.name, "mechanism": self.mechanism,
                "sensitivity": self.sensitivity.statement,
                "sensitivity_derivation": self.sensitivity.derivation,
                "relation": self.relation.value, "parameters": self.parameters,
                "repeat": self.repeat, "guarantee": as_dict(self.guarantee),
                "formula": self.noise.formula}


def compose(steps: Iterable[NoiseStep], relation: Relation | None = None) -> Guarantee:
    """Sequential composition of the steps, each repeated ``repeat`` times (same people).

    Without ``relation`` the steps must share one relation (``privacy.MixedRelations``
    otherwise) and the result is stated for it. With ``relation``, each draw's guarantee is
    first converted to it by ``privacy.convert_relation`` (group privacy of size 2 from
    add-remove to replace-one; the reverse is refused), then composed: the conversion is
    named at the call, never implied.
    """
    parts: list[Guarantee] = []
    for step in steps:
        g = step.guarantee if relation is None else convert_relation(step.guarantee, relation)
        parts.extend([g] * step.repeat)
    return sequential(parts)


def from_dict(d: Mapping[str, Any]) -> NoiseStep:
    """A step rebuilt from its ``as_dict()`` form; its guarantee is recomputed, not read.
    A step without ``relation`` (written before relations were typed) is replace-one; its
    sensitivity is the published text (and derivation, where the manifest has one): it states,
    it gives no number."""
    cls = MAPS.get(d["mechanism"])
    if cls is None:
        raise ValueError(f"unknown mechanism {d['mechanism']!r}")
    privacy_map(d["mechanism"], d["parameters"])  # validates the parameter names
    relation = Relation.parse(d.get("relation", PROJECT_RELATION.value))
    sensitivity = Sensitivity.published(d["sensitivity"], d.get("sensitivity_derivation", ""),
                                        relation)
    return NoiseStep(d["name"], cls(**d["parameters"]), sensitivity, int(d["repeat"]))
