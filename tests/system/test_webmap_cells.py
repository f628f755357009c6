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
# The same release laid out as before issue 35: every cell's features stacked in one
# tracts.pmtiles, filtered by cell, no values apart.
STACKED = "20261128T000000Z-stacked"
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
    table = P.assemble(results, boundaries)
    stacked = write_release(table, {"release_id": STACKED, "published": "2026-11-28"}, root,
                            STACKED, config=config)
    _as_published_before(stacked)
    F.update_feed(root, STACKED)
    folder = write_release(table, {"release_id": RELEASE, "published": "2026-11-29"}, root,
                           RELEASE, config=config)
    F.update_feed(root, RELEASE)
    W.write_feed_map(root)
    httpd, base = serve_in_thread(root)
    yield base, folder
    httpd.shutdown()
    httpd.server_close()


def _as_published_before(folder) -> None:
    """A release as published before its tracts' values were apart: tracts.pmtiles built from
    tracts.geojson (every cell's features), no values documents, the manifest re-hashed."""
    import shutil

    from dpatlas.core.hashing import sha256_file
    from dpatlas.publication import tiles as T, tract_values as V

    T.build_tiles(folder / "tracts.geojson", folder / T.TILES_FILE)
    shutil.rmtree(folder / V.VALUES_FOLDER)
    m = json.loads((folder / "manifest.json").read_text())
    del m[V.MANIFEST_KEY]
    m["files"] = {name: {"sha256": sha256_file(folder / name),
                         "bytes": (folder / name).stat().st_size}
                  for name in m["files"] if not V.is_values_document(name)}
    (folder / "manifest.json").write_text(json.dumps(m, indent=2))


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


@pytest.mark.slow
@pytest.mark.browser
def test_a_release_published_before_draws_the_chosen_cells_features_of_its_stacked_archive(
        browser, release):  # noqa: F811 (the imported fixture)
    """Every cell's features in one tracts.pmtiles, no values apart (a release of before):
    the map filters the archive by the chosen cell, as it did then, and its popup reads the
    features."""
    base, folder = release
    stacked = folder.parent / STACKED
    assert "tract_values" not in json.loads((stacked / "manifest.json").read_text())
    geoid, lon, lat, colour = _target(stacked, CELLS[2], CELLS[0])
    page = Page(browser)
    try:
        page.open(f"{base}{STACKED}/", STACKED)
        options = page.page.eval_on_selector_all("#cell option", "os => os.map(o => o.value)")
        assert options == CELLS
        page.page.select_option("#cell", CELLS[2])
        page.idle()
        _assert_colour(page.screenshot("stacked-third.png"), page.pixel_of(lon, lat), colour,
                       f"tract {geoid} of {CELLS[2]} (stacked archive)")
        assert not [n for n in _fetched(page, ".json") if "tract-values/" in n]
        page.page.mouse.click(*page.pixel_of(lon, lat))
        text = page.page.wait_for_selector(".maplibregl-popup-content",
                                           timeout=10_000).inner_text()
        assert geoid in text and CELLS[2] in text, text
        assert page.errors == [] and set(page.tile_statuses) == {206}
    finally:
        page.close()
