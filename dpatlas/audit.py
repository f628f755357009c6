"""Check a published release from its folder alone: ``dpatlas audit RELEASE_DIR``.

An auditor needs the release folder and nothing of this project's mechanisms code: this
module imports only the standard library, numpy, pyarrow (with pandas) and dp-accounting (for
the zCDP → (ε, δ) conversion the manifest states it used). It re-derives every privacy figure of
the manifest from first principles and compares:

(a) files: every file listed in ``files`` exists with its sha256 and size; nothing else is
    in the folder except manifest.json;
(b) config: config.json parses and agrees with the manifest's selection and budget figures;
(c) noise: each noise step's guarantee is recomputed from its parameters
    - grid Laplace: discrete Laplace of scale t = scale_num/scale_den on an integer query of
      L1 sensitivity grid_steps + dims is ε-DP with ε = (grid_steps + dims)/t
      (Canonne, Kamath & Steinke 2020, and Ghosh, Roughgarden & Sundararajan 2012);
    - grid Gaussian: discrete Gaussian of variance sigma2 on an integer query of L2
      sensitivity grid_steps + √dims is ρ-zCDP with ρ = (grid_steps + √dims)²/(2·sigma2)
      (Canonne, Kamath & Steinke 2020, Thm 4);
    - exponential-mechanism median: ε = rate/rate_den (McSherry & Talwar 2007, with the
      utility's sensitivity folded into the rate);
    - Student's t with smooth sensitivity: ε = (d+1)(beta + s/(2√d))
      (Bun & Steinke 2019, Thm 31);
    - PrivTree's split decisions with discrete Laplace noise of scale t on biased counts of
      grid_steps units per record, bias units per level (BinAgg's binning): under replace-one
      ε = grid_steps/t + Σ_j [ln S(m_j) − ln S(m_j + grid_steps)], m_j = bias − 1 − j·bias,
      S the discrete Laplace survival function, the tail bounded geometrically (the project's
      docs/binagg.md, Theorem 1, after Zhang, Xiao & Xie 2016, Thm 3.1);
    and each alternative of a step, composed sequentially (``repeat`` times each), must give
    the step's guarantee: never more, and less only by the samplers' rounding of their
    parameters (each rounds towards more noise by at most one unit of its last parameter).
    A noise step stated for add-remove neighbours (its sensitivity computed for adding or
    removing a record) pays a replace-one step only through group privacy of size 2, applied
    to each draw before composing: pure ε → 2ε, (ε, δ) → (2ε, (1 + e^ε)δ), ρ → 4ρ, μ → 2μ
    (Dwork & Roth 2014, Thm 2.2; Bun & Steinke 2016, Prop. 1.9; Dong, Roth & Su 2022,
    Sec. 2.3); no other pair of relations converts;
(d) totals: the per-tract-and-cell guarantee and the total per person over cells are
    recomposed from the steps (sequential composition: pure ε add, Dwork et al. 2006; ρ add,
    Bun & Steinke 2016 Lemma 2.3, with pure ε lifted to ε²/2, Prop. 1.4; (ε, δ) add) and the
    concentrated part converted with dp-accounting's RDP accountant at the manifest's
    ``conversion_delta`` (at the orders of :func:`zcdp_conversion_orders`, the pipeline's);
    the ledger entry's sums are recomputed the same way;
(r) relations: the release is charged for replace-one neighbours (``neighbouring_relation``,
    ``relations.charged_in``; a missing ``relation`` anywhere means replace-one, as in
    manifests written before relations were stated), every budget step, its guarantee and the
    per-tract-and-cell and total guarantees are stated for it, and every alternative whose
    noise is stated for another relation is listed in the step's ``relation_conversions``;
(e) table: tracts.parquet has only accounted-for columns, values exactly where released,
    nothing spent where suppressed, the per-tract-and-cell figures where spent, and the
    manifest's counts.

A synthetic-microdata folder (``dpatlas synthesize``, manifest ``kind: synthetic
microdata``) gets the same files, mode, machine-path, relations, noise and totals checks, and
instead of (b) and (e): its rows have exactly the columns GEOID, cell, bin_lo, bin_hi, x, y
(no person ids), 11-digit GEOIDs, the manifest's cells and counts, finite values, and the CSV
holds the same rows.

``main(folder)`` prints one line per check and returns 0 (every check passed), 1 (a check
failed) or 2 (the folder or its manifest cannot be read).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow.parquet as pq

MANIFEST = "manifest.json"
CONFIG = "config.json"
SYNTHETIC_KIND = "synthetic microdata"
SYNTHETIC_PARQUET, SYNTHETIC_CSV = "synthetic.parquet", "synthetic.csv"
SYNTHETIC_COLUMNS = ["GEOID", "cell", "bin_lo", "bin_hi", "x", "y"]
REL_TOL = 1e-9
RANDOM_BITS = ("os.urandom", "seeded (test only, NOT FOR RELEASE)")
STATUSES = ("released", "suppressed", "failed")
VALUE_COLUMNS = ("p25", "p75", "p25_raw", "p75_raw")

Check = tuple[str, bool, str]


class AuditUnreadable(Exception):
    """The folder or its manifest cannot be read at all."""


class Mismatch(Exception):
    """A check's finding (the message is the detail line)."""


