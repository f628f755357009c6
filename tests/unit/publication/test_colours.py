"""One colour scale for both maps (issue 21): the PNG map (png_map.write_map) and the web
map (the legend.json each release's page reads) take the same breaks and colours from
dpatlas.publication.colours."""

from __future__ import annotations

import bisect
import json

import numpy as np

from dpatlas.publication import colours
from dpatlas.publication import png_map as P
from dpatlas.publication import webmap as W

# Every break, just below and above it, the ends of [0, 1].
VALUES = sorted({0.0, 1.0, *colours.BREAKS, *(b - 1e-9 for b in colours.BREAKS),
                 *(b + 1e-9 for b in colours.BREAKS)})


def test_the_png_and_the_web_maps_legend_json_give_every_value_the_same_colour(tmp_path):
    W.write_web_map(tmp_path, "r1")
    legend = json.loads((tmp_path / W.LEGEND_FILE).read_text())
    assert legend["breaks"] == list(colours.BREAKS)
    # What app.js does with legend.json: a MapLibre `step` over the breaks.
    web = [legend["classes"][bisect.bisect_right(legend["breaks"], v)]["colour"] for v in VALUES]
    png = list(P.class_colours(np.array(VALUES)))
    assert png == web == [colours.class_colour(v) for v in VALUES]
    assert {s: legend["status"][s]["colour"] for s in legend["status"]} == colours.STATUS_COLOURS


def test_the_scale_is_a_diverging_palette_of_distinct_classes_whose_labels_state_the_breaks():
    assert len(colours.CLASS_COLOURS) == len(colours.BREAKS) + 1 == 8
    assert len(set(colours.CLASS_COLOURS)) == 8
    labels = colours.class_labels()
    assert labels[0] == "< 0.20" and labels[-1] == "≥ 0.80" and "0.40 – 0.50" in labels
    # Diverging about 0.5: the two middle classes are the lightest, the ends the darkest.
    lightness = [sum(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in colours.CLASS_COLOURS]
    middle = colours.class_index(0.5)
    assert max(lightness) in (lightness[middle - 1], lightness[middle])
    assert lightness[0] < lightness[middle - 1] and lightness[-1] < lightness[middle]
