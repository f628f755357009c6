"""Prefect-free unit tests of the release's plain stages: allocate, selection, estimate, and
the ledger's charges. None of them needs a Prefect server (checked in a fresh interpreter:
importing them does not import Prefect, tests/integration/test_prefect_free_stages.py)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpatlas.release.allocate import SuiteShare, plan
from dpatlas.core.config import parse_config
from dpatlas.release.estimate import (CHUNK_COLUMNS, Chunk, estimate_partition, read_chunk,
                                      select_partition, split_into_chunks, staged_tracts)
from dpatlas.ledger import charges
from dpatlas.release.selection import EXP_THEIL_SEN, NOISY_STATS, Rule, select
from dpatlas.release.outcome import BudgetState, ReleaseOutcome
from mechanisms.batch import TractBatch
from mechanisms.noise import SeededRandomness
from mechanisms.privacy import PureDP, to_approx

from tests.support.inputs import line_tract


def config(**over) -> object:
    base = {"input": {"path": "in.parquet"}, "boundaries": {"path": "tracts.parquet"},
            "privacy": {"epsilon_per_tract": 1.0, "delta": 1e-6},
            "selection": {"rule": "dp", "threshold": 3.0},
            "publish": {"root": "releases"}}
    base.update(over)
    return parse_config(base, base=Path("/tmp"))


# --- allocate -------------------------------------------------------------------------------


def test_primary_plan_spends_exactly_the_configured_epsilon():
    budget = plan(config(), 3.0)
    eps, delta = budget.charged()
    # never over; under only by the exact samplers' rounding to 2^-20 grids
    assert eps <= 1.0 and math.isclose(eps, 1.0, rel_tol=1e-6) and delta == 0.0
    assert budget.suite == ()
    assert isinstance(budget.per_tract(), PureDP)
    # selection 10%, intervals 25% of the rest: the steps' own budgets, as configured
    names = [s.name for s in budget.steps]
    assert names == ["selection: noisy n*var(x)", "primary: p25 and p75", "interval: p25 and p75"]
    assert math.isclose(budget.interval_epsilon, 0.25, rel_tol=1e-12)


def test_full_suite_plan_names_each_share_and_fits_epsilon_and_delta():
    suite = ["NoisyStats", "DPExpTheilSenMatch", "DPGDzCDP", "DPGDApprox"]
    budget = plan(config(profile={"name": "full-suite", "suite": suite}), 3.0)
    assert [s.estimator for s in budget.suite] == suite
    assert all(isinstance(s, SuiteShare) for s in budget.suite)
    with pytest.raises(TypeError):  # named fields, not an anonymous tuple
        name, eps, delta = budget.suite[0]
    eps_total, delta_total = budget.charged()
    assert eps_total <= 1.0 * (1 + 1e-6) and math.isclose(eps_total, 1.0, rel_tol=1e-6)
    assert delta_total <= 1e-6 * (1 + 1e-9)


def test_two_zcdp_estimators_in_one_suite_are_refused():
    with pytest.raises(ValueError, match="at most one zCDP"):
        plan(config(profile={"name": "full-suite", "suite": ["DPGDzCDP", "DPGDzCDP"]}), 3.0)


def test_charges_are_one_per_step_and_cell_and_sum_to_the_plan():
    budget = plan(config(profile={"name": "full-suite",
                                  "suite": ["NoisyStats", "DPGDzCDP", "DPGDApprox"]}), 3.0)
    cells = ["all", "female"]
    charged = charges(budget, cells)
    assert len(charged) == len(budget.steps) * len(cells)
    per_cell = [c for c in charged if c.cell == "all"]
    assert math.isclose(sum(c.epsilon for c in per_cell), budget.charged()[0], rel_tol=1e-12)
    assert math.isclose(sum(c.delta for c in per_cell), budget.charged()[1], rel_tol=1e-12)
    zcdp = [c for c in per_cell if c.guarantee_type == "zcdp"]
    assert len(zcdp) == 1 and zcdp[0].rho is not None
    conv = to_approx(budget.step(zcdp[0].step).guarantee, budget.conversion_delta)
    assert math.isclose(zcdp[0].epsilon, conv.epsilon)
    pure = [c for c in per_cell if c.guarantee_type == "pure"]
    assert all(math.isclose(c.rho, c.epsilon ** 2 / 2) for c in pure)


# --- selection ------------------------------------------------------------------------------


def _one_tract(n: int, seed: int = 3) -> TractBatch:
    x, y = line_tract(n, seed)
    return TractBatch.from_labels(np.array(["17031010100"] * n), x, y)


def test_dp_rule_picks_noisy_stats_half_the_time_at_its_own_nvar():
    """The selection compares ε·(nvar + Laplace noise) with the threshold: at threshold
    ε·nvar the noise is as likely to push either way (the Laplace is symmetric)."""
    batch = _one_tract(400)
    nvar = float(400 * np.var(batch.x))
    rule = Rule("dp", threshold=1.0 * nvar, share=0.1)
    sel = select(batch, 1.0, rule, SeededRandomness(11), reps=4000)
    share = sel.use_noisy_stats.mean()
    assert abs(share - 0.5) < 4 * math.sqrt(0.25 / 4000), share
    assert np.isfinite(sel.noisy_nvar).all() and sel.epsilon_rest == pytest.approx(0.9)


def test_dp_rule_is_decided_by_the_threshold_far_from_it():
    # n·var(x) ≈ 330 against Laplace noise of scale about (1 - 1/n)/0.1 ≈ 10: a threshold
    # at 0.2 or 5 times it is over 25 scales away (probability e^-25 of the other choice)
    batch = _one_tract(4000)
    nvar = float(4000 * np.var(batch.x))
    low = select(batch, 1.0, Rule("dp", threshold=0.2 * nvar), SeededRandomness(1), reps=500)
    high = select(batch, 1.0, Rule("dp", threshold=5.0 * nvar), SeededRandomness(2), reps=500)
    assert low.use_noisy_stats.mean() > 0.99 and high.use_noisy_stats.mean() < 0.01


def test_public_and_fixed_rules_draw_nothing():
    class NoDraws(SeededRandomness):
        def words(self, *a, **k):  # pragma: no cover - failing is the point
            raise AssertionError("a public/fixed rule drew noise")

    small, large = _one_tract(20), _one_tract(200)
    rand = NoDraws(0)
    assert not select(small, 1.0, Rule("public", threshold=50), rand).use_noisy_stats.any()
    assert select(large, 1.0, Rule("public", threshold=50), rand).use_noisy_stats.all()
    fixed = select(large, 1.0, Rule("fixed", mechanism=EXP_THEIL_SEN), rand)
    assert (fixed.mechanism == EXP_THEIL_SEN).all() and fixed.epsilon_rest == 1.0
    with pytest.raises(ValueError, match="unknown selection rule"):
        select(large, 1.0, Rule("coin"), rand)
    assert NOISY_STATS != EXP_THEIL_SEN


# --- estimate -------------------------------------------------------------------------------


def _frame(sizes: dict[str, int]) -> pd.DataFrame:
    frames = []
    for k, (geoid, n) in enumerate(sizes.items()):
        x, y = line_tract(n, seed=k)
        frames.append(pd.DataFrame({"geoid": geoid, "x": x, "y": y, "cell": "all"}))
    return pd.concat(frames, ignore_index=True)


def test_chunks_are_named_runs_of_each_partition(tmp_path):
    geoids = {tmp_path / "input-17.parquet": [f"17{i:09d}" for i in range(5)],
              tmp_path / "input-18.parquet": ["18000000001"]}
    chunks = split_into_chunks(geoids, 2)
    assert [c.name for c in chunks] == ["input-17-0", "input-17-1", "input-17-2", "input-18-0"]
    assert chunks[2] == Chunk(tmp_path / "input-17.parquet", "17000000004", "17000000004",
                              "input-17-2")
    assert chunks[0] == Chunk(tmp_path / "input-17.parquet", "17000000000", "17000000001",
                              "input-17-0")
    with pytest.raises(ValueError, match="at least 1"):
        split_into_chunks(geoids, 0)


def test_chunk_parameters_stay_small_for_a_national_release(tmp_path):
    """The subflow receives the chunks as parameters; Prefect's server refuses more than
    512 KiB. 80,000 tracts in 100-tract chunks: the size grows with chunks, not tracts."""
    import json

    geoids = {tmp_path / f"input-{s:02d}.parquet": [f"{s:02d}{i:09d}" for i in range(1600)]
              for s in range(1, 51)}
    chunks = split_into_chunks(geoids, 1000)
    size = len(json.dumps([[str(c.staged), c.first_geoid, c.last_geoid, c.name]
                           for c in chunks]))
    assert len(chunks) == 100 and size < 20_000


def test_staged_tracts_and_read_chunk(tmp_path):
    df = _frame({"17000000001": 30, "17000000002": 5, "17000000003": 12})
    path = tmp_path / "input-17.parquet"
    df.to_parquet(path, index=False)
    geoids, sizes = staged_tracts([path])
    assert geoids == {path: ["17000000001", "17000000002", "17000000003"]}
    assert dict(zip(sizes["geoid"], sizes["n"])) == {"17000000001": 30, "17000000002": 5,
                                                     "17000000003": 12}
    (chunk,) = split_into_chunks(geoids, 2)[:1]
    assert set(read_chunk(chunk)["geoid"]) == {"17000000001", "17000000002"}


def test_tract_cell_counts_in_batches_equal_one_group_by(tmp_path, monkeypatch):
    """plan_chunks' sizes, counted a few records at a time, are those of the whole file."""
    from dpatlas.release import estimate

    df = pd.concat([_frame({"17000000001": 30, "17000000002": 5, "17000000003": 12})
                    .assign(cell=c) for c in ("b", "a", "c")], ignore_index=True)
    path = tmp_path / "input-17.parquet"
    df.to_parquet(path, index=False)
    whole = df.groupby(["geoid", "cell"]).size().rename("n").reset_index()
    monkeypatch.setattr(estimate, "_COUNT_BATCH_ROWS", 7)
    geoids, sizes = staged_tracts([path])
    assert all(isinstance(sizes[c].dtype, pd.CategoricalDtype) for c in ("geoid", "cell"))
    pd.testing.assert_frame_equal(sizes.astype({"geoid": str, "cell": str}), whole)
    assert geoids == {path: ["17000000001", "17000000002", "17000000003"]}


