"""County and state levels in the budget plan (issue 20, item 1): the config's levels and
split, each level a budget step of its own, composed sequentially with the tract's steps."""

from __future__ import annotations

import math

import pytest

from dpatlas.core.config import DEFAULT_LEVEL_SHARES, ConfigError, parse_config
from dpatlas.ledger import charges
from dpatlas.release.allocate import level_estimate_step, level_interval_step, plan

BASE = {"input": {"path": "x"}, "boundaries": {"path": "b"},
        "selection": {"rule": "dp", "threshold": 3.0}}


def cfg(**over):
    return parse_config({**BASE, **over})


def test_default_levels_are_tracts_only_with_the_whole_budget():
    c = cfg()
    assert c.levels == ("tract",) and c.shares() == {"tract": 1.0}
    p = plan(c, 3.0)
    assert p.levels == () and not any(s.name.startswith("level ") for s in p.steps)
    # the tract steps get exactly what they got before levels existed
    assert p.primary_epsilon == pytest.approx(0.75) and p.interval_epsilon == 0.25


def test_levels_are_steps_of_their_own_and_compose_to_the_per_person_total():
    c = cfg(levels=["tract", "county", "state"])
    assert c.shares() == DEFAULT_LEVEL_SHARES
    p = plan(c, 3.0)
    names = [s.name for s in p.steps]
    for level in ("county", "state"):
        assert level_estimate_step(level) in names and level_interval_step(level) in names
    by_level = {"tract": 0.0, "county": 0.0, "state": 0.0}
    for s in p.steps:
        level = s.name.split(":")[0].split()[1] if s.name.startswith("level ") else "tract"
        by_level[level] += s.guarantee.epsilon
    for level, share in DEFAULT_LEVEL_SHARES.items():
        assert by_level[level] == pytest.approx(share * 1.0, rel=1e-6)
    # sequential across levels: the per-person guarantee is the sum of every level's steps
    assert p.per_tract().epsilon == pytest.approx(math.fsum(by_level.values()), rel=1e-12)
    assert p.per_tract().epsilon <= 1.0 + 1e-12
    assert p.charged()[0] == pytest.approx(1.0, rel=1e-6)
    # parallel across units: one charge per step and cell, whatever the number of counties
    ch = charges(p, ["all"])
    assert sorted(c.step for c in ch) == sorted(names)


def test_level_steps_pay_noisy_stats_and_its_interval():
    p = plan(cfg(levels=["tract", "county"], level_shares={"tract": 0.85, "county": 0.15}),
             3.0)
    lp = p.level("county")
    assert lp.epsilon == pytest.approx(0.15)
    assert lp.estimate_epsilon == pytest.approx(0.15 * 0.75)
    assert lp.interval_epsilon == pytest.approx(0.15 * 0.25)
    est = p.step(level_estimate_step("county"))
    assert [ns.name for ns in est.alternatives()["NoisyStats"]] == ["nvar", "ncov", "intercept"]
    ci = p.step(level_interval_step("county"))
    assert [ns.name for ns in ci.alternatives()["NoisyStats"]] == [
        "interval: mean of x", "interval: nvar", "interval: nvar of y"]


def test_without_intervals_a_level_has_one_step():
    p = plan(cfg(levels=["tract", "state"], intervals={"enabled": False}), 3.0)
    assert p.level("state").interval_epsilon == 0.0
    assert [s.name for s in p.steps if s.name.startswith("level ")] == [
        level_estimate_step("state")]


@pytest.mark.parametrize("over, message", [
    ({"levels": ["county"]}, "must include tract"),
    ({"levels": ["tract", "tract"]}, "names a level twice"),
    ({"levels": ["tract", "city"]}, "must be one of"),
    ({"levels": ["tract", "county"], "level_shares": {"tract": 0.5, "county": 0.4}},
     "sum to 1"),
    ({"levels": ["tract", "county"], "level_shares": {"tract": 1.0, "county": 0.0}},
     "(0, 1]"),
    ({"levels": ["tract", "county"], "level_shares": {"tract": 1.0}}, "exactly the levels"),
    ({"levels": ["tract"], "level_shares": {"tract": 0.5, "moon": 0.5}}, "unknown level"),
    ({"levels": ["tract", "county"], "level_shares": {"tract": True, "county": 0.5}},
     "not true/false"),
])
def test_invalid_levels_are_refused_with_what_is_wrong(over, message):
    with pytest.raises(ConfigError, match=None) as err:
        cfg(**over)
    assert message in str(err.value)


def test_default_levels_leave_the_config_fingerprint_as_before():
    from dpatlas.core.config import fingerprint, public_config

    c = cfg()
    assert "levels" not in public_config(c)
    with_levels = cfg(levels=["tract", "county"])
    assert public_config(with_levels)["levels"] == ["tract", "county"]
    assert fingerprint(c) != fingerprint(with_levels)


@pytest.mark.parametrize("levels", [["tract"], ["tract", "county"], ["tract", "state"]])
def test_the_model_without_county_and_state_levels_is_refused(levels):
    with pytest.raises(ConfigError) as err:
        cfg(levels=levels, small_area={"model": True})
    assert "small_area.model needs the county and state levels" in str(err.value)


def test_the_model_is_off_by_default_and_leaves_the_config_as_before():
    from dpatlas.core.config import fingerprint, public_config

    three = ["tract", "county", "state"]
    off, on = cfg(levels=three), cfg(levels=three, small_area={"model": True})
    assert not off.small_area.model and "small_area" not in public_config(off)
    assert fingerprint(off) == fingerprint(cfg(levels=three, small_area={"model": False}))
    assert public_config(on)["small_area"] == {"model": True}
    assert fingerprint(on) != fingerprint(off)
