"""The static map (dpatlas/publication/tract_files.py write_map): the low-reliability hatch is one merged shape
that covers exactly the low-reliability tracts (compared as geometries and as rasterised
pixels), draws what one hatched patch per tract drew, and the PNG is written."""

from __future__ import annotations

import geopandas as gpd
import numpy as np
import pytest
import shapely
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from shapely.geometry import MultiPolygon, Polygon, box

from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication.static_map import low_reliability
from dpatlas.publication.png_map import (MAP_HATCH, MAP_HATCH_COLOUR, _add_tracts,
                                          class_paths, low_reliability_shape, write_map)
from dpatlas.evaluation.synthetic_input import tract_geoids

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RASTER = 500  # pixels a side of the rasterised test images


@pytest.fixture(scope="module")
def table() -> gpd.GeoDataFrame:
    """160 synthetic tracts tiling a state; about half released with an interval spanning
    several colour classes, the others with a point interval."""
    geoids, _ = tract_geoids("17", 160, 6)
    t = synth_boundaries(geoids, seed=3)
    rng = np.random.default_rng(5)
    n = len(t)
    t["status"] = np.where(rng.random(n) < 0.9, "released", "suppressed")
    t["p25"] = np.where(t["status"] == "released", rng.uniform(0.1, 0.7, n), np.nan)
    width = np.where(rng.random(n) < 0.5, 0.8, 0.0)
    t["p25_lo"], t["p25_hi"] = t["p25"] - width / 2, t["p25"] + width / 2
    return t


def weak_mask(t) -> np.ndarray:
    weak = low_reliability(t).to_numpy()
    assert 20 < weak.sum() < len(t) - 20  # both kinds well represented
    return weak


# ---------------------------------------------------------------------------------------------
# The merged shape, as geometry


def test_merged_shape_is_exactly_the_low_reliability_tracts(table):
    geoms = table.geometry.to_numpy()
    weak = weak_mask(table)
    shape = low_reliability_shape(geoms[weak])
    assert shape.is_valid
    assert shape.area == pytest.approx(shapely.area(geoms[weak]).sum(), rel=1e-9)
    area = shapely.area(geoms)
    uncovered = shapely.area(shapely.difference(geoms[weak], shape))
    assert np.all(uncovered <= 1e-9 * area[weak])  # every low-reliability tract hatched
    spill = shapely.area(shapely.intersection(geoms[~weak], shape))
    assert np.all(spill <= 1e-9 * area[~weak])  # no other tract


def test_merged_shape_falls_back_to_the_general_union_for_overlapping_tracts():
    """Polygons that are not a clean coverage (they overlap) still merge to their union."""
    geoms = np.array([box(0, 0, 2, 2), box(1, 1, 3, 3), box(5, 5, 6, 6)], dtype=object)
    shape = low_reliability_shape(geoms)
    assert shape.is_valid and shape.area == pytest.approx(4 + 4 - 1 + 1)
    assert shapely.equals(shape, shapely.union_all(geoms))


def test_merged_shape_skips_missing_and_empty_geometries():
    geoms = np.array([box(0, 0, 1, 1), None, Polygon(), box(1, 0, 2, 1)], dtype=object)
    assert shapely.equals(low_reliability_shape(geoms), box(0, 0, 2, 1))
    assert low_reliability_shape(np.array([None, Polygon()], dtype=object)).is_empty


# ---------------------------------------------------------------------------------------------
# Rasterised


def render(draw, bounds) -> np.ndarray:
    """RGB in [0, 1] of an axes filling a RASTER² canvas over ``bounds`` (row 0 at the top)."""
    fig = Figure(figsize=(RASTER / 100, RASTER / 100), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_axis_off()
    draw(ax)
    ax.set_aspect("auto")
    ax.set_xlim(bounds[0], bounds[2])
    ax.set_ylim(bounds[1], bounds[3])
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3] / 255.0


