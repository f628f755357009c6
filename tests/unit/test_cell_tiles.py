"""Names of the per-cell tract archives (issue 35, item 3): plain cells named as they are,
others by a digest no plain name can take; the audit derives the same names on its own; STAC
lists each archive as tiles."""

from __future__ import annotations

import pytest

from dpatlas.audit.cell_tiles import cell_archive_name
from dpatlas.publication import stac
from dpatlas.publication.cell_tiles import cell_tiles_file, is_cell_tiles_file

CELLS = ["all", "outcome-1", "Outcome_2", "men 1980", "a/b", "../x", "é", "", "x" * 65,
         "cell.1", "-lead"]


@pytest.mark.parametrize("cell", CELLS)
def test_the_audit_names_each_cells_archive_as_the_publication_does(cell):
    assert cell_archive_name(cell) == cell_tiles_file(cell)


def test_plain_cells_are_named_as_they_are_others_by_a_digest_and_no_two_share_a_name():
    assert cell_tiles_file("outcome-1") == "tracts-outcome-1.pmtiles"
    names = [cell_tiles_file(c) for c in CELLS]
    assert len(set(names)) == len(CELLS)
    for name in names:
        assert "/" not in name and ".." not in name and is_cell_tiles_file(name)
        assert name.removesuffix(".pmtiles").replace("-", "").replace("_", "").isalnum()
    assert cell_tiles_file("a/b").startswith("tracts--")
    assert not is_cell_tiles_file("tracts.pmtiles")


def test_stac_lists_a_cells_archive_as_tiles_with_its_cell_in_the_title():
    name = cell_tiles_file("outcome-1")
    assert stac.asset_roles(name) == stac.asset_roles("tracts.pmtiles") == ["visual", "tiles"]
    assert stac.is_download(name)
    asset = stac._asset("r1", name, "0" * 64, 10)
    assert asset.title == "Tracts of cell outcome-1: vector tiles (PMTiles)"
    assert asset.media_type == "application/vnd.pmtiles"


def test_a_cells_archive_input_without_a_crs_is_refused_naming_that_input(tmp_path):
    """The refusal names the file being written (the cell's archive input), not
    ``tracts.geojson``, which a release partitioned by state does not write."""
    import geopandas as gpd
    from shapely.geometry import box

    from dpatlas.core.places import BoundaryError
    from dpatlas.publication.cell_tiles import CellTileBuilder

    table = gpd.GeoDataFrame({"geoid": ["01001000100", "02001000100"], "cell": ["a", "b"]},
                             geometry=[box(0, 0, 1, 1), box(1, 0, 2, 1)], crs=None)
    builder = CellTileBuilder(tmp_path, "r1", {}, tiler=None)
    with pytest.raises(BoundaryError, match="without a CRS") as refused:
        builder.add_group(table)
    message = str(refused.value)
    assert "tracts.geojson" not in message.replace(".pmtiles.geojson", "")
    assert str(tmp_path / ".tracts-a.pmtiles.geojson") in message
    assert str(tmp_path / ".tracts-b.pmtiles.geojson") in message