@dataclass
class AuditReport:
    folder: Path
    checks: list[Check] = field(default_factory=list)
    ok: bool = False

    def lines(self) -> list[str]:
        return [f"{'ok  ' if good else 'FAIL'}  {name}: {detail}"
                for name, good, detail in self.checks]


# ------------------------------------------------------------------------- guarantee algebra


@dataclass(frozen=True)
class G:
    """A privacy guarantee: kind is pure (ε), approx (ε, δ), zcdp (ρ) or gdp (μ)."""

    kind: str
    epsilon: float = 0.0
    delta: float = 0.0
    rho: float = 0.0
    mu: float = 0.0

    def text(self) -> str:
        return {"pure": f"{self.epsilon:.10g}-DP", "approx": f"({self.epsilon:.10g}, "
                f"{self.delta:.3g})-DP", "zcdp": f"{self.rho:.10g}-zCDP",
                "gdp": f"{self.mu:.10g}-GDP"}[self.kind]


def guarantee_from(d: dict) -> G:
    """A manifest guarantee dict as a G (Mismatch for an unknown or malformed one)."""
    kind = d.get("type") if isinstance(d, dict) else None
    fields = {"pure": ("epsilon",), "approx": ("epsilon", "delta"), "zcdp": ("rho",),
              "gdp": ("mu",)}
    if kind not in fields:
        raise Mismatch(f"guarantee type {kind!r} cannot be audited (expected pure, approx, "
                       "zcdp or gdp)")
    values = {}
    for f in fields[kind]:
        v = d.get(f)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
                or v < 0:
            raise Mismatch(f"{kind} guarantee has no valid {f}: {v!r}")
        values[f] = float(v)
    return G(kind, **values)


def zcdp_rho(g: G) -> float:
    """The zCDP ρ implied by a pure, zCDP or GDP guarantee (Bun & Steinke 2016, Prop. 1.4:
    ε-DP ⇒ ε²/2-zCDP; μ-GDP ⇒ μ²/2-zCDP)."""
    if g.kind == "zcdp":
        return g.rho
    if g.kind == "pure":
        return g.epsilon ** 2 / 2.0
    if g.kind == "gdp":
        return g.mu ** 2 / 2.0
    raise Mismatch(f"{g.text()} implies no zCDP bound")


@lru_cache(maxsize=1)
def zcdp_conversion_orders() -> tuple[float, ...]:
    """The RDP orders the pipeline converts zCDP at: dp-accounting's defaults (up to 1024),
    then a geometric grid of ratio 1.02 up to 1e7, so that small ρ, whose best order is
    about 1 + √(ln(1/δ)/ρ), convert tightly (mechanisms/privacy.py builds the same list)."""
    from dp_accounting.rdp import rdp_privacy_accountant

    return tuple(float(a) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS) + tuple(
        1024.0 * 1.02 ** k for k in range(1, 1000) if 1024.0 * 1.02 ** k <= 1e7)


