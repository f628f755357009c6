"""The web map of a release of several cells (issue 35, item 3): each cell has its own tract
archive, and the map showing one cell fetches that cell's archive alone (the bytes counted);
choosing another cell switches the tract source to that cell's archive and draws its values."""

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


def _tile_bytes(page: Page) -> dict[str, int]:
    """Bytes transferred per PMTiles archive (the resource timing's decoded bodies)."""
    entries = page.page.evaluate(
        "() => performance.getEntriesByType('resource').filter(e => e.name.endsWith('.pmtiles'))"
        ".map(e => [e.name.split('/').pop(), e.decodedBodySize])")
    out: dict[str, int] = {}
    for name, size in entries:
        out[name] = out.get(name, 0) + int(size)
    return out


@pytest.mark.slow
@pytest.mark.browser
def test_the_map_fetches_only_the_shown_cells_tiles_and_switches_archive_with_the_cell(
        browser, release):  # noqa: F811 (the imported fixture)
    base, folder = release
    m = json.loads((folder / "manifest.json").read_text())
    assert sorted(m["cell_tiles"]) == CELLS
    geoid, lon, lat, colour = _target(folder, CELLS[2], CELLS[0])
    page = Page(browser)
    try:
        page.open(f"{base}{RELEASE}/", RELEASE)
        assert page.page.evaluate("() => window.dpatlas.state.cell") == CELLS[0]
        fetched = _tile_bytes(page)
        first = m["cell_tiles"][CELLS[0]]
        assert list(fetched) == [first], fetched  # no other cell's archive, no tracts.pmtiles
        assert 0 < fetched[first] <= (folder / first).stat().st_size
        options = page.page.eval_on_selector_all("#cell option", "os => os.map(o => o.value)")
        assert options == CELLS and page.page.is_visible("#cell")

        page.page.select_option("#cell", CELLS[2])
        page.idle()
        fetched = _tile_bytes(page)
        third = m["cell_tiles"][CELLS[2]]
        assert set(fetched) == {first, third}, fetched
        assert m["cell_tiles"][CELLS[1]] not in fetched
        _assert_colour(page.screenshot("cells-third.png"), page.pixel_of(lon, lat), colour,
                       f"tract {geoid} of {CELLS[2]}")
        assert page.errors == [] and set(page.tile_statuses) == {206}
    finally:
        page.close()
