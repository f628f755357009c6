"""Check a published release from its folder alone: ``dpatlas audit RELEASE_DIR``.

An auditor needs the release folder and nothing of this project's code: this module imports
only the standard library, numpy, pyarrow (with pandas), shapely (to compare polygons),
dp-accounting (for the zCDP → (ε, δ) conversion the manifest states it used), for
``--ledger`` only, SQLAlchemy, and for the ``small_area`` check and ``--boundaries`` only
geopandas and ``dpatlas.small_area`` (which imports nothing of ours); for the ``names`` check,
its module ``names.py`` (beside this file), which reads libpysal's bundled Census tables with
the standard library. It reads the vector
tiles with its own PMTiles/MVT reader. It re-derives every
privacy figure of the manifest from first principles, checks the manifest's structure
against fixed rules rather than against itself, and compares:

(s) schema: ``manifest_version`` is one this audit reads (2; 3 adds the standard errors; 4
    one estimand that every interval, SE, margin of error and model column declares);
    every required field is there
    with its type (``min_n``, ``ledger_entry``, ``assumptions``, ``public_values``,
    ``public``...); ``release_id`` is a valid id and the folder's name (and the ledger entry's);
    ``started`` and ``published`` are dates, published not before started nor in the future;
    ``code_version`` is a package version and a git commit (or none). A manifest over 16 MiB
    is refused before it is read, one nested deeper than 64 levels is refused (exit 2);
(p) public: ``public_values`` and the ``public`` section (docs/threat-model.md) have their
    fixed keys and meanings, the public columns are exactly geoid, state, county, name, cell,
    n, status, geometry (without name before issue 33), and "n per tract and cell is public"
    is an unverified assumption;
(a) files: every file listed in ``files`` exists with its sha256 and size; nothing else is
    in the folder except manifest.json; a symlink, FIFO, socket, device or folder in the
    folder is named, and no check ever opens one, nor a file larger than twice its recorded
    size plus 1 MiB (:func:`readable`), so a hostile folder can neither hang nor exhaust
    the audit;
(x) machine paths: no string of manifest.json or config.json is an absolute path or URL,
    and no other published file (text streamed; a PMTiles archive's metadata and a Parquet
    file's key-value metadata) holds a path or address of a machine
    (:data:`MACHINE_PATH_IN_TEXT`);
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
(k) sensitivities: for every noise step kind a manifest can hold (the selection rule, each
    publishable estimator, the intervals) the audit's own table (SENSITIVITIES) derives the
    query's sensitivity from the mechanism and public parameters (n, ranks clipped to [0, 1],
    k = n − 1 pairs, the grid) and the noise that can pay for it (mechanism, relation, number
    of coordinates the grid calibration must cover); the manifest's sensitivity text must state
    that derivation, never the other way round;
(u) columns: every column of the table is public (the fixed list) or paid for by its step
    (p25/p75 by the primary step, ``X_p25`` by ``suite: X``, the interval columns by the
    interval step, whose ``intervals.epsilon`` must be the step's, and their standard errors
    ``p25_se``/``p75_se``, present exactly with them, as post-processing of that step, and
    ``p25_moe90``/``p75_moe90`` only with them); nothing else may be declared public; from
    version 4, every value, interval, SE, margin of error and model column declares the one
    estimand: its ``published_columns`` entry and its ``tracts.schema.json`` description
    contain :data:`ESTIMAND_ID`;
(e) table: tracts.parquet has only accounted-for columns, values exactly where released,
    nothing spent where suppressed, suppression exactly where n < min_n, ``failed`` only with
    its mechanism's DP failure, ``reason`` one of an enumerated set, interval values only on
    released rows and around the released value, each standard error finite, in
    [0, SE_CAP] exactly where its interval is (up to version 3, when it was the interval's
    (hi − lo)/(2z) at ``intervals.level``, recomputed so, z from the standard library's
    NormalDist, and found rounded up by at most one unit of the 4th decimal), each 90% margin
    of error exactly where its SE is and equal to ceil(MOE90_Z·se·10⁴)/10⁴,
    the per-tract-and-cell figures where spent,
    and the manifest's counts;
(f) formats: tracts.csv and tracts.geojson row for row, and the features of tracts.pmtiles
    (its lowest zoom) attribute for attribute, hold the values of tracts.parquet, and its
    polygons (one per GEOID): the GeoJSON's within GEOMETRY_TOLERANCE_DEGREES, the tiles'
    within TILE_TOLERANCE_UNITS of their lowest zoom's grid (:func:`tile_distance`).
(l) levels: a release with county or state levels (manifest ``levels``) has each level's
    budget steps ("level county: NoisyStats", "level county: interval") in the budget, so in
    the per-person total (d) recomposes, with the epsilons the level states; counties.* and
    states.* listed in ``files``; every column public or paid by the level's own steps; the
    table rules of (e) (values where released, suppression by n < min_n, reasons, intervals,
    standard errors); epsilon_spent / delta_spent where spent the charge of the level's own
    steps (not the per-person total); n per unit the sum of its tracts' n; the CSV and GeoJSON
    (and the level's vector tiles ``counties.pmtiles``/``states.pmtiles``, when listed, at
    their lowest zoom) holding the parquet's values and polygons, each unit's polygon the
    union of its tracts' in tracts.parquet; and no level file without its level.
(m) small_area: model-based tract columns (``p25_model``, ``_lo``, ``_hi``, ``_se``, ``_z``, and
    p75's) are there exactly with the manifest's ``small_area`` section and are declared
    post-processing (no budget step); the model is re-fitted from the published files alone
    (tracts.parquet with its geometry, counties.parquet, states.parquet) by
    ``dpatlas.small_area`` (the one package of ours the audit imports; it imports nothing of
    ours; it reads the tracts with geopandas), and every published model
    value must be within one rounding step of the re-fit, with the fits' σ² and β as stated;
    the z columns (the direct against the model) finite exactly where a direct is.
(n) names: every published ``name`` (tracts, counties, states) is the Census-style name
    recomputed from its GEOID and public reference geography (dpatlas/audit/names.py).

External anchors, run only when given (otherwise a ``skip`` line says what was not checked):
``--boundaries FILE`` (the boundary file whose sha256 the manifest states has every tract
exactly once per cell in the table: no row deleted; and every polygon of tracts.parquet,
tracts.geojson and tracts.pmtiles is its boundary tract's, within the tolerances of (f)) and
``--ledger URL`` (the ledger charged this release id exactly what its steps cost, recorded
this manifest's sha256 as published, and the dataset's spend, zCDP charges composed as rho
(:func:`lifetime_spend`), is within its cap; SQLite or PostgreSQL, read only).

A synthetic-microdata folder (``dpatlas synthesize``, manifest ``kind: synthetic
microdata``) gets the same files, mode, machine-path, relations, noise and totals checks, and
instead of (b) and (e): its rows have exactly the columns GEOID, cell, bin_lo, bin_hi, x, y
(no person ids), 11-digit GEOIDs, the manifest's cells and counts, finite values, and the CSV
holds the same rows.

``main(folder)`` prints one line per check and returns 0 (every check passed), 1 (a check
failed), 2 (the folder, its manifest or an anchor cannot be read) or 3 (every check passed
but the release is a test release, mode test or seeded noise: its mode line reads TEST; pass
``allow_test`` / ``--allow-test`` to accept it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import stat
import statistics
import struct
import sys
import zlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pyarrow.parquet as pq

try:
    from dpatlas.audit import names
except ImportError:  # audit.py run alone, its names.py beside it (no dpatlas package)
    import names  # type: ignore[no-redef]

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024   # refused before reading: manifests are ~100 kB
MAX_JSON_DEPTH = 64                     # ours nest 8 deep; deeper is refused, not recursed
MAX_GEOJSON_BYTES = 1 << 33  # the published GeoJSON of a national release is a few GB
CONFIG = "config.json"
SYNTHETIC_KIND = "synthetic microdata"
SYNTHETIC_PARQUET, SYNTHETIC_CSV = "synthetic.parquet", "synthetic.csv"
SYNTHETIC_COLUMNS = ["GEOID", "cell", "bin_lo", "bin_hi", "x", "y"]
REL_TOL = 1e-9
RANDOM_BITS = ("os.urandom", "seeded (test only, NOT FOR RELEASE)")
RANDOM_BITS_MIXED = "mixed (NOT FOR RELEASE): "  # draws from several sources (test mode only)
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
    test: bool = False                  # a test release: its mode line reads TEST
    skipped: list[tuple[str, str]] = field(default_factory=list)  # anchors not given

    def lines(self) -> list[str]:
        def mark(name, good):
            if not good:
                return "FAIL"
            return "TEST" if self.test and name == "mode" else "ok  "
        return [f"{mark(name, good)}  {name}: {detail}" for name, good, detail in self.checks] \
            + [f"skip  {name}: {why}" for name, why in self.skipped]


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
        if kind := not_regular(path):
            problems.append(f"{name} is {kind}, not a regular file: not read")
        elif not path.is_file():
            problems.append(f"{name} missing")
        elif path.stat().st_size != info.get("bytes"):
            problems.append(f"{name} has {path.stat().st_size} bytes, manifest says "
                            f"{info.get('bytes')}")
        elif _sha256(path) != info.get("sha256"):
            problems.append(f"{name} sha256 differs from the manifest")
    extra = sorted(p.name for p in folder.iterdir() if p.name not in files and p.name != MANIFEST)
    if extra:
        problems.append(f"files not in the manifest: {extra}")
    odd = [f"{name} ({kind})" for name in extra if (kind := not_regular(folder / name))]
    if odd:
        problems.append(f"not regular files, not read: {', '.join(odd)}")
    required = ((SYNTHETIC_PARQUET, SYNTHETIC_CSV, CONFIG) if _synthetic(m)
                else ("tracts.parquet", CONFIG))
    for required in required:
        if required not in files:
            problems.append(f"{required} is not listed")
    if problems:
        raise Mismatch("; ".join(problems))
    return f"{len(files)} files match their sha256 and size; no other files"


def _json_object(path: Path, name: str, error: type[Exception],
                 limit: int = MAX_MANIFEST_BYTES) -> dict:
    """The JSON object in ``path``; ``error`` (with ``name`` in the message) if there is none,
    if the file is over ``limit`` bytes (refused before reading) or nests too deeply."""
    try:
        size = readable(path).stat().st_size
        if size > limit:
            raise error(f"{name} is {size:,} bytes, over the {limit:,} this audit reads")
        with open(path, "rb") as fh:
            # its size, not the limit: read(n) sets n bytes aside before it reads
            raw = fh.read(size + 1)
        if len(raw) > limit:
            raise error(f"{name} grew past the {limit:,} bytes this audit reads")
        obj = json.loads(raw)
    except (OSError, ValueError) as err:
        raise error(f"{name} cannot be read: {err}") from None
    except RecursionError:
        raise error(f"{name} nests too deeply to read") from None
    if json_depth_exceeds(obj, MAX_JSON_DEPTH):
        raise error(f"{name} nests deeper than {MAX_JSON_DEPTH} levels")
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
    mixed = isinstance(bits, str) and bits.startswith(RANDOM_BITS_MIXED)  # from the draw log
    if bits not in RANDOM_BITS and not mixed:
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
    in_files, n_read = _published_machine_paths(folder, m)
    bad += in_files
    if bad:
        raise Mismatch(f"{len(bad)} machine path(s), e.g. {bad[0]}")
    return (f"no absolute path or URL in manifest.json or config.json, no machine path in the "
            f"{n_read} other published file(s) read as text (tile and Parquet metadata too)")


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
    conv = budget.get("conversion_delta") or 0.0
    if not _is_number(conv) or not 0 <= conv < 1:
        raise Mismatch(f"conversion_delta {conv!r} is not a delta in [0, 1)")
    conv = float(conv)
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
    if "guarantee" in total or not _synthetic(m):
        stated_total = guarantee_from(total.get("guarantee"))
        if not same_guarantee(combined, stated_total):
            problems.append(f"total per person: recomposed {combined.text()}, stated "
                            f"{stated_total.text()}")
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
        df = pq.read_table(readable(folder / "tracts.parquet")).to_pandas()
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
    small = df["n"].astype(int) < int(m["min_n"])
    if (small != suppressed).any():
        problems.append(f"suppression is not 'n < min_n = {m['min_n']}' in "
                        f"{int((small != suppressed).sum())} row(s): it must depend on the "
                        "public n only")
    if (df.loc[suppressed, "mechanism"] != "none").any():
        problems.append("suppressed rows name a mechanism")
    problems += _mechanism_and_reason_problems(df, m)
    problems += _interval_value_problems(df, released)
    problems += _standard_error_problems(df, m)
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


def _expected_reasons(df, m: dict):
    """The reason each row must give: '' where released; the public n where suppressed; the
    mechanism's own DP failure where failed (None: any of FAILURE_REASONS[mechanism])."""
    status, n = df["status"].astype(str), df["n"].astype(int)
    want = np.where(status == "released", "", None).astype(object)
    suppressed = (status == "suppressed").to_numpy()
    want[suppressed] = np.where(n[suppressed] == 0, NO_RECORDS,
                                f"fewer than {int(m['min_n'])} records")
    return want


def _mechanism_and_reason_problems(df, m: dict) -> list[str]:
    problems = []
    status = df["status"].astype(str).to_numpy()
    mech = df["mechanism"].astype(str).to_numpy()
    reason = df["reason"].fillna("").astype(str).to_numpy()
    ran = status != "suppressed"
    bad_mech = ran & ~np.isin(mech, PRIMARY_MECHANISMS)
    if bad_mech.any():
        problems.append(f"mechanism must be one of {list(PRIMARY_MECHANISMS)} where a tract "
                        f"ran: {sorted(set(mech[bad_mech]))}")
    rule = m["selection"]
    if rule.get("rule") == "public" and isinstance(rule.get("threshold"), (int, float)):
        by_n = np.where(df["n"].astype(float).to_numpy() >= rule["threshold"], "NoisyStats",
                        "DPExpTheilSen")
        if (ran & (mech != by_n)).any():
            problems.append("the public rule's mechanism is not 'NoisyStats if n >= threshold'")
    want = _expected_reasons(df, m)
    fixed = np.array([w is not None for w in want])
    wrong = fixed & (reason != np.array(["" if w is None else w for w in want], dtype=object))
    failed = status == "failed"
    allowed = np.array([r in FAILURE_REASONS.get(k, ()) for r, k in zip(reason, mech)])
    wrong |= failed & ~allowed
    if wrong.any():
        i = int(np.argmax(wrong))
        problems.append(f"{int(wrong.sum())} row(s) give a reason that is not theirs (released: "
                        f"none; suppressed: 'fewer than {m['min_n']} records' or "
                        f"'{NO_RECORDS}'; failed: {FAILURE_REASONS}), e.g. {reason[i]!r} "
                        f"where {status[i]}")
    return problems


def _interval_value_problems(df, released) -> list[str]:
    cols = [c for c in (*INTERVAL_COLUMNS, *SE_COLUMNS, *MOE90_COLUMNS) if c in df.columns]
    if not cols:
        return []
    problems = []
    values = df[cols].astype(float)
    unpaid = values[~released].notna().any(axis=1)
    if unpaid.any():
        problems.append(f"{int(unpaid.sum())} row(s) not released (nothing spent on an "
                        "interval) carry interval values")
    if len(cols) == len(INTERVAL_COLUMNS):
        r = df.loc[released]
        for p in ("p25", "p75"):
            lo, hi, v = r[f"{p}_lo"].astype(float), r[f"{p}_hi"].astype(float), r[p]
            has = lo.notna() & hi.notna()
            bad = has & ~((lo >= 0) & (lo <= v) & (v <= hi) & (hi <= 1))
            if bad.any():
                problems.append(f"{int(bad.sum())} {p} interval(s) do not hold the released "
                                f"{p} inside [0, 1]")
    return problems