def zcdp_to_epsilon(rho: float, delta: float) -> float:
    """ε of the (ε, δ) guarantee implied by ρ-zCDP, by dp-accounting's RDP accountant (the
    conversion of Canonne, Kamath & Steinke 2020, Prop. 12, minimised over the orders)."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant

    if rho == 0:
        return 0.0
    if not 0.0 < delta < 1.0:
        raise Mismatch(f"cannot convert {rho:.6g}-zCDP at delta={delta!r}")
    acc = rdp_privacy_accountant.RdpAccountant(zcdp_conversion_orders())
    acc.compose(dp_accounting.ZCDpEvent(rho))
    return float(acc.get_epsilon(delta))


def gdp_to_epsilon(mu: float, delta: float) -> float:
    """ε of the (ε, δ) guarantee implied by μ-GDP, by dp-accounting's PLD accountant (a
    Gaussian with noise multiplier 1/μ, exact for GDP)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    if mu == 0:
        return 0.0
    if not 0.0 < delta < 1.0:
        raise Mismatch(f"cannot convert {mu:.6g}-GDP at delta={delta!r}")
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-5)
    acc.compose(dp_accounting.GaussianDpEvent(1.0 / mu))
    return float(acc.get_epsilon(delta))


def sequential(parts: list[G], conversion_delta: float = 0.0) -> G:
    """Sequential composition of ``parts`` (see the module docstring for the rules).

    With an (ε, δ) part, the concentrated (zCDP/GDP) parts are composed as such, converted to
    (ε, δ) at ``conversion_delta``, and that δ is added to the total.
    """
    if not parts:
        return G("pure", 0.0)
    kinds = {g.kind for g in parts}
    if kinds == {"pure"}:
        return G("pure", math.fsum(g.epsilon for g in parts))
    if kinds == {"gdp"}:
        return G("gdp", mu=math.sqrt(math.fsum(g.mu ** 2 for g in parts)))
    if "approx" not in kinds:
        return G("zcdp", rho=math.fsum(zcdp_rho(g) for g in parts))
    eps = math.fsum(g.epsilon for g in parts if g.kind in ("approx", "pure"))
    delta = math.fsum(g.delta for g in parts if g.kind == "approx")
    concentrated = [g for g in parts if g.kind in ("zcdp", "gdp")]
    if concentrated:
        if not conversion_delta > 0:
            raise Mismatch("concentrated steps beside (epsilon, delta) steps need a "
                           "conversion_delta > 0")
        conc = sequential(concentrated)
        eps += (gdp_to_epsilon(conc.mu, conversion_delta) if conc.kind == "gdp"
                else zcdp_to_epsilon(conc.rho, conversion_delta))
        delta += conversion_delta
    return G("approx", eps, delta)


def as_approx(g: G, delta: float) -> tuple[float, float]:
    """(ε, δ) implied by ``g``; concentrated guarantees converted at ``delta``."""
    if g.kind == "pure":
        return g.epsilon, 0.0
    if g.kind == "approx":
        return g.epsilon, g.delta
    if g.kind == "zcdp":
        return zcdp_to_epsilon(g.rho, delta), delta
    return gdp_to_epsilon(g.mu, delta), delta


def close(a: float, b: float, rel: float = REL_TOL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-300)


def same_guarantee(a: G, b: G) -> bool:
    return a.kind == b.kind and all(close(getattr(a, f), getattr(b, f))
                                    for f in ("epsilon", "delta", "rho", "mu"))


# ------------------------------------------------------------------ neighbouring relations

REPLACE_ONE, ADD_REMOVE = "replace-one", "add-remove"
RELATIONS = (REPLACE_ONE, ADD_REMOVE)
# What the ledger charges and every published guarantee must be stated for (docs/privacy.md).
CHARGED_RELATION = REPLACE_ONE


def relation_of(obj, where: str) -> str:
    """The neighbouring relation ``obj`` (a manifest dict) is stated for. A missing one is
    replace-one: manifests written before relations were stated meant that."""
    rel = obj.get("relation", REPLACE_ONE) if isinstance(obj, dict) else REPLACE_ONE
    if rel not in RELATIONS:
        raise Mismatch(f"{where}: unknown neighbouring relation {rel!r} (expected "
                       f"{' or '.join(RELATIONS)})")
    return rel


