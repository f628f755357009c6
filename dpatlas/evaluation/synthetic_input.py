"""Opportunity-Insights-like synthetic microdata (the paper's Appendix A, rebuilt).

The paper's numbers for Appendix A were lost in conversion; the parameters below are our
choices, each stated with its reason, and every run records them:

- tract sizes: exponential with mean 70 (Illinois: 3,108 tracts, about 70 children per tract,
  a long tail to several hundred), at least 1; the default state keeps Illinois' 3,108 tracts
  (so the evaluation's figures stay comparable with earlier runs) but is North Carolina, the
  paper's second state, with its 100 real counties, so the demo map is a real place;
- parent log income: tract mean ~ N(0, σ_b²), person ~ N(tract mean, σ_w²) with σ_w = 2·σ_b
  (within-tract spread about twice the between-tract spread); σ_b = 0.35;
- x: the parent's percentile rank within the whole state's parent income distribution,
  rounded to 0.01 (ties are common, as in real data);
- y = α_t + β_t·x + e, β_t ~ N(0.34, 0.10²) (the national rank-rank slope, Chetty et al. 2014),
  α_t ~ N(0.33, 0.06²), e ~ N(0, 0.22²); clipped to [0, 1] and rounded to 0.01.

Spatial structure. Each of the three tract effects (the parent income mean, α_t, β_t) is its
mean plus its standard deviation times a sum of three independent, unit-variance parts:

    √s · F(centroid)  +  √c · C(county)  +  √(1 − s − c) · E(tract)

- F: a Gaussian random field over the tract centroids with a Matérn covariance (ν = 3/2,
  length scale 60 km), so neighbouring tracts have similar values and the map shows regions,
  as the real Atlas does. It is drawn by random Fourier features (Rahimi & Recht 2007): by
  Bochner's theorem the Matérn covariance is E[cos(ω·(p − q))] for ω drawn from its spectral
  density, a bivariate Student's t with 2ν degrees of freedom and scale 1/ℓ, so
  √(2/M) Σ_m cos(ω_m·p + b_m) with b_m uniform on [0, 2π) has exactly that covariance and is
  Gaussian as M grows (M = 1,024). The cost is O(tracts × M): 74,000 tracts take about 2.3 s
  of CPU per field, where an exact draw would factor a 74,000² covariance matrix. The draw is then
  standardised over the state's tracts, so one state's spread of tract effects is the
  non-spatial model's whatever the length scale;
- C: a county effect, N(0, 1) per county (county lines show on the map as in the real data);
- E: the tract's own N(0, 1) part.

Shares s = 0.6 and c = 0.15. The sum has variance 1, so each effect keeps the marginal law
above and the evaluation's per-tract statistics stay those of the non-spatial model (measured
in docs/files.md). Centroids come from the synthetic boundaries (`dpatlas.evaluation.synthetic_boundaries`) of the
same GEOIDs and seed, so the published map and the data agree.

Cells (``cells=N``, ``dpatlas synth --cells N``). The release composes cells sequentially:
a person may have one record in each cell (docs/privacy.md; the ledger charges every cell).
The generator draws exactly that shape, as the Atlas's several outcomes of the same children:
every person has one record in each of the N cells ``outcome-1`` ... ``outcome-N`` (column
``cell``), with the same person id, tract and parent rank, and the cell's own outcome

    y_c = (α_t + a_c) + (β_t + b_c)·x + e_c,   a_c ~ N(0, 0.05²), b_c ~ N(0, 0.08²),

e_c ~ N(0, 0.22²) drawn afresh per cell (each cell its own random stream), so the cells'
estimates differ as different outcomes would. Records are persons × N; the state's file holds
one row group per cell, written one cell at a time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

NORTH_CAROLINA_FIPS = "37"
# Random streams of one state's data, each its own: the spatial parts do not shift the others.
_PEOPLE_STREAM, _FIELD_STREAM, _COUNTY_STREAM, _TRACT_STREAM, _CELL_STREAM = 0, 1, 2, 3, 4
_FOURIER_FEATURES = 1024
_FIELD_CHUNK = 4096  # centroids per block of the feature sum: memory stays ~35 MB
# The three tract effects that vary over space, in the order their fields are drawn.
_EFFECTS = ("parent_income", "intercept", "slope")
# Each cell's shift of the intercept and slope (standard deviations): outcomes of one child
# differ in level and in how steeply they follow the parent's rank.
_CELL_INTERCEPT_SD, _CELL_SLOPE_SD = 0.05, 0.08
CELL_PREFIX = "outcome-"


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
    # North Carolina's 100 counties: their FIPS codes are the odd numbers 001-199, the codes
    # tract_geoids gives, so the tracts land in the real counties (evaluation.synthetic_boundaries).
    counties: int = 100
    # Shares of each tract effect's variance: a smooth field over space, a county effect
    # (the rest is the tract's own). See the module docstring.
    spatial_share: float = 0.6
    county_share: float = 0.15
    length_scale_km: float = 60.0
    matern_nu: float = 1.5

    def __post_init__(self):
        if not (0 <= self.spatial_share and 0 <= self.county_share
                and self.spatial_share + self.county_share <= 1):
            raise ValueError("spatial_share and county_share must be >= 0 with a sum <= 1, got "
                             f"{self.spatial_share} and {self.county_share}")
        if not (self.length_scale_km > 0 and self.matern_nu > 0):
            raise ValueError("length_scale_km and matern_nu must be > 0")

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


def matern_field(points_km: np.ndarray, length_scale_km: float, nu: float,
                 rng: np.random.Generator, features: int = _FOURIER_FEATURES) -> np.ndarray:
    """A zero-mean, unit-variance random field with Matérn(ν, ℓ) covariance at ``points_km``.

    Random Fourier features (Rahimi & Recht 2007): ω_m = Z_m/ℓ · √(2ν/W_m) with Z_m ~ N(0, I₂)
    and W_m ~ χ²(2ν) is the Matérn spectral density (a bivariate t), b_m ~ U[0, 2π), and
    f(p) = √(2/M) Σ_m cos(ω_m·p + b_m) has E[f(p) f(q)] = E[cos(ω·(p − q))] = k(|p − q|).
    """
    points_km = np.asarray(points_km, dtype=float).reshape(-1, 2)
    omega = rng.standard_normal((features, 2)) / length_scale_km
    omega *= np.sqrt(2 * nu / rng.chisquare(2 * nu, features))[:, None]
    phase = rng.uniform(0.0, 2 * np.pi, features)
    field = np.empty(len(points_km))
    for lo in range(0, len(points_km), _FIELD_CHUNK):
        block = points_km[lo:lo + _FIELD_CHUNK]
        field[lo:lo + _FIELD_CHUNK] = np.cos(block @ omega.T + phase).sum(axis=1)
    return field * np.sqrt(2.0 / features)


def matern_covariance(distance_km: np.ndarray, length_scale_km: float, nu: float) -> np.ndarray:
    """The Matérn covariance k(r) = 2^(1−ν)/Γ(ν) (√(2ν) r/ℓ)^ν K_ν(√(2ν) r/ℓ), k(0) = 1."""
    from scipy.special import gamma, kv

    r = np.sqrt(2 * nu) * np.asarray(distance_km, dtype=float) / length_scale_km
    with np.errstate(invalid="ignore"):
        k = 2 ** (1 - nu) / gamma(nu) * r ** nu * kv(nu, r)
    return np.where(r == 0, 1.0, k)


def _standardised(values: np.ndarray) -> np.ndarray:
    """Mean 0 and variance 1 over the state's tracts (unchanged if it has one tract)."""
    sd = values.std()
    return (values - values.mean()) / sd if sd > 0 else np.zeros_like(values)


