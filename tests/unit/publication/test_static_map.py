"""What the static maps show (issue 33, item 2; dpatlas.publication.static_map): a value is
marked unreliable when its interval spans more than one colour class of the legend, not by a
fixed width, for direct and model values alike; p25_map.png draws the web map's default (the
model where the release has one) and a labelled direct map sits beside it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dpatlas.publication import colours
from dpatlas.publication import static_map as M


def test_an_interval_spans_classes_when_its_ends_fall_in_different_classes():
    lo = [0.21, 0.19, 0.30, 0.25, 0.0, np.nan, 0.81]
    hi = [0.29, 0.21, 0.30, 0.30, 1.0, 0.50, 1.00]
    # a break belongs to the class above it (MapLibre's step, bisect_right), so [0.25, 0.30]
    # reaches the next class; a missing end marks nothing
    assert colours.spans_classes(lo, hi).tolist() == [False, True, False, True, True, False,
                                                     False]
    assert colours.class_index(0.3) == colours.class_index(0.35)


def tracts(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    return pd.DataFrame({"status": ["released"] * n, **columns})


def test_a_model_interval_spanning_three_classes_is_hatched_though_narrower_than_half():
    """The old rule (width > intervals.low_reliability_width, 0.5) hatched no model value."""
    t = tracts(p25=[0.45, 0.45, 0.45], p25_lo=[0.41, 0.1, 0.2], p25_hi=[0.49, 0.9, 0.48],
               p25_model=[0.4, 0.44, 0.45], p25_model_lo=[0.25, 0.41, 0.40],
               p25_model_hi=[0.52, 0.48, 0.50])
    assert ((t.p25_model_hi - t.p25_model_lo) < 0.5).all()
    assert M.low_reliability(t, "model").tolist() == [True, False, True]
    assert M.low_reliability(t, "direct").tolist() == [False, True, True]


def test_only_units_the_map_colours_are_hatched_and_none_without_intervals():
    t = tracts(p25=[0.45, np.nan], p25_lo=[0.1, 0.1], p25_hi=[0.9, 0.9])
    t.loc[1, "status"] = "suppressed"
    assert M.low_reliability(t, "direct").tolist() == [True, False]
    assert not M.low_reliability(t[["status", "p25"]], "direct").any()
    assert not M.low_reliability(t, "model").any()  # no model columns


def test_the_default_map_follows_the_model_where_the_release_has_one():
    direct = tracts(p25=[0.4, 0.5])
    assert M.default_estimate(direct) == "direct"
    assert M.default_estimate(direct.assign(p25_model=[np.nan, np.nan])) == "direct"
    assert M.default_estimate(direct.assign(p25_model=[np.nan, 0.42])) == "model"


def test_model_only_and_flagged_tracts():
    t = tracts(p25=[0.4, np.nan, np.nan, 0.3], p25_model=[0.41, 0.43, np.nan, 0.5],
               p25_model_z=[0.5, np.nan, np.nan, -2.6])
    t.loc[[1, 2], "status"] = ["suppressed", "failed"]
    assert M.model_only(t).tolist() == [False, True, False, False]
    assert M.model_flagged(t).tolist() == [False, False, False, True]


def test_the_png_default_is_the_model_titled_so_with_a_labelled_direct_map_beside(tmp_path):
    drawn = []

    def draw(table, path, title, intervals, *estimate):
        drawn.append((path.name, title, intervals, estimate))

    title = "Demo\nRelease r1: p25 by tract (2 of 3 released)"
    t = tracts(p25=[0.4, np.nan], p25_model=[0.41, 0.43])
    assert M.write_overview_maps(t, tmp_path, title, False, draw=draw) == [M.DIRECT_MAP_FILE]
    assert drawn == [
        ("p25_map.png", "Demo\nRelease r1: p25 (model-based) by tract (2 of 3 released)", True,
         ("model",)),
        ("p25_map_direct.png", "Demo\nRelease r1: p25 (direct) by tract (2 of 3 released)",
         False, ())]
    drawn.clear()
    assert M.write_overview_maps(t.drop(columns="p25_model"), tmp_path, title, True,
                                 draw=draw) == []
    assert drawn == [("p25_map.png", "Demo\nRelease r1: p25 (direct) by tract (2 of 3 "
                      "released)", True, ())]
