"""CITATION.cff and CHANGELOG.md at the repository root (issue 21, item 5)."""

from __future__ import annotations

import re

import yaml

from tests.support.paths import REPO

# Citation File Format 1.2.0: the keys a file must have, and the keys it may have.
CFF_REQUIRED = {"cff-version", "message", "title", "authors"}
CFF_KEYS = CFF_REQUIRED | {
    "abstract", "commit", "contact", "date-released", "doi", "identifiers", "keywords",
    "license", "license-url", "preferred-citation", "references", "repository",
    "repository-artifact", "repository-code", "type", "url", "version"}
CHANGE_TYPES = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_citation_cff_is_valid_cff_1_2_0():
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert CFF_REQUIRED <= set(cff) and set(cff) <= CFF_KEYS, set(cff) ^ CFF_KEYS
    assert cff["cff-version"] == "1.2.0"
    assert cff["type"] in ("software", "dataset")
    assert isinstance(cff["message"], str) and cff["message"].strip()
    assert isinstance(cff["authors"], list) and cff["authors"]
    for author in cff["authors"]:  # a person (family-names) or an entity (name)
        assert isinstance(author, dict) and ("family-names" in author or "name" in author)
    assert str(cff["version"]) == re.search(r'^version = "([^"]+)"',
                                            (REPO / "pyproject.toml").read_text(), re.M)[1]


def test_changelog_follows_keep_a_changelog():
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "# Changelog" and "keepachangelog.com" in text
    versions = [ln for ln in lines if ln.startswith("## ")]
    assert versions[0] == "## [Unreleased]"
    for heading in versions[1:]:
        assert re.fullmatch(r"## \[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}.*", heading), heading
    sections = {ln[4:] for ln in lines if ln.startswith("### ")}
    assert sections and sections <= CHANGE_TYPES, sections - CHANGE_TYPES
    # every section holds entries
    for block in re.split(r"^### .*$", text, flags=re.M)[1:]:
        assert re.search(r"^- \S", block.split("\n## ")[0], re.M), block[:80]


# A markdown link or image `[text](target)` and an HTML `<img src="target">`; fenced code and
# code spans are removed first, since their brackets are code, not links.
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|<img\s[^>]*src=\"([^\"]+)\"")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def relative_links(path):
    text = CODE_SPAN.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    for match in MARKDOWN_LINK.finditer(text):
        target = (match[1] or match[2]).split("#")[0]
        if target and not re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:
            yield target


def test_relative_markdown_links_point_to_existing_files():
    """Text moved from the README into docs/ (issue 33) keeps links that open."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = [f"{page.relative_to(REPO)}: {target}" for page in pages
              for target in relative_links(page) if not (page.parent / target).exists()]
    assert not broken, broken
    assert "docs/README.md" in set(relative_links(REPO / "README.md"))


def test_readme_is_short_and_docs_index_lists_every_document():
    """A newcomer reads the README in minutes (issue 33); docs/README.md indexes the rest."""
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) < 200
    indexed = {target.rstrip("/") for target in relative_links(REPO / "docs" / "README.md")}
    docs = {p.name for p in (REPO / "docs").iterdir()
            if (p.suffix == ".md" and p.name != "README.md")
            or (p.is_dir() and p.name.startswith("evaluation"))}
    assert docs <= indexed, docs - indexed


def test_the_national_doc_says_the_tracts_polygons_are_tiled_once_and_the_values_apart():
    """docs/national.md quoted `tracts.pmtiles` sizes as the national release's; since issue 35
    `tracts.pmtiles` holds the polygons alone and each cell's values are documents of their
    own (tract_values.py)."""
    from dpatlas.publication.tract_values import VALUES_FOLDER

    text = (REPO / "docs" / "national.md").read_text(encoding="utf-8")
    assert f"`{VALUES_FOLDER}/<cell>/<state>.json`" in text
    assert "the polygons alone" in text
