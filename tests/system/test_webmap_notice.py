"""The web map tells its reader what the release is (issue 33, item 1): publish.title as
its heading, publish.notice as a banner (the demo's: synthetic data), the licence and the
citation, from the release's config.json; nothing of them without the config fields."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from dpatlas.cli.demo import DEMO_METADATA, DEMO_NOTICE
from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.publication import feed as F
from dpatlas.publication import tiles as T
from dpatlas.publication import tract_files as P
from dpatlas.publication import webmap as W
from dpatlas.publication.cell_stream import write_release
from dpatlas.publication.geography import synth_boundaries
from dpatlas.publication.serve import serve_in_thread
from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from tests.system.test_webmap import Page, _results

RELEASE = "20261129T000000Z-notice"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("notice") / "releases"
    root.mkdir()
    geoids, _ = tract_geoids("17", 60, 3)
    boundaries = synth_boundaries(geoids, seed=0)
    table = P.assemble(_results(boundaries["geoid"].to_numpy(), 7), boundaries)
    manifest = {"release_id": RELEASE,
                "published": datetime(2026, 11, 29, tzinfo=timezone.utc).isoformat()}
    config = {"publish": {"license": "CC-BY-4.0", **DEMO_METADATA}}
    folder = write_release(table, manifest, root, RELEASE, config=config)
    if not (folder / T.TILES_FILE).exists():
        T.build_tiles(folder / "tracts.geojson", folder / T.TILES_FILE)
    if not (folder / W.PAGE).exists():
        W.write_web_map(folder, RELEASE)
    F.update_feed(root, RELEASE)
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
