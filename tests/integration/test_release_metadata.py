"""What users and catalogues read about a release (issue 21, item 5): the PMTiles archive's
name, description and attribution; the Atom enclosures' media types; STAC roles, licence and
citation; GeoJSON feature ids; the Frictionless datapackage.json (validated by `frictionless
validate`); the config keys publish.license and publish.citation."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

from dpatlas.core.config import ConfigError, fingerprint, parse_config, public_config
from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.publication import feed as F
from dpatlas.publication import stac, tiles
from dpatlas.publication.datapackage import DATAPACKAGE_FILE
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.publication.geojson import feature_ids
from dpatlas.publication.cell_stream import write_release
from dpatlas.publication.tract_files import assemble

from tests.integration.test_publication_files import fake_results

ATOM = "{http://www.w3.org/2005/Atom}"
CITATION = "Statistics Office (2026). Mobility by tract, release m1. doi:10.0000/example"
CONFIG = {"release": "m1", "ledger": {"dataset": "state-17"},
          "publish": {"mode": "public", "license": "CC-BY-4.0", "citation": CITATION}}
WEB_MAP_PARTS = (".js", ".css", ".txt", ".html")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A publish root with release m1 (files as publish writes them, manifest with the
    licence and citation build_manifest adds) listed in the feed."""
    geoids, _ = tract_geoids("01", 40, 3)
    boundaries = synth_boundaries(list(geoids), seed=3)
    table = assemble(fake_results(boundaries["geoid"]), boundaries)
    root = tmp_path_factory.mktemp("pub")
    manifest = {"release_id": "m1", "published": "2026-11-26", "license": "CC-BY-4.0",
                "citation": CITATION}
    write_release(table, manifest, root, "m1", config=CONFIG)
    F.update_feed(root, "m1")
    return root


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("network use in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)


# ----------------------------------------------------------------------------------- PMTiles


def test_the_tiles_are_named_described_and_attributed_from_the_release(root):
    meta = tiles.read_metadata(root / "m1" / tiles.TILES_FILE)
    assert meta["name"] == "dpatlas release m1: census tracts"
    assert "Differentially private" in meta["description"]
    assert "release m1" in meta["description"] and "state-17" in meta["description"]
    assert "differentially private release" in meta["description"]
    assert meta["attribution"] == ("dpatlas release m1 (state-17), licence CC-BY-4.0. "
                                   f"Cite: {CITATION}")
    assert not any("partial" in meta[k] or ".pmtiles" in meta[k]
                   for k in ("name", "description", "attribution"))


def test_level_archives_and_test_releases_say_what_they_are():
    county = tiles.release_tile_text("m1", {"publish": {"mode": "test"}}, "counties")
    assert county.name == "dpatlas release m1: counties" and "by county" in county.description
    assert county.description.endswith("TEST RELEASE: NOT FOR USE.")
    assert county.attribution == "dpatlas release m1 (default), licence CC-BY-4.0"
    args = tiles.tippecanoe_arguments(Path("c.geojson"), Path("c.pmtiles"), layer="counties",
                                      text=county)
    assert f"--name={county.name}" in args and f"--attribution={county.attribution}" in args
    # without the release's text the archive is still never named after the staging file
    assert "--name=tracts" in tiles.tippecanoe_arguments(Path("t.geojson"), Path(".t.partial"))


# -------------------------------------------------------------------------------------- Atom


def test_atom_enclosures_are_downloads_with_media_types(root):
    entry = ET.parse(root / F.FEED_ATOM).getroot().find(f"{ATOM}entry")
    enclosures = {ln.get("title"): ln for ln in entry.findall(f"{ATOM}link")
                  if ln.get("rel") == "enclosure"}
    files = json.loads((root / "m1" / "manifest.json").read_text())["files"]
    assert any(name.endswith(WEB_MAP_PARTS) for name in files)  # the page is published...
    assert not [n for n in enclosures if n.endswith(WEB_MAP_PARTS) or n == "legend.json"]
    expected = {"tracts.csv": "text/csv", "tracts.parquet": "application/vnd.apache.parquet",
                "tracts.geojson": "application/geo+json", "tracts.schema.json":
                "application/json", "tracts.pmtiles": "application/vnd.pmtiles",
                "p25_map.png": "image/png", "config.json": "application/json",
                DATAPACKAGE_FILE: "application/json", "README.md": "text/markdown"}
    assert {n: ln.get("type") for n, ln in enclosures.items()} == expected  # ...not enclosed
    assert all(int(ln.get("length")) == files[n]["bytes"] for n, ln in enclosures.items())


# -------------------------------------------------------------------------------------- STAC


def test_stac_roles_licence_and_citation(root, no_network):
    assert stac.validate_catalog(root) == 1  # offline, the sci extension restated
    item = json.loads((root / stac.ITEMS_DIR / "m1.json").read_text())
    roles = {name: asset["roles"] for name, asset in item["assets"].items()}
    assert roles["tracts.csv"] == roles["tracts.parquet"] == roles["tracts.geojson"] == ["data"]
    for name in ("tracts.schema.json", "manifest.json", DATAPACKAGE_FILE, "config.json"):
        assert roles[name] == ["metadata"], name
    assert roles["p25_map.png"] == ["overview"]
    assert "visual" in roles["tracts.pmtiles"] and roles["index.html"] == ["visual"]
    assert not [n for n, r in roles.items() if n.endswith(WEB_MAP_PARTS) and "data" in r]
    assert item["properties"]["license"] == "CC-BY-4.0"
    assert item["properties"]["sci:citation"] == CITATION
    assert stac.SCI_EXTENSION in item["stac_extensions"]
    licence = [ln for ln in item["links"] if ln["rel"] == "license"]
    assert [ln["href"] for ln in licence] == ["https://spdx.org/licenses/CC-BY-4.0.html"]
    collection = json.loads((root / stac.COLLECTION_FILE).read_text())
    assert collection["license"] == "CC-BY-4.0"
    assert any(ln["rel"] == "license" for ln in collection["links"])


def test_a_collection_of_mixed_or_unstated_licences_says_other(tmp_path):
    manifests = {"a": {"license": "CC0-1.0"}, "b": {"license": "CC-BY-4.0"}, "c": {}}
    for rid, extra in manifests.items():
        (tmp_path / rid).mkdir()
        (tmp_path / rid / "manifest.json").write_text(json.dumps(
            {"release_id": rid, "published": "2026-11-26", **extra}))
    entries = [{"release_id": rid, "files": {}} for rid in manifests]
    assert stac.build_catalog(tmp_path, entries)["collection.json"]["license"] == "other"
    docs = stac.build_catalog(tmp_path, entries[:1])
    assert docs["collection.json"]["license"] == "CC0-1.0"
    assert "sci:citation" not in docs["catalog/a.json"]["properties"]  # none stated


# ------------------------------------------------------------------------------------ GeoJSON


def test_geojson_features_are_identified_by_geoid(root):
    doc = json.loads((root / "m1" / "tracts.geojson").read_text())
    ids = [f["id"] for f in doc["features"]]
    assert ids == [f["properties"]["geoid"] for f in doc["features"]]
    assert len(set(ids)) == len(ids) and all(i.startswith("01") and len(i) == 11 for i in ids)


def test_feature_ids_name_one_feature_when_a_geoid_has_several_cells():
    props = pd.DataFrame({"geoid": ["01001000100", "01001000100", "01001000200"],
                          "cell": ["men", "women", "men"]})
    assert feature_ids(props) == ["01001000100/men", "01001000100/women", "01001000200/men"]
    assert feature_ids(props.iloc[[0, 2]]) == ["01001000100", "01001000200"]
    assert feature_ids(pd.DataFrame({"name": ["x"]})) is None


# ------------------------------------------------------------------------------ datapackage


def frictionless_validate(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "frictionless", "validate", "--json",
                           str(path)], capture_output=True, text=True, timeout=300)
    report = json.loads(done.stdout)
    assert (done.returncode == 0) == report["valid"], done.stderr
    return report


