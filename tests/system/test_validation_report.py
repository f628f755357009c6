"""Issue 21 item 2: the validation report of a real release, in a real browser, offline.

A small two-state release with county and state tables is run by the release flow (one input row of state 18 breaks the
contract and is dropped under policy ``drop``, so one run fails); its report
(``<internal>/validation_report/index.html``) is opened from ``file://`` in headless Chromium
(Debian's ``chromium``, as tests/system/test_webmap.py). Every request the pages make is
recorded, and any that would leave the machine is refused and fails the test.

Chromium is required (the test FAILS without it, with how to install it); marked ``slow`` and
``browser`` like the web map's browser tests. Screenshots go to tests/artifacts/validation_report/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402
from dpatlas.publication.webmap import screenshot as B  # noqa: E402
from dpatlas.release import validation_report as R  # noqa: E402
from tests.support.browser import browser  # noqa: E402,F401 (the shared Chromium fixture)
from tests.support.inputs import write_config  # noqa: E402
from tests.support.paths import REPO  # noqa: E402

ARTIFACTS = REPO / "tests" / "artifacts" / "validation_report"
LOCAL = ("file://", "http://127.0.0.1")
PASSED_GREEN = "rgb(26, 107, 47)"  # .passed in the report's inline style: the style applied


def _break_one_rank(data: Path) -> None:
    """One more record in state 18, with a child rank of 1.7: the input contract fails on it."""
    part = data / "microdata" / "state=18" / "part-0.parquet"
    df = pd.read_parquet(part)
    bad = df.iloc[[0]].assign(person_id="18-bad", child_rank=1.7)
    pd.concat([df, bad], ignore_index=True).to_parquet(part, index=False)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("report")
    data = tmp / "data"
    write_synthetic(data, ["17", "18"], seed=3, params=StateParams(n_tracts=30, counties=2))
    _break_one_rank(data)
    config = write_config(tmp / "config.yaml", {
        "input": {"path": str(data / "microdata")},
        "boundaries": {"path": str(data / "tracts.parquet")},
        "privacy": {"epsilon_per_tract": 1.0},
        "selection": {"rule": "dp", "threshold": 3.0},
        "validation": {"policy": "drop"},
        "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
        "levels": ["tract", "county", "state"],  # so the county and state tables are checked
    })
    from flows.release import release as release_flow

    with prefect_test_harness(server_startup_timeout=180):
        release_flow(str(config), "r1", 7)
    internal = tmp / "internal" / "r1"
    # every validation the release made: Great Expectations stores one result per run
    stored = [p for p in (internal / "gx" / "gx" / "uncommitted" / "validations").rglob("*.json")]
    partitions = json.loads((internal / "validation.json").read_text())["partitions"]
    return {"internal": internal, "stored": stored, "partitions": partitions}


class OfflinePage:
    """A page whose every request is recorded; one that would leave the machine is aborted
    (so the test does not wait on it) and recorded as external."""

    def __init__(self, browser):
        self.context = browser.new_context(viewport=B.VIEWPORT, device_scale_factor=1)
        self.requests: list[str] = []
        self.external: list[str] = []
        self.errors: list[str] = []
        self.context.on("request", lambda r: self.requests.append(r.url))
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))

    def _route(self, route):
        url = route.request.url
        if url.startswith(LOCAL):
            route.continue_()
        else:
            self.external.append(url)
            route.abort()

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self):
        self.context.close()


@pytest.mark.slow
@pytest.mark.browser
def test_the_report_lists_every_run_and_opens_one_without_leaving_the_machine(browser, release):
    internal = release["internal"]
    stored = release["stored"]
    # each table's boundary coverage is a GX run of its own (published_coverage), of the same
    # name as the table's: the report joins it to that run
    coverage = [p for p in stored if "published_coverage" in p.parts]
    assert len(coverage) == 3
    runs_made = len(stored) - len(coverage)
    inputs = sorted(f"input-{p['partition']}" for p in release["partitions"])
    assert inputs == ["input-17", "input-18"]
    assert runs_made == len(inputs) + 3  # the input checks and the three tables' checks

    page = OfflinePage(browser)
    try:
        page.page.goto(R.report_index(internal).as_uri())
        rows = page.page.locator("tr.run")
        assert rows.count() == runs_made
        names = [rows.nth(i).get_attribute("data-run") for i in range(rows.count())]
        assert sorted(n for n in names if n.startswith("input-")) == inputs
        assert sorted(n for n in names if n.startswith("published")) == \
            ["published", "published-county", "published-state"]
        outcomes = dict(zip(names, (rows.nth(i).get_attribute("data-success")
                                    for i in range(rows.count()))))
        assert outcomes.pop("input-18") == "false"  # the broken rank
        assert set(outcomes.values()) == {"true"}
        failed_row = page.page.locator('tr.run[data-run="input-18"]')
        failed_text = " ".join(failed_row.inner_text().split())
        # named as in the input (input.columns.child_rank), with where the row went and the fix
        assert "expect_column_values_to_be_between on child_rank: 1 value(s)" in failed_text
        assert "quarantine/input-18.parquet" in failed_text
        assert "policy drop left these rows out of the release" in failed_text
        assert page.page.locator(".passed").first.evaluate(
            "e => getComputedStyle(e).color") == PASSED_GREEN
        index_text = page.page.locator("body").inner_text()
        page.screenshot("index.png")

        failed_row.locator("td:first-child a").click()
        page.page.wait_for_selector("#asset")
        asset = page.page.locator("#asset").inner_text()
        source = internal.parent.parent / "data" / "microdata"
        assert asset == f"input partition 18 (state 18) of {source}"
        assert "None" not in asset
        expectations = page.page.locator("tr.expectation")
        assert expectations.count() >= 10
        assert page.page.locator('tr.expectation[data-success="false"]').count() == 1
        assert "of" in page.page.locator("#outcome").inner_text()
        run_text = page.page.locator("body").inner_text()
        page.screenshot("run.png")
    finally:
        page.close()

    assert page.external == [] and page.errors == []
    assert page.requests and all(url.startswith(LOCAL) for url in page.requests), page.requests
    assert any(url.endswith("/index.html") for url in page.requests)
    assert any("/runs/" in url for url in page.requests)
    for text in (index_text, run_text):
        assert "newsletter" not in text.lower()


@pytest.mark.slow
@pytest.mark.browser
def test_the_request_watch_catches_what_the_gx_site_fetches_from_cdns(browser, release):
    """The watch above can fail: Great Expectations' own site (GX 1.x) asks public CDNs for its
    scripts and styles, and the same page class sees those requests. If a GX upgrade vendors
    them, this test says so (and the report's reason to exist should be re-read)."""
    page = OfflinePage(browser)
    try:
        page.page.goto((release["internal"] / "data_docs" / "index.html").resolve().as_uri())
    finally:
        page.close()
    assert page.external, "the GX site made no external request"
    assert all(not url.startswith(LOCAL) for url in page.external)