def group_of_two(g: G) -> G:
    """An add-remove guarantee restated for replace-one neighbours: a replacement is a removal
    then an addition, so group privacy of size 2 applies. Pure ε → 2ε (Dwork & Roth 2014,
    Thm 2.2); (ε, δ) → (2ε, (1 + e^ε)δ), the (ε, δ) inequality applied along the path;
    ρ-zCDP → 4ρ (Bun & Steinke 2016, Prop. 1.9, k²ρ); μ-GDP → 2μ (Dong, Roth & Su 2022,
    Sec. 2.3, kμ)."""
    if g.kind == "pure":
        return G("pure", 2.0 * g.epsilon)
    if g.kind == "approx":
        # e^ε overflows a float above ε ≈ 709: no δ < 1 is left there anyway
        delta = ((1.0 + math.exp(g.epsilon)) * g.delta if g.epsilon < 700 else math.inf) \
            if g.delta else 0.0
        if not delta < 1.0:
            raise Mismatch(f"{g.text()} (add-remove) gives delta {delta:.3g} >= 1 for "
                           "replace-one neighbours: no guarantee")
        return G("approx", 2.0 * g.epsilon, delta)
    if g.kind == "zcdp":
        return G("zcdp", rho=4.0 * g.rho)
    return G("gdp", mu=2.0 * g.mu)


def restate(g: G, noise_relation: str, step_relation: str) -> G:
    """One draw's guarantee, stated for ``noise_relation``, in the step's relation: unchanged
    if they agree, group privacy of size 2 from add-remove to replace-one, and nothing else
    (a replace-one bound says nothing about adding a record: n may enter it without limit)."""
    if noise_relation == step_relation:
        return g
    if (noise_relation, step_relation) == (ADD_REMOVE, REPLACE_ONE):
        return group_of_two(g)
    raise Mismatch(f"noise stated for {noise_relation} cannot pay a step charged for "
                   f"{step_relation}")


# ---------------------------------------------------------------------------- noise formulas


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


# ------------------------------------------------------------------------------------- checks


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_files(folder: Path, m: dict) -> str:
    files = m.get("files")
    if not isinstance(files, dict) or not files:
        raise Mismatch("the manifest lists no files")
    problems = []
    for name, info in files.items():
        if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
            problems.append(f"{name!r} is not a plain file name")
            continue
        path = folder / name
        if path.is_symlink() or not path.is_file():
            problems.append(f"{name} missing (or not a regular file)")
        elif path.stat().st_size != info.get("bytes"):
            problems.append(f"{name} has {path.stat().st_size} bytes, manifest says "
                            f"{info.get('bytes')}")
        elif _sha256(path) != info.get("sha256"):
            problems.append(f"{name} sha256 differs from the manifest")
    extra = sorted(p.name for p in folder.iterdir() if p.name not in files and p.name != MANIFEST)
    if extra:
        problems.append(f"files not in the manifest: {extra}")
    required = ((SYNTHETIC_PARQUET, SYNTHETIC_CSV, CONFIG) if _synthetic(m)
                else ("tracts.parquet", CONFIG))
    for required in required:
        if required not in files:
            problems.append(f"{required} is not listed")
    if problems:
        raise Mismatch("; ".join(problems))
    return f"{len(files)} files match their sha256 and size; no other files"


def _json_object(path: Path, name: str, error: type[Exception]) -> dict:
    """The JSON object in ``path``; ``error`` (with ``name`` in the message) if there is none."""
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise error(f"{name} cannot be read: {err}") from None
    if not isinstance(obj, dict):
        raise error(f"{name} is not a JSON object")
    return obj


def _config(folder: Path) -> dict:
    return _json_object(folder / CONFIG, CONFIG, Mismatch)