def pixel_centres(bounds) -> tuple[np.ndarray, np.ndarray]:
    step = (np.arange(RASTER) + 0.5) / RASTER
    x = bounds[0] + step * (bounds[2] - bounds[0])
    y = bounds[3] - step * (bounds[3] - bounds[1])
    return np.meshgrid(x, y)


def hatched(ax, geoms) -> None:
    _add_tracts(ax, geoms, facecolor="none", hatch=MAP_HATCH, edgecolor=MAP_HATCH_COLOUR,
                linewidth=0.0)


def test_hatch_pixels_lie_on_the_low_reliability_tracts_and_cover_them(table):
    geoms = table.geometry.to_numpy()
    weak = weak_mask(table)
    bounds = shapely.total_bounds(geoms)
    img = render(lambda ax: hatched(ax, np.array([low_reliability_shape(geoms[weak])],
                                                 dtype=object)), bounds)
    line = img.max(axis=2) < 0.8  # hatch lines are #555555 on white
    # Pixel centres two pixels clear of the low-reliability tracts' edges (antialiasing),
    # judged against the tracts themselves, not against the merged shape.
    margin = 2 * max(bounds[2] - bounds[0], bounds[3] - bounds[1]) / RASTER
    x, y = pixel_centres(bounds)
    inside = shapely.contains_xy(shapely.union_all(shapely.buffer(geoms[weak], -margin)), x, y)
    outside = ~shapely.contains_xy(shapely.union_all(shapely.buffer(geoms[weak], margin)), x, y)
    assert inside.sum() > 10_000 and outside.sum() > 10_000
    assert not line[outside].any()
    assert 0.05 < line[inside].mean() < 0.6  # the hatch's density, throughout
    # Every low-reliability tract shows hatch lines: none of them left blank.
    for tract in geoms[weak]:
        core = shapely.contains_xy(tract.buffer(-margin), x, y)
        if core.sum() >= 400:  # wide enough for a hatch line to cross
            assert line[core].any()


def test_merged_hatch_draws_what_one_patch_per_tract_drew(table):
    """The reference: geopandas, one hatched patch per tract (the previous map)."""
    geoms = table.geometry.to_numpy()
    weak = weak_mask(table)
    bounds = shapely.total_bounds(geoms)
    merged = render(lambda ax: hatched(ax, np.array([low_reliability_shape(geoms[weak])],
                                                    dtype=object)), bounds)
    per_tract = render(lambda ax: gpd.GeoSeries(geoms[weak]).plot(
        ax=ax, facecolor="none", hatch=MAP_HATCH, edgecolor=MAP_HATCH_COLOUR, linewidth=0.0),
        bounds)
    differ = np.abs(merged - per_tract).max(axis=2) > 0.1
    # Only the seams where one tract's hatch met the next's may differ.
    assert differ.mean() < 0.01
    assert (per_tract.max(axis=2) < 0.8).mean() > 0.05  # and there was a hatch to compare


def test_class_paths_fill_parts_and_leave_holes_empty():
    ring = Polygon(box(0, 0, 4, 4).exterior, [box(1, 1, 3, 3).exterior])
    two = MultiPolygon([box(5, 0, 6, 1), box(7, 0, 8, 1)])
    lone = box(9, 0, 10, 1)
    geoms = np.array([ring, lone, two], dtype=object)
    paths, classes = class_paths(geoms, np.array(["b", "a", "b"]))
    assert list(classes) == ["a", "b"] and len(paths) == 2  # one path per class, sorted
    for path, members in zip(paths, ([lone], [ring, two])):
        rings = [shapely.get_coordinates(r) for g in shapely.normalize(members)
                 for p in shapely.get_parts(g) for r in [p.exterior, *p.interiors]]
        assert np.array_equal(path.vertices, np.concatenate(rings))
        starts = np.cumsum([0] + [len(r) for r in rings])
        assert set(np.nonzero(path.codes == path.MOVETO)[0]) == set(starts[:-1])
        assert set(np.nonzero(path.codes == path.CLOSEPOLY)[0]) == set(starts[1:] - 1)
    bounds = (0, 0, 10, 4)
    img = render(lambda ax: _add_tracts(ax, geoms, facecolor=["#000000", "#ff0000",
                                                                 "#000000"]), bounds)

    def pixel(px, py):
        return img[int((bounds[3] - py) / 4 * RASTER), int(px / 10 * RASTER)]

    assert pixel(0.5, 0.5).max() < 0.1 and pixel(2, 2).min() > 0.9  # filled; the hole empty
    assert pixel(5.5, 0.5).max() < 0.1 and pixel(7.5, 0.5).max() < 0.1
    assert pixel(6.5, 0.5).min() > 0.9  # between the parts
    assert pixel(9.5, 0.5)[0] > 0.9 and pixel(9.5, 0.5)[1] < 0.1  # its own colour


