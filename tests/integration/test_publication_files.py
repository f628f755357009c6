"""The published files follow their standards: RFC 7946 GeoJSON, a Frictionless Table Schema
beside the CSV, values rounded to the stated precision, and a STAC catalogue that validates."""

from __future__ import annotations

import hashlib
import json
import re
import socket
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import shapely
from shapely.geometry import Polygon

from dpatlas.publication import feed as F
from dpatlas.publication import stac
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication.geojson import write_geojson_rfc7946
from dpatlas.publication.tract_files import (CSV_SCHEMA_FILE, PUBLISHED_DECIMALS, PUBLISHED_FILES,
                                             PublishError, assemble, read_csv_with_schema,
                                             table_schema)
from dpatlas.publication.cell_stream import write_release
from dpatlas.evaluation.synthetic_input import tract_geoids

TABLE_SCHEMA_TYPES = {"string", "number", "integer", "boolean", "object", "array", "date",
                      "time", "datetime", "year", "yearmonth", "duration", "geopoint",
                      "geojson", "any"}


# ------------------------------------------------------------------------------------ helpers


def fake_results(geoids, seed: int = 1) -> pd.DataFrame:
    """Estimate-stage output for ``geoids``: mostly released, a few suppressed and failed,
    values with many decimals, some outside [0, 1], and intervals."""
    rng = np.random.default_rng(seed)
    n = len(geoids)
    res = pd.DataFrame({"geoid": list(geoids), "cell": "all", "n": rng.integers(2, 300, n),
                        "mechanism": "NoisyStats", "status": "released", "reason": None,
                        "p25_raw": rng.normal(0.4, 0.3, n), "p75_raw": rng.normal(0.6, 0.3, n),
                        "epsilon_spent": 1.0, "delta_spent": 0.0})
    for v in ("p25", "p75"):
        res[f"{v}_lo"] = np.clip(res[f"{v}_raw"] - rng.uniform(0, 0.3, n), 0, 1)
        res[f"{v}_hi"] = np.clip(res[f"{v}_raw"] + rng.uniform(0, 0.3, n), 0, 1)
        res[f"{v}_lo"] = np.minimum(res[f"{v}_lo"], res[f"{v}_raw"].clip(0, 1))
        res[f"{v}_hi"] = np.maximum(res[f"{v}_hi"], res[f"{v}_raw"].clip(0, 1))
    for v in ("p25", "p75"):  # the interval step's, unrounded, after the bounds as there
        res[f"{v}_se"] = rng.uniform(0.001, 0.5, n)
    values = ["p25_raw", "p75_raw", "p25_lo", "p25_hi", "p75_lo", "p75_hi", "p25_se", "p75_se"]
    res.loc[:2, ["status", "mechanism", "reason", "n", "epsilon_spent"]] = [
        "suppressed", "none", "fewer than min_n", 1, 0.0]
    res.loc[3, ["status", "reason"]] = ["failed", "noisy nvar <= 0"]
    res.loc[:3, values] = np.nan
    return res


@pytest.fixture(scope="module")
def alabama():
    """Boundaries of a small synthetic Alabama: state FIPS 01, so GEOIDs start with 0."""
    geoids, _ = tract_geoids("01", 80, 5)
    return synth_boundaries(list(geoids), seed=4)


def publish(root: Path, rid: str, boundaries, published="2026-03-01T12:00:00+00:00",
            seed: int = 1) -> tuple[Path, pd.DataFrame]:
    results = fake_results(boundaries["geoid"], seed)
    table = assemble(results, boundaries)
    folder = write_release(table, {"release_id": rid, "published": published}, root, rid,
                           config={"release": rid})
    return folder, results


@pytest.fixture(scope="module")
def release(alabama, tmp_path_factory):
    root = tmp_path_factory.mktemp("pub")
    folder, results = publish(root, "r1", alabama)
    return folder, results


def shoelace(ring) -> float:
    """Signed area: positive for a counter-clockwise ring (x east, y north)."""
    xy = np.asarray(ring, dtype=float)
    x, y = xy[:, 0], xy[:, 1]
    return 0.5 * float(np.sum(x[:-1] * y[1:] - x[1:] * y[:-1]))


