"""The static maps of a release with the model (issue 33, item 2): p25_map.png (the model, as
the web map opens) and p25_map_direct.png beside it, each hashed in the manifest, an overview
asset of the STAC item, described in the codebook, and the release passes the audit."""

from __future__ import annotations

import io
import json

from dpatlas.audit import run as audit
from dpatlas.core.hashing import sha256_file
from dpatlas.publication import stac
from dpatlas.publication.codebook import CODEBOOK_FILE
from dpatlas.publication.static_map import DIRECT_MAP_FILE, MAP_FILE

from tests.integration.test_release_notice import released  # noqa: F401 (its fixture)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_a_model_release_publishes_the_model_map_and_the_direct_one_listed_everywhere(
        released):  # noqa: F811
    manifest = json.loads((released / "manifest.json").read_text())
    for name in (MAP_FILE, DIRECT_MAP_FILE):
        assert (released / name).read_bytes()[:8] == PNG_SIGNATURE
        assert manifest["files"][name]["sha256"] == sha256_file(released / name)
    assert sha256_file(released / MAP_FILE) != sha256_file(released / DIRECT_MAP_FILE)
    item = json.loads((released.parent / stac.ITEMS_DIR / "r1.json").read_text())
    assets = {a["href"].rsplit("/", 1)[1]: a for a in item["assets"].values()}
    for name in (MAP_FILE, DIRECT_MAP_FILE):
        assert assets[name]["roles"] == ["overview"] and assets[name]["type"] == "image/png"
    assert assets[DIRECT_MAP_FILE]["title"] == "Map of p25: direct estimates"
    assert "model-based" in assets[MAP_FILE]["title"]
    readme = (released / CODEBOOK_FILE).read_text()
    maps = readme.split("## Maps", 1)[1].split("\n## ", 1)[0]
    assert f"`{MAP_FILE}`" in maps and f"`{DIRECT_MAP_FILE}`" in maps
    assert "spans more than one colour class" in maps
    out = io.StringIO()
    assert audit.main(released, out, allow_test=True) == 0, out.getvalue()