def test_a_chunk_read_without_person_ids_estimates_what_the_whole_records_give(tmp_path):
    """read_chunk leaves out the person id and input row (most of a chunk's memory when a
    person has a record per cell): selection and estimates are those of the full records."""
    df = pd.concat([_frame({"17000000001": 60, "17000000002": 45}).assign(cell=c)
                    for c in ("outcome-2", "outcome-1")], ignore_index=True)
    df = df.assign(person_id=[f"p{i % 105}" for i in range(len(df))], row=np.arange(len(df)))
    path = tmp_path / "input-17.parquet"
    df.to_parquet(path, index=False)
    (chunk,) = split_into_chunks(staged_tracts([path])[0], 10)
    read = read_chunk(chunk)
    assert list(read.columns) == CHUNK_COLUMNS
    budget = plan(config(), 3.0)
    sel_full = select_partition(df, budget, SeededRandomness(5), min_n=20)
    sel_read = select_partition(read, budget, SeededRandomness(5), min_n=20)
    pd.testing.assert_frame_equal(sel_read, sel_full)
    pd.testing.assert_frame_equal(
        estimate_partition(read, sel_read, budget, SeededRandomness(6), min_n=20),
        estimate_partition(df, sel_full, budget, SeededRandomness(6), min_n=20))