def decimals(text: str) -> int:
    """Digits after the decimal point of a JSON number as written (exponent counted)."""
    mantissa, _, exponent = text.lower().partition("e")
    places = len(mantissa.partition(".")[2])
    return max(0, places - int(exponent or 0))


def polygons(geometry: dict) -> list:
    return [geometry["coordinates"]] if geometry["type"] == "Polygon" else geometry["coordinates"]


# ------------------------------------------------------------------------------ RFC 7946


def check_rfc7946(path: Path) -> dict:
    """Parse ``path`` and assert RFC 7946 on it; returns the parsed document."""
    literal = json.loads(path.read_text(), parse_float=lambda s: s)  # numbers as written
    doc = json.loads(path.read_text())
    assert doc["type"] == "FeatureCollection"
    assert "crs" not in doc and all("crs" not in f for f in doc["features"])  # section 4
    rings = 0
    for feature, written in zip(doc["features"], literal["features"]):
        assert feature["type"] == "Feature" and set(feature) >= {"properties", "geometry"}
        geometry = feature["geometry"]
        if geometry is None:
            continue
        assert geometry["type"] in ("Polygon", "MultiPolygon")
        for polygon in polygons(geometry):
            outer, *holes = polygon
            for ring in polygon:
                assert ring[0] == ring[-1] and len(ring) >= 4  # closed linear ring
            assert shoelace(outer) > 0, "exterior ring not counter-clockwise"  # section 3.1.6
            assert all(shoelace(h) < 0 for h in holes), "hole not clockwise"
            rings += len(polygon)
        numbers = re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?",
                             json.dumps(written["geometry"]["coordinates"]))
        assert max(decimals(n) for n in numbers) <= 6  # RFC 7946 section 11.2
        shape = shapely.geometry.shape(geometry)
        assert shape.is_valid, shapely.is_valid_reason(shape)
        lon, lat = shapely.get_coordinates(shape).T
        assert (np.abs(lon) <= 180).all() and (np.abs(lat) <= 90).all()  # lon, lat order
    assert rings > 0
    return doc


def test_published_geojson_is_rfc7946(release, alabama):
    folder, _ = release
    doc = check_rfc7946(folder / "tracts.geojson")
    assert len(doc["features"]) == len(alabama)
    first = doc["features"][0]["properties"]
    assert first["geoid"] == alabama["geoid"].iloc[0] and first["geoid"].startswith("01")
    assert first["p25"] is None  # NaN is null, never the non-JSON NaN token
    # the bbox (section 5) holds every coordinate
    west, south, east, north = doc["bbox"]
    xy = np.vstack([shapely.get_coordinates(shapely.geometry.shape(f["geometry"]))
                    for f in doc["features"]])
    assert west <= xy[:, 0].min() and xy[:, 0].max() <= east
    assert south <= xy[:, 1].min() and xy[:, 1].max() <= north
    # still the same tracts: rounding moved no vertex by more than half a unit of 1e-6
    back = gpd.read_file(folder / "tracts.geojson")
    moved = shapely.hausdorff_distance(back.geometry.to_numpy(), alabama.geometry.to_numpy())
    assert moved.max() < 1e-6


def test_clockwise_input_and_holes_are_reoriented(tmp_path):
    outer_cw = [(0, 0), (0, 1), (1, 1), (1, 0), (0, 0)]  # clockwise, as shapefiles store it
    hole_ccw = [(0.2, 0.2), (0.4, 0.2), (0.4, 0.4), (0.2, 0.4), (0.2, 0.2)]
    square = Polygon(outer_cw, [hole_ccw])
    assert shoelace(outer_cw) < 0 and shoelace(hole_ccw) > 0  # the input really is wrong-way
    gdf = gpd.GeoDataFrame({"geoid": ["01001000100"]}, geometry=[square], crs="EPSG:4326")
    doc = check_rfc7946(write_geojson_rfc7946(gdf, tmp_path / "t.geojson"))
    assert len(doc["features"][0]["geometry"]["coordinates"]) == 2  # the hole is kept


