"""DP confidence intervals (mechanisms/intervals.py): coverage against known truths, the
guarantee derived from the noise steps, every draw paid, containment, bad inputs."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy.stats import t as student_t

import mechanisms as M
from dpatlas.release.selection import Rule, run_selected, select
from mechanisms import intervals as CI
from mechanisms.batch import X_HIGH, X_LOW, TractBatch, sufficient_stats
from mechanisms.intervals import (EXP_THEIL_SEN, NOISY_STATS, RULE, Released,
                                  interval_guarantee, interval_noise_steps, intervals,
                                  theil_sen_rank_offset)
from mechanisms.median import Segments, exp_median
from mechanisms.noise import SeededRandomness
from mechanisms.pairs import all_pairs, chunk_tracts, theil_sen_points
from mechanisms.privacy_maps import compose
from mechanisms.sufficient_stats import noisy_stats_release


def synthetic(n_tracts: int, n: int, seed: int):
    """Tracts of n records, y = α + βx + N(0, 0.15²) kept inside [0, 1]: (batch, truth)."""
    rng = np.random.default_rng(seed)
    slope = rng.normal(0.34, 0.1, n_tracts)
    icpt = rng.normal(0.33, 0.04, n_tracts)
    centre = rng.uniform(0.3, 0.7, n_tracts)
    x = np.clip(centre[:, None] + rng.normal(0, 0.25, (n_tracts, n)), 0, 1)
    # Symmetric errors truncated symmetrically, so the mean line stays α + βx.
    mean = icpt[:, None] + slope[:, None] * x
    room = np.minimum(mean, 1 - mean)
    e = np.clip(rng.normal(0, 0.15, (n_tracts, n)), -room, room)
    labels = np.repeat(np.array([f"t{i:04d}" for i in range(n_tracts)]), n)
    batch = TractBatch.from_labels(labels, x.ravel(), (mean + e).ravel())
    return batch, {"p25": icpt + slope * X_LOW, "p75": icpt + slope * X_HIGH}


def coverage(res, truth) -> tuple[float, int]:
    hits, total = 0, 0
    for name in ("p25", "p75"):
        lo, hi = getattr(res, f"{name}_lo"), getattr(res, f"{name}_hi")
        ok = np.isfinite(lo)
        hits += int(((lo <= truth[name]) & (truth[name] <= hi))[ok].sum())
        total += int(ok.sum())
    return hits / total, total


def assert_at_least_nominal(cov: float, total: int, level: float) -> None:
    """Both methods claim coverage >= level: fail below 3 binomial standard errors of it."""
    se = math.sqrt(level * (1 - level) / total)
    assert cov >= level - 3 * se, f"coverage {cov:.4f} over {total} intervals < {level}"


def noisy_stats_released(batch, eps, rand, reps):
    third = eps / 3
    out = noisy_stats_release(batch, third, third, third, rand, reps)
    return Released(np.where(out.failed, np.nan, out.p25), np.where(out.failed, np.nan, out.p75),
                    out.extras["noisy_nvar"], third, third, third)


class RecordingMeter:
    """Records each spend per label, and checks nothing else."""

    def __init__(self):
        self.spent: dict[str, float] = {}

    def spend(self, labels, guarantee, times=1):
        for label in np.asarray(labels):
            self.spent[str(label)] = self.spent.get(str(label), 0.0) + guarantee.epsilon * times


# ---------------------------------------------------------------------------------------------
# Coverage


@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_noisy_stats_coverage_at_least_nominal(eps):
    batch, truth = synthetic(60, 150, seed=3)
    rand = SeededRandomness(11)
    rel = noisy_stats_released(batch, eps, rand, reps=25)
    res = intervals(NOISY_STATS, batch, rel, 0.25 * eps, rand, 0.9, reps=25)
    assert_at_least_nominal(*coverage(res, truth), 0.9)


@pytest.mark.parametrize("eps", [1.0, 8.0])
def test_theil_sen_coverage_at_least_nominal(eps):
    batch, truth = synthetic(40, 60, seed=4)
    rand = SeededRandomness(12)
    out = M.estimate_batch("DPExpTheilSen", batch, eps, rand=rand, reps=20)
    res = intervals(EXP_THEIL_SEN, batch, Released(out.p25, out.p75, eps_theil_sen=eps), 0.25 * eps, rand, 0.9,
                    reps=20)
    assert_at_least_nominal(*coverage(res, truth), 0.9)


def test_noisy_stats_interval_shrinks_with_budget_to_the_sampling_interval():
    """At a large budget the privacy noise is negligible and the interval is about the
    least-squares t-interval of the expected outcome (issue 32: the estimand is the tract's
    expected outcome, so sampling error is covered; the residual spread is bounded by
    Σ(y − ȳ)², so it errs wide, by < 35% here); at a small budget it is wider."""
    batch, _ = synthetic(20, 400, seed=5)
    rand = SeededRandomness(13)
    rel = noisy_stats_released(batch, 50.0, rand, reps=5)
    res = intervals(NOISY_STATS, batch, rel, 20.0, rand, 0.95, reps=5)
    st = sufficient_stats(batch)
    n = st.n.astype(float)
    rss = st.nvar_y - st.ncov ** 2 / st.nvar
    t_width = 2 * student_t.ppf(0.975, n - 2) * np.sqrt(
        rss / (n - 2) * (1 / n + (0.25 - st.xbar) ** 2 / st.nvar))
    ratio = np.nanmedian((res.p25_hi - res.p25_lo) / t_width[None, :])
    assert 1.0 <= ratio < 1.35
    rel_small = noisy_stats_released(batch, 8.0, rand, reps=5)
    small = intervals(NOISY_STATS, batch, rel_small, 2.0, rand, 0.95, reps=5)
    assert np.nanmedian(small.p25_hi - small.p25_lo) > 1.3 * np.nanmedian(res.p25_hi - res.p25_lo)


# ---------------------------------------------------------------------------------------------
# Structure of the intervals


@pytest.mark.parametrize("mech", [NOISY_STATS, EXP_THEIL_SEN, RULE])
def test_interval_contains_point_estimate_and_nan_where_unpublished(mech):
    batch, _ = synthetic(12, 30, seed=6)
    tiny = TractBatch.single([0.2], [0.4])  # one record: nothing can be published
    batch = TractBatch(np.concatenate([batch.x, tiny.x]), np.concatenate([batch.y, tiny.y]),
                       np.append(batch.starts, batch.starts[-1] + 1),
                       np.append(batch.labels, "zz"))
    rand = SeededRandomness(14)
    reps = 4
    if mech == NOISY_STATS:
        rel = noisy_stats_released(batch, 2.0, rand, reps)
    elif mech == EXP_THEIL_SEN:
        out = M.estimate_batch("DPExpTheilSen", batch, 2.0, rand=rand, reps=reps)
        rel = Released(out.p25, out.p75, eps_theil_sen=2.0)
    else:
        rule = Rule("dp", threshold=2.79)
        sel = select(batch, 2.0, rule, rand, reps)
        out = run_selected(batch, rule, sel, rand, reps)
        eps_sel, rest = rule.budgets(2.0)
        rel = Released(out.p25, out.p75, sel.noisy_nvar, eps_sel, rest / 2, rest / 2,
                       out.mechanism, eps_theil_sen=rest)
    res = intervals(mech, batch, rel, 0.5, rand, 0.95, reps)
    for name in ("p25", "p75"):
        point = getattr(rel, name)
        lo, hi = getattr(res, f"{name}_lo"), getattr(res, f"{name}_hi")
        pub = np.isfinite(point)
        assert np.array_equal(np.isfinite(lo), pub) and np.array_equal(np.isfinite(hi), pub)
        p = np.clip(point[pub], 0, 1)
        assert np.all(lo[pub] <= p) and np.all(p <= hi[pub])
        assert np.all((0 <= lo[pub]) & (hi[pub] <= 1))
        assert np.all(np.isnan(lo[:, -1]))  # the one-record tract


def test_theil_sen_trivial_ends_when_the_offset_reaches_the_middle():
    """A public offset r ≥ m/2 gives [0, 1] without any draw (small n, small ε)."""
    n = 6
    assert 2 * theil_sen_rank_offset(np.array([n]), 0.01, 0.95)[0] >= n * (n - 1) / 2
    batch = TractBatch.single(np.linspace(0, 1, n), np.linspace(0.2, 0.6, n))
    res = intervals(EXP_THEIL_SEN, batch, Released(np.array([[0.3]]), np.array([[0.5]]),
                                                      eps_theil_sen=1.0), 0.04,
                    SeededRandomness(1), 0.95, 1)
    assert (res.p25_lo[0, 0], res.p25_hi[0, 0]) == (0.0, 1.0)


def test_rank_offset_grows_with_noise_and_level():
    n = np.array([50, 200])
    base = theil_sen_rank_offset(n, 1.0, 0.9)
    assert np.all(theil_sen_rank_offset(n, 0.5, 0.9) > base)
    assert np.all(theil_sen_rank_offset(n, 1.0, 0.99) > base)
    # relative to the number of pairs the offset shrinks as tracts grow
    rel = base / (n * (n - 1) / 2)
    assert rel[1] < rel[0]


# ---------------------------------------------------------------------------------------------
# Privacy: guarantees derived from the steps, every draw paid


@pytest.mark.parametrize("mech", [NOISY_STATS, EXP_THEIL_SEN, RULE])
@pytest.mark.parametrize("eps", [0.01, 0.25, 1.0, 2.0, 17.0])
def test_guarantee_is_the_composition_of_the_steps_and_within_budget(mech, eps):
    steps = interval_noise_steps(mech, eps)
    g = interval_guarantee(mech, eps)
    assert g.epsilon == pytest.approx(sum(s.guarantee.epsilon for s in steps))
    assert g.epsilon == compose(steps).epsilon
    assert eps * 0.999 <= g.epsilon <= eps


def test_rule_is_charged_the_costlier_alternative():
    for eps in (0.3, 1.0, 8.0):
        rule = interval_guarantee(RULE, eps).epsilon
        assert rule == max(interval_guarantee(NOISY_STATS, eps).epsilon,
                           interval_guarantee(EXP_THEIL_SEN, eps).epsilon)


@pytest.mark.parametrize("mech", [NOISY_STATS, EXP_THEIL_SEN])
def test_every_draw_spends_its_map(mech):
    batch, _ = synthetic(6, 25, seed=8)
    rand = SeededRandomness(15)
    if mech == NOISY_STATS:
        rel = noisy_stats_released(batch, 3.0, rand, 1)
    else:
        out = M.estimate_batch("DPExpTheilSen", batch, 3.0, rand=rand, reps=1)
        rel = Released(out.p25, out.p75, eps_theil_sen=3.0)
    meter = RecordingMeter()
    intervals(mech, batch, rel, 1.0, rand, 0.95, 1, meter=meter)
    want = interval_guarantee(mech, 1.0).epsilon
    assert set(meter.spent) == set(batch.labels)
    assert all(v == pytest.approx(want) for v in meter.spent.values())


def test_a_filter_charged_too_little_refuses_before_drawing():
    batch, _ = synthetic(3, 20, seed=9)
    rand = SeededRandomness(16)
    rel = noisy_stats_released(batch, 3.0, rand, 1)
    filt = M.PrivacyFilter({"interval": M.PureDP(0.5)}, batch.labels)
    with pytest.raises(M.BudgetOverrun):
        intervals(NOISY_STATS, batch, rel, 2.0, rand, 0.95, 1, meter=filt.meter("interval"))
    ok = M.PrivacyFilter({"interval": interval_guarantee(NOISY_STATS, 2.0)}, batch.labels)
    intervals(NOISY_STATS, batch, rel, 2.0, rand, 0.95, 1, meter=ok.meter("interval"))


# ---------------------------------------------------------------------------------------------
# Bad inputs


def _one():
    batch, _ = synthetic(2, 10, seed=10)
    rel = noisy_stats_released(batch, 1.0, SeededRandomness(1), 1)
    return batch, rel


@pytest.mark.parametrize("kwargs, match", [
    ({"mechanism": "OLS"}, "intervals exist for"),
    ({"epsilon_interval": 0.0}, "epsilon_interval must be"),
    ({"epsilon_interval": float("nan")}, "epsilon_interval must be"),
    ({"epsilon_interval": True}, "epsilon_interval must be"),
    ({"level": 1.0}, "level must lie"),
    ({"level": 0.2}, "level must lie"),
    ({"reps": 0}, "reps must be"),
    ({"reps": 2}, "expected \\(reps, tracts\\)"),
])
def test_bad_inputs(kwargs, match):
    batch, rel = _one()
    args = {"mechanism": NOISY_STATS, "epsilon_interval": 1.0, "level": 0.95, "reps": 1, **kwargs}
    with pytest.raises(ValueError, match=match):
        intervals(args["mechanism"], batch, rel, args["epsilon_interval"], SeededRandomness(2),
                  args["level"], args["reps"])


def test_noisy_stats_needs_its_noisy_statistics_and_rule_its_choice():
    batch, rel = _one()
    with pytest.raises(ValueError, match="released.noisy_nvar"):
        intervals(NOISY_STATS, batch, Released(rel.p25, rel.p75), 1.0, SeededRandomness(3))
    with pytest.raises(ValueError, match="released.mechanism"):  # with its budget, no choice
        intervals(RULE, batch, dataclasses.replace(rel, eps_theil_sen=1.0), 1.0,
                  SeededRandomness(3))
    with pytest.raises(ValueError, match="intervals exist for"):
        interval_noise_steps("DPGDPure", 1.0)
    with pytest.raises(ValueError, match="too small"):
        interval_noise_steps(NOISY_STATS, 1e-12)


def test_interval_evaluation_reports_coverage_by_quintile_and_plots_it(tmp_path):
    from dpatlas.evaluation.interval_eval import evaluate_intervals, write_interval_report

    with pytest.raises(ValueError, match="demo"):
        evaluate_intervals(tracts=30, reps=2, seed=0)
    summary, per_tract, edges = evaluate_intervals(tracts=60, reps=3, seed=21,
                                                   epsilons=(8.0,))
    assert list(summary["mechanism"]) == ["NoisyStats", "DPExpTheilSen", "rule"]
    for col in ("coverage", "Q1", "Q2", "Q3", "Q4", "Q5", "unpublished"):
        assert summary[col].between(0, 1).all(), col
    assert (summary["width/OLS"] > 0).all() and len(edges["demo"]) == 5  # per scenario now
    assert summary["coverage"].min() > 0.8  # nominal 95%: far below means a broken interval
    paths = write_interval_report(summary, per_tract, edges, tmp_path)
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)


# ---------------------------------------------------------------------------------------------
# Faster, and the same numbers: bit-identical to the previous computation given the same bits


def sorted_with_padding(tract, z, n_tracts, keep, pad, pad_value) -> Segments:
    """REFERENCE: the tracts ``keep``' values and their padding, sorted tract by tract."""
    parts = [np.sort(np.concatenate([z[tract == t], np.full(p, pad_value)]))
             for t, p in zip(keep, pad)]
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return Segments(np.concatenate(parts) if parts else np.zeros(0), offsets)


