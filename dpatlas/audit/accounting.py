"""Composing privacy guarantees (sequential composition, zCDP and GDP conversions with
dp-accounting, relations and group privacy) and the totals check (d): the per-tract-and-cell
and per-person guarantees recomposed from the budget steps."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .base import Mismatch, REL_TOL, _is_number, _synthetic, close


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