def test_rounding_to_6_decimals_keeps_polygons_valid(tmp_path):
    # A spike 4e-7 degrees from the bottom edge: rounding each vertex on its own puts it on
    # the edge, and the ring touches itself (invalid). The writer must repair that.
    spike = Polygon([(0, 0), (1, 0), (1, 1), (0.5, 4e-7), (0, 1), (0, 0)])
    assert spike.is_valid
    naive = Polygon(np.round(shapely.get_coordinates(spike), 6))
    assert not naive.is_valid  # the hazard is real
    projected_precise = Polygon([(10.123456789, 0), (10.2, 0), (10.2, 0.1), (10.123456789, 0.1)])
    gdf = gpd.GeoDataFrame({"geoid": ["01001000100", "01001000200"]},
                           geometry=[spike, projected_precise], crs="EPSG:4326")
    doc = check_rfc7946(write_geojson_rfc7946(gdf, tmp_path / "t.geojson"))
    assert doc["features"][1]["geometry"]["coordinates"][0][0][0] in (10.123457, 10.2)


def test_geojson_is_reprojected_to_wgs84(tmp_path, alabama):
    projected = alabama.head(5).to_crs("EPSG:5070")  # CONUS Albers, metres
    doc = check_rfc7946(write_geojson_rfc7946(projected, tmp_path / "t.geojson"))
    lon = [c[0] for f in doc["features"] for c in f["geometry"]["coordinates"][0]]
    assert -90 < min(lon) and max(lon) < -80  # degrees again, not metres


# ----------------------------------------------------------------------- CSV and Table Schema


def test_csv_reads_back_through_its_schema_with_string_geoids(release, alabama):
    folder, _ = release
    df = read_csv_with_schema(folder / "tracts.csv")
    assert pd.api.types.is_string_dtype(df["geoid"])
    assert list(df["geoid"]) == list(alabama["geoid"])
    assert df["geoid"].str.fullmatch(r"0\d{10}").all()  # leading zeros kept
    assert (df["state"] == "01").all() and df["county"].str.startswith("01").all()
    assert str(df["n"].dtype) == "Int64" and df["p25"].dtype == float
    # without the schema the leading zeros are gone: that is why the schema is there
    naive = pd.read_csv(folder / "tracts.csv")
    assert pd.api.types.is_integer_dtype(naive["geoid"])
    assert not naive["geoid"].astype(str).str.len().eq(11).any()


def test_table_schema_types_and_describes_every_column(release):
    folder, _ = release
    schema = json.loads((folder / CSV_SCHEMA_FILE).read_text())
    header = pd.read_csv(folder / "tracts.csv", nrows=0).columns.tolist()
    assert [f["name"] for f in schema["fields"]] == header
    for field in schema["fields"]:
        assert field["type"] in TABLE_SCHEMA_TYPES
        assert len(field["description"]) > 10
    geoid = schema["fields"][0]
    assert geoid["name"] == "geoid" and geoid["type"] == "string"
    assert geoid["constraints"] == {"required": True, "pattern": "^[0-9]{11}$",
                                    "minLength": 11, "maxLength": 11}
    assert schema["primaryKey"] == ["geoid", "cell"] and schema["missingValues"] == [""]


def test_a_csv_that_breaks_its_schema_is_refused(release, tmp_path):
    folder, _ = release
    text = (folder / "tracts.csv").read_text()
    (tmp_path / CSV_SCHEMA_FILE).write_text((folder / CSV_SCHEMA_FILE).read_text())
    bad = tmp_path / "tracts.csv"
    bad.write_text(text.replace("\n01001000100,", "\n1001000100,", 1))  # a zero lost
    with pytest.raises(PublishError, match="geoid"):
        read_csv_with_schema(bad)
    bad.write_text(text.replace(",released,", ",published,", 1))
    with pytest.raises(PublishError, match="status"):
        read_csv_with_schema(bad)


def test_an_undescribed_column_is_refused_before_publishing():
    with pytest.raises(PublishError, match="secret_column"):
        table_schema(["geoid", "secret_column"])


# --------------------------------------------------------------------------------- rounding