def spatial_effects(points_km: np.ndarray, county_of: np.ndarray, params: "StateParams",
                    seed: int) -> dict[str, np.ndarray]:
    """Unit-variance, spatially structured parts of each tract effect (``_EFFECTS``).

    √s·F + √c·C + √(1−s−c)·E per effect, with independent F (Matérn field over the centroids,
    standardised over the state), C (per county) and E (per tract), each from its own stream.
    """
    s, c = params.spatial_share, params.county_share
    field_rng = np.random.default_rng([seed, _FIELD_STREAM])
    county_rng = np.random.default_rng([seed, _COUNTY_STREAM])
    tract_rng = np.random.default_rng([seed, _TRACT_STREAM])
    counties, county_index = np.unique(county_of, return_inverse=True)
    out = {}
    for effect in _EFFECTS:
        field = _standardised(matern_field(points_km, params.length_scale_km, params.matern_nu,
                                           field_rng))
        county = county_rng.standard_normal(len(counties))[county_index]
        own = tract_rng.standard_normal(len(points_km))
        out[effect] = np.sqrt(s) * field + np.sqrt(c) * county + np.sqrt(1 - s - c) * own
    return out


def oi_like_state(seed: int = 0, params: StateParams = StateParams(),
                  state_fips: str = NORTH_CAROLINA_FIPS,
                  centroids: np.ndarray | None = None) -> pd.DataFrame:
    """One state's person-level records: columns ``geoid``, ``parent_rank``, ``child_rank``.

    ``centroids``: the tracts' (lon, lat) in GEOID order; by default those of
    ``synth_boundaries`` for these GEOIDs and ``seed`` (what ``write_synthetic`` publishes).
    Also returns the true tract parameters in ``df.attrs['truth']`` (for evaluation only).
    """
    from dpatlas.core.places import local_km, tract_centroids
    from dpatlas.evaluation.synthetic_boundaries import synth_boundaries

    p = params
    geoids, county_code = tract_geoids(state_fips, p.n_tracts, p.counties)
    if centroids is None:
        centroids = tract_centroids(synth_boundaries(list(geoids), seed=seed)).loc[geoids]
        centroids = centroids[["lon", "lat"]].to_numpy()
    centroids = np.asarray(centroids, dtype=float)
    if centroids.shape != (p.n_tracts, 2):
        raise ValueError(f"centroids must be ({p.n_tracts}, 2) lon/lat pairs, got "
                         f"{centroids.shape}")
    effects = spatial_effects(local_km(centroids[:, 0], centroids[:, 1]), county_code, p, seed)

    rng = np.random.default_rng([seed, _PEOPLE_STREAM])
    sizes = np.maximum(1, np.rint(rng.exponential(p.mean_tract_size, p.n_tracts))).astype(int)
    tract = np.repeat(np.arange(p.n_tracts), sizes)
    tract_mean = p.between_sd * effects["parent_income"]
    log_income = rng.normal(tract_mean[tract], p.within_sd)
    # percentile rank within the state, rounded to 0.01
    order = np.argsort(log_income, kind="stable")
    rank = np.empty(tract.size)
    rank[order] = (np.arange(tract.size) + 0.5) / tract.size
    x = np.round(rank, 2)
    slope = p.slope_mean + p.slope_sd * effects["slope"]
    intercept = p.intercept_mean + p.intercept_sd * effects["intercept"]
    y = intercept[tract] + slope[tract] * x + rng.normal(0.0, p.noise_sd, tract.size)
    y = np.round(np.clip(y, 0.0, 1.0), 2)
    df = pd.DataFrame({"geoid": geoids[tract], "parent_rank": x, "child_rank": y})
    df.attrs["truth"] = pd.DataFrame({"geoid": geoids, "slope": slope, "intercept": intercept,
                                      "n": sizes})
    df.attrs["params"] = {**p.as_dict(), "seed": seed, "state_fips": state_fips}
    return df


