"""Issue 21 item 2: the release's validation report (dpatlas/release/validation_report.py), the
offline pages written beside Great Expectations' Data Docs from the same validation runs.

The browser test (a real release opened from file:// in Chromium) is
tests/system/test_validation_report.py."""

from __future__ import annotations

import json
import os
import re
import stat

import pandas as pd
import pytest

from dpatlas.release import validation_report as R
from dpatlas.release.validate import ValidationFailed, apply_policy


def _frame(x: list[float]) -> pd.DataFrame:
    n = len(x)
    return pd.DataFrame({"row": range(n), "geoid": ["17001000100"] * n, "x": x,
                         "y": [0.5] * n, "cell": "all"})


@pytest.fixture
def validated(tmp_path):
    """Two input checks of one release, as the flow makes them: partition 17 passes, partition
    18 (a rank of 1.7) fails under policy fail."""
    internal = tmp_path / "internal" / "r1"
    old = os.umask(0o000)  # the report must be private whatever the umask
    try:
        _, report = apply_policy(_frame([0.2, 0.4, 0.6]), "fail", "17", internal,
                                 source="/data/microdata")
        with pytest.raises(ValidationFailed) as failed:
            apply_policy(_frame([0.2, 1.7, 0.6]), "fail", "18", internal,
                         source="/data/microdata")
    finally:
        os.umask(old)
    return internal, report, str(failed.value)


def test_every_run_is_listed_with_its_asset_outcome_and_failing_expectations(validated):
    internal, report, message = validated
    index = R.report_index(internal)
    assert report.docs_index == index and index.is_file()
    assert f"validation report: {index}" in message  # the refusal points at the offline page
    page = index.read_text()
    rows = re.findall(r'<tr class="run" data-run="([^"]+)" data-success="(\w+)">', page)
    assert rows == [("input-17", "true"), ("input-18", "false")]
    # as many runs as Great Expectations recorded in the release's Data Docs
    gx_runs = list((internal / "data_docs" / "validations").glob("*/*"))
    assert len(gx_runs) == len(rows) == 2
    assert "input partition 17 (state 17) of /data/microdata" in page
    assert "input partition 18 (state 18) of /data/microdata" in page
    assert "2 validation run(s): 1 passed, 1 failed." in page
    failing = page[page.index('data-run="input-18"'):].replace("<wbr>", "")
    assert "<code>expect_column_values_to_be_between</code> on <code>x</code>: 1 value(s)" \
        in failing
    assert "None" not in page


def test_a_run_page_shows_every_expectation_and_names_the_asset(validated):
    internal, _, _ = validated
    runs = R.load_runs(internal)
    failed = next(r for r in runs if r["run_name"] == "input-18")
    html = (R.report_dir(internal) / R.RUNS_DIR / f"{failed['run_id']}.html").read_text()
    assert re.search(r'<td id="asset">input partition 18 \(state 18\) of /data/microdata</td>',
                     html)
    from data_contracts import load_suite

    # every expectation of the suite without the person_id one (the frame has no person_id)
    expected = len(load_suite("input_microdata").expectations) - 1
    assert html.count('<tr class="expectation"') == failed["evaluated"] == expected
    assert html.count('data-success="false"') == 1 and failed["met"] == expected - 1
    assert "1.7" in html  # the offending value is quoted (hence private files)


def test_pages_need_no_network_and_carry_no_marketing(validated):
    internal, _, _ = validated
    for page in R.report_dir(internal).rglob("*.html"):
        text = page.read_text()
        assert not re.search(r"(?:src|href)=\"(?:https?:)?//", text), page
        assert "http" not in text and "<script" not in text, page
        assert "newsletter" not in text.lower(), page


def test_the_report_is_private(validated):
    internal, _, _ = validated
    folder = R.report_dir(internal)
    modes = {p.relative_to(folder): stat.S_IMODE(p.stat().st_mode)
             for p in [folder, *folder.rglob("*")]}
    assert len(modes) == 1 + 1 + 1 + 2 * 2  # folder, index, runs/, a record and a page per run
    for path, got in modes.items():
        want = 0o700 if (folder / path).is_dir() else 0o600
        assert got == want, (path, oct(got))


def test_data_docs_are_rendered_once_for_all_partitions_not_after_each(tmp_path, monkeypatch):
    """Issue 22 item 2: a partition's check stores its run and renders no site (GX rebuilt the
    whole site after every partition: quadratic in the number of states); one
    ``write_release_docs`` after the last partition renders a site listing every run."""
    from data_contracts import _context
    from dpatlas.release.validate import write_release_docs

    internal = tmp_path / "internal" / "r1"
    builds = []
    real_build = _context.FileDataContext.build_data_docs

    def counted(self, *args, **kwargs):
        builds.append(kwargs.get("resource_identifiers"))
        return real_build(self, *args, **kwargs)

    monkeypatch.setattr(_context.FileDataContext, "build_data_docs", counted)
    for state in ("17", "18", "19"):
        apply_policy(_frame([0.2, 0.4, 0.6]), "fail", state, internal, source="/data/microdata")
    assert builds == [] and not (internal / "data_docs").exists()
    (stored,) = (internal / "gx" / "gx" / "checkpoints").glob("*.json")
    assert json.loads(stored.read_text())["actions"] == []  # no site rebuild per run
    index = write_release_docs(internal)
    assert builds == [None]  # one full build, not one per run
    assert index == (internal / "data_docs").resolve() / "index.html"
    runs = sorted(p.name for p in (internal / "data_docs" / "validations").glob("*/*"))
    assert runs == ["input-17", "input-18", "input-19"]
    site = index.read_text()
    assert all(run in site for run in runs)
    report = R.report_index(internal).read_text()
    assert [r for r, _ in re.findall(r'data-run="([^"]+)" data-success="(\w+)"', report)] == runs
    modes = {stat.S_IMODE(p.stat().st_mode) for p in (internal / "data_docs").rglob("*")}
    assert modes <= {0o700, 0o600}  # sealed like the rest of the internal folder
