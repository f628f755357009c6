"""The web map (dpatlas.publication.webmap) in a real browser: headless Chromium (Debian's ``chromium``)
driven by Playwright against releases published by the project's own functions, served by
``dpatlas.publication.serve``.

Chromium is required: without it the browser tests FAIL with how to install it (they are not
skipped, so CI cannot pass without having run them). They take ~20 s, so they are also marked
``slow`` (CI's second stage). On a machine without Chromium, deselect them with
``-m 'not browser'`` (see docs/webmap.md).

Screenshots are kept in tests/artifacts/webmap/ (ignored by git).
"""

from __future__ import annotations

import json
import re
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import shapely

from dpatlas.core.hashing import sha256_file
from dpatlas.publication import colours
from dpatlas.core.state_fips import STATE_FIPS
from dpatlas.publication import feed as F
from dpatlas.publication import tract_files as P
from dpatlas.publication.cell_stream import write_release
from dpatlas.publication import tiles as T
from dpatlas.publication import tract_values as V
from dpatlas.publication import webmap as W
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication.serve import serve_in_thread
from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.publication.webmap import screenshot as B
from dpatlas.publication.webmap import vendor
from mechanisms.estimand import ESTIMAND as ESTIMAND_DEFINITION
from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from tests.support.paths import REPO

ARTIFACTS = REPO / "tests" / "artifacts" / "webmap"
LOW_RELIABILITY_WIDTH = 0.5
COLOUR_TOLERANCE = 3          # per channel, 0-255: SwiftShader blends exactly, allow rounding


# ------------------------------------------------------------------------- tests without one


def test_the_maps_estimand_is_the_one_of_mechanisms_estimand():
    """Issue 32: the legend and popups state one estimand for every value, from legend.json,
    written from mechanisms/estimand.py; app.js holds no estimand text of its own (the old
    per-mechanism lines of the tract's own records are gone)."""
    from mechanisms import estimand as E

    text = W.legend()["estimand"]
    assert text["id"] == E.ESTIMAND_ID and text["definition"] == E.ESTIMAND
    assert E.MOE90_MEANING in text["plus_minus"] and E.INTERVAL_MEANING in text["interval"]
    assert text["model_z_limit"] == 2.58 and "model may not apply here" in text["model_flag"]
    app = (Path(W.__file__).parent / "app.js").read_text()
    assert "const ESTIMANDS" not in app and "observed ranks" not in app
    assert "least-squares" not in app and "Theil" not in app
    page = (Path(W.__file__).parent / "index.html").read_text()
    assert "expected outcome" in page and "which line" not in page


def test_class_colours_follow_the_breaks_as_maplibre_step_does():
    assert len(W.CLASS_COLOURS) == len(W.BREAKS) + 1 == len(W.class_labels())
    assert W.class_colour(0.0) == W.CLASS_COLOURS[0]
    assert W.class_colour(0.1999) == W.CLASS_COLOURS[0]
    assert W.class_colour(0.2) == W.CLASS_COLOURS[1]             # a break opens its class
    assert W.class_colour(0.7999) == W.CLASS_COLOURS[6]
    assert W.class_colour(0.8) == W.class_colour(1.0) == W.CLASS_COLOURS[7]
    colours = [*W.CLASS_COLOURS, *W.STATUS_COLOURS.values(), W.LOW_RELIABILITY_HATCH]
    assert len(set(colours)) == len(colours)                     # legend entries distinct
    assert W.class_labels()[0] == "< 0.20" and W.class_labels()[-1] == "≥ 0.80"


def test_pages_use_relative_urls_only_and_the_vendored_files_match_their_pins(tmp_path):
    vendor.check()
    release = tmp_path / "r1"
    release.mkdir()
    written = W.write_web_map(release, "r1")
    # The libraries are the publish root's (../_lib/), not a copy per release.
    assert written[0] == "index.html" and "maplibre-gl.js" not in written
    assert all("/" not in name and (release / name).is_file() for name in written)
    html = (release / "index.html").read_text()
    assert '<script src="../_lib/maplibre-gl-5.24.1/maplibre-gl.js">' in html
    assert '<script src="../_lib/pmtiles-4.5.0/pmtiles.js">' in html
    config = json.loads(re.search(r'id="dpatlas-config"[^>]*>(.*?)</script>', html).group(1))
    assert config == {"feed": "../feed.json", "releaseBase": "../", "release": "r1",
                      "assets": "", "states": {  # states' postal codes and names: the search
                          code: list(v) for code, v in STATE_FIPS.items()}}
    urls = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert urls and all(not re.match(r"^(https?:)?//", u) for u in urls), urls
    assert "http" not in (release / "app.js").read_text()
    legend = json.loads((release / "legend.json").read_text())
    assert [c["colour"] for c in legend["classes"]] == list(W.CLASS_COLOURS)


def test_feed_page_is_idempotent_and_refuses_a_file_in_its_place(tmp_path):
    first = W.write_feed_map(tmp_path)
    stamp = {n: (tmp_path / n).stat().st_mtime_ns for n in first}
    assert first[0] == "index.html" and f"{W.ASSETS_DIR}/app.js" in first
    assert W.write_feed_map(tmp_path) == first
    assert {n: (tmp_path / n).stat().st_mtime_ns for n in first} == stamp
    assert not [p for p in tmp_path.rglob(".*tmp*")]
    other = tmp_path / "other"
    other.mkdir()
    (other / W.ASSETS_DIR).write_text("not a folder")
    with pytest.raises(W.WebMapError, match="is not a folder"):
        W.write_feed_map(other)


def test_the_root_pages_names_can_never_be_release_ids():
    from dpatlas.core.ids import InvalidReleaseId, validate_release_id

    for name in (W.PAGE, W.ASSETS_DIR):
        with pytest.raises(InvalidReleaseId):
            validate_release_id(name)


def test_vendor_check_names_a_changed_file(tmp_path):
    for name in vendor.expected_files():
        shutil.copy(vendor.VENDOR_DIR / name, tmp_path / name)
    vendor.check(tmp_path)
    (tmp_path / "pmtiles.js").write_text("tampered")
    with pytest.raises(vendor.VendorError, match="pmtiles.js sha256 differs"):
        vendor.check(tmp_path)


# ------------------------------------------------------------------------------ the releases


