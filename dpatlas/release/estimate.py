"""Selecting and estimating one partition, per tract and cell (plain functions, no Prefect).

``select_partition`` draws the selection noise (dp rule) and returns the choice as a table;
the flow persists it before ``estimate_partition`` runs the chosen mechanism and the suite.

Both build a :class:`~mechanisms.privacy_filter.PrivacyFilter` per cell from the plan's charged
steps for the tracts they draw for, and hand each mechanism the meter of its step: a draw
that would spend more than the ledger charged raises ``BudgetOverrun`` before it happens.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np
import pandas as pd

import mechanisms as M
from mechanisms.batch import TractBatch
from mechanisms.privacy_filter import NO_METER, PrivacyFilter
from mechanisms.noise import Randomness, default_randomness
from mechanisms.sorted_predictions import sharing_sorted_predictions

from mechanisms import intervals as CI
from mechanisms.sufficient_stats import noisy_stats_split

from dpatlas.core.columns import UNCERTAINTY_COLUMNS, RESULT_COLUMNS
from dpatlas.release import staging
from dpatlas.release.cell_groups import group_cells, group_suffix
from dpatlas.release.allocate import INTERVAL_STEP, BudgetPlan, interval_kind, suite_step
from dpatlas.release.selection import (DP_BAND, PRIMARY_STEP, SELECTION_STEP, Selection,
                                       record_selection_spend, run_selected, select)



@dataclass(frozen=True)
class Chunk:
    """Up to ``partition_tracts`` tracts of one staged partition: selected and estimated
    together (one task run, or one of a run of chunks: :mod:`dpatlas.release.task_groups`),
    its noise persisted under ``name`` (so a resumed release finds it again).

    The tracts are the contiguous range ``first_geoid``..``last_geoid`` of the partition's
    sorted GEOIDs: a chunk is a few bytes whatever its size, so the subflow's parameters stay
    O(chunks), not O(tracts) (a national list of GEOIDs is over Prefect's 512 KiB limit).
    ``staged`` is a local path, or a URL under the release's ``staging_url``
    (:mod:`dpatlas.release.staging`) that Dask workers on other machines read."""

    staged: Path | str
    first_geoid: str
    last_geoid: str
    name: str
    # The cells this chunk estimates (dpatlas.release.cell_groups): None for every cell of
    # its tracts; a group when the range's records over all cells exceed the task bound.
    cells: Optional[tuple[str, ...]] = None


def staged_tracts(staged: list[Path]) -> tuple[dict[Path, list[str]], pd.DataFrame]:
    """Per staged partition its sorted tract GEOIDs, and n per (geoid, cell) over all of them.

    Read after contribution bounding, which may have rewritten staged files."""
    counts = staged_counts(staged)
    return tracts_of(counts), all_sizes(counts)


def staged_counts(staged: list[Path], known: Optional[dict[Path, pd.DataFrame]] = None
                  ) -> dict[Path, pd.DataFrame]:
    """Per staged partition, n per (geoid, cell) (sorted): what chunks are planned from.
    ``known``: partitions' counts already made from the rows they were staged with (by the
    validation tasks on the workers, :func:`tract_cell_counts`), used instead of reading
    those files again; the flow then reads no record to plan the chunks."""
    known = {Path(path): counts for path, counts in (known or {}).items()}
    return {Path(path): known[Path(path)] if Path(path) in known
            else _tract_cell_counts(Path(path)) for path in staged}


def tracts_of(counts: dict[Path, pd.DataFrame]) -> dict[Path, list[str]]:
    return {path: sorted(c["geoid"].unique()) for path, c in counts.items()}


def all_sizes(counts: dict[Path, pd.DataFrame]) -> pd.DataFrame:
    """n per (geoid, cell) over every partition (the public sizes the pre-charge checks read).

    GEOIDs and cells are categorical: the flow keeps this table to the end, one row per
    tract-cell (3.1 million with 42 cells), and as text it would take ~140 bytes a row."""
    frames = [f for f in counts.values() if len(f)]
    if not frames:
        return pd.DataFrame({"geoid": [], "cell": [], "n": []})
    from pandas.api.types import union_categoricals

    def joined(column: str) -> pd.Categorical:
        return union_categoricals([pd.Categorical(f[column]) for f in frames],
                                  sort_categories=True)

    return pd.DataFrame({"geoid": joined("geoid"), "cell": joined("cell"),
                         "n": np.concatenate([f["n"].to_numpy() for f in frames])})


_COUNT_BATCH_ROWS = 1 << 20  # records counted at a time (a partition holds every cell)


def _tract_cell_counts(path: Path) -> pd.DataFrame:
    """n per (geoid, cell) of one staged file (sorted), counted a batch of records at a time
    and summed, so memory follows the tract-cells, not the records."""
    import pyarrow.parquet as pq

    batches = pq.ParquetFile(path).iter_batches(batch_size=_COUNT_BATCH_ROWS,
                                                columns=["geoid", "cell"])
    return _summed([tract_cell_counts(batch.to_pandas()) for batch in batches])


def tract_cell_counts(rows: pd.DataFrame) -> pd.DataFrame:
    """n per (geoid, cell) of ``rows`` (sorted; GEOIDs and cells as text), as
    :func:`staged_counts` reads them from a staged file of those rows."""
    if not len(rows):
        return pd.DataFrame({"geoid": [], "cell": [], "n": []})
    keys = rows[["geoid", "cell"]].astype(str)
    return keys.groupby(["geoid", "cell"]).size().rename("n").reset_index()


def _summed(parts: list[pd.DataFrame]) -> pd.DataFrame:
    parts = [p for p in parts if len(p)]
    if len(parts) <= 1:
        return parts[0] if parts else pd.DataFrame({"geoid": [], "cell": [], "n": []})
    return pd.concat(parts).groupby(["geoid", "cell"])["n"].sum().reset_index()


def split_into_chunks(geoids: dict[Path, list[str]], size: int,
                      counts: Optional[dict[Path, pd.DataFrame]] = None,
                      record_bound: Optional[int] = None) -> list[Chunk]:
    """Each partition's sorted GEOIDs in runs of ``size``; chunk k of ``input-17.parquet`` is
    named ``input-17-k`` (the same names on every run of the same input, hence resumable).

    With ``counts`` (:func:`staged_counts`), a run whose records over every cell exceed
    ``record_bound`` is split by groups of cells (:func:`dpatlas.release.cell_groups.group_cells`),
    chunk ``input-17-k-cj`` holding group j, so a chunk's memory does not grow with the cells."""
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, got {size}")
    chunks = []
    for path, gs in geoids.items():
        for i in range(0, len(gs), size):
            first, last = gs[i], gs[min(i + size, len(gs)) - 1]
            name = f"{Path(path).stem}-{i // size}"
            groups = ([None] if counts is None else group_cells(
                _records_per_cell(counts[Path(path)], first, last), record_bound))
            chunks.extend(Chunk(Path(path), first, last, name + group_suffix(j, groups), cells)
                          for j, cells in enumerate(groups))
    return chunks


