"""The web map: a static page per release, and one at the publish root over the feed.

Layout (every URL relative, so the pages work from any static host that serves HTTP range
requests, and offline: MapLibre GL JS and the PMTiles decoder are vendored, no CDN)::

    <root>/index.html              the feed's map: release picker from feed.json, latest first
    <root>/map/...                 its app and legend
    <root>/_lib/maplibre-gl-5.24.1/, <root>/_lib/pmtiles-4.5.0/
                                   the vendored libraries, once for every page of the root
                                   (sha256-pinned; a version's folder never changes)
    <root>/<id>/index.html         the release's map: the same app, opened on that release
    <root>/<id>/app.js, ...        its own app, style and legend.json, beside the other files
                                   (the folder stays flat: the manifest, the audit and the STAC
                                   items list plain file names); its libraries are ../_lib/
    <root>/<id>/tracts.pmtiles     the tracts' polygons, once (dpatlas.publication.tiles)
    <root>/<id>/tract-values/...   each cell and state's values, which the map paints them with
                                   (dpatlas.publication.tract_values)

Releases written before the shared libraries carry their own copy and keep using it.
The choropleth's classes come from :mod:`dpatlas.publication.colours` (shared with the PNG
map), written into each page's ``legend.json``.
"""

from __future__ import annotations

import json
import threading
from importlib import resources
from pathlib import Path

from mechanisms.estimand import ESTIMAND, ESTIMAND_ID, INTERVAL_MEANING, MOE90_MEANING

from dpatlas.core.errors import OperatorError
from dpatlas.core.files import write_bytes_atomic
from dpatlas.core.hashing import sha256_file
from dpatlas.core.state_fips import STATE_FIPS
from dpatlas.publication import colours
from dpatlas.publication.context import CONTEXT_FILE, states_context_bytes
from dpatlas.publication.webmap import vendor

ASSETS_DIR = "map"   # the root page's assets; a name dpatlas.core.ids reserves: never a release id
# The vendored libraries, once for the whole publish root: ``<root>/_lib/<package>-<version>/``
# (a leading "_" is never a release id). A version's folder is written once and never changes,
# so every release page keeps the library it was written for.
LIB_DIR = "_lib"
PAGE = "index.html"
# Files of the app itself (dpatlas/publication/webmap/); a release carries its own copy.
APP_FILES = ("app.js", "app.css")
LEGEND_FILE = "legend.json"

# The colour scale lives in dpatlas.publication.colours (shared with the PNG map); these names
# stay importable from here.
BREAKS, CLASS_COLOURS, VALUES = colours.BREAKS, colours.CLASS_COLOURS, colours.VALUES
STATUS_COLOURS, LOW_RELIABILITY_HATCH = colours.STATUS_COLOURS, colours.LOW_RELIABILITY_HATCH
NO_DATA_BACKGROUND = colours.NO_DATA_BACKGROUND
class_index, class_colour, class_labels = (colours.class_index, colours.class_colour,
                                           colours.class_labels)


# A model value is flagged where its standardised difference from the direct value
# (``p25_model_z``) exceeds this: beyond the two-sided 1% level of their combined noise.
MODEL_Z_LIMIT = 2.58
MODEL_FLAG = ("model may not apply here: the direct value differs from the model beyond their "
              "combined noise")


def estimand_text() -> dict:
    """What every value the map shows estimates, and what its ± and interval mean: the one
    estimand's wording (mechanisms/estimand.py), so app.js holds none of its own."""
    return {"id": ESTIMAND_ID, "definition": ESTIMAND,
            "same": "Direct and model-based values estimate the same.",
            "plus_minus": f"±: the {MOE90_MEANING}",
            "plus_minus_model": ("±: none for model-based values; their interval below is "
                                 "the model's"),
            "interval": f"[low, high]: the {INTERVAL_MEANING}.",
            "interval_direct": ("Direct values: the {level} interval of the release's own DP "
                                "interval step."),
            "interval_model": ("Model-based values: the 95% interval, the value ± 1.96 × the "
                               "model's root mean squared error (p25_model_se, p75_model_se), "
                               "clipped to [0, 1]; from the published values only "
                               "(post-processing)."),
            "model_flag": MODEL_FLAG, "model_z_limit": MODEL_Z_LIMIT}