def _results(geoids: np.ndarray, seed: int) -> pd.DataFrame:
    """Estimator output for a release: mostly released values, some suppressed and failed
    tracts, intervals of varied widths (every other one narrow, most of the others spanning
    several colour classes: low reliability)."""
    rng = np.random.default_rng(seed)
    n = len(geoids)
    status = np.array(["released"] * n, dtype=object)
    status[rng.choice(n, 6, replace=False)] = "suppressed"
    status[np.flatnonzero(status == "released")[rng.choice(n - 6, 3, replace=False)]] = "failed"
    released = status == "released"
    p25, p75 = rng.uniform(0.05, 0.95, n), rng.uniform(0.05, 0.95, n)
    half = rng.uniform(0.02, 0.4, n)
    half[::2] = 0.004
    frame = pd.DataFrame({
        "geoid": geoids, "cell": "all", "n": rng.integers(20, 400, n),
        "mechanism": rng.choice(["NoisyStats", "DPExpTheilSen"], n), "status": status,
        "reason": np.where(status == "suppressed", "n < min_n",
                           np.where(status == "failed", "no valid estimate", "")),
        "p25_raw": p25, "p75_raw": p75,
        "epsilon_spent": np.where(status == "suppressed", 0.0, 0.9999998614530536),
        "delta_spent": np.where(status == "suppressed", 0.0, 1e-6),
        "p25_lo": np.clip(p25 - half, 0, 1), "p25_hi": np.clip(p25 + half, 0, 1),
        "p75_lo": np.clip(p75 - half, 0, 1), "p75_hi": np.clip(p75 + half, 0, 1),
        "p25_se": np.minimum(half / 2, 0.5), "p75_se": np.minimum(half / 2, 0.5)})
    frame.loc[status == "suppressed", "n"] = 1
    frame.loc[~released, ["p25_raw", "p75_raw", "p25_lo", "p25_hi", "p75_lo", "p75_hi",
                          "p25_se", "p75_se"]] = np.nan
    return frame


def _publish(root: Path, release_id: str, published: datetime, seed: int,
             boundaries, publish: dict | None = None) -> Path:
    """A release made as the pipeline makes one (publish.assemble, write_release, the feed),
    with its tiles and page (``publish``: the config's publish section, if any)."""
    table = P.assemble(_results(boundaries["geoid"].to_numpy(), seed), boundaries)
    manifest = {"release_id": release_id, "published": published.isoformat()}
    config = {"intervals": {"enabled": True, "level": 0.95,
                            "low_reliability_width": LOW_RELIABILITY_WIDTH, "share": 0.25},
              **({"publish": publish} if publish else {})}
    folder = write_release(table, manifest, root, release_id, config=config)
    if not (folder / T.TILES_FILE).exists():
        T.build_tiles(folder / "tracts.geojson", folder / T.TILES_FILE)
    if not (folder / W.PAGE).exists():
        W.write_web_map(folder, release_id)
    F.update_feed(root, release_id)
    return folder


@pytest.fixture(scope="module")
def publish_root(tmp_path_factory) -> dict:
    """Three releases of one 150-tract state: old, withdrawn, latest; and the feed's page."""
    root = tmp_path_factory.mktemp("publish") / "releases"
    root.mkdir()
    geoids, _ = tract_geoids("17", 150, 6)
    boundaries = synth_boundaries(geoids, seed=0)
    t0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
    ids = {"old": "20261101T000000Z-old", "withdrawn": "20261102T000000Z-wdn",
           "latest": "20261103T000000Z-new"}
    for day, (key, rid) in enumerate(ids.items()):
        _publish(root, rid, t0 + timedelta(days=day), seed=100 + day, boundaries=boundaries)
    F.withdraw(root, ids["withdrawn"], "test: a withdrawn release")
    W.write_feed_map(root)
    return {"root": root, "ids": ids}


def _published(folder: Path, stem: str = "tracts"):
    import geopandas as gpd

    return gpd.read_file(folder / f"{stem}.geojson").set_index("geoid")


# ------------------------------------------------ a release with levels and model-based values

LEVELS = ["tract", "county", "state"]
MODEL_SHIFT = 0.35   # model = direct + 0.35 (mod 1): another colour class for most tracts
MODEL_Z = {"p25": 3.1, "p75": -1.2}   # p25's model check flags, p75's does not (|z| > 2.58)
MODEL_WITHOUT_DIRECT = 0.55  # the model value of a tract without a direct one


def _level_results(geoids: np.ndarray, seed: int) -> pd.DataFrame:
    """County and state estimator output (as release/levels.py writes it), one county
    suppressed."""
    from dpatlas.publication.level_files import unit_of

    frames = []
    for level in ("county", "state"):
        units = np.unique(unit_of(geoids, level))
        frames.append(_unit_results(units, seed).assign(level=level))
    return pd.concat(frames, ignore_index=True)


def _unit_results(units: np.ndarray, seed: int) -> pd.DataFrame:
    """Released values with narrow intervals, the first of several units suppressed."""
    rng = np.random.default_rng(seed)
    n = len(units)
    p25, p75 = rng.uniform(0.1, 0.9, n), rng.uniform(0.1, 0.9, n)
    status = np.where((np.arange(n) == 0) & (n > 1), "suppressed", "released")
    frame = pd.DataFrame({
        "geoid": units, "cell": "all", "n": rng.integers(500, 5000, n),
        "mechanism": "NoisyStats", "status": status,
        "reason": np.where(status == "suppressed", "n < min_n", ""),
        "p25_raw": p25, "p75_raw": p75,
        "epsilon_spent": np.where(status == "suppressed", 0.0, 0.15),
        "delta_spent": np.where(status == "suppressed", 0.0, 1e-6),
        "p25_lo": p25 - 0.03, "p25_hi": p25 + 0.03, "p75_lo": p75 - 0.03, "p75_hi": p75 + 0.03,
        "p25_se": 0.015, "p75_se": 0.015})
    frame.loc[status == "suppressed", ["p25_raw", "p75_raw", "p25_lo", "p25_hi", "p75_lo",
                                       "p75_hi", "p25_se", "p75_se"]] = np.nan
    return frame


