"""The budget plan a release records at its charge (issue 31, item 1): canonical, hashed, and
the difference between two plans named for the refusal of a resume under another one."""

from __future__ import annotations

import json

import pytest

from dpatlas.core import config as config_module
from dpatlas.core.config import parse_config
from dpatlas.core.plan_record import (PlanChanged, canonical_plan, describe_changes,
                                      plan_changes, plan_sha256)
from dpatlas.core.errors import OperatorError
from dpatlas.release.allocate import plan
from dpatlas.release.plan_record import budget_plan_record, plan_entry

BASE = {"input": {"path": "x"}, "boundaries": {"path": "b"},
        "selection": {"rule": "dp", "threshold": 3.0}, "levels": ["tract", "county", "state"]}


def record(**over) -> dict:
    return budget_plan_record(plan(parse_config({**BASE, **over}), 3.0))


def test_the_record_holds_every_step_with_its_noise_and_sensitivity():
    r = record()
    step = r["steps"]["level county: NoisyStats"]
    assert step["epsilon_param"] == pytest.approx(0.31 * 0.75)
    alternatives = step["noise"]["alternatives"]["NoisyStats"]
    assert all({"mechanism", "parameters", "sensitivity", "sensitivity_derivation",
                "guarantee"} <= set(ns) for ns in alternatives)
    assert r["levels"]["county"]["epsilon"] == pytest.approx(0.31)
    assert r["rule"]["kind"] == "dp" and r["rule"]["threshold"] == 3.0
    json.loads(canonical_plan(r))  # plain JSON


def test_the_same_plan_has_the_same_sha256_whatever_the_key_order():
    r = record()
    shuffled = dict(reversed(list(r.items())))
    assert canonical_plan(shuffled) == canonical_plan(r)
    assert plan_sha256(shuffled) == plan_sha256(r) == plan_sha256(record())


def test_a_code_default_that_changes_a_level_share_changes_the_plan_and_is_named(monkeypatch):
    before = record()
    monkeypatch.setattr(config_module, "DEFAULT_LEVEL_SHARES",
                        {"tract": 0.5, "county": 0.45, "state": 0.05})
    after = record()
    assert plan_sha256(after) != plan_sha256(before)  # the config itself did not change
    changes = plan_changes(before, after)
    assert "levels/county/epsilon: 0.31 → 0.45" in changes
    assert "levels/state/epsilon: 0.03 → 0.05" in changes
    # the shallowest first: the budgets before the noise parameters derived from them
    assert changes.index("levels/county/epsilon: 0.31 → 0.45") < next(
        i for i, c in enumerate(changes) if "/noise/" in c)


def test_a_step_added_or_removed_is_named():
    with_levels, tracts_only = record(), record(levels=["tract"])
    changes = plan_changes(with_levels, tracts_only)
    assert any(c.startswith("levels/county: ") and c.endswith("→ (none)") for c in changes)


def test_the_description_names_the_first_changes_and_counts_the_rest():
    changes = [f"a{i}: {i} → {i + 1}" for i in range(11)]
    text = describe_changes(changes)
    assert text.startswith("a0: 0 → 1; a1: 1 → 2") and "a7" in text and "a8" not in text
    assert text.endswith("and 3 more difference(s)")
    assert describe_changes(changes[:1]) == "a0: 0 → 1"
    assert plan_changes({"x": 1.0}, {"x": 1.0}) == []


def test_the_entry_holds_the_code_version_beside_the_plan():
    entry = plan_entry(plan(parse_config(BASE), 3.0))
    assert entry["plan_sha256"] == plan_sha256(entry["plan"])
    code = entry["code_version"]
    assert {"package", "git_commit", "source_sha256"} <= set(code)
    assert len(code["source_sha256"]) == 64


def test_a_plan_change_is_an_operator_error():
    assert issubclass(PlanChanged, OperatorError)


def test_the_draw_layout_names_each_task_with_its_records_and_not_where_they_lie():
    from pathlib import Path

    from dpatlas.release.estimate import Chunk
    from dpatlas.release.levels import LevelTask
    from dpatlas.release.plan_record import draw_layout

    chunks = [Chunk(Path("/a/input-17.parquet"), "17001000100", "17001000900", "input-17-0-c0",
                    ("a", "b")), Chunk("s3://x/input-17.parquet", "17001001000", "17001009900",
                                       "input-17-1")]
    units = [LevelTask("17", None, "state-17")]
    record = draw_layout(chunks, units)
    assert record["chunks"] == [["input-17-0-c0", "17001000100", "17001000900", ["a", "b"]],
                                ["input-17-1", "17001001000", "17001009900", None]]
    assert record["levels"] == [["state-17", "17", None]]
    moved = [Chunk("s3://elsewhere/x.parquet", *c[1:]) for c in
             [(None, "17001000100", "17001000900", "input-17-0-c0", ("a", "b")),
              (None, "17001001000", "17001009900", "input-17-1")]]
    assert plan_sha256(draw_layout(moved, units)) == plan_sha256(record)  # staged elsewhere
    json.loads(canonical_plan(record))