def test_a_path_per_colour_draws_what_a_path_per_tract_drew(table):
    """The choropleth as one compound path per colour against one path per tract: only the
    white seams between tracts may differ, by a sliver."""
    from matplotlib.collections import PathCollection

    geoms = table.geometry.to_numpy()
    colour = np.where(np.arange(len(geoms)) % 3 == 0, "#1f77b4", "#ff7f0e")
    bounds = shapely.total_bounds(geoms)

    def per_tract(ax):
        paths = [class_paths(np.array([g], dtype=object), np.array(["x"]))[0][0]
                 for g in geoms]
        ax.add_collection(PathCollection(paths, facecolor=list(colour), edgecolor="white",
                                         linewidth=0.1))

    merged = render(lambda ax: _add_tracts(ax, geoms, facecolor=colour, edgecolor="white",
                                           linewidth=0.1), bounds)
    reference = render(per_tract, bounds)
    differ = np.abs(merged - reference).max(axis=2) > 0.1
    assert differ.mean() < 0.01
    assert (reference.min(axis=2) < 0.9).mean() > 0.3  # and there was a map to compare


# ---------------------------------------------------------------------------------------------
# The PNG


def read_png(path) -> np.ndarray:
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    return imread(path)


def test_map_png_is_written_with_the_hatch_only_when_asked(table, tmp_path):
    import matplotlib.pyplot as plt

    before = set(plt.get_fignums())
    write_map(table, tmp_path / "hatched.png", "t", True)
    write_map(table, tmp_path / "plain.png", "t", False)
    hatched_png, plain_png = read_png(tmp_path / "hatched.png"), read_png(tmp_path / "plain.png")
    # the figure's size follows the area's shape (map_figsize), at MAP_DPI
    from dpatlas.publication.png_map import MAP_DPI, map_figsize
    width, height = map_figsize(table.geometry.to_numpy(), table.crs)
    assert hatched_png.shape[:2] == plain_png.shape[:2] == (round(height * MAP_DPI),
                                                            round(width * MAP_DPI))
    differ = np.abs(hatched_png - plain_png)[..., :3].max(axis=2) > 0.1
    assert differ.mean() > 0.01  # the hatch (and its legend entry) drawn
    assert set(plt.get_fignums()) == before  # no pyplot figure left open


def test_map_without_released_tracts_or_with_empty_geometries_is_written(table, tmp_path):
    none_released = table.assign(status="suppressed")
    write_map(none_released, tmp_path / "grey.png", "t", True)
    read_png(tmp_path / "grey.png")
    holes = table.copy()
    holes.loc[holes.index[:3], "geometry"] = Polygon()
    holes.loc[holes.index[3], "geometry"] = None
    write_map(holes, tmp_path / "holes.png", "t", True)
    read_png(tmp_path / "holes.png")


