"""The sensitivities check (k): each noise step's sensitivity derived by the audit's own table
(SENSITIVITIES) from the mechanism and public parameters, and the manifest's text checked
against it."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .accounting import ADD_REMOVE, REPLACE_ONE, relation_of
from .base import Mismatch


# Each noise step a manifest may contain, keyed by (alternative, noise step name): the
# sensitivity of its query derived from the mechanism and the public parameters alone (records
# clipped to [0, 1] x [0, 1], n public, k = n - 1 pairwise predictions per record for all-pairs
# Theil-Sen), the norm and number of coordinates that fixes the noise that can pay for it, and
# the statement the manifest must make. The noise check then recomputes the guarantee from the
# calibration, which holds for a query of exactly these coordinates: the grid mechanisms round
# each coordinate, adding at most one grid unit per coordinate (grid_steps + dims in L1,
# grid_steps + sqrt(dims) in L2).


@dataclass(frozen=True)
class Derived:
    mechanism: str                 # the only noise that pays for this sensitivity
    dims: int | str | None         # coordinates of the query ("bins", "bins^2": DDSSP's grid)
    at_n: Callable[[int], float]   # the sensitivity at a public n (records on [0, 1])
    statement: str                 # what the manifest states, a regular expression
    relation: str = REPLACE_ONE


def _text(s: str) -> str:
    return re.escape(s)


_NUMBER = r"[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?"
_L1 = "(L1, replace-one, {} on [0, 1])"
_EXP_ALL = ("utility sensitivity k = the most pairwise predictions one record is in "
            "(k = n - 1 for all pairs) (replace-one; predictions clipped to [lo, hi])")
_EXP_MATCH = ("utility sensitivity k = the most pairwise predictions one record is in "
              "(k = 1 matching) (replace-one; predictions clipped to [lo, hi])")
_EXP_KMATCH = ("utility sensitivity k = the most pairwise predictions one record is in "
               "(k = min(k matchings, n - 1)) (replace-one; predictions clipped to [lo, hi])")
_EXP_INTERVAL = ("utility sensitivity k = n - 1 (pairwise predictions one record is in; "
                 "padding with public values lo/hi shifts the target rank and changes nothing "
                 "else)")
_SIMPLEX = ("1 (L1, add-remove: each record adds or removes a vector of nonnegative "
            "coordinates summing to 1; ranks on [0, 1])")
_MARGINAL = ("sqrt(2) (L2, replace-one: one record leaves one cell of the marginal and joins "
             "another)")


def _nvar() -> Derived:
    # n·var(x) = Σx² − (Σx)²/n: replacing one x in [0, 1] moves it by at most 1 − 1/n
    return Derived("grid-laplace", 1, lambda n: 1 - 1 / n,
                   _text("1 - 1/n " + _L1.format("parent ranks")))


def _exp(statement: str, k: Callable[[int], float]) -> Derived:
    return Derived("exponential-median", None, k, _text(statement))


_MEDIANS = ("p25 median", "p75 median")
_INTERVAL_ENDS = [f"interval: {p} {end}" for p in ("p25", "p75") for end in ("lower", "upper")]

SENSITIVITIES: dict[tuple[str, str], Derived] = {
    ("dp selection rule", "nvar"): _nvar(),
    ("NoisyStats", "nvar"): _nvar(),
    # n·cov(x, y): one record moves it by at most 1 − 1/n (both ranks on [0, 1])
    ("NoisyStats", "ncov"): Derived("grid-laplace", 1, lambda n: 1 - 1 / n,
                                    _text("1 - 1/n " + _L1.format("ranks"))),
    # ȳ − slope·x̄ given the released (DP) slope: (1 + |slope|)/n, at least 1/n
    ("NoisyStats", "intercept"): Derived(
        "grid-laplace", 1, lambda n: 1 / n,
        _text("(1 + |noisy slope|)/n given the released noisy slope " + _L1.format("ranks"))),
    ("NoisyIntercept", "mean of y"): Derived("grid-laplace", 1, lambda n: 1 / n,
                                             _text("1/n " + _L1.format("child ranks"))),
    ("NoisyStats", "interval: mean of x"): Derived(
        "grid-laplace", 1, lambda n: 1 / n, _text("1/n " + _L1.format("parent ranks"))),
    # the interval's own, second draw of n·var(x): the same query as the selection's nvar
    ("NoisyStats", "interval: nvar"): Derived(
        "grid-laplace", 1, lambda n: 1 - 1 / n,
        _text("1 - 1/n " + _L1.format("parent ranks") + ": a second draw of n var(x)")),
    # the interval's draw of n·var(y) = Σy² − (Σy)²/n, the outcomes' spread (issue 32): as
    # n·var(x) with child ranks for parent ranks
    ("NoisyStats", "interval: nvar of y"): Derived(
        "grid-laplace", 1, lambda n: 1 - 1 / n,
        _text("1 - 1/n " + _L1.format("child ranks") + ": n var(y), the spread of the outcomes")),
    **{("DPExpTheilSen", end): _exp(_EXP_INTERVAL, lambda n: n - 1) for end in _INTERVAL_ENDS},
    # Theil–Sen medians: one record is in k pairwise predictions (k = n − 1 over all pairs)
    **{(est, med): _exp(_EXP_ALL, lambda n: n - 1)
       for est in ("DPExpTheilSen", "DPWideTheilSen") for med in _MEDIANS},
    **{("DPExpTheilSenMatch", med): _exp(_EXP_MATCH, lambda n: 1) for med in _MEDIANS},
    **{("DPExpTheilSenkMatch", med): _exp(_EXP_KMATCH, lambda n: min(1, n - 1))
       for med in _MEDIANS},
    # a record's clipped gradient lies in [−τ, τ]²: L1 distance 4τ, L2 distance 2√2·τ
    ("DPGDPure", "gradient step"): Derived(
        "grid-laplace", 2, lambda n: 4.0,
        r"4\*tau = " + _NUMBER + _text(" (L1, replace-one: each record's gradient is clipped "
                                       "to [-tau, tau]^2)")),
    **{(est, "gradient step"): Derived(
        "grid-gaussian", 2, lambda n: 2 * math.sqrt(2),
        r"2\*sqrt\(2\)\*tau = " + _NUMBER + _text(" (L2, replace-one: each record's gradient "
                                                  "is clipped to [-tau, tau]^2)"))
       for est in ("DPGDzCDP", "DPGDApprox")},
    ("BinAgg", "privtree bins"): Derived(
        "privtree-grid-laplace", None, lambda n: 1.0,
        _text("1 record = grid_steps units of a node's count; replace-one: one path gains a "
              "record, one loses it (docs/binagg.md, Theorem 1)")),
    ("BinAgg", "bin counts"): Derived(
        "grid-gaussian", 1, lambda n: 1.0,
        _text("1 per bin (L2, a record is in one bin); replace-one changes 2 bins")),
    ("BinAgg", "bin sums of x"): Derived(
        "grid-gaussian", 1, lambda n: 1.0,
        _text("U_k = the bin's upper edge, per bin (x confined to [L_k, U_k]); replace-one "
              "changes 2 bins")),
    ("BinAgg", "bin sums of y"): Derived(
        "grid-gaussian", 1, lambda n: 1.0,
        _text("B_y = 1 per bin (y on [0, 1]); replace-one changes 2 bins")),
    # each record adds a vector of nonnegative coordinates summing to 1 (add-remove: L1 = 1)
    ("FreeLunchSSP", "x simplex (x^2, x(1-x), 1-x)"): Derived(
        "grid-laplace", 3, lambda n: 1.0, _text(_SIMPLEX), ADD_REMOVE),
    ("FreeLunchSSP", "xy simplex (xy, (1-x)y, x(1-y), (1-x)(1-y))"): Derived(
        "grid-laplace", 4, lambda n: 1.0, _text(_SIMPLEX), ADD_REMOVE),
    # a record leaves one histogram cell and joins another: L2 distance √2
    ("DDSSP", "x marginal"): Derived("grid-gaussian", "bins", lambda n: math.sqrt(2),
                                     _text(_MARGINAL)),
    ("DDSSP", "y marginal"): Derived("grid-gaussian", "bins", lambda n: math.sqrt(2),
                                     _text(_MARGINAL)),
    ("DDSSP", "xy marginal"): Derived("grid-gaussian", "bins^2", lambda n: math.sqrt(2),
                                      _text(_MARGINAL)),
    # λ_min(X'X) moves by at most 1 (Courant–Fischer, rows (1, x) with x in [0, 1])
    ("AdaSSP", "min eigenvalue of X'X"): Derived(
        "grid-gaussian", 1, lambda n: 1.0,
        _text("1 (replace-one, n public, features (1, x) with x in [0, 1]: Courant-Fischer, "
              "see mechanisms/adassp.py)")),
    ("AdaSSP", "X'X"): Derived(
        "grid-gaussian", 2, lambda n: math.sqrt(2),
        _text("sqrt(2) (L2 of (sum x, sum x^2), replace-one, x in [0, 1]; n is public, not "
              "noised)")),
    ("AdaSSP", "X'y"): Derived(
        "grid-gaussian", 2, lambda n: math.sqrt(2),
        _text("sqrt(2) (L2 of (sum y, sum x*y), replace-one, x and y in [0, 1])")),
}


def _shown(statement: str) -> str:
    """A derived statement (a regular expression) as text: numbers shown as <number>."""
    return re.sub(r"\\(.)", r"\1", statement.replace(_NUMBER, "<number>"))


def _ddssp_bins(noise_steps: list) -> int | None:
    """DDSSP's grid size B from its x marginal (B cells); its xy marginal must have B²."""
    for ns in noise_steps:
        if ns.get("name") == "x marginal":
            return (ns.get("parameters") or {}).get("dims")
    return None


