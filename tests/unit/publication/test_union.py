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
