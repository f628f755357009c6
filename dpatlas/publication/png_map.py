"""The static map's drawing (``p25_map.png`` and ``p25_map_direct.png``): a choropleth of the
released p25 on the release's colour classes, unreliable values hatched, model marks dotted and
outlined (:mod:`dpatlas.publication.static_map` says what each map shows; this module draws it)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from dpatlas.publication import colours, static_map
from dpatlas.publication.tract_files import tract_union, union_groups

# The static map (p25_map.png), drawn with matplotlib's object API (a Figure on an Agg canvas,
# no pyplot state): each layer is one collection built from shapely's coordinate arrays, and the
# figure is drawn only by tight_layout and savefig (geopandas redrew it after every layer).
MAP_FIGSIZE_INCHES = (7, 8)
MAP_DPI = 110
MAP_EDGES = {"edgecolor": "white", "linewidth": 0.1}
MAP_HATCH = "////"
MAP_HATCH_COLOUR = "#555555"


def overview_title(release_id: str, shown: pd.DataFrame, several_cells: bool,
                   publish: dict | None = None) -> str:
    """The overview PNG's title: the cell it draws when the release has several; above it
    ``publish.title`` and below it ``publish.notice`` where the config sets them."""
    cell = f", cell {shown['cell'].iloc[0]}" if several_cells else ""
    line = (f"Release {release_id}: p25 by tract{cell} "
            f"({int((shown.status == 'released').sum())} of {len(shown)} released)")
    publish = publish or {}
    notice = textwrap.fill(publish["notice"], 90) if publish.get("notice") else None
    return "\n".join(t for t in (publish.get("title"), line, notice) if t)


def shown_cell(cells: list[str]) -> str:
    """The cell the overview PNG draws when a release has several: ``all`` when there is
    one, else the first in sorted order."""
    return "all" if "all" in cells else sorted(cells)[0]


def write_map(table: gpd.GeoDataFrame, path: Path, title: str, intervals: bool = True,
              estimate: str = "direct") -> None:
    """The p25 choropleth in the web map's classes and colours (dpatlas.publication.colours),
    the breaks on its colour bar; ``estimate``: "direct" (p25) or "model" (p25_model); units
    without a value in their legend greys; with ``intervals``, units whose interval spans more
    than one colour class hatched as low reliability; on the model map, model-only tracts
    dotted and flagged ones outlined (dpatlas.publication.static_map; all in the legend).

    The low-reliability tracts are merged into one shape and hatched once: one hatched patch
    per tract took ~58 s of an 84 s national publish (docs/national.md). A hatch is a pattern
    fixed to the page, so the merged shape shows the same lines over the same tracts.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    geoms = table.geometry.to_numpy()
    states = union_groups(table)  # where a merged shape is unioned state by state
    drawn = _drawn(geoms)
    fig = Figure(figsize=map_figsize(geoms[drawn], table.crs))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    status = table["status"].to_numpy()
    valued = static_map.has_value(table, estimate)  # released, or with a model value
    p25 = (table[static_map.shown_column(estimate)].to_numpy(dtype=float) if valued.any()
           else np.full(len(table), np.nan))
    handles = []
    unreleased = {"suppressed": ~valued & (status != "failed"),
                  "failed": ~valued & (status == "failed")}
    for name, colour in colours.STATUS_COLOURS.items():   # as the web map's legend
        if _add_tracts(ax, geoms[drawn & unreleased[name]], facecolor=colour,
                       **MAP_EDGES) is not None:   # in the legend where drawn
            handles.append(Patch(facecolor=colour, label=colours.STATUS_LABELS[name]))
    coloured = drawn & valued & np.isfinite(p25)  # no value: not drawn (as geopandas does)
    _add_choropleth(ax, geoms[coloured], p25[coloured], static_map.ESTIMATE_WORDS[estimate])
    weak = drawn & static_map.low_reliability(table, estimate).to_numpy() & bool(intervals)
    if weak.any():
        _add_tracts(ax, np.array([low_reliability_shape(geoms[weak], _of(states, weak))],
                                 dtype=object),
                    facecolor="none", hatch=MAP_HATCH, edgecolor=MAP_HATCH_COLOUR,
                    linewidth=0.0)
        handles.append(Patch(facecolor="white", edgecolor=MAP_HATCH_COLOUR, hatch=MAP_HATCH,
                             label=colours.LOW_RELIABILITY_LABEL))
    for rows, merge, style, handle in (static_map.model_marks(table, coloured)
                                       if estimate == "model" else []):
        shapes = (np.array([low_reliability_shape(geoms[rows], _of(states, rows))],
                           dtype=object) if merge else geoms[rows])
        _add_tracts(ax, shapes, **style)
        handles.append(handle)
    _set_map_aspect(ax, geoms[drawn], table.crs)
    # below the map, not over it (the model map's marks make five entries)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0, 0), fontsize=7,
              frameon=False)
    ax.set_axis_off()
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=MAP_DPI)


def _of(groups: np.ndarray | None, rows) -> np.ndarray | None:
    return None if groups is None else groups[rows]


def low_reliability_shape(geoms: np.ndarray, groups: np.ndarray | None = None):
    """The tracts ``geoms`` merged into one (Multi)Polygon, to hatch as one patch.

    Tracts tile their area, so the coverage union applies (~0.3 s for 67,000 tracts); tracts
    that do not form a clean coverage take the general union, state by state where ``groups``
    gives each tract's state (:func:`tract_union`).
    """
    drawn = _drawn(geoms)
    geoms = geoms[drawn]
    groups = groups[drawn] if groups is not None else None
    return tract_union(geoms, groups) if len(geoms) else shapely.Polygon()


