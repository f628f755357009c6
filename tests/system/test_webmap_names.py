"""The web map's search finds what people type (issue 33 item 4): a county by its name with
or without "County" and a state, any case; a state by its name or postal code; a tract by its
Census GEO_ID; with suggestions from the published names; a miss closes the open popup.
Against a release of real North Carolina counties (their Census-style names published)."""

from __future__ import annotations

from contextlib import contextmanager
from functools import partial

import pytest

from dpatlas.publication import feed as F
from dpatlas.publication import tract_files as P
from dpatlas.publication import webmap as W
from dpatlas.publication.cell_stream import write_release
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication.serve import serve_in_thread
from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from tests.system.test_webmap import (LEVELS, Page, _level_results, _open_popup_text,
                                      _popup_count, _results, _search, _shown_level)

RELEASE = "20261129T000000Z-names"
# Wake, Durham, Orange, Mecklenburg and McDowell counties, four tracts each (two with decimals).
COUNTIES = ("37183", "37063", "37135", "37119", "37111")
TRACTS = ("000100", "000200", "001201", "001202")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from dpatlas.publication.level_files import assemble_level, write_all_levels

    root = tmp_path_factory.mktemp("names") / "releases"
    root.mkdir()
    geoids = [c + t for c in COUNTIES for t in TRACTS]
    boundaries = synth_boundaries(geoids, seed=0)
    table = P.assemble(_results(boundaries["geoid"].to_numpy(), 300), boundaries)
    results = _level_results(boundaries["geoid"].to_numpy(), 301)
    levels = {level: assemble_level(results, boundaries, level, ["all"])
              for level in ("county", "state")}
    config = {"intervals": {"enabled": True, "level": 0.95, "low_reliability_width": 0.5,
                            "share": 0.25}, "levels": LEVELS}
    write_release(table, {"release_id": RELEASE, "published": "2026-11-29"}, root, RELEASE,
                  config=config, more_files=partial(write_all_levels, levels))
    F.update_feed(root, RELEASE)
    W.write_feed_map(root)
    httpd, base = serve_in_thread(root)
    yield base
    httpd.shutdown()
    httpd.server_close()


@contextmanager
def opened(browser, server, **kw):
    """The release's page, loaded; no console error, failed request or exception by the end."""
    page = Page(browser, **kw)
    try:
        page.open(server, RELEASE)
        yield page
        assert page.errors == [], page.errors
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_search_finds_counties_states_and_geo_ids_as_people_type_them(browser, server):
    with opened(browser, server, flights=True) as page:
        # A county by its name: lower case, without "County", with the state or its code.
        for query in ("wake county", "Wake", "Wake County, NC", "WAKE COUNTY, North Carolina"):
            message = _search(page, query)
            assert message.startswith(f"Found county named “{query}”."), (query, message)
            assert _shown_level(page) == "county"
            assert "37183 Wake County, North Carolina" in _open_popup_text(page), query
            assert _popup_count(page) == 1
        # The start of a name finds the counties it begins ("Mc": McDowell, not Mecklenburg).
        assert _search(page, "mc").startswith("Found county named “mc”.")
        assert "37111 McDowell County, North Carolina" in _open_popup_text(page)
        # A state by its name or postal code: its popup names it (no longer "State 37").
        for query in ("North Carolina", "nc"):
            message = _search(page, query)
            assert message == "Found state North Carolina.", (query, message)
            assert _shown_level(page) == "state"
            assert "37 North Carolina" in _open_popup_text(page)
        # A tract by its Census GEO_ID (any case), a county and a state by theirs.
        message = _search(page, "1400000US37183001201")
        assert message == "Found tract 37183001201.", message
        assert _shown_level(page) == "tract"
        assert "Census Tract 12.01; Wake County; North Carolina" in _open_popup_text(page)
        assert _search(page, "0500000us37063") == "Found county 37063."
        assert "37063 Durham County, North Carolina" in _open_popup_text(page)
        assert _search(page, "0400000US37") == "Found state 37."
        # A miss closes the open popup and says so.
        assert _popup_count(page) == 1
        for query in ("Nowhere County", "Texas", "1400000US3718300120", "Wake County, SC"):
            message = _search(page, query)
            assert message.startswith("Not found: no ") or message.startswith("Type an"), \
                (query, message)
            assert page.page.get_attribute("#search-message", "data-found") == "false"
            assert _popup_count(page) == 0, query
            _search(page, "Durham")                 # a popup open again for the next miss
        page.screenshot("search-names.png")


@pytest.mark.slow
@pytest.mark.browser
def test_the_search_box_suggests_the_published_names(browser, server):
    with opened(browser, server) as page:
        page.page.focus("#search-box")
        page.page.wait_for_function(
            "() => document.querySelectorAll('#search-names option').length > 0",
            timeout=10_000)
        options = page.page.eval_on_selector_all("#search-names option",
                                                 "os => os.map(o => o.value)")
        assert "Wake County, North Carolina" in options and "North Carolina" in options
        assert len(options) == len(COUNTIES) + 1, options
        assert page.page.get_attribute("#search-box", "list") == "search-names"


@pytest.mark.slow
@pytest.mark.browser
def test_zoomed_out_the_states_around_the_release_are_drawn_under_it(browser, server):
    """Context (issue 33 item 4): at low zoom the 48 contiguous states' outlines
    (states_context.geojson, beside the app) are drawn under every layer of the release, so
    North Carolina does not float on grey; zoomed in they give way to the release."""
    with opened(browser, server) as page:
        page.page.evaluate("() => window.dpatlas.map.jumpTo({center: [-90, 37], zoom: 3.5})")
        page.idle()
        order = page.page.evaluate("() => window.dpatlas.map.getStyle().layers.map(l => l.id)")
        context = [order.index("states-context-fill"), order.index("states-context-line")]
        release = [i for i, name in enumerate(order)
                   if name.startswith(("tracts-", "counties-", "states-"))
                   and not name.startswith("states-context")]
        assert max(context) < min(release), order
        drawn = set(page.page.evaluate(
            "() => window.dpatlas.map.queryRenderedFeatures({layers: ['states-context-fill']})"
            ".map(f => f.properties.name)"))
        assert {"North Carolina", "Virginia", "Tennessee", "Texas"} <= drawn, drawn
        page.screenshot("states-context.png")
        page.page.evaluate("() => window.dpatlas.map.jumpTo({center: [-78.6, 35.8], zoom: 9})")
        page.idle()
        assert page.page.evaluate(
            "() => window.dpatlas.map.queryRenderedFeatures("
            "{layers: ['states-context-fill']}).length") == 0
