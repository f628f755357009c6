"""The noise check (c): each noise step's guarantee recomputed from its parameters (grid
Laplace and Gaussian, exponential median, smooth-sensitivity t, PrivTree), and the relations
check (r): every step charged for replace-one neighbours, conversions listed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

from .accounting import (
    CHARGED_RELATION, G, REPLACE_ONE, as_approx, guarantee_from, relation_of, restate,
    same_guarantee, sequential, zcdp_rho,
)
from .base import Mismatch, REL_TOL, close


def _number(params: dict, key: str, positive: bool = True) -> float:
    v = params.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or v < 0 or (positive and v == 0):
        raise Mismatch(f"parameter {key} must be a {'positive' if positive else 'non-negative'} "
                       f"number, got {v!r}")
    return float(v)


def _grid_laplace(p: dict) -> G:
    return G("pure", (_number(p, "grid_steps") + _number(p, "dims")) * _number(p, "scale_den")
             / _number(p, "scale_num"))


def _grid_gaussian(p: dict) -> G:
    k = _number(p, "grid_steps") + math.sqrt(_number(p, "dims"))
    return G("zcdp", rho=k * k / (2.0 * _number(p, "sigma2")))


def _exponential_median(p: dict) -> G:
    return G("pure", _number(p, "rate") / _number(p, "rate_den"))


def _students_t(p: dict) -> G:
    d = _number(p, "d")
    return G("pure", (d + 1.0) * (_number(p, "beta") + _number(p, "s") / (2.0 * math.sqrt(d))))


def _whole(params: dict, key: str) -> int:
    v = params.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise Mismatch(f"parameter {key} must be an integer >= 1, got {v!r}")
    return v


def _discrete_laplace_log_survival(m: int, t: float) -> float:
    """ln P(K > m), P(K = k) = (1 − p)/(1 + p)·p^|k|, p = e^{−1/t}: for m ≥ 0 the tail
    Σ_{k>m} is p^{m+1}/(1 + p); for m < 0 it is 1 − P(K ≥ |m|) = 1 − p^{|m|}/(1 + p)."""
    if m >= 0:
        return -(m + 1) / t - math.log1p(math.exp(-1.0 / t))
    return math.log1p(-math.exp(m / t) / (1.0 + math.exp(-1.0 / t)))


def privtree_replace_one_epsilon(grid_steps: int, t: float, bias: int) -> float:
    """PrivTree's replace-one ε (see the module docstring), an upper bound by construction.

    Where m_j + grid_steps < 0 the band terms fall at least geometrically, ratio
    r = e^{−bias/t}, so everything after the last term summed is at most last·r/(1 − r);
    that bound is added where the sum stops."""
    r = math.exp(-bias / t)
    tail = r / (1.0 - r) if r < 1.0 else math.inf
    total, last = 0.0, 0.0
    for j in range(200_000):
        m = bias - 1 - j * bias
        last = (_discrete_laplace_log_survival(m, t)
                - _discrete_laplace_log_survival(m + grid_steps, t))
        total += last
        if m + grid_steps < 0 and last * tail <= 1e-16 * total:
            break
    return grid_steps / t + total + last * tail


def _privtree_parameters(p: dict) -> tuple[int, int, int, int]:
    _whole(p, "branching")  # not in the map (the band argument holds for any branching)
    return (_whole(p, "grid_steps"), _whole(p, "scale_num"), _whole(p, "scale_den"),
            _whole(p, "bias"))


def _privtree(p: dict) -> G:
    n, num, den, bias = _privtree_parameters(p)
    return G("pure", privtree_replace_one_epsilon(n, num / den, bias))


NOISE_FORMULAS: dict[str, Callable[[dict], G]] = {
    "grid-laplace": _grid_laplace,
    "grid-gaussian": _grid_gaussian,
    "exponential-median": _exponential_median,
    "students-t-smooth-sensitivity": _students_t,
    "privtree-grid-laplace": _privtree,
}


def noise_guarantee(noise_step: dict) -> G:
    """The guarantee of one run of a noise step, recomputed from its parameters."""
    mech = noise_step.get("mechanism")
    if mech not in NOISE_FORMULAS:
        raise Mismatch(f"unknown noise mechanism {mech!r}")
    params = noise_step.get("parameters")
    if not isinstance(params, dict):
        raise Mismatch("no parameters")
    return NOISE_FORMULAS[mech](params)


def noise_guarantee_bound(noise_step: dict) -> G:
    """The largest budget the noise step's parameters could have been calibrated for.

    Each sampler rounds its last parameter one way, towards more noise: the Laplace scale
    numerator up (ceil), the Gaussian σ² up (ceil), the exponential rate down (floor), the
    t-noise s down by ulps. One unit back gives a budget that the parameters still fit, so a
    step's stated guarantee above the composition of these bounds is not explained by rounding.
    PrivTree's scale numerator is rounded up the same way and its bias is ⌈t·ln 2⌉ of that
    scale, so one unit less of the numerator may also lower the bias by one unit: the larger
    of the two maps.
    """
    p, mech = noise_step["parameters"], noise_step["mechanism"]
    exact = noise_guarantee(noise_step)
    if mech == "grid-laplace":
        num = _number(p, "scale_num")
        return G("pure", math.inf if num <= 1 else exact.epsilon * num / (num - 1))
    if mech == "grid-gaussian":
        sigma2 = _number(p, "sigma2")
        return G("zcdp", rho=math.inf if sigma2 <= 1 else exact.rho * sigma2 / (sigma2 - 1))
    if mech == "exponential-median":
        return G("pure", (_number(p, "rate") + 1) / _number(p, "rate_den"))
    if mech == "privtree-grid-laplace":
        n, num, den, bias = _privtree_parameters(p)
        if num <= 1:
            return G("pure", math.inf)
        return G("pure", max(privtree_replace_one_epsilon(n, (num - 1) / den, b)
                             for b in {bias, max(bias - 1, 1)}))
    return G("pure", exact.epsilon * (1 + 1e-12))


def _repeat(noise_step: dict) -> int:
    r = noise_step.get("repeat")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise Mismatch(f"repeat must be a positive integer, got {r!r}")
    return r


def _compare_value(g: G, stated: G) -> tuple[float, str] | str:
    """``g``'s figure in the terms of ``stated`` (its ε, ρ or μ), or why it has none."""
    if stated.kind == "approx":
        if g.kind == "approx":
            if g.delta > stated.delta * (1 + REL_TOL):
                return f"delta {g.delta:.6g} > stated {stated.delta:.6g}"
            return g.epsilon, "epsilon"
        return as_approx(g, stated.delta)[0], f"epsilon at delta={stated.delta:.3g}"
    if stated.kind == "pure":
        return (g.epsilon, "epsilon") if g.kind == "pure" else f"{g.text()} is not pure DP"
    if stated.kind == "zcdp":
        return (zcdp_rho(g), "rho") if g.kind != "approx" else f"{g.text()} implies no zCDP"
    return (g.mu, "mu") if g.kind == "gdp" else f"{g.text()} is not GDP"