def cell_names(cells: int) -> list[str]:
    """The names of ``cells`` cells: ``outcome-1`` ... ``outcome-N``."""
    if cells < 1:
        raise ValueError(f"cells must be >= 1, got {cells}")
    return [f"{CELL_PREFIX}{k}" for k in range(1, cells + 1)]


def cell_records(people: pd.DataFrame, truth: pd.DataFrame, cell: int, seed: int,
                 params: StateParams = StateParams()) -> pd.DataFrame:
    """Cell number ``cell``'s records (0-based) of the persons of ``people`` (a frame of
    :func:`oi_like_state`, with its ``truth``): the same persons, tracts and parent ranks, the
    cell's own outcome (see the module docstring), and a ``cell`` column."""
    tract = np.repeat(np.arange(len(truth)), truth["n"].to_numpy())
    rng = np.random.default_rng([seed, _CELL_STREAM, cell])
    shift_intercept, shift_slope = rng.normal(0.0, [_CELL_INTERCEPT_SD, _CELL_SLOPE_SD])
    intercept = truth["intercept"].to_numpy() + shift_intercept
    slope = truth["slope"].to_numpy() + shift_slope
    x = people["parent_rank"].to_numpy()
    y = intercept[tract] + slope[tract] * x + rng.normal(0.0, params.noise_sd, tract.size)
    out = people.drop(columns="child_rank").assign(child_rank=np.round(np.clip(y, 0.0, 1.0), 2),
                                                    cell=cell_names(cell + 1)[cell])
    return out