def _derived_dims(d: Derived, noise_steps: list):
    if isinstance(d.dims, int) or d.dims is None:
        return d.dims
    bins = _ddssp_bins(noise_steps)
    if not isinstance(bins, int) or isinstance(bins, bool) or bins < 2:
        raise Mismatch(f"DDSSP's grid size (x marginal dims) {bins!r} is not an integer >= 2")
    return bins if d.dims == "bins" else bins * bins


def sensitivity_problem(label: str, ns: dict, noise_steps: list, min_n: int) -> str | None:
    """Why the noise step does not carry the sensitivity the audit derives, or None."""
    name = ns.get("name")
    # An alternative that runs one mechanism after another ("dp selection rule + NoisyStats",
    # the banded rule's dp band) draws the noise of each of its parts.
    d = next((SENSITIVITIES[(part, name)] for part in [label, *label.split(" + ")]
              if (part, name) in SENSITIVITIES), None)
    if d is None:
        return "the audit derives no sensitivity for it (an unknown mechanism or step)"
    if ns.get("mechanism") != d.mechanism:
        return f"mechanism {ns.get('mechanism')!r}, its sensitivity needs {d.mechanism!r}"
    if relation_of(ns, "noise step") != d.relation:
        return f"stated for {relation_of(ns, 'noise step')}, its sensitivity is {d.relation}"
    want = _derived_dims(d, noise_steps)
    got = (ns.get("parameters") or {}).get("dims")
    if want is not None and got != want:
        return (f"dims {got!r}: the query has {want} coordinate(s), so the calibration must "
                f"cover {want} rounding unit(s)")
    text = ns.get("sensitivity")
    if not isinstance(text, str) or not re.fullmatch(d.statement, text):
        return f"states sensitivity {text!r}; the audit derives {_shown(d.statement)!r}"
    value = d.at_n(min_n)
    if not (math.isfinite(value) and value > 0):
        return f"its sensitivity at n = min_n = {min_n} is {value!r}, not positive"
    return None


def check_sensitivities(folder: Path, m: dict) -> str:
    min_n = m["min_n"]
    if isinstance(min_n, bool) or not isinstance(min_n, int) or min_n < 2:
        raise Mismatch(f"min_n {min_n!r}: sensitivities are derived for n >= 2")
    problems, n = [], 0
    for step in m["budget"]["steps"]:
        for label, noise_steps in ((step.get("noise") or {}).get("alternatives") or {}).items():
            for ns in noise_steps or ():
                n += 1
                why = sensitivity_problem(label, ns, noise_steps, min_n)
                if why:
                    problems.append(f"step {step.get('step')!r}, {label}, "
                                    f"{ns.get('name')!r}: {why}")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{n} noise steps: each sensitivity derived from the mechanism and public "
            f"parameters (n >= {min_n}, ranks on [0, 1]) and covered by its calibration")
