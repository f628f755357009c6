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