def check_config(folder: Path, m: dict) -> str:
    cfg = _config(folder)
    budget, sel = m["budget"], m["selection"]
    problems = []

    def same(label, a, b):
        equal = close(float(a), float(b)) if isinstance(a, (int, float)) and isinstance(
            b, (int, float)) and not isinstance(a, bool) else a == b
        if not equal:
            problems.append(f"{label}: config {a!r} != manifest {b!r}")

    privacy, selection = cfg["privacy"], cfg["selection"]
    same("privacy.epsilon_per_tract", privacy["epsilon_per_tract"], budget["epsilon_available"])
    same("privacy.delta", privacy["delta"], budget["delta_available"])
    same("privacy.unit", privacy["unit"], m["privacy_unit"])
    same("privacy.neighbouring", privacy["neighbouring"], m["neighbouring_relation"])
    same("selection.rule", selection["rule"], sel["rule"])
    if selection["rule"] in ("dp", "banded"):
        same("selection.budget_share", selection["budget_share"], sel["budget_share"])
    if selection.get("threshold") is not None:
        same("selection.threshold", selection["threshold"], sel["threshold"])
    same("profile.name", cfg["profile"]["name"], m["profile"])
    suite = sorted(s["estimator"] for s in budget["steps"] if s.get("estimator"))
    if cfg["profile"]["name"] == "full-suite":
        same("profile.suite", sorted(cfg["profile"]["suite"]), suite)
    elif suite:
        problems.append(f"profile primary but the budget has suite steps {suite}")
    same("publish.mode", cfg["publish"]["mode"], m["mode"])
    if "min_n" in m:
        same("publish.min_n", cfg["publish"]["min_n"], m["min_n"])
    same("boundaries.vintage", cfg["boundaries"].get("vintage") or "unstated",
         m["boundaries"]["vintage"])
    same("boundaries.path", cfg["boundaries"]["path"], m["boundaries"]["file"])
    if m.get("ledger_entry"):
        same("ledger.dataset", cfg["ledger"]["dataset"], m["ledger_entry"].get("dataset"))
    if cfg["validation"]["policy"] == "drop" and not any(
            "dropped rows" in a for a in m["assumptions"]["unverified"]):
        problems.append("validation.policy is drop but the assumptions do not say n excludes "
                        "dropped rows")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"config.json agrees with the manifest (epsilon {budget['epsilon_available']}"
            f", delta available {budget['delta_available']}, rule {sel['rule']}, profile "
            f"{m['profile']}, mode {m['mode']})")


def check_mode(folder: Path, m: dict) -> str:
    mode, bits = m.get("mode"), m.get("noise_sampler", {}).get("random_bits")
    if mode not in ("public", "test"):
        raise Mismatch(f"mode {mode!r} is neither public nor test")
    if bits not in RANDOM_BITS:
        raise Mismatch(f"random_bits {bits!r} is not one of {list(RANDOM_BITS)}")
    if mode == "public" and bits != "os.urandom":
        raise Mismatch("a public release with seeded noise")
    return f"mode {mode}, random bits {bits}"


def check_no_machine_paths(folder: Path, m: dict) -> str:
    bad = []

    def walk(obj, where):
        if isinstance(obj, str):
            t = obj.strip()
            if t.startswith(("/", "~", "\\")) or re.match(r"^[A-Za-z]:[\\/]", t) \
                    or re.match(r"^[a-z][a-z0-9+.-]*://", t, re.IGNORECASE):
                bad.append(f"{where}={obj!r}")
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(k, f"{where}.{k}(key)")
                walk(v, f"{where}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]")

    walk(m, "")
    walk(_config(folder), "config.json")
    if bad:
        raise Mismatch(f"{len(bad)} machine path(s), e.g. {bad[0]}")
    return "no absolute path or URL in manifest.json or config.json"


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


def _charged(g: G, conversion_delta: float) -> tuple[float, float]:
    """What a ledger charges for one step: basic composition (ε, δ); concentrated steps at
    the conversion δ."""
    if g.kind in ("pure", "approx"):
        return g.epsilon, g.delta
    return as_approx(g, conversion_delta)