def _drawn(geoms: np.ndarray) -> np.ndarray:
    """Which geometries have something to draw (neither missing nor empty)."""
    return ~(shapely.is_missing(geoms) | shapely.is_empty(geoms))


def class_colours(values: np.ndarray) -> np.ndarray:
    """The class colour of each published value, from the scale the web map's legend.json
    states (dpatlas.publication.colours): ``searchsorted(side="right")`` is ``bisect_right``."""
    index = np.searchsorted(np.asarray(colours.BREAKS), np.asarray(values, dtype=float),
                            side="right")
    return np.asarray(colours.CLASS_COLOURS)[index]


def _add_choropleth(ax, geoms: np.ndarray, p25: np.ndarray, words: str = "DP") -> None:
    """Tracts coloured by the class of their p25, with a colour bar of the classes whose
    ticks are the class breaks (the web map's legend)."""
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import BoundaryNorm, ListedColormap

    if _add_tracts(ax, geoms, facecolor=class_colours(p25), **MAP_EDGES) is None:
        return
    bounds = [0.0, *colours.BREAKS, 1.0]
    scale = ScalarMappable(BoundaryNorm(bounds, len(colours.CLASS_COLOURS)),
                           ListedColormap(colours.CLASS_COLOURS))
    bar = ax.figure.colorbar(scale, ax=ax, shrink=0.6, spacing="uniform", ticks=bounds)
    # the label above the bar, not along it: along it, it sets the figure's height
    bar.ax.set_title(f"p25 ({words})\nweb map\nclasses", fontsize=7, loc="left")
    bar.ax.tick_params(labelsize=7)


def _add_tracts(ax, geoms: np.ndarray, facecolor, **style):
    """The (Multi)Polygons ``geoms`` (none empty) as one PathCollection on ``ax``, filled with
    ``facecolor`` (one colour, or one per geometry); None if there are none. The geometries
    of one colour are one compound path (:func:`class_paths`)."""
    from matplotlib.collections import PathCollection

    if len(geoms) == 0:
        return None
    each = np.asarray(facecolor, dtype=object)
    if each.ndim == 0:
        each = np.full(len(geoms), facecolor, dtype=object)
    paths, shared = class_paths(geoms, each.astype(str))
    coll = PathCollection(paths, facecolor=list(shared), **style)
    ax.add_collection(coll, autolim=True)
    ax.autoscale_view()
    return coll


def class_paths(geoms: np.ndarray, classes: np.ndarray) -> tuple[list, np.ndarray]:
    """One matplotlib Path per class (``classes``: each geometry's, e.g. its colour) holding
    every ring of the class's (Multi)Polygons as a closed sub-path (MOVETO, LINETO…,
    CLOSEPOLY), and the classes in the paths' order.

    Rings are normalised first (``shapely.normalize``: exterior and holes wound oppositely,
    so matplotlib's non-zero fill leaves holes empty; tracts do not overlap, so a class's
    tracts fill as they did one path each). A path per class, not per tract: a national map
    has 74,000 tracts in 9 colours, and building and drawing 74,000 Path objects took 3.1 of
    its 3.9 s (two maps). Built from shapely's ragged coordinate arrays in a few numpy calls.
    """
    from matplotlib.path import Path as MplPath

    classes = np.asarray(classes)
    order = np.argsort(classes, kind="stable")
    shared, first = np.unique(classes[order], return_index=True)
    _, coords, offsets = shapely.to_ragged_array(shapely.normalize(geoms[order]))
    ring_starts = offsets[0]  # into coords, one per ring, and the end
    # The first ring of each geometry (through the polygon level for MultiPolygons).
    geom_rings = offsets[1] if len(offsets) == 2 else offsets[1][offsets[2]]
    codes = np.full(len(coords), MplPath.LINETO, dtype=MplPath.code_type)
    codes[ring_starts[:-1]] = MplPath.MOVETO
    codes[ring_starts[1:] - 1] = MplPath.CLOSEPOLY
    cuts = [*ring_starts[geom_rings[first]], len(coords)]
    return ([MplPath(coords[a:b], codes[a:b]) for a, b in zip(cuts[:-1], cuts[1:])],
            shared)


def map_figsize(geoms: np.ndarray, crs) -> tuple[float, float]:
    """The PNG's size in inches: MAP_FIGSIZE_INCHES' width, and a height that follows the
    area's shape (height/width on the ground, within [0.3, 1.6] of the width) plus room for the
    title and legend, so that a wide state (North Carolina) is not drawn between empty bands."""
    width, _ = MAP_FIGSIZE_INCHES
    if not len(geoms):
        return MAP_FIGSIZE_INCHES
    minx, miny, maxx, maxy = shapely.total_bounds(geoms)
    across = (maxx - minx) * (np.cos(np.deg2rad((miny + maxy) / 2))
                              if crs is not None and crs.is_geographic else 1.0)
    shape = (maxy - miny) / across if across > 0 else 1.0
    return width, float(width * np.clip(shape, 0.3, 1.6) + 1.2)


def _set_map_aspect(ax, geoms: np.ndarray, crs) -> None:
    """Equal distances across and up the map: for longitude/latitude an aspect of
    1/cos(middle latitude) (equirectangular, as geopandas sets it), else 1."""
    if crs is not None and crs.is_geographic and len(geoms):
        _, miny, _, maxy = shapely.total_bounds(geoms)
        ax.set_aspect(1 / np.cos(np.deg2rad((miny + maxy) / 2)))
    else:
        ax.set_aspect("equal")
