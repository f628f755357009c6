"""Names per cell (issue 35): the county and state archives of a release of several cells
(``counties-<cell>.pmtiles``) and the tracts' values folders (``tract-values/<cell>``): plain
cells named as they are, others by a digest no plain name can take; the audit derives the same
names on its own; STAC lists an archive as tiles and a values document as data, each with
its cell in the title."""

from __future__ import annotations

import pytest

from dpatlas.audit.cell_tiles import cell_archive_name, values_document_name
from dpatlas.audit.part_names import is_values_document as audit_is_values_document
from dpatlas.publication import stac, tract_values
from dpatlas.publication.cell_tiles import cell_tiles_file, level_of_cell_tiles_file

CELLS = ["all", "outcome-1", "Outcome_2", "men 1980", "a/b", "../x", "é", "", "x" * 65,
         "cell.1", "-lead"]


@pytest.mark.parametrize("cell", CELLS)
def test_the_audit_names_each_cells_files_as_the_publication_does(cell):
    for layer in ("counties", "states"):
        assert cell_archive_name(cell, layer) == cell_tiles_file(cell, layer)
    name = tract_values.values_file(cell, "06")
    assert values_document_name(cell, "06") == name
    assert audit_is_values_document(name) and tract_values.is_values_document(name)


def test_plain_cells_are_named_as_they_are_others_by_a_digest_and_no_two_share_a_name():
    assert cell_tiles_file("outcome-1", "counties") == "counties-outcome-1.pmtiles"
    assert tract_values.cell_folder("outcome-1") == "tract-values/outcome-1"
    for names in ([cell_tiles_file(c, "counties") for c in CELLS],
                  [tract_values.cell_folder(c) for c in CELLS]):
        assert len(set(names)) == len(CELLS)
        for name in names:
            assert ".." not in name and name.count("/") <= 1
            last = name.rsplit("/", 1)[-1].removesuffix(".pmtiles")
            assert last.replace("-", "").replace("_", "").isalnum()
    assert cell_tiles_file("a/b", "states").startswith("states--")
    assert level_of_cell_tiles_file(cell_tiles_file("a/b", "states")) == "state"
    assert level_of_cell_tiles_file("tracts.pmtiles") is None


def test_stac_lists_a_cells_archive_as_tiles_and_its_values_as_data_each_titled():
    name = cell_tiles_file("outcome-1", "counties")
    assert stac.asset_roles(name) == stac.asset_roles("tracts.pmtiles") == ["visual", "tiles"]
    asset = stac._asset("r1", name, "0" * 64, 10)
    assert asset.title == "Counties of cell outcome-1: vector tiles (PMTiles)"
    assert asset.media_type == "application/vnd.pmtiles"
    values = tract_values.values_file("outcome-1", "06")
    assert stac.asset_roles(values) == ["data"]
    asset = stac._asset("r1", values, "0" * 64, 10)
    assert asset.title == "Tract values of cell outcome-1, state 06: the web map's (JSON)"
    assert asset.media_type == "application/json"
