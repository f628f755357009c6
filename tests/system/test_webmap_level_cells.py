"""The web map of a release of several cells with county and state levels (issue 35, item 3):
each level has an archive per cell, as the tracts do, and the map showing one cell fetches
that cell's county and state archives alone; choosing another cell switches every level's
source to that cell's archive."""

from __future__ import annotations

import json

import pytest

from dpatlas.evaluation.synthetic_input import StateParams, cell_names, write_synthetic
from dpatlas.publication.serve import serve_in_thread
from tests.integration.test_cells_release import release_cells
from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from tests.system.test_webmap import Page, _tile_urls

CELLS = cell_names(3)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("level-cells")
    write_synthetic(tmp / "data", ["17", "18"], seed=5,
                    params=StateParams(n_tracts=30, counties=3), cells=len(CELLS))
    folder = release_cells(tmp / "data", tmp, "lc1")
    httpd, base = serve_in_thread(folder.parent)
    yield base, folder
    httpd.shutdown()
    httpd.server_close()


def _fetched(page: Page) -> set[str]:
    return {u.rsplit("/", 1)[1] for u in _tile_urls(page)}


@pytest.mark.slow
@pytest.mark.browser
def test_the_map_fetches_the_shown_cells_county_and_state_archives_and_switches_them(
        browser, release):  # noqa: F811 (the imported fixture)
    base, folder = release
    m = json.loads((folder / "manifest.json").read_text())
    levels = m["level_cell_tiles"]
    page = Page(browser)
    try:
        page.open(f"{base}{folder.name}/", folder.name)
        first = page.page.evaluate("() => window.dpatlas.state.cell")
        assert first == CELLS[0]
        page.page.check("input[name=level][value=county]")
        page.idle()
        fetched = _fetched(page)
        assert levels["county"][first] in fetched and levels["state"][first] in fetched, fetched
        others = {levels[lv][c] for lv in levels for c in CELLS if c != first}
        assert not fetched & others, fetched
        assert not {"counties.pmtiles", "states.pmtiles"} & fetched

        page.page.select_option("#cell", CELLS[2])
        page.idle()
        fetched = _fetched(page)
        assert levels["county"][CELLS[2]] in fetched, fetched
        assert levels["county"][CELLS[1]] not in fetched and levels["state"][CELLS[1]] not in fetched
        rendered = page.page.evaluate(
            "() => [...new Set(window.dpatlas.map.queryRenderedFeatures({layers: "
            "['counties-fill']}).map(f => String(f.properties.cell)))]")
        assert rendered == [CELLS[2]], rendered
        assert page.errors == [] and set(page.tile_statuses) == {206}
    finally:
        page.close()
