"""Every output explains itself (issue 33, item 1): publish.title, description, measure,
notice and contact reach the map's config, the PNG's title, the feed, STAC, datapackage.json
and the README.md codebook, which lists every column of every published table and passes the
audit; the demo sets them all, its notice saying the data are synthetic."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")

from prefect.testing.utilities import prefect_test_harness  # noqa: E402

from dpatlas.audit import run as audit  # noqa: E402
from dpatlas.cli.demo import DEMO_METADATA, DEMO_NOTICE, release_config  # noqa: E402
from dpatlas.core.config import READER_METADATA_KEYS, parse_config  # noqa: E402
from dpatlas.core.hashing import sha256_file  # noqa: E402
from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic  # noqa: E402
from dpatlas.publication import stac  # noqa: E402
from dpatlas.publication.codebook import CODEBOOK_FILE  # noqa: E402
from dpatlas.publication.png_map import overview_title  # noqa: E402

from tests.support.inputs import levels_release_config, write_config  # noqa: E402

TABLES = ("tracts", "counties", "states")
CONTACT = DEMO_METADATA["contact"]


@pytest.fixture(scope="module")
def released(tmp_path_factory) -> Path:
    """A seeded release of a 90-tract, 3-county state with all three levels, the model and
    the demo's reader metadata."""
    tmp = tmp_path_factory.mktemp("notice")
    write_synthetic(tmp / "data", ["17"], seed=5, params=StateParams(n_tracts=90, counties=3))
    cfg = levels_release_config(tmp, **DEMO_METADATA)
    with prefect_test_harness(server_startup_timeout=180):
        from flows.release import release

        outcome = release(str(write_config(tmp / "config.yaml", cfg)), "r1", 11)
    assert outcome.status == "published"
    return Path(outcome.folder)


def test_the_demo_sets_every_reader_field_and_says_it_is_synthetic(tmp_path):
    cfg = release_config(tmp_path / "data", tmp_path / "releases")
    assert all(cfg["publish"].get(k) for k in (*READER_METADATA_KEYS, "citation"))
    assert "SYNTHETIC" in DEMO_NOTICE and "no real people" in DEMO_NOTICE
    # metadata only: the config's hash is the one without them
    from dpatlas.core.config import fingerprint
    bare = {**cfg, "publish": {"root": cfg["publish"]["root"]}}
    assert fingerprint(parse_config(cfg, tmp_path)) == fingerprint(parse_config(bare, tmp_path))


def test_the_codebook_lists_every_column_of_every_published_table(released):
    readme = (released / CODEBOOK_FILE).read_text()
    for stem in TABLES:
        schema = json.loads((released / f"{stem}.schema.json").read_text())
        csv_columns = list(pd.read_csv(released / f"{stem}.csv", nrows=0).columns)
        assert [f["name"] for f in schema["fields"]] == csv_columns
        section = readme.split(f"### {stem}.csv", 1)[1].split("\n### ", 1)[0]
        for field in schema["fields"]:
            assert f"| `{field['name']}` | {field['type']} |" in section, (stem, field["name"])
        assert f'pd.read_csv("{stem}.csv", dtype={{' in section
    assert '"geoid": str' in readme and '"county": str' in readme


def test_the_codebook_says_what_the_release_is_how_to_read_it_and_cite_it(released):
    readme = (released / CODEBOOK_FILE).read_text()
    assert readme.startswith(f"# {DEMO_METADATA['title']}\n")
    for key in ("notice", "description", "measure", "citation", "contact"):
        assert DEMO_METADATA[key] in readme, key
    assert "tract expected outcome" in readme and "90% margin of error" in readme
    assert "Licence: CC-BY-4.0" in readme and "Suppressed" in readme


def test_the_codebook_is_hashed_in_the_manifest_and_the_release_passes_the_audit(released):
    manifest = json.loads((released / "manifest.json").read_text())
    assert manifest["files"][CODEBOOK_FILE]["sha256"] == sha256_file(released / CODEBOOK_FILE)
    out = io.StringIO()
    assert audit.main(released, out, allow_test=True) == 0, out.getvalue()


def test_the_notice_reaches_the_map_feed_stac_and_datapackage(released):
    # the web map reads the release's config.json (its publish section) for its panel
    served = json.loads((released / "config.json").read_text())["publish"]
    assert {k: served[k] for k in READER_METADATA_KEYS} == {
        k: DEMO_METADATA[k] for k in READER_METADATA_KEYS}
    package = json.loads((released / "datapackage.json").read_text())
    assert package["title"] == DEMO_METADATA["title"]
    assert package["description"].startswith(DEMO_NOTICE)
    assert package["contact"] == CONTACT
    root = released.parent
    entry = json.loads((root / "feed.json").read_text())["items"][0]["_dpatlas"]
    assert entry["title"] == DEMO_METADATA["title"] and entry["notice"] == DEMO_NOTICE
    item = json.loads((root / stac.ITEMS_DIR / "r1.json").read_text())
    assert item["properties"]["title"] == DEMO_METADATA["title"]
    assert item["properties"]["description"].startswith(DEMO_NOTICE)


def test_the_png_title_carries_the_release_title_and_the_notice():
    shown = pd.DataFrame({"cell": ["all"] * 3, "status": ["released"] * 2 + ["suppressed"]})
    title = overview_title("r1", shown, several_cells=False, publish=DEMO_METADATA)
    lines = title.split("\n")
    assert lines[0] == DEMO_METADATA["title"]
    assert lines[1] == "Release r1: p25 by tract (2 of 3 released)"
    assert " ".join(lines[2:]) == DEMO_NOTICE
    assert overview_title("r1", shown, several_cells=False) == lines[1]


def test_a_demo_folder_written_before_the_reader_metadata_is_still_the_demos(tmp_path):
    import yaml

    from dpatlas.cli.demo import _earlier_demo

    cfg = release_config(tmp_path / "data", tmp_path / "releases", relative_to=tmp_path)
    cfg["publish"] = {"root": cfg["publish"]["root"]}  # as the demo wrote it before issue 33
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert _earlier_demo(tmp_path, ["config.yaml", "releases"])


def test_the_notice_reaches_every_tile_archive_and_the_json_feed_item(released):
    """Issue 33, item 1: the tiles' attribution (what a map shows of its data's source) and
    the JSON Feed item a feed reader shows carry the notice."""
    from dpatlas.publication import tiles

    archives = sorted(released.glob("*.pmtiles"))
    assert [p.name for p in archives] == ["counties.pmtiles", "states.pmtiles",
                                          "tracts.pmtiles"]
    for archive in archives:
        attribution = tiles.read_metadata(archive)["attribution"]
        assert attribution.startswith(DEMO_NOTICE.rstrip(" .")), (archive.name, attribution)
        assert "licence CC-BY-4.0" in attribution
    item = json.loads((released.parent / "feed.json").read_text())["items"][0]
    assert item["title"] == DEMO_METADATA["title"]
    assert item["content_text"].startswith(DEMO_NOTICE)


def test_the_example_config_for_synth_data_says_they_are_synthetic():
    """`dpatlas synth` + `dpatlas config example` (the README's steps): the release's notice
    says the data are synthetic, as the demo's does (issue 33, item 1)."""
    import yaml

    from dpatlas.core.config import EXAMPLE

    notice = parse_config(yaml.safe_load(EXAMPLE)).publish.notice
    assert notice is not None and "SYNTHETIC" in notice and "no real people" in notice