@pytest.mark.parametrize("pad_value", [CI._TS_LO, CI._TS_HI])
def test_padding_sorted_values_gives_the_sorted_padded_values(pad_value):
    rng = np.random.default_rng(32)
    tract = np.repeat(np.arange(7), [5, 0, 12, 1, 30, 8, 3])
    z = np.clip(rng.normal(0.5, 0.8, tract.size), CI._TS_LO, CI._TS_HI)  # some at the ends
    z[:3] = [CI._TS_LO, CI._TS_HI, 0.4]
    seg = Segments.build(tract, z, 7)
    keep = np.array([0, 2, 3, 4, 6])
    pad = np.array([2, 0, 3, 11, 1])
    got = CI._padded(seg, keep, pad, pad_value)
    want = sorted_with_padding(tract, z, 7, keep, pad, pad_value)
    assert np.array_equal(got.offsets, want.offsets)
    assert np.array_equal(got.z.view(np.int64), want.z.view(np.int64))
    with pytest.raises(ValueError, match="padding goes at an end"):
        CI._padded(seg, keep, pad, 0.5)


def previous_theil_sen_intervals(batch, released, eps, rand, level):
    """REFERENCE: DPExpTheilSen intervals as computed before (the pairs' predictions one x* at
    a time, each end's padded values sorted afresh), same order of draws."""
    reps, T = released.p25.shape
    ends = {}
    eps_q = CI._theil_sen_steps(eps)[0].noise.argument
    offset = theil_sen_rank_offset(batch.n, eps_q, level)
    for name, _ in CI._PREDICTIONS:
        for end in ("lo", "hi"):
            ends[f"{name}_{end}"] = np.full((reps, T), np.nan)
    for chunk in chunk_tracts(batch, CI.MAX_PAIRS_PER_CHUNK):
        sub = batch.subset(chunk)
        usable = sub.n >= CI.MIN_RECORDS
        pairs = all_pairs(sub)
        for name, x_star in CI._PREDICTIONS:
            tract, z = theil_sen_points(sub, pairs, x_star, CI._TS_LO, CI._TS_HI)
            # the clipped values spread by their pair's place among all pairs (issue 18)
            place = np.nonzero(sub.x[pairs.i] != sub.x[pairs.j])[0] + 1
            u = (place * ((5 ** 0.5 - 1) / 2)) % 1.0
            u[u == 0] = 0.5
            z = np.where(z == CI._TS_LO, CI._TS_LO + 0.4 * u,
                         np.where(z == CI._TS_HI, CI._TS_HI - 0.4 * u, z))
            r = offset[chunk]
            pairs_without_ties = sub.n * (sub.n - 1) // 2  # public: never the data's m (issue 17)
            for end, pad_value, trivial in (("lo", CI._TS_LO, 0.0), ("hi", CI._TS_HI, 1.0)):
                draw = np.nonzero(usable & (2 * r < pairs_without_ties))[0]
                vals = np.full((reps, sub.n_tracts), trivial)
                if draw.size:
                    seg = sorted_with_padding(tract, z, sub.n_tracts, draw, 2 * r[draw],
                                              pad_value)
                    vals[:, draw] = exp_median(seg, eps_q, np.maximum(sub.n[draw] - 1, 1),
                                               CI._TS_LO, CI._TS_HI, rand, reps)
                ends[f"{name}_{end}"][:, chunk] = vals
    for name, _ in CI._PREDICTIONS:
        point = getattr(released, name)
        ends[f"{name}_lo"], ends[f"{name}_hi"] = CI._finish(ends[f"{name}_lo"],
                                                            ends[f"{name}_hi"], point)
    return CI.Intervals(**ends)


