"""How a tract's published direct relates to its expected outcome: the calibration behind
``dpatlas.small_area.model.DIRECT_LAW`` (issue 32; docs/small-area.md, "The directs' law").

A published direct p25/p75 is attenuated towards 0.5: at small n·ε the mechanisms' outputs
are mostly noise clipped to [0, 1] (NoisyStats) or a near-uniform exponential-mechanism draw
(DPExpTheilSen), both centred near 0.5. On the calibration seeds the regression of the direct
on the truth has intercept ≈ (1 − slope)·0.5 in every size bin, so per tract

    E[direct | θ] = 0.5 + s·(θ − 0.5),   Var[direct − E | θ] = D,

with s (the attenuation) and D functions of the mechanism, public n and the mechanism's ε
from the public plan (``fit_direct_law``):

    logit s = b·f(n, ε_m),    log D = d·f(n, ε_m),

f = (1, u, u², u³, log ε_m, u·log ε_m), u = log(n·ε_m) (``_features``).

They are fitted on calibration seeds only (``CALIBRATION``: the demo generator's 101-103 and
the stress scenarios' calibration seeds) at ε ∈ ``EPSILONS`` per person, tract share 0.66,
on the released tracts with a truth; p25 and p75 pooled (s is least squares on the tract
rows; D is least squares on log of size-bin mean squared residuals). Research code: the model
reads the resulting constants, never this module.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import optimize

from dpatlas.evaluation.small_area_eval import (DEFAULT_SPLIT, SPLITS, synthetic_state,
                                                tract_plan, tract_release)
from dpatlas.evaluation.small_area_scenarios import CALIBRATION_SEEDS, scenario_state
from dpatlas.small_area.model import law_features
from dpatlas.small_area.published import noise_from_steps

EPSILONS = (1.0, 2.0, 4.0, 8.0)
CALIBRATION = (("generator", 101), ("generator", 102), ("generator", 103),
               *(("field-15km-county", s) for s in CALIBRATION_SEEDS),
               *(("size-dependent", s) for s in CALIBRATION_SEEDS))


def calibration_rows(calibration=CALIBRATION, epsilons=EPSILONS) -> pd.DataFrame:
    """One row per released tract and quantity: mechanism, n, ε_m, direct, truth."""
    share = SPLITS[DEFAULT_SPLIT][0]
    rows = []
    for name, seed in calibration:
        state = synthetic_state(seed) if name == "generator" else scenario_state(seed, name)
        for eps in epsilons:
            eps_m = noise_from_steps([s.as_dict() for s in tract_plan(eps * share).steps])
            t = tract_release(state, eps * share, seed * 1000 + int(eps * 10))
            m = t.merge(state.truth[["geoid", "p25", "p75"]], on="geoid", suffixes=("", "_t"))
            m = m[(m["status"] == "released") & m["p25_t"].notna()]
            for q in ("p25", "p75"):
                rows.append(pd.DataFrame({
                    "quantity": q, "mechanism": m["mechanism"].astype(str), "n": m["n"].astype(float),
                    "epsilon_m": m["mechanism"].astype(str).map(eps_m).astype(float),
                    "direct": m[q].astype(float), "truth": m[f"{q}_t"].astype(float)}))
    return pd.concat(rows, ignore_index=True)


def fit_direct_law(rows: pd.DataFrame) -> dict:
    """{mechanism: (b, {quantity: (a, d)})}: logit s = b·f (shared by p25 and p75: the
    within-quantity slope of the direct on the truth), the offset A = a·f and log D = d·f
    per quantity, f = ``model.law_features`` (module docstring). s and A by least squares on
    the tract rows; D by least squares on the log of the mean squared residual per (ε, size
    bin)."""
    out = {}
    for mech, g in rows.groupby("mechanism"):
        ln, le = np.log(g["n"].to_numpy()), np.log(g["epsilon_m"].to_numpy())
        y, t = g["direct"].to_numpy(), g["truth"].to_numpy()
        is75 = (g["quantity"] == "p75").to_numpy()
        F = law_features(ln, le)
        k = F.shape[1]

        def expected(p):
            offset = np.where(is75, F @ p[2 * k:], F @ p[k:2 * k])
            return offset + t / (1.0 + np.exp(-(F @ p[:k])))

        p = optimize.least_squares(lambda p: expected(p) - y,
                                   np.r_[0.0, 1.0, np.zeros(3 * k - 2)]).x
        r2 = (y - expected(p)) ** 2
        per_quantity = {}
        for q, sel in (("p25", ~is75), ("p75", is75)):
            bins = pd.DataFrame({"r2": r2[sel], "ln": ln[sel], "le": le[sel]})
            bins["bin"] = bins.groupby("le")["ln"].transform(
                lambda v: pd.qcut(v, 12, labels=False, duplicates="drop"))
            means = bins.groupby(["le", "bin"]).mean().reset_index()
            A = law_features(means["ln"].to_numpy(), means["le"].to_numpy())
            d, *_ = np.linalg.lstsq(A, np.log(means["r2"].to_numpy()), rcond=None)
            a = p[2 * k:] if q == "p75" else p[k:2 * k]
            per_quantity[q] = (_rounded(a), _rounded(d))
        out[mech] = (_rounded(p[:k]), per_quantity)
    return out


def _rounded(values) -> tuple:
    return tuple(round(float(v), 5) for v in values)


if __name__ == "__main__":  # pragma: no cover
    print(fit_direct_law(calibration_rows()))