def check_totals(folder: Path, m: dict) -> str:
    budget, total = m["budget"], m["total_per_person"]
    steps = [guarantee_from(s["guarantee"]) for s in budget["steps"]]
    conv = float(budget.get("conversion_delta") or 0.0)
    cells = len(m["cells"])
    problems = []
    if total.get("cells") != cells:
        problems.append(f"total is over {total.get('cells')} cells, the manifest lists {cells}")

    per_tract = sequential(steps, conv)
    stated = guarantee_from(budget["per_tract_and_cell"])
    if not same_guarantee(per_tract, stated):
        problems.append(f"per tract and cell: recomposed {per_tract.text()}, stated "
                        f"{stated.text()}")
    # What each tract and cell is charged: the steps' (ε, δ) summed (basic composition).
    charged = [_charged(g, conv) for g in steps]
    eps_c, delta_c = math.fsum(e for e, _ in charged), math.fsum(d for _, d in charged)
    for what, got, key in (("epsilon", eps_c, "epsilon_per_tract_and_cell"),
                           ("delta", delta_c, "delta_per_tract_and_cell")):
        if not close(got, float(budget[key])):
            problems.append(f"{what} per tract and cell: recomputed {got:.12g}, stated "
                            f"{budget[key]:.12g}")
        available = float(budget[f"{what}_available"])
        if got > available * (1 + REL_TOL):
            problems.append(f"{what} per tract and cell {got:.12g} is over the available "
                            f"{available:.12g}")

    combined = sequential(steps * cells, conv * cells)
    eps, delta = as_approx(combined, conv * cells)
    if not close(eps, float(total["epsilon"])):
        problems.append(f"total epsilon: recomposed {eps:.12g}, stated {total['epsilon']:.12g}")
    if not close(delta, float(total["delta"])):
        problems.append(f"total delta: recomposed {delta:.6g}, stated {total['delta']:.6g}")
    if "approx" in {g.kind for g in steps}:
        if total.get("rho") is not None:
            problems.append("a total rho is stated although a step is (epsilon, delta) only")
    else:
        rho = math.fsum(zcdp_rho(g) for g in steps * cells)
        if total.get("rho") is None or not close(rho, float(total["rho"])):
            problems.append(f"total rho: recomposed {rho:.12g}, stated {total.get('rho')}")

    entry = m.get("ledger_entry")
    if entry:
        led_eps, led_delta = cells * eps_c, cells * delta_c
        if entry.get("charges") != len(steps) * cells:
            problems.append(f"ledger charges {entry.get('charges')} != {len(steps)} steps x "
                            f"{cells} cells")
        if not close(led_eps, float(entry.get("epsilon", float("nan")))):
            problems.append(f"ledger epsilon: recomputed {led_eps:.12g}, stated "
                            f"{entry.get('epsilon')}")
        if not close(led_delta, float(entry.get("delta", float("nan")))):
            problems.append(f"ledger delta: recomputed {led_delta:.6g}, stated "
                            f"{entry.get('delta')}")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"per tract and cell {per_tract.text()}; total per person over {cells} cell(s) "
            f"({eps:.10g}, {delta:.3g})" + (f", rho {total['rho']:.10g}"
                                           if total.get("rho") is not None else ""))


def _accounted_columns(m: dict) -> set[str]:
    return {c.strip() for key in m["published_columns"] for c in key.split(",") if c.strip()}


