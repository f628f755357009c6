"""The ledger keeps the budget plan each release was charged under, and a resume under
another plan is refused with nothing written (issue 31, item 1); a release charged before plans
were recorded is compared by its charges per step and cell. SQLite and PostgreSQL, as
test_ledger.py."""

from __future__ import annotations

import pytest

from tests.support.pg_server import LEDGER_DATASET, ledger, ledger_url, pg, url  # noqa: F401  (fixtures)
from tests.integration.test_ledger import _old_schema
from dpatlas.core.plan_record import PlanChanged, plan_sha256
from dpatlas.ledger import Charge, Ledger

DS, CFG = LEDGER_DATASET, "c" * 64


def charges(county_eps: float = 0.31) -> list[Charge]:
    return [Charge(cell="all", step=step, guarantee_type="pure", epsilon=eps, delta=0.0,
                   rho=None)
            for step, eps in (("primary", 0.66), ("level county", county_eps))]


def entry(county_eps: float = 0.31, package: str = "1.0") -> dict:
    plan = {"levels": {"county": {"epsilon": county_eps}}}
    return {"plan": plan, "plan_sha256": plan_sha256(plan),
            "code_version": {"package": package, "git_commit": "abc", "source_sha256": "s"}}


def test_the_plan_is_recorded_with_the_charge_and_an_identical_one_resumes(ledger):
    assert ledger.begin_release("r1", DS, charges(), CFG, "a", plan=entry()) == "new"
    kept = ledger.release_plan("r1")
    assert kept["plan"] == entry()["plan"] and kept["plan_sha256"] == entry()["plan_sha256"]
    assert kept["code_version"]["package"] == "1.0" and kept["recorded_by"] == "charge"
    # another code version, the same plan: resumes (the version is recorded, not compared)
    assert ledger.begin_release("r1", DS, charges(), CFG, "a",
                                plan=entry(package="2.0")) == "resume"
    assert ledger.release_plan("r1")["code_version"]["package"] == "1.0"


def test_a_resume_under_another_plan_is_refused_and_writes_nothing(ledger):
    ledger.begin_release("r1", DS, charges(), CFG, "a", plan=entry())
    before, entries = ledger.release("r1"), ledger.entries()
    with pytest.raises(PlanChanged) as err:
        ledger.begin_release("r1", DS, charges(0.45), CFG, "a", plan=entry(0.45, "2.0"))
    message = str(err.value)
    assert "levels/county/epsilon: 0.31 → 0.45" in message
    assert "dpatlas 1.0, git abc" in message and "the charge is unchanged" in message
    assert ledger.release("r1") == before  # no attempt counted, no lease taken
    assert ledger.entries().equals(entries)
    assert ledger.release_plan("r1")["plan"] == entry()["plan"]


def test_a_release_charged_before_plans_resumes_only_with_the_same_charges(ledger):
    ledger.begin_release("old", DS, charges(), CFG, "a")  # as the previous version charged it
    assert ledger.release_plan("old") is None
    before = ledger.release("old")
    with pytest.raises(PlanChanged, match=r"step level county, cell all: epsilon 0\.31 → 0\.45"):
        ledger.begin_release("old", DS, charges(0.45), CFG, "a", plan=entry(0.45))
    assert ledger.release("old") == before and ledger.release_plan("old") is None
    assert ledger.begin_release("old", DS, charges(), CFG, "a", plan=entry()) == "resume"
    assert ledger.release_plan("old")["recorded_by"] == "resume"  # compared in full from now on
    with pytest.raises(PlanChanged):
        ledger.begin_release("old", DS, charges(), CFG, "a", plan=entry(0.32))


def test_an_old_ledger_opens_and_gains_the_plans_table(url):
    _old_schema(url)
    with Ledger(url, create=False) as ro:
        assert ro.release_plan("old-run") is None  # read as it is
    with Ledger(url) as led:
        assert led.release_plan("old-run") is None
        old = [Charge(cell="all", step=f"primary #{seq}", guarantee_type="pure", epsilon=0.75,
                      delta=0.0, rho=None) for seq in range(2)]
        assert led.begin_release("old-run", "tracts-2020", old, CFG, "new", plan=entry()) \
            == "resume"
        assert led.release_plan("old-run")["plan"] == entry()["plan"]