def _add_model_columns(folder: Path) -> None:
    """Give the tracts model-based values (what a small-area model will add as
    post-processing: p25_model, p75_model with _lo, _hi, _se; every other interval narrow, the
    others spanning classes; tracts without a direct value get one too, without a model check)
    in tracts.geojson, then rewrite the tracts' values documents from it, as publish writes
    them, and restate their hashes and columns in the manifest (the feed checks them). Only
    the map's files carry them: this release is for the browser only."""
    path = folder / "tracts.geojson"
    doc = json.loads(path.read_text())
    for i, feature in enumerate(doc["features"]):
        props = feature["properties"]
        half = 0.004 if i % 2 == 0 else 0.15
        for v in ("p25", "p75"):
            if props.get(v) is None:
                model = MODEL_WITHOUT_DIRECT
                props.update({f"{v}_model": model, f"{v}_model_lo": model - half,
                              f"{v}_model_hi": model + half, f"{v}_model_se": 0.0256})
                continue
            model = round((props[v] + MODEL_SHIFT) % 1.0, 4)
            props.update({f"{v}_model": model, f"{v}_model_lo": round(max(model - half, 0), 4),
                          f"{v}_model_hi": round(min(model + half, 1), 4),
                          f"{v}_model_se": 0.0256,
                          # issue 32: the direct value's 90% margin of error (its ± on the
                          # map), and the model check, p25 beyond the flag's limit
                          f"{v}_moe90": float(np.ceil(1.6448536269514722 * props[f"{v}_se"]
                                                      * 1e4) / 1e4),
                          f"{v}_model_z": MODEL_Z[v]})
    path.write_text(json.dumps(doc))
    rows = [f["properties"] for f in doc["features"]]
    names = list(dict.fromkeys(k for r in rows for k in r))
    values = {c: [r.get(c) for r in rows] for c in names}
    columns = V.value_columns(names, T.NOT_IN_TILES)
    manifest = json.loads((folder / "manifest.json").read_text())
    shutil.rmtree(folder / V.VALUES_FOLDER)  # written again, each with the model columns
    for name in ("tracts.geojson", *V.write_documents(folder, values, columns)):
        manifest["files"][name] = {"sha256": sha256_file(folder / name),
                                   "bytes": (folder / name).stat().st_size}
    manifest[V.MANIFEST_KEY] = V.manifest_entry(columns, values["cell"])
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


def _county_name(geoid: str) -> str:
    return f"Testcounty {geoid[-3:]}"


def _add_county_names(folder: Path) -> None:
    """A ``name`` per county in counties.geojson (what a demo with real counties publishes;
    the search finds a county by it), the manifest's hash restated."""
    path = folder / "counties.geojson"
    doc = json.loads(path.read_text())
    for feature in doc["features"]:
        feature["properties"]["name"] = _county_name(feature["properties"]["geoid"])
    path.write_text(json.dumps(doc))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][path.name] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.fixture(scope="module")
def levels_root(tmp_path_factory) -> dict:
    """One release of a 150-tract, 6-county state with county and state levels (published by
    write_release with the level files, as tasks/publish.py does) and model-based tract
    values."""
    from functools import partial

    from dpatlas.publication.level_files import assemble_level, write_all_levels

    root = tmp_path_factory.mktemp("publish-levels") / "releases"
    root.mkdir()
    geoids, _ = tract_geoids("17", 150, 6)
    boundaries = synth_boundaries(geoids, seed=0)
    rid = "20261104T000000Z-lvl"
    table = P.assemble(_results(boundaries["geoid"].to_numpy(), 200), boundaries)
    results = _level_results(boundaries["geoid"].to_numpy(), 201)
    levels = {level: assemble_level(results, boundaries, level, ["all"])
              for level in ("county", "state")}
    config = {"intervals": {"enabled": True, "level": 0.95,
                            "low_reliability_width": LOW_RELIABILITY_WIDTH, "share": 0.25},
              "levels": LEVELS}
    folder = write_release(table, {"release_id": rid, "published": "2026-11-04"}, root,
                             rid, config=config, more_files=partial(write_all_levels, levels))
    _add_model_columns(folder)
    _add_county_names(folder)
    F.update_feed(root, rid)
    W.write_feed_map(root)
    return {"root": root, "id": rid, "folder": folder}


def _target_tract(*folders: Path) -> tuple[str, float, float]:
    """A tract released in every one of ``folders`` and nowhere low reliability (so no hatch
    crosses it), the largest such (its pixels are far from any edge): its GEOID and a point
    inside it."""
    tables = [_published(f) for f in folders]
    ok = pd.Series(True, index=tables[0].index)
    for t in tables:
        ok &= t["status"] == "released"
        for v in ("p25", "p75"):
            ok &= ~colours.spans_classes(t[f"{v}_lo"], t[f"{v}_hi"])
    candidates = tables[0][ok]
    assert len(candidates), "no tract is released and reliable in every release"
    geoid = candidates.to_crs("EPSG:6933").area.idxmax()
    point = candidates.loc[geoid, "geometry"].representative_point()
    return geoid, point.x, point.y


# ------------------------------------------------------------------------------ the browser


@pytest.fixture(scope="module")
def server(publish_root):
    httpd, base = serve_in_thread(publish_root["root"])
    yield base
    httpd.shutdown()
    httpd.server_close()