# Publish rounds released values to 4 decimals, standard errors up (dpatlas/publication/tract_files.py): a
# fixed rule here, not the manifest's word, so a forger cannot widen the tolerance.
SE_ROUNDING_STEP = 1e-4


def interval_standard_error(lo, hi, level: float):
    """The interval-implied standard error (hi − lo)/(2z), z the standard normal quantile at
    (1 + level)/2 (docs/uncertainty.md section 5)."""
    z = statistics.NormalDist().inv_cdf((1.0 + level) / 2.0)
    return (np.asarray(hi, dtype=float) - np.asarray(lo, dtype=float)) / (2.0 * z)


# The one estimand's identifier (mechanisms/estimand.py ESTIMAND_ID), its SE cap and the 90%
# margin's z: fixed rules here, not the manifest's word (the audit imports nothing of ours).
ESTIMAND_ID = "tract expected outcome"
SE_CAP = 0.5
MOE90_Z = 1.6448536269514722


def _standard_error_problems(df, m: dict) -> list[str]:
    """Each published standard error is finite and in [0, SE_CAP] exactly where its row's
    interval is, NaN elsewhere (up to manifest version 3 it was the interval's (hi − lo)/(2z),
    rounded up by less than one step, and is checked so); each 90% margin of error is there
    exactly where its SE is and is ceil(MOE90_Z·se·10⁴)/10⁴."""
    pairs = [p for p in ("p25", "p75") if f"{p}_se" in df.columns
             and {f"{p}_lo", f"{p}_hi"} <= set(df.columns)]
    level = (m.get("intervals") or {}).get("level")
    if not pairs or isinstance(level, bool) or not isinstance(level, (int, float)) \
            or not 0 < level < 1:
        return []  # columns without intervals or a level: the columns check reports it
    problems, geoid = [], df["geoid"].astype(str).to_numpy()

    def report(wrong, what: str, values, want=None) -> None:
        if wrong.any():
            i = int(np.argmax(wrong))
            problems.append(f"{int(wrong.sum())} {what}, e.g. {geoid[i]}: {values[i]!r}"
                            + ("" if want is None else f" for {want[i]!r}"))

    for p in pairs:
        lo, hi = df[f"{p}_lo"].astype(float).to_numpy(), df[f"{p}_hi"].astype(float).to_numpy()
        se = df[f"{p}_se"].astype(float).to_numpy()
        has = ~np.isnan(lo) & ~np.isnan(hi)
        with np.errstate(invalid="ignore"):
            fine = np.isfinite(se) & (se >= 0) & (se <= SE_CAP)
        report(has & ~fine, f"{p}_se value(s) where the interval is published are not finite "
                            f"in [0, {SE_CAP:g}]", se)
        report(~has & ~np.isnan(se), f"{p}_se value(s) where no interval is published", se)
        if m.get("manifest_version") in (2, 3):
            want = interval_standard_error(lo, hi, float(level))
            wrong = has & ~((se >= want - FLOAT_ATOL)
                            & (se <= want + SE_ROUNDING_STEP + FLOAT_ATOL))
            report(wrong, f"{p}_se value(s) are not ({p}_hi - {p}_lo)/(2z) at level "
                          f"{level:g} rounded up to 4 decimals", se, want)
        if f"{p}_moe90" in df.columns:
            moe = df[f"{p}_moe90"].astype(float).to_numpy()
            report(np.isnan(moe) != np.isnan(se), f"{p}_moe90 value(s) are not there exactly "
                                                   f"where {p}_se is", moe)
            want = np.ceil(MOE90_Z * se * 1e4) / 1e4
            with np.errstate(invalid="ignore"):
                wrong = ~np.isnan(moe) & ~np.isnan(se) & ~(np.abs(moe - want) <= FLOAT_ATOL)
            report(wrong, f"{p}_moe90 value(s) are not ceil({MOE90_Z:.4f}·{p}_se, 4 decimals)",
                   moe, want)
    return problems


def _synthetic(m: dict) -> bool:
    return m.get("kind") == SYNTHETIC_KIND


def check_synthetic_table(folder: Path, m: dict) -> str:
    try:
        df = pq.read_table(readable(folder / SYNTHETIC_PARQUET)).to_pandas()
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
        n_csv = sum(1 for _ in open(readable(folder / SYNTHETIC_CSV))) - 1
        header = open(readable(folder / SYNTHETIC_CSV)).readline().strip().split(",")
    except OSError as err:
        raise Mismatch(f"{SYNTHETIC_CSV} cannot be read: {err}") from None
    if header != SYNTHETIC_COLUMNS or n_csv != len(df):
        problems.append(f"{SYNTHETIC_CSV} has columns {header} and {n_csv} rows, the Parquet "
                        f"file {SYNTHETIC_COLUMNS} and {len(df)}")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{len(df)} rows in {geoid.nunique()} tracts; columns {SYNTHETIC_COLUMNS} only; "
            "CSV agrees")


# ----------------------------------------------------------------------- schema (version 2)

# 3: the tract tables carry p25_se, p75_se with the intervals; 4: one estimand, declared by
# every value, interval, SE, margin-of-error and model column (ESTIMAND_ID).
MANIFEST_VERSIONS = (2, 3, 4)
# Release ids (dpatlas/core/ids.py): 1-64 of A-Z a-z 0-9 . _ -, not a name the publish root uses.
RELEASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RESERVED_IDS = frozenset({"latest", "feed", "index", "collection", "catalog", "tiles", "map",
                          "config", "manifest"})
RESERVED_ID_PREFIXES = ("feed.", "latest.", "index.", "collection.", "catalog.")
RESERVED_ID_SUFFIXES = (".json", ".atom", ".xml", ".html", ".tmp", ".lock", ".pmtiles")
# A PEP 440 release (dpatlas's package version), and a git commit (or none: not a checkout).
PACKAGE_VERSION = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?"
                             r"(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?")
GIT_COMMIT = re.compile(r"[0-9a-f]{40}")
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")

# Columns published without noise (public under the replace-one relation; status is a
# function of the public n and of DP outputs). Everything else must be paid for.
PUBLIC_COLUMNS = ("geoid", "state", "county", "name", "cell", "n", "status", "geometry")
PUBLIC_VALUES = ["n (records per tract and cell)", "tract boundaries"]
# The `public` section: what the guarantee does not protect (docs/threat-model.md).
PUBLIC_SECTION_KEYS = ("neighbours", "membership", "counts", "columns", "existence", "validity",
                       "input", "timing", "confidential", "threat_model")
N_IS_PUBLIC = "n per tract and cell is public"
# What each statement of the `public` section must say (its fixed meaning).
PUBLIC_SECTION_WORDS = {"neighbours": ("replace-one",), "membership": ("tract", "cell"),
                        "counts": ("n per tract and cell",),
                        "existence": ("depends on the data",),
                        "validity": ("drop", "valid", "public"),
                        "input": ("commitment", "key", "internal"),
                        "timing": ("not protected", "rounded to the day"),
                        "confidential": ("Prefect", "internal folder"),
                        "threat_model": ("docs/threat-model.md",)}

# The input is committed to, never hashed in the clear (dpatlas.release.manifest.input_commitment).
INPUT_COMMITMENT_SCHEME = "hmac-sha256"

# Required fields of a release manifest and their JSON types (None: null allowed).
REQUIRED_FIELDS: dict[str, tuple] = {
    "manifest_version": (int,), "release_id": (str,), "mode": (str,), "started": (str,),
    "published": (str,), "code_version": (dict,), "config_sha256": (str,),
    "config_file": (str,), "input_commitment": (dict,), "boundaries": (dict,),
    "privacy_unit": (str,), "neighbouring_relation": (str,),
    "public_values": (list,), "public": (dict,), "assumptions": (dict,), "profile": (str,),
    "selection": (dict,), "min_n": (int,), "budget": (dict,), "composition": (dict,),
    "cells": (list,), "total_per_person": (dict,), "counts": (dict,),
    "published_columns": (dict,), "intervals": (dict, type(None)),
    "noise_sampler": (dict,), "ledger_entry": (dict,), "files": (dict,),
}
SYNTHETIC_REQUIRED_FIELDS: dict[str, tuple] = {
    "release_id": (str,), "mode": (str,), "created": (str,), "code_version": (dict,),
    "min_n": (int,), "budget": (dict,), "cells": (list,), "total_per_person": (dict,),
    "counts": (dict,), "noise_sampler": (dict,), "ledger_entry": (dict,), "files": (dict,),
}


def json_depth_exceeds(obj, limit: int) -> bool:
    """Whether ``obj`` nests deeper than ``limit`` (iteratively: no recursion to exhaust)."""
    stack = [(obj, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                   else item))
    return False


def release_id_problem(value) -> str | None:
    """Why ``value`` is not a release id (the rule of dpatlas/core/ids.py), or None."""
    if not isinstance(value, str) or not RELEASE_ID.fullmatch(value):
        return f"release_id {value!r} is not 1-64 characters of A-Z a-z 0-9 . _ -"
    low = value.lower()
    if low in RESERVED_IDS or low.startswith(RESERVED_ID_PREFIXES) \
            or low.endswith(RESERVED_ID_SUFFIXES):
        return f"release_id {value!r} is a name the publish root reserves"
    return None


def _day(value, what: str) -> str:
    """The UTC day of a manifest time: a date, or an ISO-8601 time (manifests before the
    times were rounded to the day)."""
    import datetime as dt

    if not isinstance(value, str):
        raise Mismatch(f"{what} {value!r} is not a date")
    try:
        if DAY.fullmatch(value):
            return dt.date.fromisoformat(value).isoformat()
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise Mismatch(f"{what} {value!r} is not a valid date") from None
    if t.tzinfo is None:
        raise Mismatch(f"{what} {value!r} has no time zone")
    return t.astimezone(dt.timezone.utc).date().isoformat()


def _code_version_problem(cv) -> str | None:
    if not isinstance(cv, dict) or set(cv) != {"package", "git_commit"}:
        return f"code_version {cv!r} is not {{package, git_commit}}"
    pkg, commit = cv["package"], cv["git_commit"]
    if not isinstance(pkg, str) or not (pkg == "unknown" or PACKAGE_VERSION.fullmatch(pkg)):
        return f"code_version.package {pkg!r} is not a version"
    if commit is not None and not (isinstance(commit, str) and GIT_COMMIT.fullmatch(commit)):
        return f"code_version.git_commit {commit!r} is not a 40-digit git commit"
    return None


def _required_problems(m: dict, required: dict[str, tuple]) -> list[str]:
    problems = []
    for key, types in required.items():
        if key not in m:
            problems.append(f"{key} missing")
        elif isinstance(m[key], bool) or not isinstance(m[key], types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            problems.append(f"{key} is {type(m[key]).__name__}, expected {wanted}")
    return problems


def _dates_problems(m: dict, keys: tuple[str, ...]) -> list[str]:
    import datetime as dt

    problems, days = [], {}
    for key in keys:
        try:
            days[key] = _day(m.get(key), key)
        except Mismatch as err:
            problems.append(str(err))
    tomorrow = (dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1)).isoformat()
    for key, day in days.items():
        if day > tomorrow:
            problems.append(f"{key} {day} is in the future")
    if len(days) == 2 and days["published"] < days["started"]:
        problems.append(f"published {days['published']} is before started {days['started']}")
    return problems


SHA256 = re.compile(r"[0-9a-f]{64}")
BOUNDARIES_HASHED_AS = ("file", "folder (relative names and contents)")


def _is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _release_field_problems(m: dict) -> list[str]:
    """Fields whose form is fixed: hashes, the config's name, the steps' parameters."""
    problems = []
    if m.get("config_file") != CONFIG:
        problems.append(f"config_file {m.get('config_file')!r} is not {CONFIG!r}")
    if "config_sha256" in m and not (isinstance(m["config_sha256"], str)
                                     and SHA256.fullmatch(m["config_sha256"])):
        problems.append(f"config_sha256 {m['config_sha256']!r} is not a sha256")
    if "input_sha256" in m:
        problems.append("input_sha256 is published: a plain hash of the confidential input is "
                        "a non-DP function of it (publish only input_commitment)")
    c = m.get("input_commitment")
    if isinstance(c, dict) and not (c.get("scheme") == INPUT_COMMITMENT_SCHEME
                                    and isinstance(c.get("value"), str)
                                    and SHA256.fullmatch(c["value"])):
        problems.append(f"input_commitment {c!r} is not an {INPUT_COMMITMENT_SCHEME} value")
    b = m.get("boundaries")
    if isinstance(b, dict):
        if not (isinstance(b.get("sha256"), str) and SHA256.fullmatch(b["sha256"])):
            problems.append(f"boundaries.sha256 {b.get('sha256')!r} is not a sha256")
        if b.get("hashed_as") not in BOUNDARIES_HASHED_AS:
            problems.append(f"boundaries.hashed_as {b.get('hashed_as')!r} is not one of "
                            f"{list(BOUNDARIES_HASHED_AS)}")
        if not isinstance(b.get("file"), str) or not isinstance(b.get("vintage"), str):
            problems.append("boundaries.file and boundaries.vintage must be text")
    budget = m.get("budget")
    for step in (budget.get("steps") or []) if isinstance(budget, dict) else []:
        if not isinstance(step, dict):
            problems.append("a budget step is not an object")
            continue
        eps, delta = step.get("epsilon_param"), step.get("delta_param")
        if not (_is_number(eps) and eps >= 0 and _is_number(delta) and 0 <= delta < 1):
            problems.append(f"step {step.get('step')!r}: epsilon_param {eps!r} / delta_param "
                            f"{delta!r} are not a budget")
        if step.get("estimator") is not None and step.get("step") != \
                f"suite: {step.get('estimator')}":
            problems.append(f"step {step.get('step')!r} names estimator "
                            f"{step.get('estimator')!r}")
    return problems


def check_schema(folder: Path, m: dict) -> str:
    """The manifest's version and required fields, its id (the folder's name), its dates and
    code version (see the module docstring, (s))."""
    if _synthetic(m):
        problems = _required_problems(m, SYNTHETIC_REQUIRED_FIELDS)
        problems += _dates_problems(m, ("created",))
    else:
        version = m.get("manifest_version")
        if version not in MANIFEST_VERSIONS or isinstance(version, bool):
            raise Mismatch(f"manifest_version {version!r} is not one this audit reads "
                           f"({', '.join(map(str, MANIFEST_VERSIONS))}): an older manifest "
                           "lacks required fields, a newer one needs a newer audit")
        problems = _required_problems(m, REQUIRED_FIELDS)
        problems += _dates_problems(m, ("started", "published"))
        # The folder's own name: `latest` (and any other link) names the folder it points to.
        name = folder.resolve().name
        if m.get("release_id") != name:
            problems.append(f"release_id {m.get('release_id')!r} is not the folder's name "
                            f"{name!r}")
        entry = m.get("ledger_entry")
        if isinstance(entry, dict) and entry.get("release_id") != m.get("release_id"):
            problems.append(f"ledger_entry.release_id {entry.get('release_id')!r} is not the "
                            f"release's {m.get('release_id')!r}")
        min_n = m.get("min_n")
        if isinstance(min_n, int) and not isinstance(min_n, bool) and min_n < 2:
            problems.append(f"min_n {min_n} < 2: a regression needs two records")
        problems += _release_field_problems(m)
    bad_id = release_id_problem(m.get("release_id"))
    if bad_id:
        problems.append(bad_id)
    if "code_version" in m:
        bad_cv = _code_version_problem(m["code_version"])
        if bad_cv:
            problems.append(bad_cv)
    if problems:
        raise Mismatch("; ".join(problems))
    if _synthetic(m):
        return f"synthetic manifest: required fields present; id {m['release_id']}"
    return (f"manifest_version {m['manifest_version']}: {len(REQUIRED_FIELDS)} required fields "
            f"present; id {m['release_id']} = folder; {m['started']} <= {m['published']}")


