"""Tract unions (footprint, hatched low-reliability shape): GEOS's coverage union raises on
some inputs that are not a clean coverage; the general union takes over (the national benchmark
on real outlines hit it)."""

import numpy as np
import shapely
from shapely.geometry import Polygon, box

from dpatlas.publication.png_map import low_reliability_shape
from dpatlas.publication.tract_files import tract_union


def test_a_coverage_whose_neighbours_do_not_share_a_vertex_falls_back_to_the_general_union():
    a = box(0, 0, 1, 1)
    b = Polygon([(1, 0), (1, 0.5), (1, 1), (2, 1), (2, 0)])  # a node a's edge lacks
    c = Polygon([(0.5, 0.5), (3, 0.2), (3, 3)])             # overlapping both
    geoms = np.array([a, b, c], dtype=object)
    try:
        shapely.coverage_union_all(geoms)
        raised = False
    except shapely.errors.GEOSException:
        raised = True
    assert raised  # the case the fallback is for
    assert tract_union(geoms).equals(shapely.union_all(geoms))
    assert low_reliability_shape(geoms).equals(shapely.union_all(geoms))


def test_a_clean_coverage_is_unioned_exactly():
    geoms = np.array([box(i, 0, i + 1, 1) for i in range(4)], dtype=object)
    assert tract_union(geoms).equals(box(0, 0, 4, 1))


def _two_states():
    """Two states, each a clean coverage of two tracts; the second's western edge has a vertex
    the first's eastern edge lacks (states drawn apart share no vertices), so the whole is no
    coverage."""
    west = [box(0, 0, 1, 1), box(1, 0, 2, 1)]
    east = [Polygon([(2, 0), (2, 0.5), (2, 1), (3, 1), (3, 0)]), box(3, 0, 4, 1)]
    return np.array([*west, *east], dtype=object), np.array(["01", "01", "02", "02"])


def test_states_that_are_coverages_apart_are_unioned_state_by_state(monkeypatch):
    geoms, states = _two_states()
    assert _coverage_fails(geoms)
    expected = shapely.union_all(geoms)
    sizes = []
    general = shapely.union_all

    def spy(values, *args, **kwargs):
        sizes.append(len(values))
        return general(values, *args, **kwargs)

    monkeypatch.setattr(shapely, "union_all", spy)
    union = tract_union(geoms, states)
    assert shapely.equals(union, expected) and union.area == 4.0
    assert sizes == [2]  # only the two states' unions went through the general union
    sizes.clear()
    assert shapely.equals(low_reliability_shape(geoms, states), expected)
    assert sizes == [2]
    sizes.clear()
    assert shapely.equals(tract_union(geoms), expected)  # without states: every tract
    assert sizes == [4]


def test_a_state_that_is_no_coverage_takes_the_general_union_alone():
    geoms, states = _two_states()
    overlapping = Polygon([(0.5, 0.5), (1.5, 0.2), (1.5, 0.9)])
    geoms = np.array([*geoms, overlapping], dtype=object)
    states = np.array([*states, "01"])
    assert shapely.equals(tract_union(geoms, states), shapely.union_all(geoms))


def _coverage_fails(geoms) -> bool:
    try:
        union = shapely.coverage_union_all(geoms)
    except shapely.errors.GEOSException:
        return True
    return not (shapely.is_valid(union)
                and np.isclose(union.area, shapely.area(geoms).sum(), rtol=1e-6))