def test_released_values_are_rounded_as_the_manifest_states(release):
    folder, results = release
    df = read_csv_with_schema(folder / "tracts.csv")
    manifest = json.loads((folder / "manifest.json").read_text())
    rounding = manifest["rounding"]
    assert rounding["decimals"] == PUBLISHED_DECIMALS == 4
    assert set(rounding["to_nearest"]) == {"p25_raw", "p75_raw", "p25", "p75"}
    assert rounding["outwards"] == {"down": ["p25_lo", "p75_lo"],
                                    "up": ["p25_hi", "p75_hi", "p25_se", "p75_se",
                                           "p25_moe90", "p75_moe90"]}
    for col in ("p25", "p75", "p25_raw", "p75_raw", "p25_lo", "p25_hi", "p75_lo", "p75_hi"):
        literal = pd.read_csv(folder / "tracts.csv", dtype=str)[col].dropna()
        assert literal.map(decimals).max() <= 4, col
    released = df["status"] == "released"
    raw = results.set_index("geoid").loc[df["geoid"]]
    # to nearest: within half a unit; p25 is exactly the rounded raw value clipped
    assert np.allclose(df.loc[released, "p25_raw"], raw.loc[released.values, "p25_raw"],
                       rtol=0, atol=0.5e-4 + 1e-12)
    assert (df.loc[released, "p25"] == df.loc[released, "p25_raw"].clip(0, 1)).all()
    # outwards: the published interval contains the computed one and the point value
    for v in ("p25", "p75"):
        lo, hi = df.loc[released, f"{v}_lo"].to_numpy(), df.loc[released, f"{v}_hi"].to_numpy()
        assert (lo <= raw.loc[released.values, f"{v}_lo"].to_numpy()).all()
        assert (hi >= raw.loc[released.values, f"{v}_hi"].to_numpy()).all()
        assert (lo <= df.loc[released, v]).all() and (df.loc[released, v] <= hi).all()
        assert (lo >= 0).all() and (hi <= 1).all()
    # the spend is accounting, not a released value: never rounded
    assert df["epsilon_spent"].isin([0.0, 1.0]).all()


def test_rounding_edges():
    from dpatlas.publication.tract_files import round_released_values

    t = pd.DataFrame({"p25_raw": [0.12346, 0.99996, -0.00004], "p25_lo": [0.12349, 0.0, 0.5],
                      "p25_hi": [0.12341, 1.0, 0.50000001], "NoisyStats_p25": [0.33333] * 3})
    r = round_released_values(t)
    assert list(r["p25_lo"]) == [0.1234, 0.0, 0.5]  # down
    assert list(r["p25_hi"]) == [0.1235, 1.0, 0.5001]  # up
    assert list(r["p25_raw"]) == [0.1235, 1.0, 0.0]  # nearest
    assert not np.signbit(r["p25_raw"]).any()  # no "-0.0" in the files
    assert list(r["NoisyStats_p25"]) == [0.3333] * 3  # suite estimators too
    assert t["p25_raw"].iloc[0] == 0.12346  # the input is not modified


# ---------------------------------------------------------------------------- standard errors