def _records_per_cell(counts: pd.DataFrame, first: str, last: str) -> pd.Series:
    rows = counts["geoid"].between(first, last)
    return counts.loc[rows].groupby("cell")["n"].sum()


def stage_chunks(chunks: list[Chunk], urls: dict[Path, str]) -> list[Chunk]:
    """The same chunks, each reading its partition from its staging URL."""
    return [replace(c, staged=urls[Path(c.staged)]) for c in chunks]


# What selection and estimation read of a record. Not the person id (unique text, the
# largest column of a staged file) or the input row: a chunk with many cells holds several
# records per person, so those columns would dominate its memory.
CHUNK_COLUMNS = ["geoid", "cell", "x", "y"]


def read_chunk(chunk: Chunk) -> pd.DataFrame:
    """Only this chunk's rows (filtered while reading, not the whole state), and only the
    columns the estimators use (``CHUNK_COLUMNS``)."""
    rows = [("geoid", ">=", chunk.first_geoid), ("geoid", "<=", chunk.last_geoid)]
    if chunk.cells is not None:
        rows.append(("cell", "in", list(chunk.cells)))
    if isinstance(chunk.staged, str):  # a staging URL: read through fsspec
        return staging.read_parquet(chunk.staged, columns=CHUNK_COLUMNS, filters=rows)
    return pd.read_parquet(chunk.staged, columns=CHUNK_COLUMNS, filters=rows)


def draw_selection(chunk: Chunk, budget: BudgetPlan, seed: Optional[int],
                   min_n: int) -> pd.DataFrame:
    """A chunk's selection drawn from ``seed`` (None: the operating system's CSPRNG): read,
    selected, returned; the caller persists and records it. Module-level and picklable, so
    a compute-pool worker (:mod:`dpatlas.release.compute_pool`) or a Dask worker runs it."""
    return select_partition(read_chunk(chunk), budget, default_randomness(seed), min_n)


def draw_estimates(chunk: Chunk, selection: Path | str, budget: BudgetPlan,
                   seed: Optional[int], min_n: int) -> pd.DataFrame:
    """A chunk's estimates from its recorded ``selection`` (a path, or a URL under the staging
    location), drawn from ``seed``; like :func:`draw_selection`."""
    chosen = (staging.read_parquet(selection) if isinstance(selection, str)
              else pd.read_parquet(selection))
    return estimate_partition(read_chunk(chunk), chosen, budget, default_randomness(seed), min_n)


