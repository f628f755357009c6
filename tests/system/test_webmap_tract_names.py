"""The web map's search finds a tract by its Census-style name ("Census Tract 12.01", any case,
with its county and/or state to tell it from the tracts of that number elsewhere), and a
popup names the county and state above its unit. Against the release of real North Carolina
counties of test_webmap_names (five counties, each with a Census Tract 12.01)."""

from __future__ import annotations

import pytest

from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from tests.system.test_webmap import _open_popup_text, _search
from tests.system.test_webmap_names import COUNTIES, opened, server  # noqa: F401 (fixture)


@pytest.mark.slow
@pytest.mark.browser
def test_search_finds_a_tract_by_its_name_and_popups_name_the_units_above(browser, server):  # noqa: F811
    with opened(browser, server, flights=True) as page:
        # The number alone: every county's tract of that number, the first shown.
        message = _search(page, "census tract 12.01")
        assert message.startswith("Found tract named “census tract 12.01” "
                                  f"({len(COUNTIES)} matches"), message
        assert "Census Tract 12.01; " in _open_popup_text(page)
        # With the county (and state) the tract is the one of that county.
        for query, geoid, county in (
                ("Census Tract 12.01, Durham County", "37063001201", "Durham"),
                ("census tract 12.01; mecklenburg county; north carolina", "37119001201",
                 "Mecklenburg"),
                ("CENSUS TRACT 12.02, McDowell County, NC", "37111001202", "McDowell"),
                ("Census Tract 1, Orange", "37135000100", "Orange"),
                ("tract 12.01, wake county, North Carolina", "37183001201", "Wake")):
            message = _search(page, query)
            assert message == f"Found tract named “{query}”.", (query, message)
            text = _open_popup_text(page)
            assert geoid in text and f"; {county} County; North Carolina" in text, (query, text)
            # The units above are named: the county's and the state's names.
            assert f"{geoid[:5]} {county} County, North Carolina" in text, (query, text)
            assert "37 North Carolina" in text, (query, text)
        for query in ("Census Tract 99.99", "Census Tract 12.01, Durham County, SC"):
            assert _search(page, query).startswith("Not found: no tract named"), query
        # A county's popup names its state.
        assert _search(page, "Durham").startswith("Found county named")
        text = _open_popup_text(page)
        assert "37063 Durham County, North Carolina" in text and "37 North Carolina" in text, \
            text