class Page:
    """A page with its console errors, uncaught exceptions and tile responses recorded."""

    def __init__(self, browser, viewport=B.VIEWPORT, flights: bool = False):
        """``flights``: the test flies the map (a search), so MapLibre may cancel tile range
        requests it no longer needs (net::ERR_ABORTED); those are kept apart, in
        ``cancelled_tiles``, and every other failed request is still an error."""
        self.context = browser.new_context(viewport=viewport, device_scale_factor=1)
        self.flights = flights
        self.cancelled_tiles: list[str] = []
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.tile_statuses: list[int] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on("requestfailed", self._failed)
        self.page.on("response", self._response)

    def _console(self, message):
        """A console error, with where it was logged and, for an Error, its stack: MapLibre
        logs an unhandled map error as the bare Error, whose text alone may say nothing."""
        if message.type != "error":
            return
        detail = message.text
        try:
            stacks = [a.evaluate("a => a instanceof Error ? a.name + ': ' + a.stack : null")
                      for a in message.args]
        except Exception:  # the page went away: keep the text
            stacks = []
        where = message.location or {}
        detail += f" (at {where.get('url', '?')}:{where.get('lineNumber', '?')})"
        detail += "".join(f"\n{s}" for s in stacks if s)
        self.errors.append(detail)

    def _failed(self, request):
        if (self.flights and request.url.endswith(".pmtiles")
                and request.failure == "net::ERR_ABORTED"):
            self.cancelled_tiles.append(request.url)
        else:
            self.errors.append(f"failed: {request.url} ({request.failure})")

    def _response(self, response):
        if response.url.endswith(".pmtiles"):
            self.tile_statuses.append(response.status)
        elif response.status >= 400:
            self.errors.append(f"HTTP {response.status}: {response.url}")

    def open(self, url: str, release: str) -> None:
        self.page.goto(url)
        self.wait_loaded(release)

    def wait_loaded(self, release: str) -> None:
        self.page.wait_for_function("id => window.dpatlas && window.dpatlas.loaded === id",
                                    arg=release, timeout=60_000)

    def idle(self) -> None:
        """The map idle once no tract values are on their way (each arrival repaints it)."""
        self.page.evaluate("""() => new Promise(resolve => {
            const map = window.dpatlas.map, state = window.dpatlas.state;
            const settle = () => {
              if (state.pendingValues > 0) { setTimeout(settle, 20); return; }
              map.once('idle', () => resolve(true));
              map.triggerRepaint();
            };
            settle(); })""")

    def pixel_of(self, lon: float, lat: float) -> tuple[int, int]:
        """Where a point is drawn, in page pixels: map.project plus the canvas's offset."""
        xy = self.page.evaluate("""([lon, lat]) => {
            const map = window.dpatlas.map, p = map.project([lon, lat]);
            const box = map.getCanvas().getBoundingClientRect();
            return [Math.round(box.left + p.x), Math.round(box.top + p.y)]; }""", [lon, lat])
        return int(xy[0]), int(xy[1])

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / name
        self.page.screenshot(path=str(path))
        return path

    def close(self):
        self.context.close()


def _rgb_at(png: Path, xy: tuple[int, int]) -> tuple[int, int, int]:
    from PIL import Image

    with Image.open(png) as image:
        return image.convert("RGB").getpixel(xy)


def _hex_rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def _assert_colour(png: Path, xy, expected_hex: str, what: str) -> None:
    got, want = _rgb_at(png, xy), _hex_rgb(expected_hex)
    assert max(abs(a - b) for a, b in zip(got, want)) <= COLOUR_TOLERANCE, \
        f"{what}: pixel {xy} of {png.name} is {got}, the legend colour is {want} {expected_hex}"


def _js_number(value: float) -> str:
    """How the page prints a number: JavaScript's String(n) (shortest round trip, like
    Python's repr, but integers without ".0")."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@pytest.mark.slow
@pytest.mark.browser
def test_feed_page_draws_the_latest_release_with_legend_colours_popup_and_picker(
        browser, server, publish_root):
    ids, root = publish_root["ids"], publish_root["root"]
    page = Page(browser)
    try:
        page.open(server, ids["latest"])
        assert page.tile_statuses and set(page.tile_statuses) == {206}, page.tile_statuses

        # The picker lists every release of the feed; the withdrawn one is marked.
        options = page.page.eval_on_selector_all(
            "#release option", "os => os.map(o => [o.value, o.textContent, "
                               "o.dataset.withdrawn || ''])")
        assert [o[0] for o in options] == [ids["latest"], ids["withdrawn"], ids["old"]]
        assert options[0][1].endswith("(latest)")
        assert options[1][1].endswith("(withdrawn)") and options[1][2] == "true"
        assert "(withdrawn)" not in options[0][1] + options[2][1]
        # The legend shows the classes, suppressed, failed and low reliability.
        legend = page.page.inner_text("#legend")
        for text in ["< 0.20", "≥ 0.80", "suppressed", "failed",
                     "low reliability: interval spans more than one colour class"]:
            assert text in legend
        # ... and the one estimand of every value, and what its ± and interval are (issue 32).
        for text in ["What p25 and its ± estimate", ESTIMAND_DEFINITION[:60],
                     "p25 at parent rank 25", "±: the 90% margin of error",
                     "[low, high]: the confidence interval for the tract expected outcome"]:
            assert text in legend, (text, legend)
        assert "rows:" not in legend and "least-squares line of the tract's" not in legend

        # A tract's pixel has the legend colour of its published p25.
        geoid, lon, lat = _target_tract(root / ids["latest"], root / ids["old"])
        latest = _published(root / ids["latest"]).loc[geoid]
        xy = page.pixel_of(lon, lat)
        shot = page.screenshot("feed-latest-p25.png")
        _assert_colour(shot, xy, W.class_colour(latest["p25"]), f"tract {geoid} p25")

        # Clicking it shows its published values.
        page.page.mouse.click(*xy)
        popup = page.page.wait_for_selector(".maplibregl-popup-content", timeout=10_000)
        page.screenshot("feed-latest-popup.png")
        text = popup.inner_text()
        for expected in (geoid, "released", _js_number(latest["p25"]),
                         # the ± is the labelled 90% margin, the interval named as such
                         _estimate_text(latest, "p25"),
                         str(latest["n"]), latest["mechanism"],
                         # the budget to 6 significant digits (0.99999986... shows as 1)
                         "ε = " + _js_number(float(format(latest["epsilon_spent"], ".6g"))) + ",",
                         "Estimand", "tract expected outcome"):
            assert expected in text, (expected, text)
        # a ± is only ever a labelled margin of error
        assert text.count(" ± ") == text.count("(90% margin of error)") >= 1
        page.page.click(".maplibregl-popup-close-button")

        # The p75 switch recolours the same tract by its p75.
        page.page.check("input[name=value][value=p75]")
        page.idle()
        shot = page.screenshot("feed-latest-p75.png")
        _assert_colour(shot, xy, W.class_colour(latest["p75"]), f"tract {geoid} p75")
        legend = page.page.inner_text("#legend")
        assert "What p75 and its ± estimate" in legend and "at parent rank 75" in legend
        page.page.check("input[name=value][value=p25]")
        page.idle()

        # Switching releases redraws the map from the other release's tiles.
        before = page.screenshot("feed-before-switch.png").read_bytes()
        page.page.select_option("#release", ids["old"])
        page.wait_loaded(ids["old"])
        after_png = page.screenshot("feed-old-p25.png")
        assert after_png.read_bytes() != before
        old = _published(root / ids["old"]).loc[geoid]
        _assert_colour(after_png, page.pixel_of(lon, lat), W.class_colour(old["p25"]),
                       f"tract {geoid} p25 in {ids['old']}")
        assert page.page.is_hidden("#withdrawn")
        assert any(u.endswith(f"{ids['old']}/tracts.pmtiles") for u in _tile_urls(page))

        # A withdrawn release can be looked at, with the withdrawal shown.
        page.page.select_option("#release", ids["withdrawn"])
        page.wait_loaded(ids["withdrawn"])
        banner = page.page.inner_text("#withdrawn")
        assert "withdrawn" in banner and "test: a withdrawn release" in banner
        page.screenshot("feed-withdrawn.png")
        assert page.errors == []
        assert set(page.tile_statuses) == {206}
    finally:
        page.close()


def _tile_urls(page: Page) -> list[str]:
    return page.page.evaluate(
        "() => performance.getEntriesByType('resource').map(e => e.name)"
        ".filter(u => u.endsWith('.pmtiles'))")


@pytest.mark.slow
@pytest.mark.browser
def test_release_page_opens_its_own_release(browser, server, publish_root):
    ids, root = publish_root["ids"], publish_root["root"]
    page = Page(browser)
    try:
        page.open(f"{server}{ids['old']}/", ids["old"])
        assert page.page.input_value("#release") == ids["old"]
        geoid, lon, lat = _target_tract(root / ids["old"])
        shot = page.screenshot("release-old-p25.png")
        _assert_colour(shot, page.pixel_of(lon, lat),
                       W.class_colour(_published(root / ids["old"]).loc[geoid, "p25"]),
                       f"tract {geoid}")
        assert set(_tile_urls(page)) == {f"{server}{ids['old']}/tracts.pmtiles"}
        # A release without levels or model values shows no level or estimate switch.
        assert page.page.is_hidden("#level-switch") and page.page.is_hidden("#estimate-switch")
        assert page.page.evaluate("() => window.dpatlas.state.shownLevel") == "tract"
        assert page.errors == [] and set(page.tile_statuses) == {206}
    finally:
        page.close()


def test_missing_chromium_is_an_actionable_error(monkeypatch, tmp_path):
    monkeypatch.setattr(B, "CHROMIUM", tmp_path / "no-chromium")
    with pytest.raises(B.BrowserMissing, match=r"apt-get install -y chromium"):
        B.launch_chromium(playwright=None)


# ------------------------------------------------------- levels and the direct/model switch


@pytest.fixture(scope="module")
def levels_server(levels_root):
    httpd, base = serve_in_thread(levels_root["root"])
    yield base
    httpd.shutdown()
    httpd.server_close()


def _unit_colour(row) -> str:
    """The colour a unit is drawn in (direct value): its class, or its status's colour."""
    return W.class_colour(row["p25"]) if row["status"] == "released" \
        else W.STATUS_COLOURS[row["status"]]