def suite_columns(plan: BudgetPlan) -> list[str]:
    return [f"{s.estimator}_{p}" for s in plan.suite for p in ("p25", "p75")]


def _cells(df: pd.DataFrame, min_n: int):
    """Per cell: the batch of its tracts and the indices of tracts large enough to estimate."""
    for cell, grp in df.groupby("cell", sort=True):
        batch = TractBatch.from_labels(grp["geoid"].to_numpy(), grp["x"].to_numpy(),
                                       grp["y"].to_numpy())
        yield str(cell), batch, np.nonzero(batch.n >= min_n)[0]


def privacy_filter(plan: BudgetPlan, labels: np.ndarray, steps: list[str]) -> PrivacyFilter:
    """The charges of ``steps`` (those this stage draws for) for the tracts ``labels``."""
    return PrivacyFilter({name: plan.step(name).guarantee for name in steps}, labels)


def _intervals(plan: BudgetPlan, sub: TractBatch, sel: Selection, res, rand: Randomness,
               meter) -> CI.Intervals:
    """The interval of each tract's released p25/p75, reusing what its mechanism released
    (post-processing) and paying the interval step's own noise. NoisyStats' noise scales
    differ between tracts that drew the selection's nvar and tracts that did not (banded
    rule), so each group gets its own call."""
    drew = (sel.drew if sel.drew is not None
            else np.full(sub.n_tracts, plan.rule.kind == "dp"))
    parts = [(np.nonzero(drew == flag)[0], flag) for flag in (True, False)]
    out = [np.full((1, sub.n_tracts), np.nan) for _ in UNCERTAINTY_COLUMNS]
    for tracts, drawn in parts:
        if tracts.size == 0:
            continue
        ci = _interval_group(plan, sub.subset(tracts), res, tracts, drawn, rand, meter)
        for dst, col in zip(out, UNCERTAINTY_COLUMNS):
            dst[:, tracts] = getattr(ci, col)
    return CI.Intervals(*out)


def _interval_group(plan: BudgetPlan, sub: TractBatch, res, tracts: np.ndarray, drawn: bool,
                    rand: Randomness, meter) -> CI.Intervals:
    eps_sel, eps_rest = plan.rule.budgets(plan.primary_epsilon)
    if drawn:  # NoisyStats reused the selection's nvar (drawn at eps_sel); the rest split
        _, eps_ncov, eps_intercept = noisy_stats_split(eps_rest, nvar_drawn=True)
        eps_nvar = eps_sel
    else:  # NoisyStats with the whole primary budget, its own split
        eps_nvar, eps_ncov, eps_intercept = noisy_stats_split(plan.primary_epsilon)
    # The dp selection publishes NoisyStats only where ε·nvar~ >= threshold: the interval of a
    # tract that drew it conditions on that (public) event.
    floor = plan.rule.threshold / plan.primary_epsilon if drawn else 0.0
    # DPExpTheilSen ran with what the selection left (drawn) or the whole primary budget
    # (selection.run_selected's branches): its rows' standard errors need it.
    eps_theil_sen = eps_rest if drawn else plan.primary_epsilon
    released = CI.Released(res.p25[:, tracts], res.p75[:, tracts],
                           noisy_nvar=res.noisy_nvar[:, tracts], eps_nvar=eps_nvar,
                           eps_ncov=eps_ncov, eps_intercept=eps_intercept,
                           mechanism=res.mechanism[:, tracts], nvar_floor=floor,
                           eps_theil_sen=eps_theil_sen)
    return CI.intervals(interval_kind(plan.rule), sub, released, plan.interval_epsilon, rand,
                        plan.interval_level, meter=meter)


