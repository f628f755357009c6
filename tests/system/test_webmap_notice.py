"""The web map tells its reader what the release is (issue 33, item 1): publish.title as
its heading, publish.notice as a banner (the demo's: synthetic data), the licence and the
citation, from the release's config.json; nothing of them without the config fields."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from dpatlas.cli.demo import DEMO_METADATA, DEMO_NOTICE
from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.publication import webmap as W
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication.serve import serve_in_thread
from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from tests.system.test_webmap import Page, _publish

RELEASE = "20261129T000000Z-notice"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("notice") / "releases"
    root.mkdir()
    geoids, _ = tract_geoids("17", 60, 3)
    _publish(root, RELEASE, datetime(2026, 11, 29, tzinfo=timezone.utc), seed=7,
             boundaries=synth_boundaries(geoids, seed=0),
             publish={"license": "CC-BY-4.0", **DEMO_METADATA})
    W.write_feed_map(root)
    httpd, base = serve_in_thread(root)
    yield base
    httpd.shutdown()
    httpd.server_close()


def test_the_map_shows_the_notice_title_licence_and_citation(browser, server):
    page = Page(browser)
    try:
        page.open(server, RELEASE)
        notice = page.page.locator("#notice")
        assert notice.is_visible() and notice.inner_text() == DEMO_NOTICE
        assert page.page.inner_text("#title") == DEMO_METADATA["title"]
        assert page.page.title().startswith(DEMO_METADATA["title"])
        assert page.page.locator("#licence").is_visible()
        assert page.page.inner_text("#licence") == "CC-BY-4.0"
        assert DEMO_METADATA["citation"] in page.page.inner_text("#citation")
        assert DEMO_METADATA["contact"] in page.page.inner_text("#about")
        assert not page.errors, page.errors
    finally:
        page.close()


def test_the_picker_names_each_release_by_title_and_day_and_the_readme_is_a_download(
        browser, server):
    """Issue 33, item 1: the picker reads the feed (JSON Feed 1.1, item 7) and shows the
    release's title and day, not its bare id; the downloads list its README.md codebook."""
    from tests.system.test_webmap import _fetch_status

    page = Page(browser)
    try:
        page.open(server, RELEASE)
        (option,) = page.page.eval_on_selector_all(
            "#release option", "os => os.map(o => [o.value, o.textContent])")
        assert option == [RELEASE, f"{DEMO_METADATA['title']}, 2026-11-29 ({RELEASE}) (latest)"]
        links = dict(page.page.eval_on_selector_all(
            "#downloads a", "as => as.map(a => [a.dataset.file, a.getAttribute('href')])"))
        assert links["README.md"] == f"{RELEASE}/README.md"
        assert _fetch_status(page, links["README.md"]) == 200
        assert not page.errors, page.errors
    finally:
        page.close()