def check_public(folder: Path, m: dict) -> str:
    """What is public is stated with its fixed meaning: the public values, the `public`
    section (docs/threat-model.md), and the assumption that n is public."""
    problems = []
    if m.get("public_values") != PUBLIC_VALUES:
        problems.append(f"public_values {m.get('public_values')!r} != {PUBLIC_VALUES!r}")
    section = m.get("public")
    if not isinstance(section, dict):
        problems.append("no `public` section")
    else:
        if sorted(section) != sorted(PUBLIC_SECTION_KEYS):
            problems.append(f"`public` has keys {sorted(section)}, expected "
                            f"{sorted(PUBLIC_SECTION_KEYS)}")
        if section.get("columns") not in (list(PUBLIC_COLUMNS),
                                          list(names.PUBLIC_COLUMNS_BEFORE_NAMES)):
            problems.append(f"public.columns {section.get('columns')!r} != "
                            f"{list(PUBLIC_COLUMNS)!r}")
        empty = [k for k in PUBLIC_SECTION_KEYS if k != "columns"
                 and not (isinstance(section.get(k), str) and section[k].strip())]
        if empty:
            problems.append(f"`public` states nothing for {empty}")
        for key, words in PUBLIC_SECTION_WORDS.items():
            text = section.get(key)
            if isinstance(text, str) and text.strip() and not all(w in text for w in words):
                problems.append(f"public.{key} does not say {' / '.join(words)}")
    assumptions = m.get("assumptions")
    unverified = assumptions.get("unverified") if isinstance(assumptions, dict) else None
    if not isinstance(unverified, list) or not isinstance(assumptions.get("verified"), list):
        problems.append("assumptions must list `verified` and `unverified`")
    elif not any(isinstance(a, str) and a.startswith(N_IS_PUBLIC) for a in unverified):
        problems.append(f"the assumption {N_IS_PUBLIC!r} is not listed as unverified")
    elif not all(isinstance(a, str) and a.strip()
                 for a in unverified + assumptions["verified"]):
        problems.append("an assumption is not a text")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"public: {', '.join(PUBLIC_COLUMNS)} and the existence and timing of the release; "
            "n is public (unverified assumption)")


# ------------------------------------------------------------- sensitivities, derived here
#
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


# ------------------------------------------------------------- columns and their payers

SELECTION_STEP = "selection: noisy n*var(x)"
PRIMARY_STEP = "primary: p25 and p75"
INTERVAL_STEP = "interval: p25 and p75"
INTERVAL_COLUMNS = ("p25_lo", "p25_hi", "p75_lo", "p75_hi")
SE_COLUMNS = ("p25_se", "p75_se")  # post-processing of the interval step
MOE90_COLUMNS = ("p25_moe90", "p75_moe90")  # value ± moe90: 90% margins, from the SEs
SPEND_COLUMNS = ("epsilon_spent", "delta_spent")
PRIMARY_MECHANISMS = ("NoisyStats", "DPExpTheilSen")
# `reason` may say only these: where nothing ran, the public n; where a mechanism failed, the
# DP failure it reports (dpatlas/release/estimate.py, dpatlas/publication/tract_files.py, mechanisms/*). The primary
# mechanisms fail only by a DP output: NoisyStats when its noisy n·var(x) is not positive; the
# exponential-mechanism Theil–Sen never fails (its "no pairs with distinct x" is the
# non-private median's, which is not publishable).
NO_RECORDS = "no records"
FAILURE_REASONS = {"NoisyStats": ("noisy nvar <= 0",)}


def _suite_step(column: str) -> str | None:
    for end in ("_p25", "_p75"):
        if column.endswith(end) and column[:-len(end)] not in ("", "p25", "p75"):
            return f"suite: {column[:-len(end)]}"
    return None


def column_payer(column: str, m: dict) -> str | None:
    """What pays for a published column: 'public', a budget step's name, or a derivation
    from paid or public values; None if nothing does."""
    if column in PUBLIC_COLUMNS:
        return "public"
    if column in MODEL_COLUMNS:
        return MODEL_PAYER
    if column in VALUE_COLUMNS:
        return PRIMARY_STEP
    if column in INTERVAL_COLUMNS or column in SE_COLUMNS or column in MOE90_COLUMNS:
        return INTERVAL_STEP
    if column == "mechanism":
        return SELECTION_STEP if m["selection"]["rule"] == "dp" else "public (the rule and n)"
    if column == "reason":
        return "public (an enumerated reason)"
    if column in SPEND_COLUMNS:
        return "public (the budget, by status)"
    return _suite_step(column)


def check_columns(folder: Path, m: dict) -> str:
    """Every published column is paid for: public ones only from PUBLIC_COLUMNS; values by
    their budget step (interval columns by the interval step, whose epsilon the manifest's
    intervals section states)."""
    try:
        columns = pq.read_schema(readable(folder / "tracts.parquet")).names
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    steps = {s.get("step"): s for s in m["budget"]["steps"]}
    problems = []
    for column in columns:
        payer = column_payer(column, m)
        if payer is None:
            problems.append(f"{column!r} is paid for by no step (only {', '.join(PUBLIC_COLUMNS)} "
                            "may be public)")
        elif not payer.startswith(("public", MODEL_PAYER)) and payer not in steps:
            problems.append(f"{column!r} needs the budget step {payer!r}, which the budget "
                            "does not have")
    for key, text in m["published_columns"].items():
        declared = [c.strip() for c in str(key).split(",") if c.strip()]
        if isinstance(text, str) and text.strip().lower() == "public":
            extra = [c for c in declared if c not in PUBLIC_COLUMNS]
            if extra:
                problems.append(f"published_columns declares {extra} public; only "
                                f"{', '.join(PUBLIC_COLUMNS)} may be")
    problems += _interval_problems(m, columns, steps)
    problems += _model_column_problems(m, columns)
    declared = _estimand_declaration_problems(folder, m, columns)
    problems += declared
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{len(columns)} columns, each public or paid for by its budget step"
            + ("" if m.get("manifest_version") in (2, 3) else
               f"; every value, interval, SE and model column declares the {ESTIMAND_ID}"))


def _model_column_problems(m: dict, columns: list[str]) -> list[str]:
    """The model columns: all or none, exactly with the ``small_area`` section, declared in
    published_columns as post-processing (they have no budget step of their own)."""
    has = [c for c in MODEL_COLUMNS if c in columns]
    if not has:
        return ["a small_area section without the model columns"] if m.get("small_area") else []
    problems = []
    if len(has) != len(MODEL_COLUMNS):
        problems.append(f"model columns {has} without the rest of {list(MODEL_COLUMNS)}")
    if not isinstance(m.get("small_area"), dict):
        problems.append("model columns without the manifest's small_area section")
    declared = {c.strip(): text for key, text in m["published_columns"].items()
                for c in str(key).split(",")}
    for column in has:
        text = declared.get(column)
        if not (isinstance(text, str) and "post-processing" in text):
            problems.append(f"{column!r} is not declared in published_columns as "
                            "post-processing of published columns")
    return problems


def _estimand_columns(columns) -> list[str]:
    """The published columns that must declare the one estimand: the values, their intervals,
    standard errors and margins of error, and the model's estimates with theirs (a model
    diagnostic, such as a standardised difference, estimates nothing)."""
    model = [c for c in columns if c.startswith(("p25_model", "p75_model"))
             and c.endswith(("_model", "_lo", "_hi", "_se"))]
    return [c for c in columns if c in ("p25", "p75", *INTERVAL_COLUMNS, *SE_COLUMNS,
                                        *MOE90_COLUMNS)] + model


def _estimand_declaration_problems(folder: Path, m: dict, columns: list[str]) -> list[str]:
    """From manifest version 4: each value, interval, SE, margin and model column declares the
    one estimand (ESTIMAND_ID) where the release declares its columns, its manifest
    ``published_columns`` entry and, where published, its ``tracts.schema.json`` field."""
    if m.get("manifest_version") in (2, 3):
        return []  # published before the one estimand: they state the estimand per mechanism
    wanted = _estimand_columns(columns)
    declared = {c.strip(): text for key, text in m["published_columns"].items()
                for c in str(key).split(",")}
    problems = [f"{c!r} is not declared with the {ESTIMAND_ID} in published_columns"
                for c in wanted if ESTIMAND_ID not in str(declared.get(c, ""))]
    if "tracts.schema.json" in (m.get("files") or {}):
        try:
            schema = json.loads(readable(folder / "tracts.schema.json").read_text())
            fields = {f.get("name"): f.get("description") for f in schema["fields"]}
        except Exception as err:  # noqa: BLE001 - any reader error is a finding
            return problems + [f"tracts.schema.json cannot be read: {err}"]
        problems += [f"{c!r} is not declared with the {ESTIMAND_ID} in tracts.schema.json"
                     for c in wanted if ESTIMAND_ID not in str(fields.get(c, ""))]
    return problems


def _interval_problems(m: dict, columns: list[str], steps: dict) -> list[str]:
    has_columns = [c for c in INTERVAL_COLUMNS if c in columns]
    section, step = m["intervals"], steps.get(INTERVAL_STEP)
    if not has_columns and step is None and section is None:
        return []
    problems = []
    if has_columns and len(has_columns) != len(INTERVAL_COLUMNS):
        problems.append(f"interval columns {has_columns} without the rest of "
                        f"{list(INTERVAL_COLUMNS)}")
    problems += _standard_error_column_problems(m, columns, bool(has_columns))
    if not has_columns:
        problems.append("the interval step or section is there but no interval column is")
    if not isinstance(section, dict):
        problems.append("interval columns without the manifest's intervals section")
        return problems
    if step is None:
        return problems  # reported above, as a column without its step
    eps = section.get("epsilon")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not close(
            float(eps), float(step.get("epsilon_param", math.nan))):
        problems.append(f"intervals.epsilon {eps!r} is not the interval step's "
                        f"{step.get('epsilon_param')!r}")
    else:
        g = guarantee_from(step.get("guarantee"))
        if g.kind != "pure" or g.epsilon > float(eps) * (1 + REL_TOL):
            problems.append(f"intervals.epsilon {eps!r} is below its step's {g.text()}")
    level = section.get("level")
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        problems.append(f"intervals.level {level!r} is not in (0, 1)")
    return problems


def _standard_error_column_problems(m: dict, columns: list[str], intervals: bool) -> list[str]:
    """p25_se, p75_se: present exactly with the intervals, and declared in published_columns as
    post-processing of the interval step (they have no budget of their own)."""
    has = [c for c in SE_COLUMNS if c in columns]
    # Version 2 manifests predate the standard errors: their releases are audited as published.
    required = m.get("manifest_version") != 2
    margins = [c for c in MOE90_COLUMNS if c in columns]
    if margins and len(has) != len(SE_COLUMNS):
        return [f"margins of error {margins} without the standard errors {list(SE_COLUMNS)}"]
    if intervals and len(has) != len(SE_COLUMNS) and (required or has):
        return [f"interval columns without their standard errors {list(SE_COLUMNS)}"]
    if has and not intervals:
        return [f"standard errors {has} without the interval columns they are computed from"]
    problems = []
    for key, text in m["published_columns"].items():
        declared = {c.strip() for c in str(key).split(",")}
        if declared & {*has, *margins} and not (isinstance(text, str) and "post-processing" in text
                                        and f"'{INTERVAL_STEP}'" in text):
            problems.append(f"published_columns {key!r} must state them as post-processing of "
                            f"the step '{INTERVAL_STEP}'")
    return problems


# ------------------------------------------- formats: CSV, GeoJSON and PMTiles hold the table
#
# A small reader of what publish writes (dpatlas/publication/tiles.py runs tippecanoe): a PMTiles v3
# archive (a 127-byte header, directories of varint-coded entries, gzip'd), whose tiles are
# Mapbox Vector Tiles (protobuf, gzip'd). Standard library only.

PMTILES_HEADER = 127
MAX_PMTILES_ENTRIES = 1_000_000
# A directory or tile inflated to more than this is refused (a gzip bomb would exhaust the
# audit's memory): the largest tile of a national release at its lowest zoom is tens of MB.
MAX_UNPACKED_BYTES = 512 << 20


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 64 bits")


def _unpack(raw: bytes, compression: int) -> bytes:
    if compression == 2:  # one gzip member, inflated no further than MAX_UNPACKED_BYTES
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        out = inflate.decompress(raw, MAX_UNPACKED_BYTES + 1)
        if len(out) > MAX_UNPACKED_BYTES or inflate.unconsumed_tail:
            raise ValueError(f"a gzip'd directory or tile of more than {MAX_UNPACKED_BYTES:,} "
                             "bytes: not inflated")
        return out
    if compression == 1:
        return raw
    raise ValueError(f"compression {compression} is not supported (1 none, 2 gzip)")


def pmtiles_entries(raw: bytes) -> list[tuple[int, int, int, int]]:
    """A PMTiles v3 directory: (tile id, offset, length, run length) per entry."""
    n, pos = _varint(raw, 0)
    if n > MAX_PMTILES_ENTRIES:
        raise ValueError(f"a directory of {n} entries")
    columns = []
    for _ in range(3):  # tile id deltas, run lengths, lengths
        col = []
        for _ in range(n):
            v, pos = _varint(raw, pos)
            col.append(v)
        columns.append(col)
    deltas, runs, lengths = columns
    ids, offsets, last = [], [], 0
    for i in range(n):
        last += deltas[i]
        ids.append(last)
        v, pos = _varint(raw, pos)
        offsets.append(offsets[i - 1] + lengths[i - 1] if v == 0 and i > 0 else v - 1)
    return list(zip(ids, offsets, lengths, runs))


def _zoom_and_first_id(tile_id: int) -> tuple[int, int]:
    """A PMTiles tile id's zoom and the id of that zoom's first tile (ids run zoom by zoom,
    4**z tiles to zoom z)."""
    z, start = 0, 0
    while start + 4 ** z <= tile_id:
        start += 4 ** z
        z += 1
    return z, start


def _zoom_of(tile_id: int) -> int:
    return _zoom_and_first_id(tile_id)[0]