def _estimate_text(row, name: str) -> str:
    """How the popup prints a value with its labelled ± (the 90% margin of error, where
    published) and its 95% interval."""
    moe = row.get(name + "_moe90")
    margin = (", " if moe is None or pd.isna(moe)
              else f" ± {_js_number(moe)} (90% margin of error); ")
    return (f"{_js_number(row[name])}{margin}95% interval "
            f"[{_js_number(row[name + '_lo'])}, {_js_number(row[name + '_hi'])}]")


def _model_target(folder: Path) -> tuple[str, float, float]:
    """The largest tract released, reliable (direct and model), whose model-based p25 is in
    another colour class than its direct p25 (so the switch must change its pixel)."""
    t = _published(folder)
    ok = (t["status"] == "released") & t["p25_model"].notna()
    for v in ("p25", "p75", "p25_model", "p75_model"):
        ok &= ~colours.spans_classes(t[f"{v}_lo"], t[f"{v}_hi"])
    ok &= t["p25"].map(W.class_colour) != t["p25_model"].map(W.class_colour)
    candidates = t[ok]
    assert len(candidates), "no tract whose model value changes its class"
    geoid = candidates.to_crs("EPSG:6933").area.idxmax()
    point = candidates.loc[geoid, "geometry"].representative_point()
    return geoid, point.x, point.y


def _shown_level(page: Page) -> str:
    return page.page.evaluate("() => window.dpatlas.state.shownLevel")


@pytest.mark.slow
@pytest.mark.browser
def test_a_tile_that_failed_to_fetch_is_fetched_again_and_the_map_is_drawn(
        browser, server, publish_root):
    """A tile's range request that fails in the network (here the first one after the page
    has loaded, aborted by the test) is a map error "Failed to fetch": the web map
    reloads that source once, with a warning, and the tract is drawn in its colour; no console
    error."""
    ids, root = publish_root["ids"], publish_root["root"]
    page = Page(browser)
    warnings, cut = [], []
    page.page.on("console", lambda m: m.type == "warning" and warnings.append(m.text))

    def cut_first_tile(route):
        ranged = route.request.headers.get("range", "")
        if not cut and ranged and not ranged.startswith("bytes=0-"):
            cut.append(ranged)
            return route.abort("failed")
        return route.continue_()

    try:
        page.open(server, ids["latest"])
        page.page.route("**/tracts.pmtiles", cut_first_tile)  # loaded: the next are tiles
        geoid, lon, lat = _target_tract(root / ids["latest"])
        _jump(page, center=[lon, lat], zoom=9)
        assert len(cut) == 1
        shot = page.screenshot("tile-refetched.png")
        _assert_colour(shot, page.pixel_of(lon, lat),
                       W.class_colour(_published(root / ids["latest"]).loc[geoid, "p25"]),
                       f"tract {geoid}")
        # the cut request is the one failure (the test's, and the browser's own log line of
        # it); the map error became a warning and a retry
        cut_request = [e for e in page.errors if e.startswith("failed: ")
                       or e.startswith("Failed to load resource: net::ERR_FAILED")]
        assert len(cut_request) == 2 and len(page.errors) == 2, page.errors
        assert any("failed to fetch; reloading the source once" in w for w in warnings), warnings
    finally:
        page.close()


