"""The audit as a package by concern (issue 34): small modules, no module named checks, and
the vector tiles read by the pmtiles and mapbox-vector-tile packages, not by decoders of ours."""

import ast
import gzip
from pathlib import Path

import pytest

import dpatlas.audit

AUDIT = Path(dpatlas.audit.__file__).parent
MODULES = sorted(AUDIT.glob("*.py"))


def test_the_audit_is_a_package_of_small_modules_without_a_checks_module():
    assert not (AUDIT / "checks.py").exists()
    sizes = {p.name: len(p.read_text().splitlines()) for p in MODULES}
    assert len(sizes) >= 10 and max(sizes.values()) <= 500, sizes


def test_every_module_of_the_audit_says_what_it_checks_and_imports_itself_relatively():
    """Relative imports only: a copy of the folder under any name runs alone."""
    for path in MODULES:
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), path.name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                assert not node.module.startswith("dpatlas.audit"), (path.name, node.module)


def test_the_tiles_are_decoded_by_the_libraries_not_by_our_own_decoders():
    source = (AUDIT / "tiles.py").read_text()
    assert "import mapbox_vector_tile" in source and "from pmtiles.tile import" in source
    defined = {node.name for path in MODULES for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.FunctionDef)}
    assert not defined & {"_varint", "_protobuf", "_mvt_value", "mvt_rings", "pmtiles_entries",
                          "mvt_layer_features"}, defined


def test_a_tile_of_odd_tags_or_garbage_is_a_read_error_not_a_crash():
    """mapbox_vector_tile asserts an even number of tags and protobuf refuses garbage: the
    audit counts both among the errors that make a file unreadable (a finding)."""
    from dpatlas.audit import tiles

    # a layer "tracts" (field 3) with one feature (field 2) of one tag (field 2: [0])
    feature = bytes([0x12, 0x01, 0x00, 0x18, 0x03])
    layer = bytes([0x0A, 0x06]) + b"tracts" + bytes([0x12, len(feature)]) + feature \
        + bytes([0x1A, 0x01]) + b"k" + bytes([0x28, 0x80, 0x20])
    tile = bytes([0x1A, len(layer)]) + layer
    for broken in (tile, b"\xff\xff\xff\xff"):
        with pytest.raises(tiles.TILE_READ_ERRORS):
            tiles.mvt_features(broken)


def test_a_gzip_bomb_directory_is_refused_before_the_library_inflates_it(monkeypatch):
    from pmtiles.tile import Compression

    from dpatlas.audit import tiles

    monkeypatch.setattr(tiles, "MAX_UNPACKED_BYTES", 1000)
    with pytest.raises(ValueError, match="more than 1,000 bytes: not inflated"):
        tiles._directory(gzip.compress(b"\x00" * 2000), Compression.GZIP)


def test_a_leaf_directory_pointing_at_itself_is_refused_not_followed_for_ever(tmp_path):
    """A hostile archive whose leaf directory lists itself as a leaf: the audit stops at the
    spec's depth and reports the file unreadable (before the bound it never returned)."""
    from pmtiles.tile import Compression, Entry, TileType, serialize_directory, serialize_header

    from dpatlas.audit import tiles

    leaf = serialize_directory([Entry(0, 0, 0, 0)])  # run length 0: a leaf at offset 0 (itself)
    leaf = serialize_directory([Entry(0, 0, len(leaf), 0)])
    root = serialize_directory([Entry(0, 0, len(leaf), 0)])
    header = {"root_offset": 127, "root_length": len(root), "metadata_offset": 127 + len(root),
              "metadata_length": 0, "leaf_directory_offset": 127 + len(root),
              "leaf_directory_length": len(leaf), "tile_data_offset": 127 + len(root) + len(leaf),
              "tile_data_length": 0, "addressed_tiles_count": 1, "tile_entries_count": 1,
              "tile_contents_count": 1, "clustered": True,
              "internal_compression": Compression.GZIP, "tile_compression": Compression.GZIP,
              "tile_type": TileType.MVT, "min_zoom": 0, "max_zoom": 0, "min_lon_e7": 0,
              "min_lat_e7": 0, "max_lon_e7": 0, "max_lat_e7": 0, "center_zoom": 0,
              "center_lon_e7": 0, "center_lat_e7": 0}
    archive = tmp_path / "loop.pmtiles"
    archive.write_bytes(serialize_header(header) + root + leaf)
    with pytest.raises(ValueError, match="nested deeper than 3"):
        tiles.pmtiles_tile_entries(archive)