def test_datapackage_describes_every_table_and_frictionless_validates_it(root):
    folder = root / "m1"
    package = json.loads((folder / DATAPACKAGE_FILE).read_text())
    report = frictionless_validate(folder / DATAPACKAGE_FILE)
    assert report["valid"], json.dumps(report["tasks"], indent=1)[:3000]
    assert [t["name"] for t in report["tasks"]] == ["tracts", "tracts-geoparquet"]
    assert report["tasks"][0]["stats"]["rows"] == len(pd.read_csv(folder / "tracts.csv"))
    csv, parquet = package["resources"]
    schema = json.loads((folder / "tracts.schema.json").read_text())
    assert csv["path"] == "tracts.csv" and csv["schema"] == schema
    assert all(f.get("description") for f in csv["schema"]["fields"])
    assert parquet["mediatype"] == "application/vnd.apache.parquet"
    assert [f["name"] for f in parquet["schema"]["fields"]] == [
        *(f["name"] for f in schema["fields"]), "geometry"]
    assert package["licenses"][0]["name"] == "CC-BY-4.0"
    assert package["citation"] == CITATION and package["name"] == "dpatlas-m1"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert DATAPACKAGE_FILE in manifest["files"]


def test_frictionless_finds_a_csv_that_breaks_the_package(root, tmp_path):
    import shutil

    copy = tmp_path / "m1"
    shutil.copytree(root / "m1", copy)
    table = pd.read_csv(copy / "tracts.csv", dtype=str, keep_default_na=False)
    table.loc[0, "geoid"] = "1001000100"  # a GEOID read as a number: 10 digits
    table.to_csv(copy / "tracts.csv", index=False)
    report = frictionless_validate(copy / DATAPACKAGE_FILE)
    assert not report["valid"]
    errors = {(e["type"], e.get("fieldName")) for t in report["tasks"] for e in t["errors"]}
    assert ("constraint-error", "geoid") in errors, errors  # the schema's pattern and length
    assert ("hash-count", None) in errors, errors          # and the file's sha256


# ---------------------------------------------------------------------------------- config


def _config(tmp_path: Path, **publish):
    return parse_config({
        "input": {"path": str(tmp_path / "in.parquet")},
        "boundaries": {"path": str(tmp_path / "tracts.parquet")},
        "selection": {"rule": "dp", "threshold": 3.0},
        "publish": {"root": str(tmp_path / "releases"), **publish}}, base=tmp_path)


def test_licence_and_citation_are_published_but_do_not_rekey_a_config(tmp_path):
    plain = _config(tmp_path)
    assert plain.publish.license == "CC-BY-4.0" and plain.publish.citation is None
    stated = _config(tmp_path, license="CC0-1.0", citation=CITATION)
    assert fingerprint(stated) == fingerprint(plain)  # resumes and old hashes unchanged
    assert public_config(stated)["publish"]["license"] == "CC0-1.0"
    assert public_config(stated)["publish"]["citation"] == CITATION


@pytest.mark.parametrize("publish, word", [({"license": "CC BY 4.0"}, "license"),
                                           ({"citation": "https://doi.org/10.1/x"}, "citation"),
                                           ({"citation": "/home/me/cite.txt"}, "citation")])
def test_unusable_licence_or_citation_is_a_config_error(tmp_path, publish, word):
    with pytest.raises(ConfigError, match=word):
        _config(tmp_path, **publish)
