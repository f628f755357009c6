"""The PNG map's size follows the area's shape (issue 21: a wide state drawn between empty
bands)."""

import numpy as np
import pyproj
import shapely

from dpatlas.publication.png_map import MAP_FIGSIZE_INCHES, map_figsize

WGS84 = pyproj.CRS.from_epsg(4326)


def test_a_wide_state_gets_a_short_figure_and_a_tall_one_a_tall_figure():
    wide = np.array([shapely.box(-84.3, 33.8, -75.5, 36.6)])   # North Carolina's extent
    tall = np.array([shapely.box(-91.5, 37.0, -87.5, 42.5)])   # Illinois'
    w_width, w_height = map_figsize(wide, WGS84)
    t_width, t_height = map_figsize(tall, WGS84)
    assert w_width == t_width == MAP_FIGSIZE_INCHES[0]
    assert w_height < 0.75 * w_width < t_width < t_height
    # the ground's shape, not the degrees': at 35.2° a degree of longitude is 0.82 of latitude's
    ground = (36.6 - 33.8) / ((84.3 - 75.5) * np.cos(np.deg2rad(35.2)))
    assert abs((w_height - 1.2) / w_width - ground) < 1e-9


def test_no_geometry_keeps_the_default_size():
    assert map_figsize(np.array([], dtype=object), WGS84) == MAP_FIGSIZE_INCHES
