"""Reading the vector tiles: a PMTiles v3 archive's header and directories with ``pmtiles``
(each byte range checked against the file, each inflation bounded), its Mapbox Vector Tiles
with ``mapbox_vector_tile``, and their polygons in world tile units. Neither package is the
code that writes our tiles (tippecanoe)."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import zlib
from pathlib import Path
from typing import Callable, Iterator

import mapbox_vector_tile
import numpy as np
from google.protobuf.message import DecodeError
from pmtiles.tile import (
    Compression, TileType, deserialize_directory, deserialize_header, read_varint,
)
from pmtiles.tile import tileid_to_zxy as tile_zxy

from .base import _shapely
from .files import readable

PMTILES_HEADER = 127
MAX_PMTILES_ENTRIES = 1_000_000
# Directories below the root a reader follows (the PMTiles v3 spec's readers, pmtiles' own among
# them, stop at this depth): a leaf that points at itself or its parent would loop for ever.
MAX_LEAF_DEPTH = 3
# A directory or tile inflated to more than this is refused (a gzip bomb would exhaust the
# audit's memory): the largest tile of a national release at its lowest zoom is tens of MB.
MAX_UNPACKED_BYTES = 512 << 20
# Columns the tiles may leave out (docs/files.md): the unclamped values and the bare standard
# errors, which the map never shows. Any other column a tile lacks is read as null.
TILE_OMITTED = frozenset({"p25_raw", "p75_raw", "p25_se", "p75_se", "p25_model_se",
                          "p75_model_se"})
# MVT feature type 3: a polygon (the only kind publish writes to a tract, county or state layer).
MVT_POLYGON = 3
# What reading a damaged or hostile archive may raise: each is a finding, never a crash
# (mapbox_vector_tile asserts an even number of tags; pmtiles refuses a zoom past 31).
TILE_READ_ERRORS = (OSError, ValueError, IndexError, UnicodeDecodeError, EOFError, zlib.error,
                    DecodeError, AssertionError, OverflowError)


def _inflate(raw: bytes, compression: Compression) -> bytes:
    """A directory, the metadata or a tile as stored (gzip'd or not), inflated no further than
    MAX_UNPACKED_BYTES (the library's gzip.decompress has no bound)."""
    if compression == Compression.GZIP:  # one gzip member
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        out = inflate.decompress(raw, MAX_UNPACKED_BYTES + 1)
        if len(out) > MAX_UNPACKED_BYTES or inflate.unconsumed_tail:
            raise ValueError(f"a gzip'd directory or tile of more than {MAX_UNPACKED_BYTES:,} "
                             "bytes: not inflated")
        return out
    if compression == Compression.NONE:
        return raw
    raise ValueError(f"compression {compression.name} is not supported (none, gzip)")


def _directory(raw: bytes, compression: Compression) -> list:
    """A PMTiles directory's entries (tile_id, offset, length, run_length), decoded by
    ``pmtiles`` once its size is known to be within bounds (inflated and entries counted)."""
    inflated = _inflate(raw, compression)
    n = read_varint(io.BytesIO(inflated))
    if n > MAX_PMTILES_ENTRIES:
        raise ValueError(f"a directory of {n} entries")
    # deserialize_directory inflates what it is given: the gzip'd bytes, now known to be small
    return deserialize_directory(raw if compression == Compression.GZIP
                                 else gzip.compress(inflated, compresslevel=1))


@contextlib.contextmanager
def _pmtiles_archive(path: Path) -> Iterator[tuple[dict, Callable[[int, int], bytes]]]:
    """A PMTiles v3 archive's header (``pmtiles``' fields) and a reader of its byte ranges,
    each range checked against the file's size (:func:`readable` refuses what is not a regular
    file within its read limit)."""
    with open(readable(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size

        def read(offset: int, length: int) -> bytes:
            if offset < 0 or length < 0 or offset + length > size:
                raise ValueError(f"a range {offset}+{length} past the archive's {size} bytes")
            fh.seek(offset)
            return fh.read(length)

        data = read(0, PMTILES_HEADER) if size >= PMTILES_HEADER else b""
        if len(data) < PMTILES_HEADER or data[:7] != b"PMTiles" or data[7] != 3:
            raise ValueError("not a PMTiles v3 archive")
        yield deserialize_header(data), read


def pmtiles_tiles(path: Path, zoom: int | None = None) -> tuple[dict, list[bytes]]:
    """The header fields and the (decompressed) tiles of ``zoom`` (default: the archive's
    minimum zoom) of a PMTiles v3 archive."""
    header, entries = pmtiles_tile_entries(path, zoom)
    return header, [tile for _, _, tile in entries]


def pmtiles_tile_entries(path: Path, zoom: int | None = None
                         ) -> tuple[dict, list[tuple[int, int, bytes]]]:
    """The header fields and (tile id, run length, decompressed tile) of each directory entry
    of ``zoom`` (default: the minimum zoom) of a PMTiles v3 archive; a run of n stands for the
    n tiles from its id on. Only the header, the directories and those tiles are read, each
    range checked against the file's size (:func:`readable` refuses what is not a regular file
    within its read limit)."""
    with _pmtiles_archive(path) as (header, read):
        if header["tile_type"] != TileType.MVT:
            raise ValueError(f"tile type {header['tile_type'].name} is not MVT")
        zoom = header["min_zoom"] if zoom is None else zoom
        tiles, pending = [], [(header["root_offset"], header["root_length"], 0)]
        while pending:
            offset, length, depth = pending.pop()
            for entry in _directory(read(offset, length), header["internal_compression"]):
                if entry.run_length == 0:  # a leaf directory
                    if depth == MAX_LEAF_DEPTH:
                        raise ValueError(f"leaf directories nested deeper than {MAX_LEAF_DEPTH}")
                    pending.append((header["leaf_directory_offset"] + entry.offset,
                                    entry.length, depth + 1))
                elif tile_zxy(entry.tile_id)[0] == zoom:
                    tile = read(header["tile_data_offset"] + entry.offset, entry.length)
                    tiles.append((entry.tile_id, entry.run_length,
                                  _inflate(tile, header["tile_compression"])))
    return header, tiles


def _layer(tile: bytes, layer_name: str) -> dict:
    """One layer of a vector tile decoded by ``mapbox_vector_tile`` in tile units (y down, as
    stored): its extent and features (properties, geometry, MVT type); empty when absent."""
    layers = mapbox_vector_tile.decode(tile, default_options={"y_coord_down": True,
                                                              "geojson": False})
    return layers.get(layer_name, {"extent": 4096, "features": []})


def mvt_features(tile: bytes, layer_name: str = "tracts") -> list[dict]:
    """The attributes of every feature of one layer of a vector tile."""
    return [feature["properties"] for feature in _layer(tile, layer_name)["features"]]


def pmtiles_metadata(path: Path) -> bytes:
    """The (decompressed) JSON metadata of a PMTiles v3 archive: tippecanoe's name,
    description, attribution and generator_options (its command line) among them."""
    with _pmtiles_archive(path) as (header, read):
        return _inflate(read(header["metadata_offset"], header["metadata_length"]),
                        header["internal_compression"])


def _shifted_polygon(geometry: dict, dx: float, dy: float):
    """A decoded MVT (multi)polygon shifted by (dx, dy) and made valid; None if it has no
    ring of non-zero area (the decoder leaves those out)."""
    shapely = _shapely()
    shape = shapely.geometry.shape(geometry)
    if shape.is_empty:
        return None
    return shapely.make_valid(shapely.transform(shape, lambda xy: xy + (dx, dy)))


def tile_geometries(entries: list, layer: str) -> tuple[list, np.ndarray, int, int]:
    """(geoid, cell), polygon in world tile units (column * extent + x, row * extent + y) of
    every feature of ``layer`` in PMTiles entries of one zoom (:func:`pmtiles_tile_entries`),
    the pieces of a polygon cut at tile edges joined; with the zoom and the tiles' extent."""
    shapely = _shapely()
    pieces: dict[tuple[str, str], list] = {}
    zoom, extents = 0, set()
    for tile_id, run, tile in entries:
        decoded = _layer(tile, layer)
        features = [f for f in decoded["features"] if f["type"] == MVT_POLYGON]
        extent = decoded["extent"]
        zoom = tile_zxy(tile_id)[0]
        if run > 4 ** zoom:
            raise ValueError(f"a run of {run} tiles at zoom {zoom}")
        for copy in range(run):  # a run repeats one tile at the ids that follow its own
            _, column, row = tile_zxy(tile_id + copy)
            for feature in features:
                extents.add(extent)
                polygon = _shifted_polygon(feature["geometry"], column * extent, row * extent)
                if polygon is not None:
                    attrs = feature["properties"]
                    key = (str(attrs.get("geoid")), str(attrs.get("cell")))
                    pieces.setdefault(key, []).append(polygon)
    if len(extents) > 1:
        raise ValueError(f"tiles of different extents {sorted(extents)}")
    geoms = [p[0] if len(p) == 1 else shapely.union_all(p) for p in pieces.values()]
    return list(pieces), np.array(geoms, dtype=object), zoom, extents.pop() if extents else 4096