def _rendered_geoids(page: Page, layer: str) -> set[str]:
    """The GEOIDs ``layer`` draws in view (tests/support/style_expressions.py)."""
    from tests.support.style_expressions import rendered

    return {f["geoid"] for f in rendered(page.page, layer)}


def _jump(page: Page, **camera) -> None:
    page.page.evaluate("camera => window.dpatlas.map.jumpTo(camera)", camera)
    page.idle()


def _popup_text(page: Page, xy) -> str:
    page.page.mouse.click(*xy)
    popup = page.page.wait_for_selector(".maplibregl-popup-content", timeout=10_000)
    text = popup.inner_text()
    page.page.click(".maplibregl-popup-close-button")
    return text


@pytest.mark.slow
@pytest.mark.browser
def test_levels_by_zoom_the_level_switch_and_the_model_direct_switch(
        browser, levels_server, levels_root):
    rid, folder = levels_root["id"], levels_root["folder"]
    states, counties = _published(folder, "states"), _published(folder, "counties")
    geoid, lon, lat = _model_target(folder)
    tract = _published(folder).loc[geoid]
    county = counties.loc[geoid[:5]]
    page = Page(browser)
    try:
        page.open(levels_server, rid)
        assert page.page.is_visible("#level-switch") and page.page.is_visible("#estimate-switch")
        assert page.page.is_checked("input[name=level][value=auto]")
        assert page.page.is_checked("input[name=estimate][value=model]")   # the default
        # By zoom: the state fitted on the screen (z5-z8) shows its counties.
        zoom = page.page.evaluate("() => window.dpatlas.map.getZoom()")
        assert 5 <= zoom < 8, zoom
        assert _shown_level(page) == "county"
        assert _rendered_geoids(page, "counties-fill") == set(counties.index)
        assert "Shown: counties (by zoom" in page.page.inner_text("#legend")

        # Zoomed out, the state layer is drawn (tracts start at z4, and are hidden anyway).
        _jump(page, zoom=3)
        assert _shown_level(page) == "state"
        assert _rendered_geoids(page, "states-fill") == {"17"}
        assert _rendered_geoids(page, "counties-fill") == set()
        point = states.loc["17", "geometry"].representative_point()
        shot = page.screenshot("levels-z3-states.png")
        _assert_colour(shot, page.pixel_of(point.x, point.y), _unit_colour(states.loc["17"]),
                       "state 17 at z3")

        # Zoomed in, tracts, coloured by the model-based value (the default).
        _jump(page, center=[lon, lat], zoom=9)
        assert _shown_level(page) == "tract"
        xy = page.pixel_of(lon, lat)
        shot = page.screenshot("levels-z9-tract-model.png")
        _assert_colour(shot, xy, W.class_colour(tract["p25_model"]), f"tract {geoid} model")
        assert "p25, model-based" in page.page.inner_text("#legend")
        text = _popup_text(page, xy)
        for expected in (geoid, "p25 model-based (shown)", _estimate_text(tract, "p25_model"),
                         "p25 direct", _estimate_text(tract, "p25"),
                         _estimate_text(tract, "p75_model"), _estimate_text(tract, "p75"),
                         f"county {geoid[:5]} (p25)", f"state 17 (p25)",
                         # issue 32: the direct ± is its labelled 90% margin of error ...
                         f"{_js_number(tract['p25'])} ± {_js_number(tract['p25_moe90'])} "
                         "(90% margin of error); 95% interval [",
                         # ... the model's value has no margin, its interval named ...
                         f"{_js_number(tract['p25_model'])}, 95% interval [",
                         # ... and where the direct differs from the model beyond their
                         # noise (|p25_model_z| > 2.58), the popup says so
                         "p25 model check", "model may not apply here: the direct value "
                         "differs from the model beyond their combined noise (z = 3.1)",
                         "tract expected outcome (direct and model-based alike)"):
            assert expected in text, (expected, text)
        assert "p75 model check" not in text   # |p75_model_z| = 1.2: no flag
        legend = page.page.inner_text("#legend")
        for expected in ("Direct and model-based values estimate the same.",
                         "Marked “model may not apply here", "|p25_model_z| > 2.58"):
            assert expected in legend, (expected, legend)
        if county["status"] == "released":
            assert _estimate_text(county, "p25") in text, text

        # The switch to the direct value recolours the tract.
        page.page.check("input[name=estimate][value=direct]")
        page.idle()
        shot = page.screenshot("levels-z9-tract-direct.png")
        _assert_colour(shot, xy, W.class_colour(tract["p25"]), f"tract {geoid} direct")
        assert "p25, direct" in page.page.inner_text("#legend")
        assert "p25 direct (shown)" in _popup_text(page, xy)

        # The level switch fixes counties at any zoom; a county's popup has its own estimate.
        page.page.check("input[name=level][value=county]")
        page.idle()
        assert _shown_level(page) == "county"
        assert geoid[:5] in _rendered_geoids(page, "counties-fill")
        assert _rendered_geoids(page, "tracts-fill") == set()
        shot = page.screenshot("levels-z9-county-fixed.png")
        _assert_colour(shot, xy, _unit_colour(county), f"county {geoid[:5]}")
        text = _popup_text(page, xy)
        assert "County" in text and geoid[:5] in text and "state 17 (p25)" in text
        if county["status"] == "released":
            assert _estimate_text(county, "p25") in text, text
        state = states.loc["17"]
        assert _estimate_text(state, "p25") in text, text
        assert "county expected outcome" in text and "tract expected outcome" not in text, text
        legend = page.page.inner_text("#legend")
        assert "Shown: counties (chosen)" in legend and "Counties without a value" in legend
        assert "county expected outcome: the population least-squares prediction" in legend
        assert "model may not apply" not in legend   # the model is fitted to tracts only

        # Back to "by zoom": tracts again at z9.
        page.page.check("input[name=level][value=auto]")
        page.idle()
        assert _shown_level(page) == "tract"
        assert page.errors == []
        assert set(page.tile_statuses) == {206}
        urls = {u.rsplit("/", 1)[1] for u in _tile_urls(page)}
        assert urls == {"tracts.pmtiles", "counties.pmtiles", "states.pmtiles"}, urls
    finally:
        page.close()


# ------------------------------------------------- issue 21: what a user of the map expects