def check_table(folder: Path, m: dict) -> str:
    try:
        df = pq.read_table(folder / "tracts.parquet").to_pandas()
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    budget, problems = m["budget"], []
    cols = set(df.columns)
    unaccounted = sorted(cols - _accounted_columns(m))
    if unaccounted:
        problems.append(f"columns not accounted for in published_columns: {unaccounted}")
    missing = sorted({"geoid", "cell", "n", "mechanism", "status", "epsilon_spent",
                      "delta_spent", *VALUE_COLUMNS} - cols)
    if missing:
        raise Mismatch(f"columns missing: {missing}")
    suite_steps = {s["estimator"] for s in budget["steps"] if s.get("estimator")}
    suite_cols = [c for c in df.columns if c.endswith(("_p25", "_p75"))
                  and c.rsplit("_", 1)[0] not in ("p25", "p75")]
    unpaid = sorted({c.rsplit("_", 1)[0] for c in suite_cols} - suite_steps)
    if unpaid:
        problems.append(f"suite columns without a budget step: {unpaid}")

    status = df["status"].astype(str)
    if not status.isin(STATUSES).all():
        problems.append(f"unknown statuses {sorted(set(status) - set(STATUSES))}")
    released, suppressed = status == "released", status == "suppressed"
    spent = ~suppressed
    values = df[list(VALUE_COLUMNS)]
    if values[released].isna().any().any():
        problems.append(f"{int(values[released].isna().any(axis=1).sum())} released row(s) "
                        "lack p25/p75")
    if values[~released].notna().any().any():
        problems.append(f"{int(values[~released].notna().any(axis=1).sum())} row(s) not "
                        "released carry p25/p75 values")
    if suite_cols and df.loc[suppressed, suite_cols].notna().any().any():
        problems.append("suppressed rows carry suite values")
    p = df.loc[released]
    for c in ("p25", "p75"):
        if not np.allclose(p[c], p[f"{c}_raw"].clip(0.0, 1.0), rtol=0, atol=0):
            problems.append(f"{c} is not {c}_raw clipped to [0, 1]")
    eps_spent = df["epsilon_spent"].astype(float)
    delta_spent = df["delta_spent"].astype(float)
    if ((eps_spent[suppressed] != 0) | (delta_spent[suppressed] != 0)).any():
        problems.append("suppressed rows with budget spent")
    for col, spent_col in (("epsilon", eps_spent), ("delta", delta_spent)):
        figure = float(budget[f"{col}_per_tract_and_cell"])
        off = int((~np.isclose(spent_col[spent], figure, rtol=REL_TOL, atol=0)).sum())
        if off:
            problems.append(f"{col}_spent differs from the manifest's {figure:.12g} in {off} "
                            "row(s)")
    if "min_n" in m:
        small = df["n"].astype(int) < int(m["min_n"])
        if (small != suppressed).any():
            problems.append(f"suppression is not 'n < min_n = {m['min_n']}' in "
                            f"{int((small != suppressed).sum())} row(s): it must depend on the "
                            "public n only")
    if (df.loc[suppressed, "mechanism"] != "none").any():
        problems.append("suppressed rows name a mechanism")
    counts = m["counts"]
    by_status = {str(k): int(v) for k, v in status.value_counts().items()}
    by_mech = {str(k): int(v) for k, v in df["mechanism"].astype(str).value_counts().items()}
    if by_status != counts["by_status"]:
        problems.append(f"counts by status {by_status} != manifest {counts['by_status']}")
    if by_mech != counts["by_mechanism"]:
        problems.append(f"counts by mechanism {by_mech} != manifest {counts['by_mechanism']}")
    if len(df) != counts["rows"] or df["geoid"].nunique() != counts["tracts"]:
        problems.append(f"{len(df)} rows / {df['geoid'].nunique()} tracts != manifest "
                        f"{counts['rows']} / {counts['tracts']}")
    if sorted(df["cell"].astype(str).unique()) != sorted(m["cells"]):
        problems.append("cells differ from the manifest's")
    if problems:
        raise Mismatch("; ".join(problems))
    statuses = ", ".join(f"{n:,} {k}" for k, n in sorted(by_status.items()))
    return (f"{len(df):,} rows ({statuses}); every column accounted for; values and spend "
            "agree with the statuses and the budget")


def _synthetic(m: dict) -> bool:
    return m.get("kind") == SYNTHETIC_KIND


