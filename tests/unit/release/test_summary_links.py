"""The release-summary artifact (issue 33, item 5): its links open from the Prefect UI. With
publish.base_url they are absolute under it; without one there is no link (a link relative
to the publish root 404s in the UI) and the summary says which folder holds the files."""

from __future__ import annotations

import re

import pytest

from dpatlas.core.config import ConfigError, fingerprint, parse_config, public_config
from dpatlas.release.outcome import BudgetState, ReleaseOutcome
from tasks.report import summary_markdown

OUTCOME = ReleaseOutcome(
    release_id="r-1", status="published", folder="/srv/x/releases/r-1",
    published_at="2026-11-29", by_status={"published": 3}, by_mechanism={"noisy": 3},
    epsilon_per_person=1.0, delta_per_person=0.0, files=["tracts.csv", "README.md"],
    budget=BudgetState(dataset="d", spent_epsilon=1.0, spent_delta=0.0))


def _links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)]*)\)", markdown)


def test_links_are_absolute_under_the_base_url():
    text = summary_markdown(OUTCOME, "https://example.org/atlas/")
    assert sorted(_links(text)) == ["https://example.org/atlas/r-1/README.md",
                                    "https://example.org/atlas/r-1/tracts.csv"]


def test_without_a_base_url_no_link_and_the_folder_is_named():
    text = summary_markdown(OUTCOME)
    assert _links(text) == []
    assert "folder `r-1/` of the publish root" in text and "`tracts.csv`" in text
    assert "/srv" not in text  # never a path of the machine that ran it


def _config(publish: dict):
    return parse_config({"input": {"path": "x"}, "boundaries": {"path": "y"},
                         "selection": {"rule": "public", "threshold": 3},
                         "publish": publish})


def test_the_base_url_is_a_web_folder_outside_the_hash_and_config_json():
    cfg = _config({"base_url": "https://example.org/atlas"})
    assert cfg.publish.base_url == "https://example.org/atlas/"
    assert fingerprint(cfg) == fingerprint(_config({}))
    assert "base_url" not in public_config(cfg)["publish"]  # the audit refuses URLs there
    for bad in ("example.org/atlas", "file:///srv/atlas", "https://a b/"):
        with pytest.raises((ConfigError, ValueError)):
            _config({"base_url": bad})