def _search(page: Page, query: str) -> str:
    """Type ``query`` into the search box, submit, and return the message once it is shown
    (with the map idle after the flight)."""
    if page.page.is_hidden("#search-box"):
        page.page.click("#panel-open")
    page.page.evaluate("() => { const m = document.getElementById('search-message');"
                       " m.hidden = true; m.textContent = ''; }")
    page.page.fill("#search-box", query)
    page.page.press("#search-box", "Enter")
    # (At phone size a found place folds the panel, message and all: read it from the DOM.)
    page.page.wait_for_function("() => { const m = document.getElementById('search-message');"
                                " return !m.hidden && m.textContent; }", timeout=20_000)
    page.idle()
    return page.page.text_content("#search-message")


def _open_popup_text(page: Page) -> str:
    return page.page.inner_text(".maplibregl-popup-content")


def _popup_count(page: Page) -> int:
    return page.page.locator(".maplibregl-popup").count()


def _fetch_status(page: Page, href: str) -> int:
    return page.page.evaluate("href => fetch(href).then(r => r.status)", href)


def _layer_order(page: Page) -> list[str]:
    return page.page.evaluate("() => window.dpatlas.map.getStyle().layers.map(l => l.id)")


@pytest.mark.slow
@pytest.mark.browser
def test_downloads_search_outlines_scale_bar_and_popups_that_follow_the_switches(
        browser, levels_server, levels_root):
    rid, folder = levels_root["id"], levels_root["folder"]
    tracts, counties = _published(folder), _published(folder, "counties")
    page = Page(browser, flights=True)
    try:
        page.open(levels_server, rid)
        # 1. Download links: each level's files and the manifest, relative, each served (200).
        links = page.page.eval_on_selector_all(
            "#downloads a", "as => as.map(a => [a.dataset.file, a.getAttribute('href')])")
        files = {f for f, _ in links}
        for stem in ("tracts", "counties", "states"):
            assert {f"{stem}.csv", f"{stem}.parquet", f"{stem}.geojson",
                    f"{stem}.schema.json"} <= files, files
        assert "manifest.json" in files
        for file, href in links:
            assert href == f"{rid}/{file}", href          # relative to the release folder
            assert _fetch_status(page, href) == 200, href

        # 3. A scale bar, and county and state outlines above every fill.
        scale = page.page.inner_text(".maplibregl-ctrl-scale")
        assert re.fullmatch(r"\d+\s?(km|m)", scale.strip()), scale
        order = _layer_order(page)
        outlines = [order.index("counties-outline"), order.index("states-outline")]
        fills = [i for i, name in enumerate(order) if name.endswith(("-fill", "-hatch"))]
        assert min(outlines) > max(fills), order
        assert _rendered_geoids(page, "counties-outline") == set(counties.index)
        assert _rendered_geoids(page, "states-outline") == {"17"}
        # A state edge is drawn dark over the fill (the outline, not the fill's colour).
        shot = page.screenshot("outlines.png")
        state = _published(folder, "states").loc["17", "geometry"]
        edge = shapely.get_coordinates(state.boundary)[::40]
        from PIL import Image
        with Image.open(shot) as image:
            rgb = image.convert("RGB")
            darkest = [min(sum(rgb.getpixel((x + dx, y + dy))) for dx in (-1, 0, 1)
                           for dy in (-1, 0, 1))
                       for x, y in (page.pixel_of(lon, lat) for lon, lat in edge)]
        assert np.median(darkest) < 3 * 90, darkest

        # 2. Search by tract GEOID: flies there, tracts drawn, its popup open.
        geoid = tracts[tracts["status"] == "released"].index[0]
        message = _search(page, geoid)
        assert message == f"Found tract {geoid}.", message
        assert _shown_level(page) == "tract"
        assert page.page.evaluate("() => window.dpatlas.map.getZoom()") >= 8
        text = _open_popup_text(page)
        assert geoid in text and "p25 model-based (shown)" in text, text

        # 5. The popup follows the p25/p75 switch (and the estimate switch).
        page.page.check("input[name=value][value=p75]")
        page.idle()
        text = _open_popup_text(page)
        assert "p75 model-based (shown)" in text and "(shown)" not in text.replace(
            "p75 model-based (shown)", ""), text
        assert f"county {geoid[:5]} (p75)" in text and "(p25)" not in text, text
        page.page.check("input[name=estimate][value=direct]")
        page.idle()
        text = _open_popup_text(page)
        assert "p75 direct (shown)" in text and "model-based (shown)" not in text, text
        assert _popup_count(page) == 1

        # ... by county FIPS code and by county name (the `name` the county files carry).
        county = counties.index[1]
        message = _search(page, county)
        assert message == f"Found county {county}.", message
        assert _shown_level(page) == "county"
        text = _open_popup_text(page)
        assert f"{county} {_county_name(county)}" in text and "p75 (shown)" in text, text
        other = counties.index[2]
        message = _search(page, _county_name(other).upper())
        assert message.startswith("Found county named “"), message
        assert f"{other} {_county_name(other)}" in _open_popup_text(page)
        assert _popup_count(page) == 1
        # ... and says so when nothing matches.
        for query, expected in (("17999999999", "Not found: no tract 17999999999"),
                                ("17999", "Not found: no county 17999"),
                                ("Nowhere", "Not found: no county named “Nowhere”"),
                                ("18", "Not found: no state 18"),
                                ("123", "Type an 11-digit tract GEOID")):
            message = _search(page, query)
            assert message.startswith(expected), (query, message)
            assert page.page.get_attribute("#search-message", "data-found") == "false"
        page.screenshot("search-county-name.png")
        assert page.errors == [] and set(page.tile_statuses) == {206}
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_outside_the_tiles_zooms_a_message_replaces_the_blank_map_and_the_popup_closes(
        browser, server, publish_root):
    ids, root = publish_root["ids"], publish_root["root"]
    page = Page(browser, flights=True)
    try:
        page.open(server, ids["latest"])
        assert page.page.is_hidden("#data-message")
        geoid, lon, lat = _target_tract(root / ids["latest"])
        page.page.mouse.click(*page.pixel_of(lon, lat))
        page.page.wait_for_selector(".maplibregl-popup-content", timeout=10_000)
        # Below the tract tiles' first zoom (z4) this release (no levels) draws nothing.
        _jump(page, zoom=3)
        assert page.page.is_visible("#data-message")
        assert page.page.inner_text("#data-message-text").startswith(
            "Zoom in to see data: tracts are drawn from zoom 4")
        assert _popup_count(page) == 0
        page.screenshot("zoom-message.png")
        _jump(page, center=[lon, lat], zoom=7)
        assert page.page.is_hidden("#data-message")
        # Looking away from the release: zoom out (or show the whole release).
        _jump(page, center=[lon + 20, lat], zoom=9)
        assert page.page.inner_text("#data-message-text").startswith("Zoom out to see data")
        page.page.click("#show-all")
        page.idle()
        assert page.page.is_hidden("#data-message")
        # The popup follows the p25/p75 switch on a release without model values too.
        page.page.mouse.click(*page.pixel_of(lon, lat))
        page.page.wait_for_selector(".maplibregl-popup-content", timeout=10_000)
        assert "p25 (shown)" in _open_popup_text(page)
        page.page.check("input[name=value][value=p75]")
        page.idle()
        text = _open_popup_text(page)
        assert "p75 (shown)" in text and "p25 (shown)" not in text, text
        # A county FIPS code in a release without county files shows that county's tracts.
        message = _search(page, geoid[:5])
        assert message.startswith("This release has no county files: showing the"), message
        assert page.errors == [] and set(page.tile_statuses) == {206}
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_at_phone_size_the_panel_folds_away_and_the_map_fills_the_screen(
        browser, server, publish_root):
    ids, root = publish_root["ids"], publish_root["root"]
    page = Page(browser, viewport=B.PHONE_VIEWPORT, flights=True)
    try:
        page.open(server, ids["latest"])
        width, height = B.PHONE_VIEWPORT["width"], B.PHONE_VIEWPORT["height"]
        canvas = page.page.locator("#map canvas").bounding_box()
        assert canvas["width"] * canvas["height"] >= 0.95 * width * height, canvas
        assert page.page.is_hidden("#panel") and page.page.is_visible("#panel-open")
        page.screenshot("phone-folded.png")
        page.page.click("#panel-open")
        assert page.page.is_visible("#panel") and page.page.is_visible("#legend")
        panel = page.page.locator("#panel").bounding_box()
        assert panel["x"] >= 0 and panel["x"] + panel["width"] <= width - 40, panel
        page.screenshot("phone-panel.png")
        page.page.click("#panel-close")
        assert page.page.is_hidden("#panel")
        # The map is usable: a tract's popup fits the screen; a search folds the panel.
        geoid, lon, lat = _target_tract(root / ids["latest"])
        message = _search(page, geoid)
        assert message == f"Found tract {geoid}.", message
        assert page.page.is_hidden("#panel")
        popup = page.page.locator(".maplibregl-popup-content").bounding_box()
        assert popup["width"] <= width, popup
        assert geoid in _open_popup_text(page)
        page.screenshot("phone-popup.png")
        assert page.errors == [] and set(page.tile_statuses) == {206}
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_at_desktop_size_the_panel_can_be_folded_and_the_map_takes_its_room(
        browser, server, publish_root):
    ids = publish_root["ids"]
    page = Page(browser)
    try:
        page.open(server, ids["latest"])
        assert page.page.is_visible("#panel") and page.page.is_hidden("#panel-open")
        before = page.page.locator("#map canvas").bounding_box()["width"]
        page.page.click("#panel-close")
        page.idle()
        after = page.page.locator("#map canvas").bounding_box()["width"]
        assert page.page.is_hidden("#panel") and after == B.VIEWPORT["width"] > before
        page.page.click("#panel-open")
        assert page.page.is_visible("#panel")
        assert page.errors == []
    finally:
        page.close()