def test_standard_errors_and_margins_in_every_file_are_the_interval_steps(release):
    """Issue 32: p25_se, p75_se in the GeoParquet, the GeoJSON and the CSV, the same values in
    each: the interval step's standard error of the total error rounded up to 4 decimals,
    empty exactly where there is no interval; p25_moe90 = 1.645·se rounded up beside it; the
    schema bounds them by the cap 0.5 and its margin."""
    folder, results = release
    parquet = gpd.read_parquet(folder / "tracts.parquet").set_index("geoid")
    geojson = gpd.read_file(folder / "tracts.geojson").set_index("geoid")
    csv = read_csv_with_schema(folder / "tracts.csv").set_index("geoid")
    raw = results.set_index("geoid")
    for v in ("p25", "p75"):
        col, moe = f"{v}_se", f"{v}_moe90"
        assert list(parquet.columns).index(col) > list(parquet.columns).index("p75_hi")
        assert list(parquet.columns).index(moe) == list(parquet.columns).index("p75_se") + \
            (1 if v == "p25" else 2)
        se = parquet[col]
        for other in (geojson, csv):
            for c in (col, moe):
                assert np.array_equal(other.loc[se.index, c].to_numpy(float),
                                      parquet[c].to_numpy(float), equal_nan=True), c
        has = parquet[f"{v}_lo"].notna()
        assert has.sum() > 0 and (se.notna() == has).all() and (parquet[moe].notna() == has).all()
        want = raw.loc[se.index, col]
        assert ((se[has] >= want[has] - 1e-12) & (se[has] <= want[has] + 1e-4)).all()
        assert (se[has].round(4) == se[has]).all()
        margin = np.ceil(1.6448536269514722 * se[has] * 1e4) / 1e4
        assert np.allclose(parquet.loc[has, moe], margin, atol=1e-9)
        literal = pd.read_csv(folder / "tracts.csv", dtype=str)[col].dropna()
        assert literal.map(decimals).max() <= 4
    schema = {f["name"]: f for f in json.loads((folder / CSV_SCHEMA_FILE).read_text())["fields"]}
    assert schema["p25_se"]["type"] == "number"
    assert schema["p25_se"]["constraints"] == {"minimum": 0, "maximum": 0.5}
    assert schema["p25_moe90"]["constraints"] == {"minimum": 0, "maximum": 0.8225}
    # the one estimand (issue 32): the SE of the total error around the tract expected outcome
    assert "standard deviation of the published value's total error" in \
        schema["p25_se"]["description"]
    assert "tract expected outcome" in schema["p25_se"]["description"]


def test_an_estimate_table_with_intervals_but_no_standard_errors_is_refused(alabama):
    """An internal table from before issue 32 (intervals, no SEs) is not published with
    made-up standard errors; without intervals there are none."""
    results = fake_results(alabama["geoid"], 3)
    with pytest.raises(PublishError, match="no \\['p25_se', 'p75_se'\\]"):
        assemble(results.drop(columns=["p25_se", "p75_se"]), alabama)
    bare = assemble(results.drop(columns=["p25_lo", "p25_hi", "p75_lo", "p75_hi",
                                          "p25_se", "p75_se"]), alabama)
    assert not {"p25_se", "p75_se", "p25_moe90", "p75_moe90"} & set(bare.columns)


# --------------------------------------------------------------------------------------- STAC


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network use in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_stac_catalogue_validates_and_lists_every_file(alabama, tmp_path, no_network):
    root = tmp_path / "pub"
    publish(root, "r1", alabama, "2026-03-01T12:00:00+00:00", seed=1)
    F.update_feed(root, "r1")
    publish(root, "r2", alabama, "2026-04-01T12:00:00+00:00", seed=2)
    F.update_feed(root, "r2")
    assert stac.validate_catalog(root) == 2

    collection = json.loads((root / stac.COLLECTION_FILE).read_text())
    assert collection["type"] == "Collection" and collection["id"] == stac.COLLECTION_ID
    items = {link["href"] for link in collection["links"] if link["rel"] == "item"}
    assert items == {"./catalog/r1.json", "./catalog/r2.json"}
    assert collection["extent"]["temporal"]["interval"] == [["2026-03-01T12:00:00Z",
                                                             "2026-04-01T12:00:00Z"]]
    item = json.loads((root / "catalog" / "r2.json").read_text())
    manifest = json.loads((root / "r2" / "manifest.json").read_text())
    assert item["id"] == "r2" and item["properties"]["datetime"] == "2026-04-01T12:00:00Z"
    assert item["properties"]["dpatlas:status"] == "published"
    assert stac.FILE_EXTENSION in item["stac_extensions"]
    assert set(item["assets"]) == set(manifest["files"]) | {"manifest.json"}
    assert set(PUBLISHED_FILES) <= set(manifest["files"])
    for name, asset in item["assets"].items():
        data = (root / "r2" / name).read_bytes()
        assert asset["href"] == f"../r2/{name}"
        assert (root / "catalog" / asset["href"]).resolve() == (root / "r2" / name).resolve()
        assert asset["file:checksum"] == "1220" + hashlib.sha256(data).hexdigest()
        assert asset["file:size"] == len(data)
        assert asset["type"] == stac.MEDIA_TYPES[Path(name).suffix]
    assert item["assets"]["tracts.geojson"]["type"] == "application/geo+json"
    # the footprint: the state's outline inside the bbox, which holds every tract
    assert item["bbox"] == manifest["extent"]["bbox"]
    footprint = shapely.geometry.shape(item["geometry"])
    union = shapely.union_all(alabama.geometry.to_numpy())
    assert footprint.is_valid and footprint.symmetric_difference(union).area < 0.01 * union.area
    west, south, east, north = item["bbox"]
    bounds = alabama.total_bounds
    assert west <= bounds[0] and south <= bounds[1] and bounds[2] <= east and bounds[3] <= north