def _equals(composed: G, stated: G) -> bool:
    got = _compare_value(composed, stated)
    if isinstance(got, str):
        return False
    value, what = got
    return close(value, getattr(stated, "epsilon" if what.startswith("epsilon") else what))


def covers(composed: G, bound: G, stated: G) -> tuple[bool, str]:
    """Whether noise composing to ``composed`` is the step's ``stated`` guarantee: at least as
    private (within float tolerance), and not more private than the rounding explains
    (``bound``: the same noise composed from :func:`noise_guarantee_bound`)."""
    got = _compare_value(composed, stated)
    finite = all(math.isfinite(getattr(bound, f)) for f in ("epsilon", "delta", "rho", "mu"))
    top = _compare_value(bound, stated) if finite else (math.inf, "")
    for v in (got, top):
        if isinstance(v, str):
            return False, v
    (value, what), (upper, _) = got, top
    claim = getattr(stated, "epsilon" if what.startswith("epsilon") else what)
    if value > claim * (1 + REL_TOL):
        return False, f"noise gives {what} {value:.12g} > stated {claim:.12g}"
    if upper < claim * (1 - REL_TOL):
        return False, (f"noise gives {what} {value:.12g} (at most {upper:.12g} before its "
                       f"parameters were rounded), below the stated {claim:.12g}: the step "
                       "does not describe its noise")
    return True, f"{what} {value:.12g} <= {claim:.12g}"


def check_noise(folder: Path, m: dict) -> str:
    steps = m["budget"]["steps"]
    if not steps:
        raise Mismatch("the budget has no steps")
    problems, n_noise, n_converted = [], 0, 0
    for step in steps:
        name = step.get("step", "?")
        try:
            stated = guarantee_from(step.get("guarantee"))
            step_relation = relation_of(step, "the step")
            alternatives = (step.get("noise") or {}).get("alternatives")
            if not isinstance(alternatives, dict) or not alternatives:
                raise Mismatch("no noise description (noise.alternatives)")
            reached = False
            for label, noise_steps in alternatives.items():
                if not isinstance(noise_steps, list) or not noise_steps:
                    raise Mismatch(f"alternative {label!r} has no noise steps")
                parts, bounds = [], []
                for ns in noise_steps:
                    where = f"alternative {label!r}, noise step {ns.get('name', '?')!r}"
                    try:
                        recomputed = noise_guarantee(ns)
                        claimed = guarantee_from(ns.get("guarantee"))
                        repeat = _repeat(ns)
                        noise_relation = _noise_relation(ns)
                    except Mismatch as err:
                        raise Mismatch(f"{where}: {err}") from None
                    if not same_guarantee(recomputed, claimed):
                        raise Mismatch(f"{where}: {ns['mechanism']} with {ns['parameters']} "
                                       f"gives {recomputed.text()}, stated {claimed.text()}")
                    # Each draw is restated for the step's relation before composing (the
                    # conversion is per draw, as the pipeline's compose(steps, relation=R)).
                    try:
                        parts += [restate(recomputed, noise_relation, step_relation)] * repeat
                        bounds += [restate(noise_guarantee_bound(ns), noise_relation,
                                           step_relation)] * repeat
                    except Mismatch as err:
                        raise Mismatch(f"{where}: {err}") from None
                    n_noise += 1
                    n_converted += noise_relation != step_relation
                composed = sequential(parts)
                ok, why = covers(composed, sequential(bounds), stated)
                if not ok:
                    raise Mismatch(f"alternative {label!r} vs the step's {stated.text()}: {why}")
                reached = reached or _equals(composed, stated)
            # Each tract runs one alternative; the step states the largest of them, exactly.
            if not reached:
                raise Mismatch(f"no alternative composes to exactly the step's {stated.text()}")
        except Mismatch as err:
            problems.append(f"step {name!r}: {err}")
    if problems:
        raise Mismatch("; ".join(problems))
    converted = (f" ({n_converted} of them add-remove, converted to replace-one draw by draw)"
                 if n_converted else "")
    return (f"{n_noise} noise steps recomputed from their parameters{converted}; every "
            f"alternative of the {len(steps)} steps composes to its step's guarantee")


