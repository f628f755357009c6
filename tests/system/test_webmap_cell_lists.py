"""The web map of a release of several cells reads what every cell has, not only the shown
cell's archive: the statuses its legend lists and the mechanisms it knows come from the
manifest's counts (each archive's tilestats know its own cell alone), and the downloads list
``p25_map_direct.png`` when the manifest's files hold it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from dpatlas.core.hashing import sha256_file
from dpatlas.evaluation.synthetic_boundaries import synth_boundaries
from dpatlas.evaluation.synthetic_input import tract_geoids
from dpatlas.publication import feed as F
from dpatlas.publication import tract_files as P
from dpatlas.publication import webmap as W
from dpatlas.publication.cell_stream import TractSummary, write_release
from dpatlas.publication.serve import serve_in_thread
from dpatlas.publication.static_map import DIRECT_MAP_FILE, MAP_FILE
from tests.support.browser import browser  # noqa: F401 (the shared Chromium fixture)
from tests.system.test_webmap import Page, _fetch_status, _results

RELEASE = "20261129T000000Z-cell-lists"
CELLS = ["outcome-1", "outcome-2"]


def _first_cell_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The first cell: no failed tract (they are suppressed) and one mechanism only."""
    failed = frame["status"] == "failed"
    frame.loc[failed, ["status", "reason", "n", "epsilon_spent", "delta_spent"]] = \
        ["suppressed", "n < min_n", 1, 0.0, 0.0]
    frame["mechanism"] = "NoisyStats"
    return frame


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    boundaries = synth_boundaries(tract_geoids("17", 60, 3)[0], seed=0)
    root = tmp_path_factory.mktemp("cell-lists") / "releases"
    root.mkdir()
    first = _first_cell_rows(_results(boundaries["geoid"].to_numpy(), 500))
    second = _results(boundaries["geoid"].to_numpy(), 501)
    table = P.assemble(pd.concat([first.assign(cell=CELLS[0]), second.assign(cell=CELLS[1])],
                                 ignore_index=True), boundaries)
    # The counts build_manifest publishes (manifest.counts, over every cell).
    manifest = {"release_id": RELEASE, "published": "2026-11-29",
                "counts": TractSummary.of(table).counts()}
    config = {"intervals": {"enabled": True, "level": 0.95, "share": 0.25}}
    folder = write_release(table, manifest, root, RELEASE, config=config)
    # As a release with model values publishes it: the direct map beside p25_map.png.
    shutil.copyfile(folder / MAP_FILE, folder / DIRECT_MAP_FILE)
    m = json.loads((folder / "manifest.json").read_text())
    m["files"][DIRECT_MAP_FILE] = {"sha256": sha256_file(folder / DIRECT_MAP_FILE),
                                   "bytes": (folder / DIRECT_MAP_FILE).stat().st_size}
    (folder / "manifest.json").write_text(json.dumps(m, indent=2))
    F.update_feed(root, RELEASE)
    W.write_feed_map(root)
    httpd, base = serve_in_thread(root)
    yield base, folder, table
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.slow
@pytest.mark.browser
def test_the_legend_lists_every_cells_statuses_and_the_state_every_cells_mechanisms(
        browser, release):  # noqa: F811 (the imported fixture)
    base, folder, table = release
    m = json.loads((folder / "manifest.json").read_text())
    assert sorted(m["tract_values"]["folders"]) == CELLS
    shown = table[table["cell"] == CELLS[0]]
    assert "failed" not in set(shown["status"]) and set(shown["mechanism"]) == {"NoisyStats"}
    assert "failed" in set(table["status"])
    page = Page(browser)
    try:
        page.open(f"{base}{RELEASE}/", RELEASE)
        assert page.page.evaluate("() => window.dpatlas.state.cell") == CELLS[0]
        # Statuses and mechanisms of every cell, though the first cell's values have fewer.
        listed = page.page.eval_on_selector_all(
            "#legend [data-status]", "rows => rows.map(r => r.dataset.status)")
        assert {"suppressed", "failed"} <= set(listed), listed
        mechanisms = page.page.evaluate("() => window.dpatlas.state.mechanisms")
        assert mechanisms == sorted(np.unique(table["mechanism"])), mechanisms
        assert page.errors == []
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.browser
def test_the_downloads_list_the_direct_map_the_manifest_lists(browser, release):  # noqa: F811
    base, _, _ = release
    page = Page(browser)
    try:
        page.open(f"{base}{RELEASE}/", RELEASE)
        links = dict(page.page.eval_on_selector_all(
            "#downloads a", "as => as.map(a => [a.dataset.file, a.getAttribute('href')])"))
        assert DIRECT_MAP_FILE in links and MAP_FILE in links, links
        assert _fetch_status(page, links[DIRECT_MAP_FILE]) == 200
        assert page.errors == []
    finally:
        page.close()