def test_withdrawal_shows_in_the_stac_item(alabama, tmp_path, no_network):
    root = tmp_path / "pub"
    publish(root, "r1", alabama)
    F.update_feed(root, "r1")
    F.withdraw(root, "r1", "wrong boundaries", withdrawn_at="2026-05-01T00:00:00+00:00")
    item = json.loads((root / "catalog" / "r1.json").read_text())
    assert item["properties"]["dpatlas:status"] == "withdrawn"
    assert item["properties"]["dpatlas:withdrawn_reason"] == "wrong boundaries"
    assert item["properties"]["title"].endswith("(withdrawn)")
    assert stac.validate_catalog(root) == 1


def test_a_damaged_catalogue_does_not_validate(alabama, tmp_path, no_network):
    root = tmp_path / "pub"
    publish(root, "r1", alabama)
    F.update_feed(root, "r1")
    path = root / "catalog" / "r1.json"
    item = json.loads(path.read_text())
    item["assets"]["tracts.csv"]["file:checksum"] = "SHA256:" + "0" * 64  # not a multihash
    path.write_text(json.dumps(item))
    with pytest.raises(stac.StacError, match="file/v2.1.0"):
        stac.validate_catalog(root)
    del item["properties"]["datetime"]
    item["assets"]["tracts.csv"]["file:checksum"] = "12" + "0" * 66
    path.write_text(json.dumps(item))
    with pytest.raises(stac.StacError, match="item-spec"):
        stac.validate_catalog(root)


def test_multihash_refuses_what_is_not_a_sha256():
    assert stac.multihash_sha256("AB" * 32) == "1220" + "ab" * 32
    for bad in ("ab" * 31, "zz" * 32, ""):
        with pytest.raises(stac.StacError):
            stac.multihash_sha256(bad)


# ------------------------------------------------------------------ a real release, end to end


@pytest.mark.slow
def test_a_released_state_has_standard_files_and_a_valid_catalogue(tmp_path):
    """The release flow (primary profile, intervals on) on a synthetic Alabama: the files
    validate, the audit still passes, and the feed's STAC catalogue lists the release."""
    import io
    import os

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.testing.utilities import prefect_test_harness

    from tests.support.inputs import basic_release_config, write_config
    from dpatlas.audit.run import main as audit
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    data = tmp_path / "state"
    write_synthetic(data, ["01"], seed=8, params=StateParams(n_tracts=60, counties=4))
    config = write_config(tmp_path / "config.yaml", basic_release_config(data, tmp_path))
    with prefect_test_harness(server_startup_timeout=180):
        from flows.release import release as run_release

        folder = Path(run_release(str(config), "al1", 7))
    root = folder.parent
    check_rfc7946(folder / "tracts.geojson")
    df = read_csv_with_schema(folder / "tracts.csv")
    assert df["geoid"].str.startswith("01").all() and df["geoid"].str.len().eq(11).all()
    report = io.StringIO()
    assert audit(folder, report, allow_test=True) == 0, report.getvalue()  # a test root
    assert stac.validate_catalog(root) == 1
    item = json.loads((root / "catalog" / "al1.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert set(item["assets"]) == set(manifest["files"]) | {"manifest.json"}
    assert item["properties"]["dpatlas:guarantee"] == manifest["total_per_person"]
    assert manifest["rounding"]["decimals"] == 4