def _noise_relation(ns: dict) -> str:
    """A noise step's relation, which its guarantee must be stated for too."""
    rel = relation_of(ns, "noise step")
    stated = relation_of(ns.get("guarantee"), "its guarantee")
    if stated != rel:
        raise Mismatch(f"its guarantee is stated for {stated}, its sensitivity for {rel}")
    return rel


def _conversions_needed(step: dict, step_relation: str) -> dict[str, list[str]]:
    """Per alternative whose noise is (partly) stated for another relation than the step's:
    the relations of its noise, sorted (what ``relation_conversions`` must list)."""
    needed = {}
    for label, noise_steps in ((step.get("noise") or {}).get("alternatives") or {}).items():
        found = sorted({relation_of(ns, f"alternative {label!r}") for ns in noise_steps or ()})
        if found != [step_relation]:
            needed[label] = found
    return needed


def _listed_conversions(step: dict) -> dict[str, list[str]]:
    listed = step.get("relation_conversions") or {}
    if not isinstance(listed, dict):
        raise Mismatch(f"relation_conversions is not an object: {listed!r}")
    bad = [label for label, c in listed.items() if not isinstance(c, dict)]
    if bad:
        raise Mismatch(f"relation_conversions[{bad[0]!r}] is not an object")
    return {label: sorted(c.get("noise_relations") or []) for label, c in listed.items()}


def check_relations(folder: Path, m: dict) -> str:
    """The release is charged for replace-one neighbours and says so everywhere (see the module
    docstring, (r)); whether the noise pays for the steps is the noise check's."""
    problems = []
    charged = relation_of({"relation": m.get("neighbouring_relation", REPLACE_ONE)},
                          "neighbouring_relation")
    if charged != CHARGED_RELATION:
        problems.append(f"neighbouring_relation is {charged}; releases are charged for "
                        f"{CHARGED_RELATION} neighbours")
    section = m.get("relations") or {}
    charged_in = section.get("charged_in", REPLACE_ONE) if isinstance(section, dict) else None
    if charged_in != charged:
        problems.append(f"relations.charged_in is {charged_in!r}, neighbouring_relation "
                        f"{charged!r}")
    budget, n_converted = m["budget"], 0
    for step in budget["steps"]:
        name = step.get("step", "?")
        try:
            step_relation = relation_of(step, "relation")
            guarantee_relation = relation_of(step.get("guarantee"), "guarantee")
            for what, rel in (("", step_relation), ("its guarantee ", guarantee_relation)):
                if rel != charged:
                    raise Mismatch(f"{what}stated for {rel}, the release is charged for "
                                   f"{charged}")
            needed = _conversions_needed(step, step_relation)
            listed = _listed_conversions(step)
            if listed != needed:
                raise Mismatch(f"relation_conversions lists {listed}, its noise needs {needed}")
            for label, c in (step.get("relation_conversions") or {}).items():
                if c.get("to") != step_relation:
                    raise Mismatch(f"relation_conversions[{label!r}] converts to "
                                   f"{c.get('to')!r}, the step is {step_relation}")
            n_converted += len(needed)
        except Mismatch as err:
            problems.append(f"step {name!r}: {err}")
    for what, g in (("budget.per_tract_and_cell", budget.get("per_tract_and_cell")),
                    ("total_per_person.guarantee", (m.get("total_per_person") or {}).get(
                        "guarantee"))):
        if g is None:
            continue
        try:
            rel = relation_of(g, what)
        except Mismatch as err:
            problems.append(str(err))
            continue
        if rel != charged:
            problems.append(f"{what} is stated for {rel}, the release is charged for {charged}")
    if problems:
        raise Mismatch("; ".join(problems))
    converted = (f"; {n_converted} alternative(s) with add-remove noise list their conversion"
                 if n_converted else "")
    return (f"charged for {charged} neighbours; {len(budget['steps'])} step(s) and the totals "
            f"stated for it{converted}")
