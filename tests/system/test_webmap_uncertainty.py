"""Uncertainty on the web map (issue 33, item 2): in model mode a tract coloured by a model
value without a published direct (suppressed) is dotted and in the legend, flagged tracts are
outlined, the hatch marks an interval spanning more than one colour class (direct and model
alike), the legend describes the shown mode's ± and interval, and every ± is labelled."""

from __future__ import annotations

import pytest

from dpatlas.publication import colours
from tests.support.style_expressions import rendered
from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from tests.system.test_webmap import (MODEL_Z, Page, _published, levels_root,  # noqa: F401
                                      levels_server)


def _rendered(page: Page, layer: str) -> dict[str, dict]:
    """The features ``layer`` draws in view (its filter and its opacity, which with the
    values apart hides a mark where it does not apply), by GEOID."""
    return {f["geoid"]: f for f in rendered(page.page, layer)}


def _legend_rows(page: Page) -> dict[str, str]:
    return dict(page.page.eval_on_selector_all(
        "#legend .row[data-status]", "rows => rows.map(r => [r.dataset.status, r.innerText])"))


def _tracts_in_view(page: Page) -> None:
    """Tracts fixed and the whole state in view (tracts are drawn from z4)."""
    page.page.check("input[name=level][value=tract]")
    page.page.evaluate("() => window.dpatlas.map.fitBounds(window.dpatlas.state.bounds, "
                       "{padding: 0, animate: false})")
    page.idle()


@pytest.mark.browser
def test_model_mode_marks_suppressed_and_flagged_tracts_and_hatches_by_colour_class(
        browser, levels_server, levels_root):
    rid, folder = levels_root["id"], levels_root["folder"]
    tracts = _published(folder)
    suppressed = set(tracts.index[tracts["status"] == "suppressed"])
    unreleased = set(tracts.index[tracts["status"] != "released"])
    page = Page(browser)
    try:
        page.open(levels_server, rid)
        assert page.page.is_checked("input[name=estimate][value=model]")   # the default
        _tracts_in_view(page)
        drawn = _rendered(page, "tracts-fill")
        assert len(drawn) == len(tracts), len(drawn)

        # Suppressed tracts (n too small, no direct) carry a model value: dotted, in the legend.
        dotted = set(_rendered(page, "tracts-dots"))
        assert suppressed and suppressed <= dotted and dotted == unreleased, dotted
        rows = _legend_rows(page)
        assert rows["model-only"] == colours.MODEL_ONLY_LABEL
        assert "suppressed" in rows["model-only"]

        # Flagged tracts (|p25_model_z| > 2.58: every direct here) outlined, in the legend.
        flagged = set(_rendered(page, "tracts-flag"))
        assert flagged == set(tracts.index[tracts["status"] == "released"]) and MODEL_Z["p25"] > 2.58
        assert "model may not apply here" in rows["model-flag"] and "2.58" in rows["model-flag"]

        # The hatch: exactly the model intervals that span more than one colour class, though
        # none is wider than 0.5 (the old fixed width hatched none of them).
        want = set(tracts.index[colours.spans_classes(tracts["p25_model_lo"],
                                                      tracts["p25_model_hi"])])
        assert want and (tracts["p25_model_hi"] - tracts["p25_model_lo"]).max() < 0.5
        assert set(_rendered(page, "tracts-hatch")) == want
        assert "spans more than one colour class (95% interval; model-based)" in \
            rows["low-reliability"]

        # The legend speaks of the model's ± and interval, not the direct estimators'.
        legend = page.page.inner_text("#legend")
        assert "±: none for model-based values" in legend
        assert "Model-based values: the 95% interval" in legend
        assert "Direct values:" not in legend and "rows:" not in legend

        # Direct mode: no dots and no outlines; the hatch follows the direct intervals; the
        # suppressed swatch (the tiles have suppressed tracts), the direct ± and interval.
        page.page.check("input[name=estimate][value=direct]")
        page.idle()
        assert _rendered(page, "tracts-dots") == {} and _rendered(page, "tracts-flag") == {}
        released = tracts[tracts["status"] == "released"]
        want = set(released.index[colours.spans_classes(released["p25_lo"], released["p25_hi"])])
        assert want and set(_rendered(page, "tracts-hatch")) == want
        rows = _legend_rows(page)
        assert "model-only" not in rows and "model-flag" not in rows
        assert rows["suppressed"].startswith("suppressed (too few records")
        legend = page.page.inner_text("#legend")
        assert "±: the 90% margin of error" in legend
        assert "Direct values: the 95% interval" in legend and "Model-based values" not in legend

        # Every ± a popup shows is labelled: a suppressed tract's (model value only) too.
        geoid = sorted(suppressed)[0]
        point = tracts.loc[geoid, "geometry"].representative_point()
        page.page.check("input[name=estimate][value=model]")
        page.page.evaluate("([lon, lat]) => window.dpatlas.map.jumpTo({center: [lon, lat], "
                           "zoom: 11})", [point.x, point.y])
        page.idle()
        page.page.mouse.click(*page.pixel_of(point.x, point.y))
        text = page.page.wait_for_selector(".maplibregl-popup-content",
                                           timeout=10_000).inner_text()
        assert geoid in text and "suppressed" in text and "95% interval [" in text, text
        assert text.count(" ± ") == text.count("(90% margin of error)"), text
        assert not page.errors, page.errors
    finally:
        page.close()