def select_partition(df: pd.DataFrame, plan: BudgetPlan, rand: Randomness,
                     min_n: int) -> pd.DataFrame:
    """The mechanism chosen for each eligible (tract, cell), and the selection's noisy nvar."""
    frames = []
    # The dp rule draws against its selection step; the banded rule's draw is part of its
    # one primary step (estimate_partition records it there again before the mechanism runs).
    step = {"dp": SELECTION_STEP, "banded": PRIMARY_STEP}.get(plan.rule.kind)
    for cell, batch, eligible in _cells(df, min_n):
        sub = batch.subset(eligible)
        meter = privacy_filter(plan, sub.labels, [step]).meter(step) if step else NO_METER
        sel = select(sub, plan.primary_epsilon, plan.rule, rand, meter=meter)
        frames.append(pd.DataFrame({"geoid": batch.labels[eligible].astype(str), "cell": cell,
                                    "mechanism": sel.mechanism[0],
                                    "noisy_nvar": sel.noisy_nvar[0],
                                    "epsilon_rest": sel.epsilon_rest}))
    cols = ["geoid", "cell", "mechanism", "noisy_nvar", "epsilon_rest"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def _bands_drawn(plan: BudgetPlan, sub: TractBatch) -> tuple:
    """(whole budget, dp-band tracts) of the banded rule, from the public n; else (None, None)."""
    if plan.rule.kind != "banded":
        return None, None
    band = plan.rule.band_choice(sub.n, plan.primary_epsilon)
    return plan.primary_epsilon, band == DP_BAND


def _estimates_and_intervals(plan: BudgetPlan, sub: TractBatch, sel: Selection,
                             rand: Randomness, budget: PrivacyFilter):
    """The chosen mechanism's release and, if the plan has one, its interval (else None)."""
    res = run_selected(sub, plan.rule, sel, rand, meter=budget.meter(PRIMARY_STEP),
                       publishable_only=True)
    ci = (_intervals(plan, sub, sel, res, rand, budget.meter(INTERVAL_STEP))
          if plan.interval_epsilon else None)
    return res, ci


def estimate_partition(df: pd.DataFrame, selection: pd.DataFrame, plan: BudgetPlan,
                       rand: Randomness, min_n: int) -> pd.DataFrame:
    """One row per (tract, cell) with data: the released numbers and what they cost."""
    frames = []
    eps_charged, delta_charged = plan.charged()
    _, eps_rest = plan.rule.budgets(plan.primary_epsilon)
    steps = [PRIMARY_STEP] + [suite_step(s.estimator) for s in plan.suite]
    if plan.interval_epsilon:
        steps.append(INTERVAL_STEP)
    for cell, batch, eligible in _cells(df, min_n):
        out = pd.DataFrame({"geoid": batch.labels.astype(str), "cell": cell, "n": batch.n,
                            "mechanism": "none", "status": "suppressed",
                            "reason": f"fewer than {min_n} records", "p25_raw": np.nan,
                            "p75_raw": np.nan, "epsilon_spent": 0.0, "delta_spent": 0.0})
        for col in suite_columns(plan) + (UNCERTAINTY_COLUMNS if plan.interval_epsilon else []):
            out[col] = np.nan
        if eligible.size:
            sub = batch.subset(eligible)
            budget = privacy_filter(plan, sub.labels, steps)
            chosen = (selection[selection["cell"] == cell].set_index("geoid")
                      .reindex(sub.labels.astype(str)))
            if chosen["mechanism"].isna().any():
                raise RuntimeError(f"cell {cell}: selection missing for some tracts")
            if not np.all(chosen["epsilon_rest"].to_numpy(dtype=float) == eps_rest):
                raise RuntimeError(f"cell {cell}: the persisted selection was drawn under "
                                   "another budget plan; rerun under a new release id")
            sel = Selection((chosen["mechanism"].to_numpy() == "NoisyStats")[None, :],
                            chosen["noisy_nvar"].to_numpy(dtype=float)[None, :], eps_rest,
                            *_bands_drawn(plan, sub))
            record_selection_spend(plan.rule, sel, sub.labels, budget.meter(PRIMARY_STEP))
            with sharing_sorted_predictions():  # the estimates' pairwise work, for the intervals
                res, ci = _estimates_and_intervals(plan, sub, sel, rand, budget)
            out.loc[eligible, "mechanism"] = res.mechanism[0]
            out.loc[eligible, "status"] = np.where(res.failed[0], "failed", "released")
            out.loc[eligible, "reason"] = np.where(res.failed[0], res.reason[0], "")
            out.loc[eligible, "p25_raw"] = res.p25[0]
            out.loc[eligible, "p75_raw"] = res.p75[0]
            out.loc[eligible, "epsilon_spent"] = eps_charged
            out.loc[eligible, "delta_spent"] = delta_charged
            if ci is not None:
                for col in UNCERTAINTY_COLUMNS:
                    out.loc[eligible, col] = getattr(ci, col)[0]
            for share in plan.suite:
                name = share.estimator
                est = M.estimate_batch(name, sub, share.epsilon, share.delta or None, rand=rand,
                                       meter=budget.meter(suite_step(name)),
                                       publishable_only=True)
                out.loc[eligible, f"{name}_p25"] = est.p25
                out.loc[eligible, f"{name}_p75"] = est.p75
        frames.append(out)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RESULT_COLUMNS)