def check_synthetic_table(folder: Path, m: dict) -> str:
    try:
        df = pq.read_table(folder / SYNTHETIC_PARQUET).to_pandas()
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"{SYNTHETIC_PARQUET} cannot be read: {err}") from None
    problems = []
    if list(df.columns) != SYNTHETIC_COLUMNS:
        raise Mismatch(f"columns {list(df.columns)}, expected exactly {SYNTHETIC_COLUMNS} "
                       "(no person ids, nothing unaccounted for)")
    geoid = df["GEOID"].astype(str)
    bad_geoid = int((~geoid.str.fullmatch(r"\d{11}")).sum())
    if bad_geoid:
        problems.append(f"{bad_geoid} GEOID(s) are not 11 digits")
    extra_cells = sorted(set(df["cell"].astype(str)) - set(m["cells"]))
    if extra_cells:
        problems.append(f"cells not in the manifest: {extra_cells}")
    values = df[["bin_lo", "bin_hi", "x", "y"]].to_numpy(dtype=float)
    if not np.isfinite(values).all():
        problems.append("non-finite values")
    elif not ((df["bin_lo"] >= 0) & (df["bin_lo"] < df["bin_hi"]) & (df["bin_hi"] <= 1)).all():
        problems.append("bins outside 0 <= bin_lo < bin_hi <= 1")
    counts = m["counts"]
    if len(df) != counts["rows"]:
        problems.append(f"{len(df)} rows, manifest says {counts['rows']}")
    try:
        n_csv = sum(1 for _ in open(folder / SYNTHETIC_CSV)) - 1
        header = open(folder / SYNTHETIC_CSV).readline().strip().split(",")
    except OSError as err:
        raise Mismatch(f"{SYNTHETIC_CSV} cannot be read: {err}") from None
    if header != SYNTHETIC_COLUMNS or n_csv != len(df):
        problems.append(f"{SYNTHETIC_CSV} has columns {header} and {n_csv} rows, the Parquet "
                        f"file {SYNTHETIC_COLUMNS} and {len(df)}")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{len(df)} rows in {geoid.nunique()} tracts; columns {SYNTHETIC_COLUMNS} only; "
            "CSV agrees")


SYNTHETIC_CHECKS: list[tuple[str, Callable[[Path, dict], str]]] = []  # filled below


CHECKS: list[tuple[str, Callable[[Path, dict], str]]] = [
    ("files", check_files),
    ("config", check_config),
    ("mode", check_mode),
    ("machine paths", check_no_machine_paths),
    ("relations", check_relations),
    ("noise", check_noise),
    ("totals", check_totals),
    ("table", check_table),
]
SYNTHETIC_CHECKS[:] = [(name, fn) for name, fn in CHECKS if name not in ("config", "table")]
SYNTHETIC_CHECKS.append(("synthetic rows", check_synthetic_table))


def load_manifest(folder: Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise AuditUnreadable(f"{folder} is not a folder")
    return _json_object(folder / MANIFEST, str(folder / MANIFEST), AuditUnreadable)


def audit_release(folder: Path) -> AuditReport:
    """Run every check on a release folder (AuditUnreadable if there is no readable manifest).

    The table and noise checks run even when the files check fails, so one report names every
    problem; a malformed manifest (a key missing, a wrong type) fails the check that reads it.
    """
    folder = Path(folder)
    m = load_manifest(folder)
    report = AuditReport(folder)
    for name, fn in (SYNTHETIC_CHECKS if _synthetic(m) else CHECKS):
        try:
            report.checks.append((name, True, fn(folder, m)))
        except Mismatch as err:
            report.checks.append((name, False, str(err)))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
            report.checks.append((name, False, f"manifest or config malformed: "
                                               f"{type(err).__name__} {err}"))
    report.ok = all(good for _, good, _ in report.checks)
    return report


def main(folder, out=None) -> int:
    """Print one line per check; 0 if all pass, 1 if any fails, 2 if the folder is unreadable."""
    out = out or sys.stdout
    try:
        report = audit_release(Path(folder))
    except AuditUnreadable as err:
        print(f"unreadable: {err}", file=out)
        return 2
    for line in report.lines():
        print(line, file=out)
    print(f"{'PASSED' if report.ok else 'FAILED'}: {sum(g for _, g, _ in report.checks)} of "
          f"{len(report.checks)} checks passed for {report.folder}", file=out)
    return 0 if report.ok else 1


if __name__ == "__main__":  # python audit.py RELEASE_DIR (this file alone is enough)
    if len(sys.argv) != 2:
        print("usage: python audit.py RELEASE_DIR", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1]))