def _write_state(people: pd.DataFrame, truth: pd.DataFrame, path: Path, seed: int,
                 params: StateParams, cells: int | None) -> int:
    """The state's microdata file: the persons as they are, or one row group per cell."""
    if cells is None:
        people.to_parquet(path, index=False)
        return len(people)
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    try:
        for c in range(cells):
            table = pa.Table.from_pandas(cell_records(people, truth, c, seed, params),
                                         preserve_index=False)
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    finally:
        if writer is not None:
            writer.close()
    return len(people) * cells


def batch_of(df: pd.DataFrame):
    """The records of a state as a :class:`mechanisms.TractBatch`."""
    from mechanisms import TractBatch

    return TractBatch.from_labels(df["geoid"].to_numpy(), df["parent_rank"].to_numpy(),
                                  df["child_rank"].to_numpy())


def write_synthetic(out: Path, states: list[str], seed: int = 0,
                    params: StateParams = StateParams(), cells: int | None = None) -> dict:
    """Write microdata (Parquet, hive-partitioned by state) and tract boundaries (GeoParquet).

    Layout: ``out/microdata/state=SS/part-0.parquet`` and ``out/tracts.parquet``. The
    boundaries come first (seed ``seed``), and each state's data (seed ``seed + index``) is
    drawn over its tracts' centroids, so the tract effects vary smoothly on the map written
    beside them. ``cells``: every person gets one record in each of that many cells (column
    ``cell``; see the module docstring); None writes no cell column. Returns the paths and
    counts.
    """
    from dpatlas.core.places import tract_centroids
    from dpatlas.core.state_fips import STATE_FIPS
    from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
    from dpatlas.release.boundaries import write_boundaries

    out = Path(out)
    bad = [s for s in states if s not in STATE_FIPS]
    if bad:
        raise ValueError(f"not state FIPS codes: {bad}")
    geoids_of = {fips: tract_geoids(fips, params.n_tracts, params.counties)[0]
                 for fips in states}
    all_geoids = [g for fips in states for g in geoids_of[fips]]
    boundaries = synth_boundaries(all_geoids, seed=seed)
    centroids = tract_centroids(boundaries)
    rows = 0
    for i, fips in enumerate(states):
        df = oi_like_state(seed + i, params, state_fips=fips,
                           centroids=centroids.loc[geoids_of[fips], ["lon", "lat"]].to_numpy())
        folder = out / "microdata" / f"state={fips}"
        folder.mkdir(parents=True, exist_ok=True)
        # One record per synthetic person (and cell): an id that is unique across states, so
        # the release can check the one-record-per-person assumption that parallel
        # composition needs.
        df.insert(0, "person_id", f"{fips}-" + pd.Series(np.arange(len(df))).astype(str)
                  .str.zfill(8))
        truth = df.attrs["truth"]
        df.attrs = {}  # the truth stays out of the microdata file
        rows += _write_state(df, truth, folder / "part-0.parquet", seed + i, params, cells)
    # TIGER/Line's columns, so synthetic and real boundary files go through one loader.
    g = boundaries["geoid"].astype(str)
    tiger = boundaries.assign(GEOID=g, STATEFP=g.str[:2], COUNTYFP=g.str[2:5],
                              TRACTCE=g.str[5:])[["GEOID", "STATEFP", "COUNTYFP", "TRACTCE",
                                                  "geometry"]]
    write_boundaries(tiger, out / "tracts.parquet")
    return {"microdata": out / "microdata", "boundaries": out / "tracts.parquet",
            "states": states, "tracts": len(all_geoids), "records": rows,
            "cells": cell_names(cells) if cells is not None else None}