def mixed_sizes() -> TractBatch:
    """Tracts of 1 to 150 records: unpublished, with trivial ends, and drawn ends."""
    parts = [synthetic(3, n, seed=40 + n)[0] for n in (1, 4, 9, 40, 80, 150)]
    x = np.concatenate([p.x for p in parts])
    y = np.concatenate([p.y for p in parts])
    labels = np.concatenate([np.char.add(f"s{i}-", p.labels[np.repeat(np.arange(p.n_tracts),
                                                                       p.n)])
                             for i, p in enumerate(parts)])
    return TractBatch.from_labels(labels, x, y)


def test_theil_sen_intervals_are_bit_identical_to_the_previous_computation(monkeypatch):
    batch = mixed_sizes()
    monkeypatch.setattr(CI, "MAX_PAIRS_PER_CHUNK", 5000)  # several chunks
    assert len(chunk_tracts(batch, CI.MAX_PAIRS_PER_CHUNK)) >= 3
    reps = 3
    out = M.estimate_batch("DPExpTheilSen", batch, 2.0, rand=SeededRandomness(41), reps=reps)
    rel = Released(out.p25, out.p75, eps_theil_sen=2.0)
    got = intervals(EXP_THEIL_SEN, batch, rel, 40.0, SeededRandomness(42), 0.9, reps)
    want = previous_theil_sen_intervals(batch, rel, 40.0, SeededRandomness(42), 0.9)
    ends = np.stack([got.p25_lo, got.p25_hi, got.p75_lo, got.p75_hi])
    assert np.isnan(ends).any() and (ends == 0.0).any()  # unpublished and trivial ends occur
    assert ((0.0 < ends) & (ends < 1.0)).mean() > 0.3  # and many ends were drawn
    for f in ("p25_lo", "p25_hi", "p75_lo", "p75_hi"):
        assert np.array_equal(getattr(got, f), getattr(want, f), equal_nan=True), f




