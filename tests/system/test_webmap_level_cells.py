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


@pytest.mark.slow
@pytest.mark.browser
def test_a_release_of_several_states_lists_each_states_files_and_finds_a_tract_in_its_state(
        browser, release):  # noqa: F811 (the imported fixture)
    """Its downloads link each state's files (which it publishes), not the single tract files
    (which it does not); a tract found by its GEOID is read from its state's GeoJSON alone."""
    import urllib.request

    from tests.system.test_webmap import _search

    base, folder = release
    m = json.loads((folder / "manifest.json").read_text())
    page = Page(browser, flights=True)
    try:
        page.open(f"{base}{folder.name}/", folder.name)
        files = page.page.eval_on_selector_all("#downloads a", "as => as.map(a => a.dataset.file)")
        assert not {"tracts.csv", "tracts.parquet", "tracts.geojson"} & set(files), files
        for state in ("17", "18"):
            for name in (f"tracts-csv/state={state}/tracts.csv",
                         f"tracts/state={state}/part-0.parquet",
                         f"tracts-geojson/state={state}/tracts.geojson"):
                assert name in files and name in m["files"], (name, files)
        for name in files:  # every link is a published file (the manifest lists the others)
            assert name in m["files"] or name == "manifest.json", name
            with urllib.request.urlopen(f"{base}{folder.name}/{name}") as response:
                assert response.status == 200
        geoid = next(g for g in read_geoids(folder) if g.startswith("18"))
        message = _search(page, geoid)
        assert page.page.get_attribute("#search-message", "data-found") == "true", message
        fetched = page.page.evaluate(
            "() => performance.getEntriesByType('resource').map(e => e.name)")
        assert any(u.endswith("tracts-geojson/state=18/tracts.geojson") for u in fetched)
        assert not any(u.endswith("tracts-geojson/state=17/tracts.geojson") for u in fetched)
        assert not any(u.endswith("/tracts.geojson") and "state=" not in u for u in fetched)
        assert page.errors == []
    finally:
        page.close()


def read_geoids(folder) -> list[str]:
    import pandas as pd

    return sorted(pd.read_parquet(folder / "tracts", partitioning=None,
                                  columns=["geoid"])["geoid"].astype(str))