def test_one_shared_library_copy_at_the_publish_root(publish_root):
    """Each release's page reads the root's _lib/ (sha256 as pinned); no release folder or
    manifest holds a copy, a withdrawn release leaves it in place, and the root's page uses
    the same files."""
    root, ids = publish_root["root"], publish_root["ids"]
    shared = W.library_files()
    assert shared and all(sha256_file(root / rel) == digest for rel, digest in shared.items())
    for rid in ids.values():
        folder = root / rid
        manifest = P.verify_release(folder)
        assert not {"maplibre-gl.js", "pmtiles.js"} & set(manifest["files"])
        assert not (folder / "maplibre-gl.js").exists()
        html = (folder / W.PAGE).read_text()
        for rel in shared:
            if rel.endswith((".js", ".css")):
                assert f'"../{rel}"' in html, rel
    assert '"_lib/maplibre-gl-5.24.1/maplibre-gl.js"' in (root / W.PAGE).read_text()
    assert not (root / W.ASSETS_DIR / "maplibre-gl.js").exists()
    # Rewritten only if its bytes are not the pinned ones.
    target = root / next(iter(shared))
    stamp = target.stat().st_mtime_ns
    W.write_shared_library(root)
    assert target.stat().st_mtime_ns == stamp
    target.write_text("tampered")
    W.write_shared_library(root)
    assert sha256_file(target) == shared[next(iter(shared))]


@pytest.mark.slow
@pytest.mark.browser
def test_a_release_that_carries_its_own_library_copy_still_works(browser, server, publish_root):
    """Releases published before the shared _lib/ hold their own MapLibre and PMTiles beside
    their page; their pages keep working."""
    root, ids = publish_root["root"], publish_root["ids"]
    rid = "20261031T000000Z-own"
    folder = root / rid
    if not folder.exists():
        shutil.copytree(root / ids["old"], folder)
        html = (folder / W.PAGE).read_text().replace(ids["old"], rid)
        for package in W.library_folders().values():
            html = html.replace(f"../{W.LIB_DIR}/{package}/", "")
        (folder / W.PAGE).write_text(html)
        for name in vendor.expected_files():
            shutil.copy(vendor.VENDOR_DIR / name, folder / name)
    page = Page(browser)
    try:
        requested = []
        page.page.on("request", lambda r: requested.append(r.url))
        page.open(f"{server}{rid}/", rid)
        assert f"{server}{rid}/maplibre-gl.js" in requested
        assert not [u for u in requested if f"/{W.LIB_DIR}/" in u]
        assert page.errors == []
    finally:
        page.close()
        shutil.rmtree(folder)
