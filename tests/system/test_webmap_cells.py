"""The web map of a release of several cells (issue 35): the tracts' polygons are one
archive, each cell's values documents of their own, and the map showing one cell fetches that
cell's values alone (the files counted); choosing another cell fetches that cell's values, no
tiles, and draws them."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.publication import feed as F
from dpatlas.publication import tract_files as P
from dpatlas.publication import webmap as W
from dpatlas.publication.cell_stream import write_release
from dpatlas.publication.serve import serve_in_thread
from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from dpatlas.publication import colours
from tests.system.test_webmap import Page, _assert_colour, _published, _results

RELEASE = "20261129T000000Z-cells"
CELLS = ["outcome-1", "outcome-2", "outcome-3"]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("cells") / "releases"
    root.mkdir()
    geoids, _ = tract_geoids("17", 150, 6)
    boundaries = synth_boundaries(geoids, seed=0)
    results = pd.concat([_results(boundaries["geoid"].to_numpy(), 400 + k).assign(cell=cell)
                         for k, cell in enumerate(CELLS)], ignore_index=True)
    config = {"intervals": {"enabled": True, "level": 0.95, "low_reliability_width": 0.3,
                            "share": 0.25}}
    folder = write_release(P.assemble(results, boundaries),
                           {"release_id": RELEASE, "published": "2026-11-29"}, root, RELEASE,
                           config=config)
    F.update_feed(root, RELEASE)
    W.write_feed_map(root)
    httpd, base = serve_in_thread(root)
    yield base, folder
    httpd.shutdown()
    httpd.server_close()


def _target(folder, shown: str, before: str) -> tuple[str, float, float, str]:
    """The largest tract released and reliable (no hatch) in cell ``shown`` whose p25 colour
    there differs from its colour in cell ``before``: its GEOID, a point inside it, the colour."""
    table = _published(folder)
    now, then = table[table["cell"] == shown], table[table["cell"] == before]
    colour = now["p25"].map(W.class_colour)
    ok = ((now["status"] == "released") & ~colours.spans_classes(now["p25_lo"], now["p25_hi"])
          & (colour != then["p25"].map(W.class_colour).reindex(now.index)))
    geoid = now[ok].to_crs("EPSG:6933").area.idxmax()
    point = now.loc[geoid, "geometry"].representative_point()
    return geoid, point.x, point.y, colour[geoid]


def _fetched(page: Page, suffix: str) -> dict[str, int]:
    """Bytes transferred per file ending in ``suffix`` (the resource timing's decoded bodies),
    by its path in the release."""
    entries = page.page.evaluate(
        "(suffix) => performance.getEntriesByType('resource')"
        ".filter(e => e.name.endsWith(suffix)).map(e => [e.name, e.decodedBodySize])", suffix)
    out: dict[str, int] = {}
    for name, size in entries:
        name = name.split(RELEASE + "/", 1)[-1]
        out[name] = out.get(name, 0) + int(size)
    return out


@pytest.mark.slow
@pytest.mark.browser
def test_the_map_fetches_only_the_shown_cells_values_and_switches_them_with_the_cell(
        browser, release):  # noqa: F811 (the imported fixture)
    base, folder = release
    m = json.loads((folder / "manifest.json").read_text())
    folders = m["tract_values"]["folders"]
    assert sorted(folders) == CELLS and "tracts.pmtiles" in m["files"]
    values = {cell: f"{folders[cell]}/17.json" for cell in CELLS}
    geoid, lon, lat, colour = _target(folder, CELLS[2], CELLS[0])
    page = Page(browser)
    try:
        page.open(f"{base}{RELEASE}/", RELEASE)
        assert page.page.evaluate("() => window.dpatlas.state.cell") == CELLS[0]
        tiles = _fetched(page, ".pmtiles")
        assert list(tiles) == ["tracts.pmtiles"], tiles  # the polygons, once for every cell
        assert 0 < tiles["tracts.pmtiles"] <= (folder / "tracts.pmtiles").stat().st_size
        fetched = _fetched(page, ".json")
        assert [n for n in fetched if n.startswith("tract-values/")] == [values[CELLS[0]]]
        assert fetched[values[CELLS[0]]] == (folder / values[CELLS[0]]).stat().st_size
        options = page.page.eval_on_selector_all("#cell option", "os => os.map(o => o.value)")
        assert options == CELLS and page.page.is_visible("#cell")

        page.page.select_option("#cell", CELLS[2])
        page.idle()
        fetched = _fetched(page, ".json")
        assert {n for n in fetched if n.startswith("tract-values/")} == {
            values[CELLS[0]], values[CELLS[2]]}, fetched  # not the second cell's
        assert _fetched(page, ".pmtiles") == tiles  # no tile fetched again
        _assert_colour(page.screenshot("cells-third.png"), page.pixel_of(lon, lat), colour,
                       f"tract {geoid} of {CELLS[2]}")
        assert page.errors == [] and set(page.tile_statuses) == {206}
    finally:
        page.close()