def test_estimate_partition_charges_released_tracts_and_suppresses_small_ones():
    budget = plan(config(), 3.0)
    df = _frame({"17000000001": 300, "17000000002": 5, "17000000003": 120})
    sel = select_partition(df, budget, SeededRandomness(5), min_n=20)
    assert set(sel["geoid"]) == {"17000000001", "17000000003"}  # only tracts with n >= min_n
    res = estimate_partition(df, sel, budget, SeededRandomness(6), min_n=20).set_index("geoid")
    assert res.loc["17000000002", "status"] == "suppressed"
    assert res.loc["17000000002", "epsilon_spent"] == 0
    released = res[res["status"] != "suppressed"]
    assert len(released) == 2
    assert np.allclose(released["epsilon_spent"], budget.charged()[0])
    assert released["p25_raw"].between(0, 1).all() and released["p75_raw"].between(0, 1).all()
    assert (released["p25_lo"] <= released["p25_hi"]).all()


# --- the summary the command line prints ------------------------------------------------------


def _outcome(status="published", by_mechanism=None):
    return ReleaseOutcome(
        release_id="r1", status=status, folder="/pub/r1", published_at="2026-11-25T00:00:00Z",
        by_status={"suppressed": 72, "released": 3036},
        by_mechanism={"NoisyStats": 1560, "none": 72, "DPExpTheilSen": 1476}
        if by_mechanism is None else by_mechanism,
        epsilon_per_person=1.0, delta_per_person=0.0, files=["tracts.csv", "manifest.json"],
        budget=BudgetState(dataset="il", spent_epsilon=1.0, spent_delta=0.0, cap_epsilon=10.0))


def test_summary_is_prose_not_a_python_dict():
    lines = _outcome().summary_lines()
    assert lines[0] == "published release r1 at /pub/r1"
    assert lines[1] == ("  tracts: 3,036 released, 72 suppressed; by mechanism: "
                        "NoisyStats 1,560, DPExpTheilSen 1,476, none 72")
    assert "{" not in "\n".join(lines) and "9 left" in lines[3]


def test_summary_of_an_id_already_published_says_nothing_was_charged():
    lines = _outcome("already_published", by_mechanism={}).summary_lines()
    assert "nothing new published, nothing charged" in lines[0]
    assert "by mechanism: none" in lines[1]
    assert lines[2].endswith("(charged when it was first published)")
