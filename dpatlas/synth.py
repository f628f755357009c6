"""Opportunity-Insights-like synthetic microdata (the paper's Appendix A, rebuilt).

The paper's numbers for Appendix A were lost in conversion; the parameters below are our
choices, each stated with its reason, and every run records them:

- tract sizes: exponential with mean 70 (Illinois: 3,108 tracts, about 70 children per tract,
  a long tail to several hundred), at least 1;
- parent log income: tract mean ~ N(0, σ_b²), person ~ N(tract mean, σ_w²) with σ_w = 2·σ_b
  (within-tract spread about twice the between-tract spread); σ_b = 0.35;
- x: the parent's percentile rank within the whole state's parent income distribution,
  rounded to 0.01 (ties are common, as in real data);
- y = α_t + β_t·x + e, β_t ~ N(0.34, 0.10²) (the national rank-rank slope, Chetty et al. 2014),
  α_t ~ N(0.33, 0.06²), e ~ N(0, 0.22²); clipped to [0, 1] and rounded to 0.01.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

ILLINOIS_FIPS = "17"


@dataclass(frozen=True)
class StateParams:
    n_tracts: int = 3108
    mean_tract_size: float = 70.0
    between_sd: float = 0.35
    within_sd: float = 0.70
    slope_mean: float = 0.34
    slope_sd: float = 0.10
    intercept_mean: float = 0.33
    intercept_sd: float = 0.06
    noise_sd: float = 0.22
    counties: int = 102  # Illinois has 102 counties

    def as_dict(self) -> dict:
        return asdict(self)


def tract_geoids(state_fips: str, n_tracts: int, counties: int) -> tuple[np.ndarray, np.ndarray]:
    """11-digit GEOIDs (2 state + 3 county + 6 tract digits), tracts spread over counties."""
    county_of = np.sort(np.arange(n_tracts) % max(1, min(counties, n_tracts)))
    county_code = 2 * county_of + 1  # county FIPS codes are odd numbers, as in most states
    tract_no = np.zeros(n_tracts, dtype=np.int64)
    for c in np.unique(county_of):
        sel = county_of == c
        tract_no[sel] = 100 * (np.arange(sel.sum()) + 1)  # e.g. 000100, 000200, ...
    geoids = np.array([f"{state_fips}{cc:03d}{tn:06d}" for cc, tn in zip(county_code, tract_no)])
    return geoids, county_code


def oi_like_state(seed: int = 0, params: StateParams = StateParams(),
                  state_fips: str = ILLINOIS_FIPS) -> pd.DataFrame:
    """One state's person-level records: columns ``geoid``, ``parent_rank``, ``child_rank``.

    Also returns the true tract parameters in ``df.attrs['truth']`` (for evaluation only).
    """
    rng = np.random.default_rng(seed)
    p = params
    sizes = np.maximum(1, np.rint(rng.exponential(p.mean_tract_size, p.n_tracts))).astype(int)
    geoids, _ = tract_geoids(state_fips, p.n_tracts, p.counties)
    tract = np.repeat(np.arange(p.n_tracts), sizes)
    tract_mean = rng.normal(0.0, p.between_sd, p.n_tracts)
    log_income = rng.normal(tract_mean[tract], p.within_sd)
    # percentile rank within the state, rounded to 0.01
    order = np.argsort(log_income, kind="stable")
    rank = np.empty(tract.size)
    rank[order] = (np.arange(tract.size) + 0.5) / tract.size
    x = np.round(rank, 2)
    slope = rng.normal(p.slope_mean, p.slope_sd, p.n_tracts)
    intercept = rng.normal(p.intercept_mean, p.intercept_sd, p.n_tracts)
    y = intercept[tract] + slope[tract] * x + rng.normal(0.0, p.noise_sd, tract.size)
    y = np.round(np.clip(y, 0.0, 1.0), 2)
    df = pd.DataFrame({"geoid": geoids[tract], "parent_rank": x, "child_rank": y})
    df.attrs["truth"] = pd.DataFrame({"geoid": geoids, "slope": slope, "intercept": intercept,
                                      "n": sizes})
    df.attrs["params"] = {**p.as_dict(), "seed": seed, "state_fips": state_fips}
    return df


def batch_of(df: pd.DataFrame):
    """The records of a state as a :class:`mechanisms.TractBatch`."""
    from mechanisms import TractBatch

    return TractBatch.from_labels(df["geoid"].to_numpy(), df["parent_rank"].to_numpy(),
                                  df["child_rank"].to_numpy())


def write_synthetic(out: "Path", states: list[str], seed: int = 0,
                    params: StateParams = StateParams()) -> dict:
    """Write microdata (Parquet, hive-partitioned by state) and tract boundaries (GeoParquet).

    Layout: ``out/microdata/state=SS/part-0.parquet`` and ``out/tracts.parquet``. Each state
    gets its own seed (``seed + index``). Returns the paths and counts.
    """
    from pathlib import Path

    from .geography import STATE_FIPS, synth_boundaries, write_boundaries

    out = Path(out)
    bad = [s for s in states if s not in STATE_FIPS]
    if bad:
        raise ValueError(f"not state FIPS codes: {bad}")
    all_geoids, rows = [], 0
    for i, fips in enumerate(states):
        df = oi_like_state(seed + i, params, state_fips=fips)
        folder = out / "microdata" / f"state={fips}"
        folder.mkdir(parents=True, exist_ok=True)
        truth = df.attrs["truth"]
        df.attrs = {}  # the truth stays out of the microdata file
        # One record per synthetic person: an id that is unique across states, so the release
        # can check the one-record-per-person assumption that parallel composition needs.
        df.insert(0, "person_id", f"{fips}-" + pd.Series(np.arange(len(df))).astype(str)
                  .str.zfill(8))
        df.to_parquet(folder / "part-0.parquet", index=False)
        all_geoids.extend(truth["geoid"])
        rows += len(df)
    boundaries = synth_boundaries(all_geoids, seed=seed)
    # TIGER/Line's columns, so synthetic and real boundary files go through one loader.
    g = boundaries["geoid"].astype(str)
    tiger = boundaries.assign(GEOID=g, STATEFP=g.str[:2], COUNTYFP=g.str[2:5],
                              TRACTCE=g.str[5:])[["GEOID", "STATEFP", "COUNTYFP", "TRACTCE",
                                                  "geometry"]]
    write_boundaries(tiger, out / "tracts.parquet")
    return {"microdata": out / "microdata", "boundaries": out / "tracts.parquet",
            "states": states, "tracts": len(all_geoids), "records": rows}