def legend() -> dict:
    """What the page draws and its legend shows (written as ``legend.json``)."""
    return {**colours.legend(), "estimand": estimand_text()}


def library_folders() -> dict[str, str]:
    """Each vendored package's folder under :data:`LIB_DIR`: ``{"maplibre-gl":
    "maplibre-gl-5.24.1", "pmtiles": "pmtiles-4.5.0"}``."""
    return {package: f"{package}-{version}" for package, (version, _, _) in vendor.PINS.items()}


def library_files() -> dict[str, str]:
    """Every shared library file, as a path under the publish root, and its pinned sha256."""
    folders = library_folders()
    files = {}
    for package, (_version, _tar_sha, members) in vendor.PINS.items():
        for name, digest in members.values():
            files[f"{LIB_DIR}/{folders[package]}/{name}"] = digest
    for name, digest in vendor.STATIC_FILES.items():   # the pmtiles licence
        files[f"{LIB_DIR}/{folders['pmtiles']}/{name}"] = digest
    return files


# Temporary files are named by process id, so two publishers in one process (threads) must not
# write the same library file at once; other processes use other names.
_LIBRARY_LOCK = threading.Lock()


def write_shared_library(root: Path) -> list[str]:
    """Write the vendored libraries once into ``<root>/_lib/`` (a file already holding its
    pinned bytes is left alone; anything else there is replaced by them, atomically). Returns
    the files, relative to the root."""
    root = Path(root)
    lib = root / LIB_DIR
    if lib.is_symlink() or (lib.exists() and not lib.is_dir()):
        raise WebMapError(f"{lib} is not a folder: the web map's libraries go there; move it "
                          "away")
    try:
        vendor.check()
    except vendor.VendorError as err:
        raise WebMapError(str(err)) from None
    with _LIBRARY_LOCK:
        for relative, digest in library_files().items():
            path = root / relative
            if path.is_file() and not path.is_symlink() and sha256_file(path) == digest:
                continue
            data = (vendor.VENDOR_DIR / Path(relative).name).read_bytes()
            path.parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(path, data)
    return list(library_files())


def page_html(*, feed: str, release_base: str, release: str | None, assets: str,
              lib: str) -> str:
    """The page, configured by a JSON block: where feed.json is, where release folders are
    relative to the page, the release to open (None: the feed's latest), the assets' folder
    ("" or "map/") and the shared libraries' folder (``../_lib/`` or ``_lib/``)."""
    config = json.dumps({"feed": feed, "releaseBase": release_base, "release": release,
                         "assets": assets, "states": STATE_FIPS})  # states: for the search
    # "</" cannot occur in the JSON of ids and relative paths we write, but keep it inert.
    config = config.replace("</", "<\\/")
    folders = library_folders()
    template = resources.files(__package__).joinpath("index.html").read_text("utf-8")
    return (template.replace("{{CONFIG}}", config).replace("{{ASSETS}}", assets)
            .replace("{{MAPLIBRE}}", f"{lib}{LIB_DIR}/{folders['maplibre-gl']}/")
            .replace("{{PMTILES}}", f"{lib}{LIB_DIR}/{folders['pmtiles']}/"))


def _asset_bytes() -> dict[str, bytes]:
    package = resources.files(__package__)
    files = {name: package.joinpath(name).read_bytes() for name in APP_FILES}
    files[LEGEND_FILE] = (json.dumps(legend(), indent=2, ensure_ascii=False) + "\n").encode()
    files[CONTEXT_FILE] = states_context_bytes()  # the states around the release (low zoom)
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
    served from a publish root, and this release alone otherwise. Its libraries are the
    publish root's (``../_lib/``, :func:`write_shared_library`), not copied into the folder.
    """
    return _install(release_folder, "", page_html(feed="../feed.json", release_base="../",
                                                  release=release_id, assets="", lib="../"))


def write_feed_map(root: Path) -> list[str]:
    """Write (or refresh) the publish root's page over the feed: ``index.html``, ``map/``
    and the shared libraries (``_lib/``). Idempotent; only files whose bytes change are
    rewritten, each atomically. Returns the files, relative to the root."""
    library = write_shared_library(root)
    return [*_install(root, ASSETS_DIR, page_html(feed="feed.json", release_base="",
                                                  release=None, assets=f"{ASSETS_DIR}/",
                                                  lib="")), *library]