@contextlib.contextmanager
def _pmtiles_archive(path: Path) -> Iterator[tuple[dict, Callable[[int, int], bytes]]]:
    """A PMTiles v3 archive's header fields and a reader of its byte ranges, each range checked
    against the file's size (:func:`readable` refuses what is not a regular file within its
    read limit)."""
    with open(readable(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size

        def read(offset: int, length: int) -> bytes:
            if offset < 0 or length < 0 or offset + length > size:
                raise ValueError(f"a range {offset}+{length} past the archive's {size} bytes")
            fh.seek(offset)
            return fh.read(length)

        data = read(0, PMTILES_HEADER) if size >= PMTILES_HEADER else b""
        if len(data) < PMTILES_HEADER or data[:7] != b"PMTiles" or data[7] != 3:
            raise ValueError("not a PMTiles v3 archive")
        u64 = [int.from_bytes(data[i:i + 8], "little") for i in range(8, 96, 8)]
        yield ({"root": (u64[0], u64[1]), "metadata": (u64[2], u64[3]),
                "leaves": (u64[4], u64[5]), "tiles": (u64[6], u64[7]),
                "internal_compression": data[97], "tile_compression": data[98],
                "tile_type": data[99], "min_zoom": data[100], "max_zoom": data[101]}, read)


def pmtiles_tiles(path: Path, zoom: int | None = None) -> tuple[dict, list[bytes]]:
    """The header fields and the (decompressed) tiles of ``zoom`` (default: the archive's
    minimum zoom) of a PMTiles v3 archive."""
    header, entries = pmtiles_tile_entries(path, zoom)
    return header, [tile for _, _, tile in entries]


def pmtiles_tile_entries(path: Path, zoom: int | None = None
                         ) -> tuple[dict, list[tuple[int, int, bytes]]]:
    """The header fields and (tile id, run length, decompressed tile) of each directory entry
    of ``zoom`` (default: the minimum zoom) of a PMTiles v3 archive; a run of n stands for the
    n tiles from its id on. Only the header, the directories and those tiles are read, each
    range checked against the file's size (:func:`readable` refuses what is not a regular file
    within its read limit)."""
    with _pmtiles_archive(path) as (header, read):
        if header["tile_type"] != 1:
            raise ValueError(f"tile type {header['tile_type']} is not MVT")
        zoom = header["min_zoom"] if zoom is None else zoom
        tiles, pending = [], [(header["root"][0], header["root"][1], True)]
        while pending:
            offset, length, is_root = pending.pop()
            raw = _unpack(read(offset, length), header["internal_compression"])
            for tile_id, off, ln, run in pmtiles_entries(raw):
                if run == 0:  # a leaf directory
                    pending.append((header["leaves"][0] + off, ln, False))
                elif _zoom_of(tile_id) == zoom:
                    tile = read(header["tiles"][0] + off, ln)
                    tiles.append((tile_id, run, _unpack(tile, header["tile_compression"])))
    return header, tiles


def _protobuf(buf: bytes):
    """(field number, wire type, value) of each field of a protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not supported")
        yield number, wire, value


def _mvt_value(buf: bytes):
    for number, _, v in _protobuf(buf):
        if number == 1:
            return v.decode("utf-8")
        if number == 2:
            return struct.unpack("<f", v)[0]
        if number == 3:
            return struct.unpack("<d", v)[0]
        if number in (4, 5):
            return v - (1 << 64) if number == 4 and v >= 1 << 63 else v
        if number == 6:
            return (v >> 1) ^ -(v & 1)
        if number == 7:
            return bool(v)
    return None


def mvt_features(tile: bytes, layer_name: str = "tracts") -> list[dict]:
    """The attributes of every feature of one layer of a vector tile."""
    return [attributes for attributes, _, _, _ in mvt_layer_features(tile, layer_name)]


def mvt_layer_features(tile: bytes, layer_name: str = "tracts"):
    """(attributes, geometry type, encoded geometry, layer extent) of every feature of one
    layer of a vector tile (Mapbox Vector Tile 2.1: layer fields 1 name, 2 features, 3 keys,
    4 values, 5 extent; feature fields 2 tags, 3 type, 4 geometry)."""
    for number, _, layer in _protobuf(tile):
        if number != 3:
            continue
        name, keys, values, features, extent = None, [], [], [], 4096
        for f, _, v in _protobuf(layer):
            if f == 1:
                name = v.decode("utf-8")
            elif f == 2:
                features.append(v)
            elif f == 3:
                keys.append(v.decode("utf-8"))
            elif f == 4:
                values.append(_mvt_value(v))
            elif f == 5:
                extent = v
        if name != layer_name:
            continue
        for feature in features:
            tags, kind, geometry = [], 0, b""
            for f, wire, v in _protobuf(feature):
                if f == 2 and wire == 2:
                    pos = 0
                    while pos < len(v):
                        t, pos = _varint(v, pos)
                        tags.append(t)
                elif f == 3 and wire == 0:
                    kind = v
                elif f == 4 and wire == 2:
                    geometry = v
            yield ({keys[k]: values[i] for k, i in zip(tags[::2], tags[1::2])}, kind, geometry,
                   extent)


FLOAT_ATOL = 1e-9   # the formats print floats from the same float64 (shortest repr)


def _same_value(a, b, *, missing_is_empty: bool = False) -> bool:
    def blank(v):
        return v is None or (isinstance(v, float) and math.isnan(v)) or (
            missing_is_empty and v == "")
    if blank(a) or blank(b):
        return blank(a) and blank(b)
    if isinstance(a, (bool, np.bool_)) or isinstance(b, (bool, np.bool_)):
        return bool(a) == bool(b) and type(a) is type(b)
    if isinstance(a, (int, float, np.integer, np.floating)) and isinstance(
            b, (int, float, np.integer, np.floating)):
        return math.isclose(float(a), float(b), rel_tol=0, abs_tol=FLOAT_ATOL)
    return str(a) == str(b) and type(a) is type(b)


def _table_rows(folder: Path, stem: str = "tracts"
                ) -> tuple[list[str], dict[tuple[str, str], dict]]:
    table = pq.read_table(readable(folder / f"{stem}.parquet"))
    columns = [c for c in table.column_names if c != "geometry"]
    rows = table.select(columns).to_pylist()
    return columns, {(r["geoid"], r["cell"]): r for r in rows}


def _csv_rows(folder: Path, columns: list[str], kinds: dict,
              stem: str = "tracts") -> tuple[list[str], list[dict]]:
    import csv

    with open(readable(folder / f"{stem}.csv"), newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, [])
        rows = []
        for cells in reader:
            row = {}
            for name, text in zip(header, cells):
                kind = kinds.get(name)
                if text == "" and kind != "string":
                    row[name] = None
                elif kind == "integer":
                    row[name] = int(text)
                elif kind == "number":
                    row[name] = float(text)
                else:
                    row[name] = text
            rows.append(row)
    return header, rows


def _kinds(folder: Path, stem: str = "tracts") -> dict[str, str]:
    import pyarrow as pa

    kinds = {}
    for f in pq.read_schema(readable(folder / f"{stem}.parquet")):
        kinds[f.name] = ("integer" if pa.types.is_integer(f.type) else "number"
                         if pa.types.is_floating(f.type) else "string")
    return kinds


def _compare(fmt: str, rows: list[dict], table: dict, columns: list[str], *,
             exact_columns: bool, missing_is_empty: bool = False,
             complete: bool = True, reference: str = "tracts.parquet") -> list[str]:
    problems, seen, differing = [], set(), {}
    for row in rows:
        key = (row.get("geoid"), row.get("cell"))
        ref = table.get(key)
        if ref is None:
            problems.append(f"{fmt} has a row {key} the table has not")
            continue
        seen.add(key)
        extra = sorted(set(row) - set(columns))
        if extra:
            problems.append(f"{fmt} has columns the table has not: {extra}")
            break
        for c in columns:
            if c not in row and not exact_columns:
                got = None  # tippecanoe omits attributes whose value is null
            elif c not in row:
                problems.append(f"{fmt} lacks column {c!r}")
                return problems
            else:
                got = row[c]
            if not _same_value(ref[c], got, missing_is_empty=missing_is_empty):
                # a dict keyed by row: vector tiles repeat a feature in every tile it crosses
                differing.setdefault(c, {})[key] = key[0]
    for c, geoids in differing.items():
        problems.append(f"{fmt}: {c} differs from {reference} in {len(geoids)} row(s), "
                        f"e.g. {next(iter(geoids.values()))}")
    if complete and len(seen) != len(table):
        problems.append(f"{fmt} has {len(seen)} of the table's {len(table)} rows")
    return problems


def check_formats(folder: Path, m: dict) -> str:
    """Every format holds the table's values: CSV and GeoJSON row for row, the PMTiles
    archive's features (at its lowest zoom) attribute for attribute; and the table's polygons:
    the GeoJSON's within its coordinate precision, the tiles' within their grid's tolerance
    (:func:`format_geometry_problems`)."""
    try:
        columns, table = _table_rows(folder)
        kinds = _kinds(folder)
        reference, problems = _reference_by_geoid(
            "tracts.parquet", *parquet_geometries(folder / "tracts.parquet"))
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    try:
        header, rows = _csv_rows(folder, columns, kinds)
        if header != columns:
            problems.append(f"tracts.csv has columns {header}, the table {columns}")
        else:
            problems += _compare("tracts.csv", rows, table, columns, exact_columns=True,
                                 missing_is_empty=True)
    except (OSError, ValueError, UnicodeDecodeError) as err:
        problems.append(f"tracts.csv cannot be read: {err}")
    try:
        features = _json_object(folder / "tracts.geojson", "tracts.geojson", Mismatch,
                                MAX_GEOJSON_BYTES).get("features")
        rows = [f.get("properties") or {} for f in features or ()]
        problems += _compare("tracts.geojson", rows, table, columns, exact_columns=True)
        problems += format_geometry_problems("tracts", reference, "tracts.parquet",
                                             features=features or [])
    except (Mismatch, AttributeError, TypeError) as err:
        problems.append(f"tracts.geojson cannot be read: {err}")
    n_tiles, n_shown = 0, 0
    if (folder / "tracts.pmtiles").exists() or "tracts.pmtiles" in m.get("files", {}):
        try:
            header, entries = pmtiles_tile_entries(folder / "tracts.pmtiles")
            n_tiles = len(entries)
            rows = [f for _, _, t in entries for f in mvt_features(t)]
            problems += _compare("tracts.pmtiles", rows, table, columns, exact_columns=False,
                                 complete=False)
            problems += format_geometry_problems("tracts", reference, "tracts.parquet",
                                                 tiles=(header, entries), layer="tracts")
            shown = {(r.get("geoid"), r.get("cell")) for r in rows}
            n_shown = len(shown & set(table))
            if not shown:
                problems.append("tracts.pmtiles has no features at its lowest zoom")
        except (OSError, ValueError, IndexError, UnicodeDecodeError, EOFError, zlib.error,
                struct.error) as err:
            problems.append(f"tracts.pmtiles cannot be read: {type(err).__name__} {err}")
    if problems:
        raise Mismatch("; ".join(problems))
    # Tiles may leave out a polygon too small to draw at the lowest zoom (tippecanoe's tiny
    # polygon reduction), so the rows shown are counted, not required.
    return (f"tracts.csv and tracts.geojson hold the values of tracts.parquet ({len(table):,} "
            f"rows, {len(columns)} columns), and so do the {n_shown:,} rows tracts.pmtiles "
            f"shows at its lowest zoom ({n_tiles} tile(s)); the GeoJSON's and the tiles' "
            "polygons are the table's (within tolerance)")


# ------------------------------------------------- levels: county and state tables (issue 20)
#
# A county is the tract GEOID's first 5 digits, a state its first 2; each level publishes
# NoisyStats on its units' pooled records, paid by budget steps of its own that compose
# sequentially with the tract's (a person is in one tract, one county and one state): the
# totals check recomposes every step of the budget, so a level step is in the per-person total
# exactly when it is in budget.steps, which this check requires of every level's steps.

LEVEL_DIGITS = {"county": 5, "state": 2}
LEVEL_STEMS = {"county": "counties", "state": "states"}
LEVEL_MECHANISM = "NoisyStats"
LEVEL_PUBLIC_COLUMNS = ("geoid", "level", "state", "county", "name", "cell", "n", "status",
                        "geometry")


def level_step_names(level: str) -> tuple[str, str]:
    """(estimate step, interval step) of a level, as the pipeline names them."""
    return f"level {level}: {LEVEL_MECHANISM}", f"level {level}: interval"


def level_column_payer(column: str, level: str) -> str | None:
    estimate, interval = level_step_names(level)
    if column in LEVEL_PUBLIC_COLUMNS and (column != "county" or level == "county"):
        return "public"
    if column in VALUE_COLUMNS:
        return estimate
    if column in INTERVAL_COLUMNS or column in SE_COLUMNS or column in MOE90_COLUMNS:
        return interval
    if column in ("mechanism", "reason") or column in SPEND_COLUMNS:
        return "public (the level's one mechanism, the public n and its DP failure)"
    return None


def _level_file_names(level: str) -> list[str]:
    stem = LEVEL_STEMS[level]
    return [f"{stem}.parquet", f"{stem}.geojson", f"{stem}.csv", f"{stem}.schema.json"]


def _tract_n_by_unit(folder: Path, digits: int) -> dict[tuple[str, str], int]:
    """n per (unit, cell) summed over the tracts of tracts.parquet (public values)."""
    t = pq.read_table(readable(folder / "tracts.parquet"),
                  columns=["geoid", "cell", "n"]).to_pydict()
    out: dict[tuple[str, str], int] = {}
    for geoid, cell, n in zip(t["geoid"], t["cell"], t["n"]):
        key = (str(geoid)[:digits], str(cell))
        out[key] = out.get(key, 0) + int(n)
    return out


def _level_step_problems(level: str, sec: dict, steps: dict, m: dict) -> list[str]:
    """The level's steps are the pipeline's, all in the budget (hence in the totals), each
    drawing NoisyStats noise, with the epsilons the section states."""
    estimate, interval = level_step_names(level)
    with_interval = bool(sec.get("interval_epsilon"))
    want = [estimate] + ([interval] if with_interval else [])
    problems = []
    if list(sec.get("steps") or ()) != want:
        problems.append(f"level {level}: steps {sec.get('steps')!r}, expected {want}")
    for name, key in ((estimate, "estimate_epsilon"), (interval, "interval_epsilon")):
        if name not in want:
            continue
        step = steps.get(name)
        if step is None:
            problems.append(f"level {level}: its step {name!r} is not in the budget (so not "
                            "in the per-person total): its values are paid by nothing")
            continue
        alts = sorted(((step.get("noise") or {}).get("alternatives") or {}))
        if alts != [LEVEL_MECHANISM]:
            problems.append(f"level {level}: step {name!r} draws {alts}, not "
                            f"{LEVEL_MECHANISM}'s noise")
        g, param = guarantee_from(step.get("guarantee")), step.get("epsilon_param")
        if not (_is_number(param) and close(float(param), float(sec.get(key, math.nan)))):
            problems.append(f"level {level}: {key} {sec.get(key)!r} is not its step's "
                            f"epsilon_param {param!r}")
        elif g.kind != "pure" or g.epsilon > float(param) * (1 + REL_TOL):
            problems.append(f"level {level}: step {name!r} spends {g.text()}, over its "
                            f"{key} {param!r}")
    spent = math.fsum(float(sec.get(k) or 0.0) for k in ("estimate_epsilon", "interval_epsilon"))
    if not close(spent, float(sec.get("epsilon", math.nan))):
        problems.append(f"level {level}: epsilon {sec.get('epsilon')!r} is not its steps' "
                        f"{spent:.12g}")
    return problems


def _level_steps_charge(sec: dict, steps: dict, m: dict) -> tuple[float, float]:
    """The (ε, δ) the level's own steps (``sec["steps"]``) charge per unit and cell, as the
    totals check charges a step (a step missing from the budget charges nothing here: the
    step check reports it). Versions 2 and 3 stated the per-person total there (issue 33)."""
    if m.get("manifest_version") in (2, 3):  # their rule: a level row stated the total
        return tuple(float(m["budget"][f"{w}_per_tract_and_cell"]) for w in ("epsilon", "delta"))
    conv = float(m["budget"].get("conversion_delta") or 0.0)
    charged = [_charged(guarantee_from(steps[name]["guarantee"]), conv)
               for name in sec.get("steps") or () if name in steps]
    return math.fsum(e for e, _ in charged), math.fsum(d for _, d in charged)


def _level_table_problems(folder: Path, level: str, sec: dict, steps: dict,
                          m: dict) -> list[str]:
    stem, digits = LEVEL_STEMS[level], LEVEL_DIGITS[level]
    df = pq.read_table(readable(folder / f"{stem}.parquet")).to_pandas()
    problems = []
    for column in df.columns:
        payer = level_column_payer(column, level)
        if payer is None:
            problems.append(f"{stem}.parquet: column {column!r} is paid for by no step")
        elif not payer.startswith("public") and payer not in (sec.get("steps") or ()):
            problems.append(f"{stem}.parquet: column {column!r} needs the step {payer!r}, "
                            f"which level {level} does not have")
    declared = {c.strip() for key in (sec.get("published_columns") or {})
                for c in str(key).split(",") if c.strip()}
    if set(df.columns) - declared:
        problems.append(f"{stem}.parquet: columns not in levels.{level}.published_columns: "
                        f"{sorted(set(df.columns) - declared)}")
    missing = sorted({"geoid", "level", "cell", "n", "mechanism", "status", "reason",
                      *SPEND_COLUMNS, *VALUE_COLUMNS} - set(df.columns))
    if missing:
        return problems + [f"{stem}.parquet: columns missing: {missing}"]
    geoid = df["geoid"].astype(str)
    if not geoid.str.fullmatch(f"[0-9]{{{digits}}}").all():
        problems.append(f"{stem}.parquet: GEOIDs not of {digits} digits")
    if not (df["level"].astype(str) == level).all():
        problems.append(f"{stem}.parquet: level is not {level!r} in every row")
    status = df["status"].astype(str)
    released, suppressed = status == "released", status == "suppressed"
    values = df[list(VALUE_COLUMNS)]
    if values[released].isna().any().any() or values[~released].notna().any().any():
        problems.append(f"{stem}.parquet: p25/p75 values are not exactly where released")
    for c in ("p25", "p75"):
        r = df.loc[released]
        if not np.allclose(r[c], r[f"{c}_raw"].clip(0.0, 1.0), rtol=0, atol=0):
            problems.append(f"{stem}.parquet: {c} is not {c}_raw clipped to [0, 1]")
    small = df["n"].astype(int) < int(m["min_n"])
    if (small != suppressed).any():
        problems.append(f"{stem}.parquet: suppression is not 'n < min_n = {m['min_n']}' in "
                        f"{int((small != suppressed).sum())} row(s)")
    mech = df["mechanism"].astype(str)
    if ((mech != LEVEL_MECHANISM) & ~suppressed).any() or (mech[suppressed] != "none").any():
        problems.append(f"{stem}.parquet: mechanism is not {LEVEL_MECHANISM} where a unit ran "
                        "and none where suppressed")
    # A unit's row states what its level's own steps charged its records, not the
    # per-person total (budget.*_per_tract_and_cell, which the tract rows state).
    for col, figure in zip(SPEND_COLUMNS, _level_steps_charge(sec, steps, m)):
        spent = df[col].astype(float)
        if (spent[suppressed] != 0).any() or (~np.isclose(spent[~suppressed], figure,
                                                          rtol=REL_TOL, atol=0)).any():
            problems.append(f"{stem}.parquet: {col} is not 0 where suppressed and "
                            f"{figure:.12g} (the charge of levels.{level}.steps) elsewhere")
    # The reasons as for tracts (no selection rule at a level: its mechanism is fixed).
    problems += [f"{stem}.parquet: {p}"
                 for p in _mechanism_and_reason_problems(df, {**m, "selection": {}})]
    problems += [f"{stem}.parquet: {p}" for p in _interval_value_problems(df, released)]
    problems += [f"{stem}.parquet: {p}" for p in _standard_error_problems(df, m)]
    has_ci = [c for c in INTERVAL_COLUMNS if c in df.columns]
    if bool(has_ci) != bool(sec.get("interval_epsilon")):
        problems.append(f"{stem}.parquet: interval columns {has_ci} but interval_epsilon "
                        f"{sec.get('interval_epsilon')!r}")
    n_by_unit = _tract_n_by_unit(folder, digits)
    got = {(g, str(c)): int(n) for g, c, n in zip(geoid, df["cell"], df["n"])}
    if got != {k: got.get(k, 0) for k in set(got) | set(n_by_unit)} or any(
            n_by_unit.get(k, 0) != v for k, v in got.items()):
        problems.append(f"{stem}.parquet: n per unit and cell is not the sum of its tracts' "
                        "n in tracts.parquet, or a unit is missing")
    counts = sec.get("counts") or {}
    by_status = {str(k): int(v) for k, v in status.value_counts().items()}
    if counts.get("by_status") != by_status or counts.get("rows") != len(df):
        problems.append(f"{stem}.parquet: counts {by_status} ({len(df)} rows) != "
                        f"levels.{level}.counts")
    return problems


def _level_format_problems(folder: Path, level: str, files: set = frozenset()) -> list[str]:
    stem = LEVEL_STEMS[level]
    columns, table = _table_rows(folder, stem)
    kinds = _kinds(folder, stem)
    header, rows = _csv_rows(folder, columns, kinds, stem)
    if header != columns:
        return [f"{stem}.csv has columns {header}, the table {columns}"]
    problems = _compare(f"{stem}.csv", rows, table, columns, exact_columns=True,
                        missing_is_empty=True, reference=f"{stem}.parquet")
    features = _json_object(folder / f"{stem}.geojson", f"{stem}.geojson", Mismatch,
                            MAX_GEOJSON_BYTES).get("features")
    problems += _compare(f"{stem}.geojson", [f.get("properties") or {} for f in features or ()],
                         table, columns, exact_columns=True, reference=f"{stem}.parquet")
    reference, unequal = _reference_by_geoid(f"{stem}.parquet",
                                             *parquet_geometries(folder / f"{stem}.parquet"))
    problems += unequal + dissolve_problems(folder, level, reference) + format_geometry_problems(
        stem, reference, f"{stem}.parquet", features=features or [])
    if f"{stem}.pmtiles" in files:
        problems += _level_tiles_problems(folder, stem, table, columns, reference)
    return problems


def _level_tiles_problems(folder: Path, stem: str, table: dict, columns: list[str],
                          reference: dict) -> list[str]:
    """The level's vector tiles (layer ``stem``) at their lowest zoom hold its table's values
    (a web map's county or state colours are the published ones) and polygons."""
    name = f"{stem}.pmtiles"
    try:
        header, entries = pmtiles_tile_entries(folder / name)
        rows = [f for _, _, t in entries for f in mvt_features(t, stem)]
        shapes = format_geometry_problems(stem, reference, f"{stem}.parquet",
                                          tiles=(header, entries), layer=stem)
    except (OSError, ValueError, IndexError, UnicodeDecodeError, EOFError, zlib.error,
            struct.error) as err:
        return [f"{name} cannot be read: {type(err).__name__} {err}"]
    if not rows:
        return [f"{name} has no {stem} at its lowest zoom"]
    return _compare(name, rows, table, columns, exact_columns=False, complete=False,
                    reference=f"{stem}.parquet") + shapes


def check_levels(folder: Path, m: dict) -> str:
    """County and state tables: every level's steps are in the budget (so in the per-person
    total the totals check recomposes), its files listed and hashed, every column public or
    paid by its own step, values, suppression, spend, intervals and standard errors as for
    tracts, n the sum of its tracts' n, and its CSV, GeoJSON and vector tiles (when
    published) hold its table's values. No level file may be published without a level."""
    levels = m.get("levels") or {}
    if not isinstance(levels, dict):
        raise Mismatch(f"levels {levels!r} is not a mapping")
    steps = {s.get("step"): s for s in m["budget"]["steps"]}
    files = set(m.get("files") or {})
    problems = []
    unknown = sorted(set(levels) - set(LEVEL_DIGITS))
    if unknown:
        problems.append(f"unknown levels {unknown}; known: {sorted(LEVEL_DIGITS)}")
    for level in LEVEL_DIGITS:
        names = _level_file_names(level)
        if level not in levels:
            stray = sorted(files & {*names, f"{LEVEL_STEMS[level]}.pmtiles"})
            if stray:
                problems.append(f"{stray} published without a {level} level (paid by no step)")
            continue
        sec = levels[level]
        problems += _level_step_problems(level, sec, steps, m)
        absent = [f for f in names if f not in files]
        if absent:
            problems.append(f"level {level}: files {absent} are not listed in files")
            continue
        try:
            problems += _level_table_problems(folder, level, sec, steps, m)
            problems += _level_format_problems(folder, level, files)
        except Mismatch as err:
            problems.append(str(err))
        except Exception as err:  # noqa: BLE001 - any reader error is a finding
            problems.append(f"level {level}: its files cannot be read: {err}")
    cfg = _config(folder)
    cfg_levels = cfg.get("levels") or ["tract"]
    if sorted(cfg_levels) != sorted(["tract", *levels]):
        problems.append(f"config.json levels {cfg_levels} != the manifest's tract + "
                        f"{sorted(levels)}")
    shares = cfg.get("level_shares") or {}
    available = float(m["budget"]["epsilon_available"])
    for level, sec in levels.items():
        if level in shares and not close(float(shares[level]) * available,
                                         float(sec.get("epsilon", math.nan))):
            problems.append(f"level {level}: epsilon {sec.get('epsilon')!r} is not config's "
                            f"level_shares.{level} {shares[level]!r} x {available!r}")
    if problems:
        raise Mismatch("; ".join(problems))
    if not levels:
        return "tracts only: no county or state level, no level file"
    return (f"{', '.join(sorted(levels))}: steps in the per-person total, every column paid "
            "or public, values, suppression, spend, intervals and n agree; CSV, GeoJSON "
            "(and tiles, where published) hold the tables' values and polygons, each unit's "
            "polygon the union of its tracts'")


# ------------------------------------------ small_area: model-based tract estimates (issue 20)
#
# Post-processing of published values: the auditor re-fits the model from the published files
# with dpatlas.small_area (numpy, pandas and scipy; it imports nothing of ours) and compares.

MODEL_COLUMNS = tuple(f"{q}_model{end}" for q in ("p25", "p75")
                      for end in ("", "_lo", "_hi", "_se", "_z"))
MODEL_PAYER = "post-processing (small_area)"
MODEL_ROUNDING_STEP = 1e-4  # the release rounds the model columns to 4 decimals
# The re-fit's sigma2 and beta against the manifest's: loose, because σ² is found by a bounded
# optimiser (log σ² to 1e-6) whose path may differ on another machine's floating point; the
# values themselves are held to one rounding step.
MODEL_FIT_RTOL = 1e-3


def _model_differences(published, refit) -> list[str]:
    problems = []
    for c in MODEL_COLUMNS:
        a, b = published[c].to_numpy(dtype=float), refit[c].to_numpy(dtype=float)
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        off = (nan_a != nan_b) | (~nan_a & ~nan_b & (np.abs(np.where(nan_a, 0, a) - np.where(
            nan_b, 0, b)) > MODEL_ROUNDING_STEP * (1 + 1e-6)))
        if off.any():
            k = int(np.argmax(off))
            problems.append(f"{c} differs from the re-fit by more than one rounding step in "
                            f"{int(off.sum())} row(s), e.g. geoid {published['geoid'].iloc[k]}"
                            f" cell {published['cell'].iloc[k]}: {a[k]!r} published, "
                            f"{b[k]!r} re-fitted")
    return problems


def _fit_problems(stated, refit: list[dict]) -> list[str]:
    if not isinstance(stated, list) or len(stated) != len(refit):
        return [f"small_area.fits lists {len(stated) if isinstance(stated, list) else stated!r}"
                f" fit(s), the re-fit has {len(refit)} (one per cell and state)"]
    problems = []
    for s, r in zip(stated, refit):
        where = f"cell {r['cell']} state {r['state']}"
        if not isinstance(s, dict) or any(s.get(k) != r[k] for k in
                                          ("cell", "state", "tracts", "directs", "fitted")):
            problems.append(f"small_area.fits: the fit of {where} is not stated as re-fitted")
            continue
        for q in ("p25", "p75") if r["fitted"] else ():
            got, want = s.get(q) or {}, r[q]
            beta = got.get("beta")
            # sigma2_interval: stated since the intervals use their own σ² (absent before)
            variances = [k for k in ("sigma2", "sigma2_interval") if k in want]
            if not (all(_is_number(got.get(k)) for k in variances) and isinstance(beta, list)
                    and len(beta) == len(want["beta"]) and all(_is_number(b) for b in beta)
                    and np.allclose([*(got[k] for k in variances), *beta],
                                    [*(want[k] for k in variances), *want["beta"]],
                                    rtol=MODEL_FIT_RTOL, atol=1e-12)):
                problems.append(f"small_area.fits: {where} {q}: sigma2/beta {got.get('sigma2')!r}"
                                f"/{beta!r} are not the re-fit's {want['sigma2']!r}/"
                                f"{want['beta']!r}")
    return problems


def _model_z_problems(tracts, fits: list[dict]) -> list[str]:
    """``p25_model_z``/``p75_model_z`` (issue 32): in every fitted cell and state, finite
    exactly where the tract has a direct (released, value present), empty elsewhere."""
    cell, state = tracts["cell"].astype(str), tracts["geoid"].astype(str).str[:2]
    fitted = np.zeros(len(tracts), dtype=bool)
    for f in fits:
        if f["fitted"]:
            fitted |= ((cell == f["cell"]) & (state == f["state"])).to_numpy()
    problems = []
    for q in ("p25", "p75"):
        direct = ((tracts["status"].astype(str) == "released")
                  & tracts[q].notna()).to_numpy()
        finite = np.isfinite(tracts[f"{q}_model_z"].to_numpy(dtype=float))
        off = fitted & (finite != direct)
        if off.any():
            problems.append(f"{q}_model_z is not finite exactly where a direct {q} is, in "
                            f"{int(off.sum())} row(s) of fitted states, e.g. geoid "
                            f"{tracts['geoid'].iloc[int(np.argmax(off))]}")
    return problems


def check_small_area(folder: Path, m: dict) -> str:
    """Model-based columns re-fitted from the published files: tracts.parquet (with its
    geometry), counties.parquet and states.parquet; each value within one rounding step."""
    try:
        columns = pq.read_schema(readable(folder / "tracts.parquet")).names
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    section = m.get("small_area")
    has = [c for c in MODEL_COLUMNS if c in columns]
    if not has and not section:
        return "no model-based columns"
    if not has or not isinstance(section, dict) or len(has) != len(MODEL_COLUMNS):
        raise Mismatch(f"model columns {has} and the manifest's small_area section "
                       f"{'present' if section else 'absent'} do not go together")
    if not (_config(folder).get("small_area") or {}).get("model"):
        raise Mismatch("model columns, but config.json does not ask for the model "
                       "(small_area.model)")
    import geopandas
    import pandas as pd

    from dpatlas.small_area.published import fit_published, noise_from_steps

    levels = m.get("levels") or {}
    try:
        tracts = geopandas.read_parquet(readable(folder / "tracts.parquet"))
        tables = [pd.read_parquet(readable(folder / f"{LEVEL_STEMS[lv]}.parquet")) if lv in levels
                  else None for lv in ("county", "state")]
        refit, fits = fit_published(tracts, *tables,
                                    noise_from_steps((m.get("budget") or {}).get("steps")))
    except Exception as err:  # noqa: BLE001 - a model that cannot be re-fitted is a finding
        raise Mismatch(f"the model cannot be re-fitted from the published files: "
                       f"{type(err).__name__} {err}") from None
    problems = (_model_differences(tracts, refit) + _fit_problems(section.get("fits"), fits)
                + _model_z_problems(tracts, fits))
    if problems:
        raise Mismatch("; ".join(problems))
    fitted = sum(f["fitted"] for f in fits)
    return (f"re-fitted from tracts.parquet, counties.parquet and states.parquet: {fitted} of "
            f"{len(fits)} cell-state fit(s); every model value within one rounding step of "
            "the published one; the z columns finite exactly where a direct is")


# ----------------------------------------------------- external anchors: boundaries, ledger


def _tree_sha256(path: Path) -> str:
    """sha256 of a file, or of a folder as its sorted relative names and file hashes (what
    the manifest's boundaries.sha256 states: dpatlas/release/manifest.py, tree_sha256)."""
    if path.is_file():
        return _sha256(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(bytes.fromhex(_sha256(f)))
    return h.hexdigest()


def dbf_column(raw: bytes, column: str) -> list[str]:
    """One column of a dBase III table (a shapefile's attributes, .dbf), deleted records left
    out: a 32-byte header (record count, header and record lengths), 32-byte field
    descriptors up to 0x0D, then fixed-width records after a deletion flag."""
    count = int.from_bytes(raw[4:8], "little")
    header_len = int.from_bytes(raw[8:10], "little")
    record_len = int.from_bytes(raw[10:12], "little")
    offset, pos, where = 1, 32, None
    while pos + 32 <= header_len and raw[pos] != 0x0D:
        name = raw[pos:pos + 11].split(b"\0", 1)[0].decode("ascii", "replace")
        width = raw[pos + 16]
        if name == column:
            where = (offset, width)
        offset += width
        pos += 32
    if where is None:
        raise ValueError(f"no column {column!r}")
    values = []
    for i in range(count):
        record = raw[header_len + i * record_len:header_len + (i + 1) * record_len]
        if len(record) < record_len:
            raise ValueError("truncated .dbf")
        if record[:1] != b"*":
            values.append(record[where[0]:where[0] + where[1]].decode("utf-8").strip())
    return values


def _shapefile_geoids(path: Path, column: str) -> list[str]:
    import zipfile

    if path.suffix.lower() == ".shp":
        return dbf_column(path.with_suffix(".dbf").read_bytes(), column)
    with zipfile.ZipFile(path) as z:
        dbfs = [n for n in z.namelist() if n.lower().endswith(".dbf")]
        if len(dbfs) != 1:
            raise ValueError(f"{len(dbfs)} .dbf files in the archive, expected one")
        return dbf_column(z.read(dbfs[0]), column)


def _geopackage_geoids(path: Path, column: str) -> list[str]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)) as db:
        tables = [r[0] for r in db.execute(
            "SELECT table_name FROM gpkg_contents WHERE data_type = 'features'")]
        if len(tables) != 1:
            raise ValueError(f"{len(tables)} feature tables, expected one")
        quoted = '"' + column.replace('"', '""') + '"'
        table = '"' + tables[0].replace('"', '""') + '"'
        return [str(r[0]) for r in db.execute(f"SELECT {quoted} FROM {table}")]


def boundary_geoids(path: Path, column: str) -> list[str]:
    """The GEOIDs of a boundary file in a format the release reads: GeoParquet, GeoJSON,
    GeoPackage, a zipped or bare shapefile (AuditUnreadable otherwise)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return [str(v) for v in pq.read_table(path, columns=[column]).column(column)
                    .to_pylist()]
        if suffix in (".geojson", ".json"):
            features = _json_object(path, path.name, AuditUnreadable,
                                    MAX_GEOJSON_BYTES).get("features") or []
            return [str((f.get("properties") or {}).get(column)) for f in features]
        if suffix in (".zip", ".shp"):
            return _shapefile_geoids(path, column)
        if suffix == ".gpkg":
            return _geopackage_geoids(path, column)
    except AuditUnreadable:
        raise
    except Exception as err:  # noqa: BLE001 - the anchor itself cannot be read
        raise AuditUnreadable(f"--boundaries {path}: cannot be read ({type(err).__name__}: "
                              f"{err})") from None
    raise AuditUnreadable(f"--boundaries {path}: not a boundary file the release could have "
                          "read (.parquet, .geojson, .json, .gpkg, .zip, .shp)")


def check_boundaries(folder: Path, m: dict, path: Path) -> str:
    """The boundary file the release names (by sha256) has every tract exactly once per
    cell in the table: no released row deleted, none added."""
    problems = []
    stated = (m.get("boundaries") or {}).get("sha256")
    digest = _tree_sha256(path)
    if digest != stated:
        problems.append(f"{path.name} has sha256 {digest[:12]}..., the manifest's boundaries "
                        f"{str(stated)[:12]}...: not the file this release was made from")
    try:
        cfg = _config(folder)
        column = (cfg.get("boundaries") or {}).get("geoid_column") or "GEOID"
    except Mismatch:
        column = "GEOID"
    geoids = boundary_geoids(path, column)
    try:
        table = pq.read_table(readable(folder / "tracts.parquet"),
                              columns=["geoid", "cell"]).to_pylist()
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    cells = [str(c) for c in m["cells"]]
    counts: dict[tuple[str, str], int] = {}
    for r in table:
        key = (str(r["geoid"]), str(r["cell"]))
        counts[key] = counts.get(key, 0) + 1
    want = {(g, c) for g in geoids for c in cells}
    missing = sorted(want - set(counts))
    extra = sorted(set(counts) - want)
    twice = sorted(k for k, v in counts.items() if v > 1)
    for what, keys in (("missing", missing), ("not in the boundaries", extra),
                       ("more than once", twice)):
        if keys:
            problems.append(f"{len(keys)} (tract, cell) row(s) {what}, e.g. {keys[0]}")
    problems += boundary_geometry_problems(folder, m, path, column)
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{len(set(geoids)):,} boundary tracts x {len(cells)} cell(s): exactly one row "
            "each; every polygon of tracts.parquet, tracts.geojson and tracts.pmtiles (its "
            "lowest zoom) is its boundary tract's (within tolerance)")


def _ledger_rows(url: str, release_id: str, dataset: str) -> tuple[dict | None, list[dict],
                                                                  tuple | None, tuple]:
    """(release row, its charges, the dataset's cap, the dataset's spend) from a ledger
    (dpatlas/ledger/store.py's tables), read only."""
    import sqlalchemy as sa

    try:
        parsed = sa.engine.make_url(url)
    except Exception:  # noqa: BLE001 - a malformed URL
        raise AuditUnreadable("--ledger: not a database URL (sqlite:///FILE or "
                              "postgresql+psycopg://...)") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if not db or db == ":memory:" or not Path(db).is_file():
            raise AuditUnreadable(f"--ledger: no ledger file {db!r}")
        url = f"sqlite:///file:{Path(db).resolve()}?mode=ro&uri=true"
    elif parsed.get_backend_name() != "postgresql":
        raise AuditUnreadable(f"--ledger: backend {parsed.get_backend_name()!r} is not a ledger "
                              "(sqlite or postgresql)")
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            def rows(sql, **kw):
                return [dict(r._mapping) for r in conn.execute(sa.text(sql), kw)]
            release = rows("SELECT release_id, dataset, status, manifest_sha256 FROM "
                           "ledger_releases WHERE release_id = :r", r=release_id)
            charges = rows("SELECT cell, step, guarantee_type, epsilon, delta, rho FROM "
                           "ledger_charges WHERE release_id = :r ORDER BY seq", r=release_id)
            cap = rows("SELECT cap_epsilon, cap_delta FROM ledger_caps WHERE dataset = :d",
                       d=dataset)
            spent = rows("SELECT c.guarantee_type AS kind, c.epsilon AS e, c.delta AS d, "
                         "c.rho AS rho FROM ledger_charges c JOIN ledger_releases r ON "
                         "r.release_id = c.release_id WHERE r.dataset = :d", d=dataset)
    except sa.exc.SQLAlchemyError as err:
        raise AuditUnreadable(f"--ledger: cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})") from None
    finally:
        engine.dispose()
    return (release[0] if release else None, charges,
            (cap[0]["cap_epsilon"], cap[0]["cap_delta"]) if cap else None,
            lifetime_spend(spent))


def lifetime_spend(charges: list[dict]) -> tuple[float, float]:
    """A dataset's (ε, δ) over its ledger charges (dicts with kind, e, d, rho): δ summed; ε
    summed (basic composition), or, when tighter, the zCDP charges' ρ summed and converted once
    at the sum of their δ, plus the other charges' ε. Both bound the same total δ."""
    eps = math.fsum(float(c["e"]) for c in charges)
    delta = math.fsum(float(c["d"]) for c in charges)
    zcdp = [c for c in charges if c["kind"] == "zcdp" and c["rho"] is not None]
    rho = math.fsum(float(c["rho"]) for c in zcdp)
    zcdp_delta = math.fsum(float(c["d"]) for c in zcdp)
    if rho > 0 and 0 < zcdp_delta < 1:
        others = math.fsum(float(c["e"]) for c in charges
                           if not (c["kind"] == "zcdp" and c["rho"] is not None))
        eps = min(eps, others + zcdp_to_epsilon(rho, zcdp_delta))
    return eps, delta


def _rho_problems(charges: list[dict], m: dict) -> list[str]:
    """A zCDP charge's stored ρ is its step's (the lifetime spend composes these ρ)."""
    steps = {s.get("step"): guarantee_from(s.get("guarantee")) for s in m["budget"]["steps"]}
    off = [c for c in charges if c["guarantee_type"] == "zcdp"
           and (c["step"] not in steps or steps[c["step"]].kind != "zcdp"
                or c["rho"] is None or not close(float(c["rho"]), steps[c["step"]].rho))]
    if not off:
        return []
    return [f"{len(off)} zCDP charge(s) whose rho is not their step's, e.g. "
            f"{off[0]['cell']} / {off[0]['step']}: rho {off[0]['rho']!r}"]


def check_ledger(folder: Path, m: dict, url: str) -> str:
    """The ledger charged this release exactly what its steps cost, published this manifest
    (by sha256), and the dataset's spend is within its cap."""
    rid, entry = m.get("release_id"), m["ledger_entry"]
    dataset = entry.get("dataset")
    release, charges, cap, spent = _ledger_rows(url, str(rid), str(dataset))
    if release is None:
        raise Mismatch(f"release {rid!r} is not in the ledger")
    problems = []
    if release["dataset"] != dataset:
        problems.append(f"the ledger charged dataset {release['dataset']!r}, the manifest says "
                        f"{dataset!r}")
    if release["status"] != "published":
        problems.append(f"the ledger's status is {release['status']!r}, not published")
    if release["manifest_sha256"] != _sha256(folder / MANIFEST):
        problems.append("manifest.json is not the manifest the ledger recorded as published "
                        "(sha256 differs)")
    conv = float(m["budget"].get("conversion_delta") or 0.0)
    want = {}
    for s in m["budget"]["steps"]:
        want[s.get("step")] = _charged(guarantee_from(s.get("guarantee")), conv)
    got: dict[tuple[str, str], tuple[float, float]] = {}
    for c in charges:
        got[(str(c["cell"]), str(c["step"]))] = (float(c["epsilon"]), float(c["delta"]))
    expected = {(str(cell), step): v for cell in m["cells"] for step, v in want.items()}
    if set(got) != set(expected):
        problems.append(f"the ledger charged {len(got)} (cell, step) pair(s), the manifest's "
                        f"steps need {len(expected)}: "
                        f"{sorted(set(got) ^ set(expected))[:3]}")
    else:
        off = [k for k, (e, d) in expected.items()
               if not (close(got[k][0], e) and close(got[k][1], d))]
        if off:
            k = off[0]
            problems.append(f"{len(off)} charge(s) differ from the steps' guarantees, e.g. "
                            f"{k}: ledger {got[k]}, recomputed ({expected[k][0]:.12g}, "
                            f"{expected[k][1]:.6g})")
    problems += _rho_problems(charges, m)
    if cap is None:
        problems.append(f"dataset {dataset!r} has no cap in the ledger")
    else:
        for what, used, limit in (("epsilon", spent[0], cap[0]), ("delta", spent[1], cap[1])):
            if used > float(limit) * (1 + REL_TOL):
                problems.append(f"the dataset's {what} spend {used:.12g} is over its cap "
                                f"{float(limit):.12g}")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"the ledger published this manifest and charged {len(charges)} step(s) as "
            f"recomputed; dataset {dataset!r} spent ({spent[0]:.6g}, {spent[1]:.3g}) of its "
            f"cap ({float(cap[0]):.6g}, {float(cap[1]):.3g})")


# ------------------------------------------------------------------------------------------------
# Issue 31: files the audit will not open (O10), machine paths in every published file, and
# the geometry of every format. Grouped here; the checks above call into it.

# --- hostile files: nothing but a regular file within its recorded size is ever opened


class NotRead(Mismatch, OSError):
    """A file the audit will not open: not a regular file (a symlink, FIFO, socket, device or
    folder), or larger than the manifest says it is. An OSError too, so every reader's
    ``except OSError`` reports it as that file's finding."""


# The audit under way (set by audit_release): its folder and each listed file's recorded
# size, so no reader reads a file far past what the manifest says it holds. A file edited
# without re-hashing is still read (one report names every problem) up to twice its recorded
# size plus READ_SLACK; a sparse file of terabytes named tracts.pmtiles is not.
_LISTED_SIZES: ContextVar[tuple[Path, dict] | None] = ContextVar("_LISTED_SIZES", default=None)
READ_SLACK = 1 << 20


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it is there but not a regular file (lstat: a symlink is named as
    one, never followed), else None."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(path)!r}"
        except OSError:
            return "a symbolic link"
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a folder" if stat.S_ISDIR(mode) else "not a regular file")


def _read_limit(path: Path) -> tuple[int, str] | None:
    """The most bytes the audit under way reads of ``path`` and why (None: no limit here)."""
    listed = _LISTED_SIZES.get()
    if listed is None or path.parent != listed[0] or path.name == MANIFEST:
        return None
    recorded = listed[1].get(path.name)
    if isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 0:
        return 0, "not listed in the manifest with its size"
    return 2 * recorded + READ_SLACK, f"the manifest records {recorded:,}"


def readable(path: Path) -> Path:
    """``path``, once it is known to be a regular file within its read limit; NotRead (naming
    it) otherwise, before anything opens it. A missing file is left to its reader to report."""
    path = Path(path)
    kind = not_regular(path)
    if kind:
        raise NotRead(f"{path.name} is {kind}, not a regular file: not read")
    limit = _read_limit(path)
    if limit is not None:
        try:
            size = os.lstat(path).st_size
        except FileNotFoundError:
            return path
        if size > limit[0]:
            raise NotRead(f"{path.name} is {size:,} bytes ({limit[1]}): not read")
    return path


@contextlib.contextmanager
def _reading_limited_to(folder: Path, m: dict):
    """Within: every read of a file of ``folder`` limited by the manifest's recorded size."""
    files = m.get("files") if isinstance(m.get("files"), dict) else {}
    sizes = {name: info.get("bytes") for name, info in files.items() if isinstance(info, dict)}
    token = _LISTED_SIZES.set((folder, sizes))
    try:
        yield
    finally:
        _LISTED_SIZES.reset(token)


# --- machine paths in every published file, not only manifest.json and config.json

_PATH_PART = rb"[A-Za-z0-9._~+@%-]"
# A folder's name begins so; not "%3E" or "-" (a data URI's or a minified regex's /%3E/, /-/g)
_PART_START = rb"[A-Za-z0-9_.~]"
_SLASH = rb"(?:/|\\/)"  # a JSON writer may escape "/" as "\/"
_NOT_AFTER = rb"[A-Za-z0-9._~:/\\+@%-]"  # a "/" after one of these does not begin a path
_SCHEMES = ("file", "sqlite", "postgres", "postgresql", "psycopg", "psycopg2", "mysql", "s3",
            "s3a", "gs", "gcs", "abfs", "abfss", "az", "hdfs", "smb", "sftp", "ssh", "ftp")
# What a path or address of the machine that made the release looks like inside text: an
# absolute POSIX path of two parts or more (not a relative ../x, a URL's /path after its host,
# a closing </tag>, "p25/p75"), a Windows drive path, a home-relative path, a URL of a file,
# database or bucket, and a web address of this machine or its private network. Public web
# addresses (a licence, the map's libraries) are not machine paths. Every alternative begins
# with one literal character ("/", "\\", "~", ":") and looks behind it, so the regex engine
# skips to those characters (tens of MB/s on GeoJSON).
MACHINE_PATH_IN_TEXT = re.compile(
    rb"/(?<!" + _NOT_AFTER + rb"/)" + _PART_START + _PATH_PART + rb"*" + _SLASH + _PART_START
    + rb"|\\/(?<!" + _NOT_AFTER + rb"\\/)" + _PART_START + _PATH_PART + rb"*" + _SLASH
    + _PART_START
    + rb"|~(?<![A-Za-z0-9._-]~)" + _SLASH + _PATH_PART
    + rb"|:(?<=[A-Za-z]:)(?<![A-Za-z0-9][A-Za-z]:)(?:\\+|/)" + _PATH_PART
    + rb"|:(?i:" + b"|".join(rb"(?<=" + s.encode() + rb":)" for s in _SCHEMES) + rb")//"
    + rb"[A-Za-z0-9_.~/\[@]"  # a host or a path follows (a bare "file://" names nothing)
    + rb"|:(?i:(?<=http:)|(?<=https:))//(?i:localhost|127\.|10\.|192\.168\."
      rb"|172\.(?:1[6-9]|2[0-9]|3[01])\.)")
TEXT_CHUNK = 1 << 20
_TEXT_OVERLAP = 512  # more than a match needs to be recognised: one across two chunks is seen


def machine_path_in_text(raw: bytes) -> str | None:
    """The first machine path in ``raw`` with a little context, or None."""
    found = MACHINE_PATH_IN_TEXT.search(raw)
    if not found:
        return None
    start = found.start()
    return raw[start:start + 60].split(b"\n")[0].decode("utf-8", "replace")


def _text_file_machine_path(path: Path) -> tuple[str | None, bool]:
    """(the first machine path in a published file, whether it was read as text): streamed in
    chunks; a binary file (a NUL byte in its first chunk) is not text and not read further."""
    tail = b""
    with open(readable(path), "rb") as fh:
        first = True
        while chunk := fh.read(TEXT_CHUNK):
            if first and b"\0" in chunk[:8192]:
                return None, False
            first = False
            found = machine_path_in_text(tail + chunk)
            if found:
                return found, True
            tail = chunk[-_TEXT_OVERLAP:]
    return None, True


def pmtiles_metadata(path: Path) -> bytes:
    """The (decompressed) JSON metadata of a PMTiles v3 archive: tippecanoe's name,
    description, attribution and generator_options (its command line) among them."""
    with _pmtiles_archive(path) as (header, read):
        return _unpack(read(*header["metadata"]), header["internal_compression"])


def _published_machine_paths(folder: Path, m: dict) -> tuple[list[str], int]:
    """(machine paths found, files read) in every published file but manifest.json and
    config.json (checked string by string): text files streamed, a PMTiles archive's metadata,
    a Parquet file's key-value metadata; other binary files (an image) and files the audit
    does not open (not regular, over their size: the files check names them) skipped."""
    found, read = [], 0
    for name in sorted(m.get("files") or {}):
        if name in (MANIFEST, CONFIG) or not isinstance(name, str) or "/" in name:
            continue
        path = folder / name
        try:
            if name.endswith(".pmtiles"):
                hit, is_text = machine_path_in_text(pmtiles_metadata(path)), True
            elif name.endswith(".parquet"):
                metadata = pq.read_schema(readable(path)).metadata or {}
                hit, is_text = machine_path_in_text(b"\n".join(metadata.values())), True
            else:
                hit, is_text = _text_file_machine_path(path)
        except (NotRead, FileNotFoundError):  # the files check names it
            continue
        except Exception as err:  # noqa: BLE001 - a file that cannot be read is not cleared
            found.append(f"{name} cannot be read ({type(err).__name__}), so not checked")
            continue
        read += is_text
        if hit:
            found.append(f"{name}: {hit!r}")
    return found, read


# --- geometry: every format's polygons are the GeoParquet's, and (--boundaries) the boundaries'

# GeoParquet against the boundary file, and GeoJSON against either: 1e-5 degrees (1.1 m north
# to south, less east to west). Publish copies the boundaries' polygons (reprojected to EPSG:4326
# by pyproj, as here) into the GeoParquet unchanged, and writes the GeoJSON snapped to a grid of
# 1e-6 degrees (RFC 7946's 6 decimals: at most 0.71e-6 per vertex); ten grid steps leave room
# for the snapping's repairs, while a polygon moved, swapped or redrawn is off by metres at least.
# (Releases before issue 33 have 7 decimals, well within it.)
GEOMETRY_TOLERANCE_DEGREES = 1e-5
# Vector tiles against the GeoParquet or the boundaries, at their lowest zoom, in units of that
# zoom's tile grid (4,096 per tile: ~150 m at z6, ~600 m at z4, ~10 km at z0 on the equator;
# :func:`tile_distance`): tippecanoe rounds every vertex to the grid (half a unit), simplifies
# each polygon by about one unit, simplifies shared borders once for both sides, and draws a
# polygon of a few square units as a square of its area. Measured on the demo release (North
# Carolina, 3,108 tracts at z6, 100 counties and a state at z0): at most 0.9 units for tracts,
# 0.7 for counties, 1.4 for the state; four units leave a margin of about three. A tract
# drawn in another's place is off by the distance between them (~80 units per 10 km at z6),
# and the GeoJSON and GeoParquet comparisons hold the exact shape.
TILE_TOLERANCE_UNITS = 4.0
# A part of a polygon this large (16 x 16 units at the lowest zoom) is drawn in the tiles: one
# smaller or thinner may vanish in simplification at that zoom.
TILE_LARGE_PART = (4 * TILE_TOLERANCE_UNITS) ** 2
_MERCATOR_MAX_LATITUDE = 85.0511287798066


def _shapely():
    """shapely, imported when polygons are compared (a synthetic folder's audit never is)."""
    import shapely

    return shapely


def parquet_geometries(path: Path) -> tuple[list[tuple[str, str]], np.ndarray]:
    """(geoid, cell) and the polygon of every row of a published GeoParquet file: WKB in
    longitude/latitude (EPSG:4326 or OGC:CRS84, as publish writes it), read with pyarrow."""
    shapely = _shapely()
    schema = pq.read_schema(readable(path))
    geo = json.loads((schema.metadata or {}).get(b"geo", b"{}"))
    column = (geo.get("columns") or {}).get("geometry") if isinstance(geo, dict) else None
    if not isinstance(column, dict) or column.get("encoding") != "WKB":
        raise Mismatch(f"{path.name}: no WKB geometry column in its GeoParquet metadata")
    crs_id = (column.get("crs") or {}).get("id") if column.get("crs") is not None else None
    if column.get("crs") is not None and crs_id not in (
            {"authority": "EPSG", "code": 4326}, {"authority": "OGC", "code": "CRS84"}):
        raise Mismatch(f"{path.name}: geometry in {crs_id or 'an unnamed CRS'}, not the "
                       "EPSG:4326 longitude/latitude publish writes")
    table = pq.read_table(path, columns=["geoid", "cell", "geometry"])
    keys = list(zip((str(g) for g in table.column("geoid").to_pylist()),
                    (str(c) for c in table.column("cell").to_pylist())))
    wkb = np.array(table.column("geometry").to_pylist(), dtype=object)
    return keys, shapely.from_wkb(wkb)


def _reference_by_geoid(name: str, keys: list, geoms: np.ndarray) -> tuple[dict, list[str]]:
    """{geoid: polygon} of a published table (its first row's), and a problem if another of
    its rows (another cell) carries another polygon for the same GEOID."""
    shapely = _shapely()
    first, differing = {}, []
    wkb = shapely.to_wkb(geoms)
    seen: dict[str, bytes] = {}
    for (geoid, _), g, w in zip(keys, geoms, wkb):
        if geoid not in first:
            first[geoid], seen[geoid] = g, w
        elif w != seen[geoid]:
            differing.append(geoid)
    problems = [f"{name}: {len(differing)} row(s) whose polygon is not their GEOID's in "
                f"another cell, e.g. {differing[0]}"] if differing else []
    return first, problems


def _geometry_differences(fmt: str, keys: list, geoms: np.ndarray, reference: dict,
                          tolerance: float, unit: str, against: str,
                          measure: Callable | None = None) -> list[str]:
    """Rows of ``fmt`` whose polygon is farther than ``tolerance`` (in ``unit``; ``measure``,
    by default the Hausdorff distance) from their GEOID's in ``reference`` (``against``: whose
    polygon that is); rows of no reference GEOID are left to the row checks."""
    shapely = _shapely()
    index = [i for i, (geoid, _) in enumerate(keys) if geoid in reference]
    if not index:
        return []
    got = geoms[index]
    want = np.array([reference[keys[i][0]] for i in index], dtype=object)
    distance = (measure or shapely.hausdorff_distance)(got, want)
    off = ~(distance <= tolerance) & ~(shapely.is_missing(got) & shapely.is_missing(want))
    if not off.any():
        return []
    worst = np.nanmax(np.where(off, distance, np.nan)) if np.isfinite(distance[off]).any() \
        else math.nan
    example = keys[index[int(np.argmax(off))]][0]
    return [f"{fmt}: the polygon of {int(off.sum())} row(s) is not {against} (off by up to "
            f"{worst:.3g} {unit}, tolerance {tolerance:g}), e.g. {example}"]


def geojson_geometries(features: list) -> tuple[list[tuple[str, str]], np.ndarray]:
    """(geoid, cell) and the polygon of every feature of a published FeatureCollection."""
    shapely = _shapely()
    keys, geoms = [], []
    for f in features:
        props = (f.get("properties") or {}) if isinstance(f, dict) else {}
        keys.append((str(props.get("geoid")), str(props.get("cell"))))
        try:
            geoms.append(shapely.geometry.shape(f["geometry"]) if f.get("geometry") else None)
        except Exception:  # noqa: BLE001 - malformed: compared as missing
            geoms.append(None)
    return keys, np.array(geoms, dtype=object)


def _farthest_vertex(sources: np.ndarray, owner: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per target: the largest distance from a vertex of the sources it owns (``owner[i]``:
    the target of ``sources[i]``) to the target's boundary; 0 where it owns none."""
    shapely = _shapely()
    out = np.zeros(len(targets))
    coords, index = shapely.get_coordinates(sources, return_index=True)
    if len(coords):
        lines = shapely.boundary(targets)
        np.maximum.at(out, owner[index], shapely.distance(shapely.points(coords),
                                                          lines[owner[index]]))
    return out


def tile_distance(tiles: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """How far a tile polygon is from its reference polygon (both in tile units): the larger
    of the farthest tile vertex from the reference's outline, and the farthest vertex of the
    reference's large parts (TILE_LARGE_PART units² or more) from the tile polygon's outline;
    NaN where either is missing. Not the Hausdorff distance: a part too small or thin to draw
    at this zoom may be left out of the tiles (an island of a coastal tract), but nothing
    drawn may be away from the polygon, and no large part may be left out or redrawn."""
    shapely = _shapely()
    count = np.arange(len(tiles))
    drawn = _farthest_vertex(tiles, count, reference)
    parts, owner = shapely.get_parts(reference, return_index=True)
    large = shapely.area(parts) >= TILE_LARGE_PART
    kept = _farthest_vertex(parts[large], owner[large], tiles)
    distance = np.maximum(drawn, kept)
    distance[shapely.is_missing(tiles) | shapely.is_missing(reference)] = np.nan
    return distance


def tile_zxy(tile_id: int) -> tuple[int, int, int]:
    """Zoom, column and row of a PMTiles tile id (PMTiles v3: tiles are numbered zoom by zoom,
    each zoom along a Hilbert curve)."""
    z, start = _zoom_and_first_id(tile_id)
    t, x, y, s = tile_id - start, 0, 0, 1
    while s < 1 << z:
        rx = 1 & (t // 2)
        ry = 1 & (t ^ rx)
        if ry == 0:
            if rx == 1:
                x, y = s - 1 - x, s - 1 - y
            x, y = y, x
        x, y, t, s = x + s * rx, y + s * ry, t // 4, s * 2
    return z, x, y


def mvt_rings(encoded: bytes) -> list[list[tuple[int, int]]]:
    """The rings of an encoded MVT polygon in tile units: MoveTo (1) and LineTo (2) with
    zigzag-coded deltas from a cursor kept across the feature, ClosePath (7)."""
    ints, pos = [], 0
    while pos < len(encoded):
        v, pos = _varint(encoded, pos)
        ints.append(v)
    rings, ring, x, y, i = [], [], 0, 0, 0
    while i < len(ints):
        command, count = ints[i] & 7, ints[i] >> 3
        i += 1
        if command in (1, 2):
            if i + 2 * count > len(ints):
                raise ValueError("truncated MVT geometry")
            for _ in range(count):
                x += (ints[i] >> 1) ^ -(ints[i] & 1)
                y += (ints[i + 1] >> 1) ^ -(ints[i + 1] & 1)
                i += 2
                if command == 1:
                    if ring:
                        rings.append(ring)
                    ring = [(x, y)]
                else:
                    ring.append((x, y))
        elif command == 7:
            if ring:
                rings.append(ring)
            ring = []
        else:
            raise ValueError(f"MVT command {command} is not a polygon's")
    if ring:
        rings.append(ring)
    return rings


def _mvt_polygon(rings: list, dx: float, dy: float):
    """A (valid) polygon of MVT rings shifted by (dx, dy): a ring of positive area in tile
    units (y down) begins a polygon, a negative one is a hole of the last (MVT 2.1, 4.3.4.4)."""
    shapely = _shapely()
    polygons: list[tuple[list, list]] = []
    for ring in rings:
        if len(ring) < 3:
            continue
        xs, ys = np.array(ring, dtype=float).T
        area = float(np.dot(xs, np.roll(ys, -1)) - np.dot(np.roll(xs, -1), ys))
        points = np.column_stack([xs + dx, ys + dy])
        if area > 0:
            polygons.append((points, []))
        elif area < 0 and polygons:
            polygons[-1][1].append(points)
    if not polygons:
        return None
    parts = [shapely.Polygon(shell, holes) for shell, holes in polygons]
    return shapely.make_valid(parts[0] if len(parts) == 1 else shapely.MultiPolygon(parts))


def tile_geometries(entries: list, layer: str) -> tuple[list, np.ndarray, int, int]:
    """(geoid, cell), polygon in world tile units (column * extent + x, row * extent + y) of
    every feature of ``layer`` in PMTiles entries of one zoom (:func:`pmtiles_tile_entries`),
    the pieces of a polygon cut at tile edges joined; with the zoom and the tiles' extent."""
    shapely = _shapely()
    pieces: dict[tuple[str, str], list] = {}
    zoom, extents = 0, set()
    for tile_id, run, tile in entries:
        features = [(attrs, mvt_rings(geometry), extent) for attrs, kind, geometry, extent
                    in mvt_layer_features(tile, layer) if kind == 3]
        zoom = _zoom_of(tile_id)
        if run > 4 ** zoom:
            raise ValueError(f"a run of {run} tiles at zoom {zoom}")
        for copy in range(run):  # a run repeats one tile at the ids that follow its own
            _, column, row = tile_zxy(tile_id + copy)
            for attrs, rings, extent in features:
                extents.add(extent)
                polygon = _mvt_polygon(rings, column * extent, row * extent)
                if polygon is not None:
                    key = (str(attrs.get("geoid")), str(attrs.get("cell")))
                    pieces.setdefault(key, []).append(polygon)
    if len(extents) > 1:
        raise ValueError(f"tiles of different extents {sorted(extents)}")
    geoms = [p[0] if len(p) == 1 else shapely.union_all(p) for p in pieces.values()]
    return list(pieces), np.array(geoms, dtype=object), zoom, extents.pop() if extents else 4096


def to_tile_units(reference: dict, zoom: int, extent: int) -> dict:
    """{geoid: polygon} from longitude/latitude to world tile units of ``zoom`` (Web
    Mercator, y down, ``extent`` units per tile): the grid tippecanoe drew the tiles on."""
    shapely = _shapely()
    scale = float(1 << zoom) * extent

    def project(xy):
        lat = np.radians(np.clip(xy[:, 1], -_MERCATOR_MAX_LATITUDE, _MERCATOR_MAX_LATITUDE))
        return np.column_stack([(xy[:, 0] + 180.0) / 360.0 * scale,
                                (1.0 - np.arcsinh(np.tan(lat)) / math.pi) / 2.0 * scale])

    geoids = list(reference)
    projected = shapely.transform(np.array([reference[g] for g in geoids], dtype=object),
                                  project)
    return dict(zip(geoids, projected))


def format_geometry_problems(stem: str, reference: dict, against: str, *,
                             parquet: tuple | None = None, features: list | None = None,
                             tiles: tuple | None = None, layer: str | None = None) -> list[str]:
    """Every given format of ``stem``'s polygons against ``reference`` ({geoid: polygon} in
    longitude/latitude, named ``against``): the GeoParquet's rows (``parquet``: keys and
    polygons) and the GeoJSON's ``features`` within GEOMETRY_TOLERANCE_DEGREES, the vector
    tiles' features (``tiles``: the header and entries of their lowest zoom) within
    TILE_TOLERANCE_UNITS of that zoom. A format whose polygons cannot be decoded or compared
    is a finding too."""
    against = f"{against}'s"

    def compare_tiles():
        keys, geoms, zoom, extent = tile_geometries(tiles[1], layer or stem)
        return _geometry_differences(
            f"{stem}.pmtiles", keys, geoms, to_tile_units(reference, zoom, extent),
            TILE_TOLERANCE_UNITS, f"units of the z{zoom} tile grid", against, tile_distance)

    comparisons = [
        ("parquet", parquet, lambda: _geometry_differences(
            f"{stem}.parquet", *parquet, reference, GEOMETRY_TOLERANCE_DEGREES, "degrees",
            against)),
        ("geojson", features, lambda: _geometry_differences(
            f"{stem}.geojson", *geojson_geometries(features), reference,
            GEOMETRY_TOLERANCE_DEGREES, "degrees", against)),
        ("pmtiles", tiles, compare_tiles)]
    problems = []
    for suffix, given, compare in comparisons:
        if given is None:
            continue
        try:
            problems += compare()
        except Exception as err:  # noqa: BLE001 - malformed polygons are a finding
            problems.append(f"{stem}.{suffix}: its polygons cannot be compared with "
                            f"{against} ({type(err).__name__}: {err})")
    return problems


def dissolve_problems(folder: Path, level: str, units: dict) -> list[str]:
    """Each unit's polygon in the level's GeoParquet (``units``: {geoid: polygon}) is the
    union of its tracts' in tracts.parquet, as publish dissolves the boundaries: a coverage
    union, or the general one where that is not valid; within GEOMETRY_TOLERANCE_DEGREES."""
    shapely = _shapely()
    tracts, _ = _reference_by_geoid("tracts.parquet",
                                    *parquet_geometries(folder / "tracts.parquet"))
    digits, groups = LEVEL_DIGITS[level], {}
    for geoid, polygon in tracts.items():
        groups.setdefault(geoid[:digits], []).append(polygon)
    union = {}
    for unit, polygons in groups.items():
        merged = shapely.coverage_union_all(polygons)
        union[unit] = merged if shapely.is_valid(merged) else shapely.union_all(polygons)
    return _geometry_differences(f"{LEVEL_STEMS[level]}.parquet", [(u, "") for u in units],
                                 np.array(list(units.values()), dtype=object), union,
                                 GEOMETRY_TOLERANCE_DEGREES, "degrees",
                                 "the union of its tracts' in tracts.parquet")


def boundary_polygons(path: Path, column: str) -> dict:
    """{geoid: polygon} of a boundary file, in EPSG:4326 longitude/latitude (reprojected by
    pyproj, as the release's boundaries were), read with geopandas (--boundaries only)."""
    import geopandas

    if path.suffix.lower() == ".parquet":
        frame = geopandas.read_parquet(path)
    else:
        frame = geopandas.read_file(path)
    if frame.crs is None:
        raise AuditUnreadable(f"--boundaries {path}: no coordinate reference system")
    frame = frame.to_crs("EPSG:4326")
    return dict(zip((str(g) for g in frame[column]), frame.geometry.to_numpy()))


def boundary_geometry_problems(folder: Path, m: dict, path: Path, column: str) -> list[str]:
    """The polygons of tracts.parquet, tracts.geojson and tracts.pmtiles (when listed) are
    the boundary file's, by GEOID (the formats check compares them with one another)."""
    try:
        reference = boundary_polygons(path, column)
    except AuditUnreadable:
        raise
    except Exception as err:  # noqa: BLE001 - the anchor itself cannot be read
        raise AuditUnreadable(f"--boundaries {path}: its polygons cannot be read "
                              f"({type(err).__name__}: {err})") from None
    against = f"the boundary file {path.name}"
    try:
        problems = format_geometry_problems(
            "tracts", reference, against, parquet=parquet_geometries(folder / "tracts.parquet"))
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        problems = [f"tracts.parquet: its polygons cannot be read ({type(err).__name__}: "
                    f"{err})"]
    try:
        features = _json_object(folder / "tracts.geojson", "tracts.geojson", Mismatch,
                                MAX_GEOJSON_BYTES).get("features") or []
        problems += format_geometry_problems("tracts", reference, against, features=features)
    except (Mismatch, AttributeError, TypeError) as err:
        problems.append(f"tracts.geojson cannot be read: {err}")
    if "tracts.pmtiles" in (m.get("files") or {}):
        try:
            problems += format_geometry_problems(
                "tracts", reference, against, tiles=pmtiles_tile_entries(
                    folder / "tracts.pmtiles"), layer="tracts")
        except (OSError, ValueError, IndexError, UnicodeDecodeError, EOFError, zlib.error,
                struct.error) as err:
            problems.append(f"tracts.pmtiles cannot be read: {type(err).__name__} {err}")
    return problems


def check_names(folder: Path, m: dict) -> str:
    """Public names recomputed from the GEOIDs and public geography (dpatlas/audit/names.py)."""
    try:
        return names.check(folder, m, readable)
    except names.NamesMismatch as err:
        raise Mismatch(str(err)) from None


SYNTHETIC_CHECKS: list[tuple[str, Callable[[Path, dict], str]]] = []  # filled below


CHECKS: list[tuple[str, Callable[[Path, dict], str]]] = [
    ("schema", check_schema),
    ("public", check_public),
    ("files", check_files),
    ("config", check_config),
    ("mode", check_mode),
    ("machine paths", check_no_machine_paths),
    ("relations", check_relations),
    ("sensitivities", check_sensitivities),
    ("noise", check_noise),
    ("totals", check_totals),
    ("columns", check_columns),
    ("table", check_table),
    ("formats", check_formats),
    ("levels", check_levels),
    ("small_area", check_small_area),
    ("names", check_names),
]
RELEASE_ONLY = ("public", "config", "columns", "table", "formats", "levels", "small_area",
                "names")
SYNTHETIC_CHECKS[:] = [(name, fn) for name, fn in CHECKS if name not in RELEASE_ONLY]
SYNTHETIC_CHECKS.append(("synthetic rows", check_synthetic_table))
# Checks against something outside the folder, run only when given (ANCHORS: the option).
ANCHORS = {"boundaries": "--boundaries FILE", "ledger": "--ledger URL"}
ANCHOR_CHECKS: dict[str, Callable[[Path, dict, object], str]] = {
    "boundaries": check_boundaries, "ledger": check_ledger}
ANCHOR_SKIPPED = {
    "boundaries": "not done (no --boundaries FILE): rows deleted from the release cannot be "
                  "detected from its own files",
    "ledger": "not done (no --ledger URL): the charge and the cap are checked only against "
              "the ledger"}


def load_manifest(folder: Path) -> dict:
    folder = Path(folder)
    if not folder.is_dir():
        raise AuditUnreadable(f"{folder} is not a folder")
    return _json_object(folder / MANIFEST, str(folder / MANIFEST), AuditUnreadable)


def _malformed(err: Exception) -> str:
    return f"manifest or config malformed: {type(err).__name__} {str(err)[:300]}"


def _run(report: AuditReport, name: str, fn, *args) -> None:
    try:
        report.checks.append((name, True, fn(*args)))
    except Mismatch as err:
        report.checks.append((name, False, str(err)))
    except RecursionError:
        report.checks.append((name, False, "nested too deeply to check"))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError,
            ZeroDivisionError) as err:
        report.checks.append((name, False, _malformed(err)))


def is_test_release(m: dict) -> bool:
    """A test release: mode test, or noise from seeded bits (never a release to trust)."""
    bits = (m.get("noise_sampler") or {}).get("random_bits") \
        if isinstance(m.get("noise_sampler"), dict) else None
    return m.get("mode") != "public" or bits != RANDOM_BITS[0]


def audit_release(folder: Path, *, ledger: str | None = None,
                  boundaries: Path | str | None = None) -> AuditReport:
    """Run every check on a release folder (AuditUnreadable if there is no readable manifest,
    or an anchor given (``ledger``, ``boundaries``) cannot be read).

    The table and noise checks run even when the files check fails, so one report names every
    problem; a malformed manifest (a key missing, a wrong type) fails the check that reads it.
    Anchors not given are listed in ``report.skipped``.
    """
    folder = Path(folder)
    m = load_manifest(folder)
    anchors = {"boundaries": Path(boundaries) if boundaries is not None else None,
               "ledger": ledger}
    if anchors["boundaries"] is not None and not anchors["boundaries"].exists():
        raise AuditUnreadable(f"--boundaries {anchors['boundaries']}: no such file")
    if anchors["boundaries"] is not None and not (anchors["boundaries"].is_file()
                                                  or anchors["boundaries"].is_dir()):
        raise AuditUnreadable(f"--boundaries {anchors['boundaries']}: not a file or folder "
                              "(a FIFO, socket or device is not read)")
    report = AuditReport(folder, test=is_test_release(m))
    with _reading_limited_to(folder, m):
        for name, fn in (SYNTHETIC_CHECKS if _synthetic(m) else CHECKS):
            _run(report, name, fn, folder, m)
        for name, fn in ANCHOR_CHECKS.items():
            if anchors[name] is None:
                report.skipped.append((name, ANCHOR_SKIPPED[name]))
            elif name == "boundaries" and _synthetic(m):
                report.skipped.append((name, "not done: a synthetic folder has no tract table"))
            else:
                _run(report, name, fn, folder, m, anchors[name])
    report.ok = all(good for _, good, _ in report.checks)
    return report


def main(folder, out=None, *, allow_test: bool = False, ledger: str | None = None,
         boundaries: Path | str | None = None, as_json: bool = False) -> int:
    """Print one line per check; 0 if all pass, 1 if any fails, 2 if the folder (or an anchor)
    is unreadable, 3 if every check passed but the release is a test release (seeded noise or
    mode test) and ``allow_test`` is not set. ``as_json``: one JSON document instead (the
    verdict, the exit code, every check), for a script."""
    out = out or sys.stdout
    try:
        report = audit_release(Path(folder), ledger=ledger, boundaries=boundaries)
    except AuditUnreadable as err:
        return _say(out, as_json, folder, 2, f"unreadable: {_one_line(str(err))}")
    except RecursionError:
        return _say(out, as_json, folder, 2, f"unreadable: {folder}: nested too deeply to audit")
    passed = f"{sum(g for _, g, _ in report.checks)} of {len(report.checks)} checks passed " \
             f"for {report.folder}"
    if not report.ok:
        return _say(out, as_json, folder, 1, f"FAILED: {passed}", report)
    if report.test and not allow_test:
        return _say(out, as_json, folder, 3, f"TEST: {passed}, but it is a test release (mode "
                    "test or seeded noise), not a release to trust; --allow-test accepts it",
                    report)
    return _say(out, as_json, folder, 0, f"PASSED: {passed}" + (
        " (a test release, accepted by --allow-test)" if report.test else ""), report)


def _say(out, as_json: bool, folder, code: int, verdict: str,
         report: AuditReport | None = None) -> int:
    """The audit's lines and its verdict, or all of it as one JSON document; ``code``."""
    if as_json:
        print(json.dumps({
            "folder": str(folder), "exit_code": code, "verdict": verdict,
            "test_release": bool(report and report.test),
            "checks": [{"name": n, "ok": bool(g), "detail": d}
                       for n, g, d in (report.checks if report else [])],
            "skipped": [{"name": n, "why": w} for n, w in (report.skipped if report else [])],
        }, indent=2, default=str), file=out)
        return code
    for line in report.lines() if report else []:
        print(line, file=out)
    print(verdict, file=out)
    return code


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 500 else line[:497] + "..."


def _arguments(argv: list[str]):
    import argparse

    parser = argparse.ArgumentParser(prog="audit.py", description="Audit a dpatlas release "
                                     "folder from its own files.")
    parser.add_argument("folder")
    parser.add_argument("--ledger", help="the ledger's database URL (checks the charge, the "
                        "published manifest and the cap)")
    parser.add_argument("--boundaries", help="the boundary file the release was made from "
                        "(checks one row per tract and cell)")
    parser.add_argument("--allow-test", action="store_true",
                        help="accept a test release (exit 0 instead of 3)")
    return parser.parse_args(argv)


if __name__ == "__main__":  # python audit.py RELEASE_DIR [options] (this file alone is enough)
    args = _arguments(sys.argv[1:])
    raise SystemExit(main(args.folder, allow_test=args.allow_test, ledger=args.ledger,
                          boundaries=args.boundaries))
