"""`dpatlas serve` serves a release's README.md codebook (issue 33, item 1): ".md" was no
published file type, so every root with a release since the codebook was refused whole."""

from __future__ import annotations

from dpatlas.publication import feed as F
from dpatlas.publication.publish_root import check_publish_root, unpublished_reason
from tests.integration.test_feed import make_release


def test_a_root_whose_release_has_its_codebook_is_served(tmp_path):
    folder = make_release(tmp_path, "r1")
    (folder / "README.md").write_text("# Release r1\n")
    F.update_feed(tmp_path, "r1")
    assert unpublished_reason(tmp_path, "r1/README.md") is None
    check_publish_root(tmp_path)  # refused: "README.md (not a published file type (.md))"
