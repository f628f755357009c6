"""The web map: a static page per release, and one at the publish root over the feed.

Layout (every URL relative, so the pages work from any static host that serves HTTP range
requests, and offline: MapLibre GL JS and the PMTiles decoder are vendored, no CDN)::

    <root>/index.html              the feed's map: release picker from feed.json, latest first
    <root>/map/...                 its assets
    <root>/<id>/index.html         the release's map: the same app, opened on that release
    <root>/<id>/app.js, ...        its own copy of the assets, beside the other files: a release
                                   folder stands alone and stays flat (the manifest, the audit
                                   and the STAC items list plain file names)
    <root>/<id>/tracts.pmtiles     the tiles (dpatlas.publication.tiles)

The choropleth's classes are fixed (:data:`BREAKS`, :data:`CLASS_COLOURS`), written into
``map/legend.json`` for the page, so the legend and the colour of a tract with a given
published value can be computed without a browser (:func:`class_colour`).
"""

from __future__ import annotations

import bisect
import json
from importlib import resources
from pathlib import Path

from dpatlas.core.files import write_bytes_atomic
from dpatlas.core.errors import OperatorError

ASSETS_DIR = "map"   # the root page's assets; a name dpatlas.core.ids reserves: never a release id
PAGE = "index.html"
# Files of the app itself (dpatlas/publication/webmap/) and of the vendored libraries (vendor/).
APP_FILES = ("app.js", "app.css")
VENDOR_FILES = ("maplibre-gl.js", "maplibre-gl.css", "pmtiles.js",
                "LICENSE-maplibre-gl.txt", "LICENSE-pmtiles.txt")
LEGEND_FILE = "legend.json"

# Class breaks for p25 and p75 (child income rank, [0, 1]); one scale for both so that the
# switch compares like with like. Class i holds values in [BREAKS[i-1], BREAKS[i]).
BREAKS = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
# ColorBrewer RdYlBu, 8 classes (Brewer & Harrower, colorbrewer2.org): diverging, colour-blind
# safe, low ranks red, high ranks blue.
CLASS_COLOURS = ("#d73027", "#f46d43", "#fdae61", "#fee090",
                 "#e0f3f8", "#abd9e9", "#74add1", "#4575b4")
STATUS_COLOURS = {"suppressed": "#bdbdbd", "failed": "#525252"}
# Released tracts whose interval is wider than the release's intervals.low_reliability_width
# are hatched with this colour over their class colour.
LOW_RELIABILITY_HATCH = "#252525"
NO_DATA_BACKGROUND = "#f7f7f7"
VALUES = ("p25", "p75")


def class_index(value: float) -> int:
    """The class of a published value: ``bisect_right`` matches MapLibre's ``step``."""
    return bisect.bisect_right(BREAKS, value)


def class_colour(value: float) -> str:
    """The legend colour of a released tract with published value ``value``."""
    return CLASS_COLOURS[class_index(value)]


def class_labels() -> list[str]:
    """Legend labels, one per class: "< 0.20", "0.20 – 0.30", ..., "≥ 0.80"."""
    inner = [f"{lo:.2f} – {hi:.2f}" for lo, hi in zip(BREAKS, BREAKS[1:])]
    return [f"< {BREAKS[0]:.2f}", *inner, f"≥ {BREAKS[-1]:.2f}"]


def legend() -> dict:
    """What the page draws and its legend shows (written as ``map/legend.json``)."""
    return {
        "values": list(VALUES),
        "breaks": list(BREAKS),
        "classes": [{"label": label, "colour": colour}
                    for label, colour in zip(class_labels(), CLASS_COLOURS)],
        "status": {
            "suppressed": {"colour": STATUS_COLOURS["suppressed"],
                           "label": "suppressed (too few records; nothing spent)"},
            "failed": {"colour": STATUS_COLOURS["failed"],
                       "label": "failed (budget spent, no value)"},
        },
        "low_reliability": {"colour": LOW_RELIABILITY_HATCH,
                            "label": "low reliability: interval wider than {width}"},
        "background": NO_DATA_BACKGROUND,
    }


def page_html(*, feed: str, release_base: str, release: str | None, assets: str) -> str:
    """The page, configured by a JSON block: where feed.json is, where release folders are
    relative to the page, the release to open (None: the feed's latest) and the assets'
    folder ("" or "map/")."""
    config = json.dumps({"feed": feed, "releaseBase": release_base, "release": release,
                         "assets": assets})
    # "</" cannot occur in the JSON of ids and relative paths we write, but keep it inert.
    config = config.replace("</", "<\\/")
    template = resources.files(__package__).joinpath("index.html").read_text("utf-8")
    return template.replace("{{CONFIG}}", config).replace("{{ASSETS}}", assets)


def _asset_bytes() -> dict[str, bytes]:
    package = resources.files(__package__)
    files = {name: package.joinpath(name).read_bytes() for name in APP_FILES}
    files.update({name: package.joinpath("vendor", name).read_bytes()
                  for name in VENDOR_FILES})
    files[LEGEND_FILE] = (json.dumps(legend(), indent=2, ensure_ascii=False) + "\n").encode()
    return files


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Write ``data`` at ``path`` by rename of a temporary file (a reader never sees a partial
    file), unless it already holds exactly those bytes. Returns whether it wrote."""
    if path.is_file() and not path.is_symlink() and path.read_bytes() == data:
        return False
    write_bytes_atomic(path, data)
    return True


def _install(folder: Path, assets_dir: str, html: str) -> list[str]:
    folder = Path(folder)
    assets = folder / assets_dir if assets_dir else folder
    if assets.is_symlink() or (assets.exists() and not assets.is_dir()):
        raise WebMapError(f"{assets} is not a folder: the web map's assets go there; move it "
                          "away")
    assets.mkdir(parents=True, exist_ok=True)
    prefix = f"{assets_dir}/" if assets_dir else ""
    written = []
    for name, data in sorted(_asset_bytes().items()):
        _write_if_changed(assets / name, data)
        written.append(prefix + name)
    _write_if_changed(folder / PAGE, html.encode("utf-8"))
    return [PAGE, *written]


class WebMapError(RuntimeError, OperatorError):
    """The web map could not be written; the message says what to do."""


def write_web_map(release_folder: Path, release_id: str) -> list[str]:
    """Write the release's page and assets into ``release_folder`` (the staging folder).

    Returns the file names written (all plain names, no folders), for the manifest. The page
    shows this release; its picker lists the feed's releases (``../feed.json``) when it is
    served from a publish root, and this release alone otherwise.
    """
    return _install(release_folder, "", page_html(feed="../feed.json", release_base="../",
                                                  release=release_id, assets=""))


def write_feed_map(root: Path) -> list[str]:
    """Write (or refresh) the publish root's page over the feed: ``index.html`` and
    ``map/``. Idempotent; only files whose bytes change are rewritten, each atomically.
    Returns the files, relative to the root."""
    return _install(root, ASSETS_DIR, page_html(feed="feed.json", release_base="",
                                                release=None, assets=f"{ASSETS_DIR}/"))