def test_spread_clipped_predictions_leave_every_rank_statistic_in_0_1_unchanged():
    rng = np.random.default_rng(5)
    z = np.clip(rng.normal(0.5, 1.5, 20_000), CI._TS_LO, CI._TS_HI)
    assert (z == CI._TS_LO).sum() > 3000 and (z == CI._TS_HI).sum() > 3000  # long tied runs
    place = np.sort(rng.choice(10**6, z.size, replace=False))
    spread = CI.spread_clipped(z, place)
    moved = (z == CI._TS_LO) | (z == CI._TS_HI)
    assert np.array_equal(spread[~moved], z[~moved])
    assert (spread[z == CI._TS_LO] > CI._TS_LO).all() and (spread[z == CI._TS_LO] <= -0.1).all()
    assert (spread[z == CI._TS_HI] < CI._TS_HI).all() and (spread[z == CI._TS_HI] >= 1.1).all()
    assert np.unique(spread[moved]).size == moved.sum()  # the runs are gone
    # clipped to [0, 1], the sorted values (so every rank statistic, the median among them)
    # are what they were
    assert np.array_equal(np.sort(np.clip(spread, 0, 1)), np.sort(np.clip(z, 0, 1)))
    # a value's spread depends on its own place only (a record moves only its own pairs)
    assert np.array_equal(CI.spread_clipped(z[:50], place[:50]), spread[:50])