def test_png_colours_each_tract_by_the_web_maps_class_of_its_p25(tmp_path):
    """The PNG's classes are the web map's (dpatlas.publication.colours): a tract's pixels
    have the legend colour of its p25's class, the unreleased ones their status colour."""
    from dpatlas.publication import colours

    values = [0.1, 0.25, 0.45, 0.55, 0.75, 0.9]
    # a 4 x 2 block of squares (the PNG's height follows the area's shape: a strip would be
    # drawn small)
    squares = [box(i % 4, i // 4, i % 4 + 1, i // 4 + 1) for i in range(len(values) + 2)]
    t = gpd.GeoDataFrame({"status": ["released"] * len(values) + ["suppressed", "failed"],
                          "p25": values + [np.nan, np.nan]}, geometry=squares, crs=None)
    write_map(t, tmp_path / "classes.png", "t", None)
    img = read_png(tmp_path / "classes.png")[..., :3]
    want = [colours.class_colour(v) for v in values] + [colours.STATUS_COLOURS["suppressed"],
                                                        colours.STATUS_COLOURS["failed"]]
    assert len(set(want)) == len(want)
    def pixels(colour) -> int:
        rgb = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255
        return int((np.abs(img - rgb).max(axis=2) < 2 / 255).sum())

    # A colour of a square has its square's pixels (~4,500) beyond its colour-bar segment's
    # (~1,400), which alone is all a class without a tract shows.
    unused = [c for c in colours.CLASS_COLOURS if c not in want]
    assert unused and max(pixels(c) for c in unused) < 2000
    for colour in want:
        assert pixels(colour) > 4000, colour


def test_the_model_png_colours_by_the_model_and_marks_model_only_and_flagged_tracts(tmp_path):
    """p25_map.png's default, the model map (issue 33): each tract in the class colour of its
    p25_model, a suppressed tract too (dotted: no direct), a flagged one outlined, a model
    interval spanning classes hatched though narrower than 0.5."""
    from dpatlas.publication import colours

    model = [0.1, 0.25, 0.45, 0.55, 0.75, 0.9]
    squares = [box(i % 3, i // 3, i % 3 + 1, i // 3 + 1) for i in range(len(model))]
    t = gpd.GeoDataFrame({"status": ["released"] * 5 + ["suppressed"],
                          "p25": [0.35] * 5 + [np.nan], "p25_model": model,
                          "p25_model_lo": model, "p25_model_hi": model,
                          "p25_model_z": [0.0, 0.0, 0.0, 0.0, 3.0, np.nan]},
                         geometry=squares, crs=None)
    t.loc[2, "p25_model_lo"], t.loc[2, "p25_model_hi"] = 0.35, 0.65
    write_map(t, tmp_path / "model.png", "t", True, "model")
    img = read_png(tmp_path / "model.png")[..., :3]

    def rgb(colour: str) -> np.ndarray:
        return np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)]) / 255

    def pixels(colour, tolerance=2 / 255) -> int:
        return int((np.abs(img - rgb(colour)).max(axis=2) < tolerance).sum())

    # every tract by its model value: the direct 0.35's class has only its colour-bar pixels
    assert pixels(colours.class_colour(0.35)) < 2000
    for value in (0.1, 0.25, 0.55):
        assert pixels(colours.class_colour(value)) > 4000, value
    assert pixels(colours.STATUS_COLOURS["suppressed"]) < 1000  # the suppressed tract coloured
    assert pixels(colours.MODEL_FLAG_OUTLINE, 0.2) > 500  # the flagged one outlined
    # hatched (0.45's interval spans three classes) and dotted: fewer pixels of their colours
    assert pixels(colours.class_colour(0.45)) < 0.8 * pixels(colours.class_colour(0.55))
    assert pixels(colours.class_colour(0.9)) < 0.9 * pixels(colours.class_colour(0.1))
    direct = tmp_path / "direct.png"
    write_map(t, direct, "t", True)
    img = read_png(direct)[..., :3]
    assert pixels(colours.class_colour(0.35)) > 4000 * 5  # the direct map: the direct values
    assert pixels(colours.STATUS_COLOURS["suppressed"]) > 4000
