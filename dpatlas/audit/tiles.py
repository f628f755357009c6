"""Reading the vector tiles: a PMTiles v3 archive's directories and tiles with ``pmtiles``
(each range checked against the file, each inflation bounded), its Mapbox Vector Tiles with
``mapbox_vector_tile``, and their polygons in world tile units."""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from .base import _shapely
from .files import readable


# A small reader of what publish writes (dpatlas/publication/tiles.py runs tippecanoe): a PMTiles v3
# archive (a 127-byte header, directories of varint-coded entries, gzip'd), whose tiles are
# Mapbox Vector Tiles (protobuf, gzip'd). Standard library only.

PMTILES_HEADER = 127
MAX_PMTILES_ENTRIES = 1_000_000
# A directory or tile inflated to more than this is refused (a gzip bomb would exhaust the
# audit's memory): the largest tile of a national release at its lowest zoom is tens of MB.
MAX_UNPACKED_BYTES = 512 << 20


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 64 bits")


def _unpack(raw: bytes, compression: int) -> bytes:
    if compression == 2:  # one gzip member, inflated no further than MAX_UNPACKED_BYTES
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        out = inflate.decompress(raw, MAX_UNPACKED_BYTES + 1)
        if len(out) > MAX_UNPACKED_BYTES or inflate.unconsumed_tail:
            raise ValueError(f"a gzip'd directory or tile of more than {MAX_UNPACKED_BYTES:,} "
                             "bytes: not inflated")
        return out
    if compression == 1:
        return raw
    raise ValueError(f"compression {compression} is not supported (1 none, 2 gzip)")


def pmtiles_entries(raw: bytes) -> list[tuple[int, int, int, int]]:
    """A PMTiles v3 directory: (tile id, offset, length, run length) per entry."""
    n, pos = _varint(raw, 0)
    if n > MAX_PMTILES_ENTRIES:
        raise ValueError(f"a directory of {n} entries")
    columns = []
    for _ in range(3):  # tile id deltas, run lengths, lengths
        col = []
        for _ in range(n):
            v, pos = _varint(raw, pos)
            col.append(v)
        columns.append(col)
    deltas, runs, lengths = columns
    ids, offsets, last = [], [], 0
    for i in range(n):
        last += deltas[i]
        ids.append(last)
        v, pos = _varint(raw, pos)
        offsets.append(offsets[i - 1] + lengths[i - 1] if v == 0 and i > 0 else v - 1)
    return list(zip(ids, offsets, lengths, runs))


def _zoom_and_first_id(tile_id: int) -> tuple[int, int]:
    """A PMTiles tile id's zoom and the id of that zoom's first tile (ids run zoom by zoom,
    4**z tiles to zoom z)."""
    z, start = 0, 0
    while start + 4 ** z <= tile_id:
        start += 4 ** z
        z += 1
    return z, start


def _zoom_of(tile_id: int) -> int:
    return _zoom_and_first_id(tile_id)[0]


@contextlib.contextmanager
def _pmtiles_archive(path: Path) -> Iterator[tuple[dict, Callable[[int, int], bytes]]]:
    """A PMTiles v3 archive's header fields and a reader of its byte ranges, each range checked
    against the file's size (:func:`readable` refuses what is not a regular file within its
    read limit)."""
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
        u64 = [int.from_bytes(data[i:i + 8], "little") for i in range(8, 96, 8)]
        yield ({"root": (u64[0], u64[1]), "metadata": (u64[2], u64[3]),
                "leaves": (u64[4], u64[5]), "tiles": (u64[6], u64[7]),
                "internal_compression": data[97], "tile_compression": data[98],
                "tile_type": data[99], "min_zoom": data[100], "max_zoom": data[101]}, read)


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
        if header["tile_type"] != 1:
            raise ValueError(f"tile type {header['tile_type']} is not MVT")
        zoom = header["min_zoom"] if zoom is None else zoom
        tiles, pending = [], [(header["root"][0], header["root"][1], True)]
        while pending:
            offset, length, is_root = pending.pop()
            raw = _unpack(read(offset, length), header["internal_compression"])
            for tile_id, off, ln, run in pmtiles_entries(raw):
                if run == 0:  # a leaf directory
                    pending.append((header["leaves"][0] + off, ln, False))
                elif _zoom_of(tile_id) == zoom:
                    tile = read(header["tiles"][0] + off, ln)
                    tiles.append((tile_id, run, _unpack(tile, header["tile_compression"])))
    return header, tiles


def _protobuf(buf: bytes):
    """(field number, wire type, value) of each field of a protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"protobuf wire type {wire} is not supported")
        yield number, wire, value


def _mvt_value(buf: bytes):
    for number, _, v in _protobuf(buf):
        if number == 1:
            return v.decode("utf-8")
        if number == 2:
            return struct.unpack("<f", v)[0]
        if number == 3:
            return struct.unpack("<d", v)[0]
        if number in (4, 5):
            return v - (1 << 64) if number == 4 and v >= 1 << 63 else v
        if number == 6:
            return (v >> 1) ^ -(v & 1)
        if number == 7:
            return bool(v)
    return None


def mvt_features(tile: bytes, layer_name: str = "tracts") -> list[dict]:
    """The attributes of every feature of one layer of a vector tile."""
    return [attributes for attributes, _, _, _ in mvt_layer_features(tile, layer_name)]


def mvt_layer_features(tile: bytes, layer_name: str = "tracts"):
    """(attributes, geometry type, encoded geometry, layer extent) of every feature of one
    layer of a vector tile (Mapbox Vector Tile 2.1: layer fields 1 name, 2 features, 3 keys,
    4 values, 5 extent; feature fields 2 tags, 3 type, 4 geometry)."""
    for number, _, layer in _protobuf(tile):
        if number != 3:
            continue
        name, keys, values, features, extent = None, [], [], [], 4096
        for f, _, v in _protobuf(layer):
            if f == 1:
                name = v.decode("utf-8")
            elif f == 2:
                features.append(v)
            elif f == 3:
                keys.append(v.decode("utf-8"))
            elif f == 4:
                values.append(_mvt_value(v))
            elif f == 5:
                extent = v
        if name != layer_name:
            continue
        for feature in features:
            tags, kind, geometry = [], 0, b""
            for f, wire, v in _protobuf(feature):
                if f == 2 and wire == 2:
                    pos = 0
                    while pos < len(v):
                        t, pos = _varint(v, pos)
                        tags.append(t)
                elif f == 3 and wire == 0:
                    kind = v
                elif f == 4 and wire == 2:
                    geometry = v
            yield ({keys[k]: values[i] for k, i in zip(tags[::2], tags[1::2])}, kind, geometry,
                   extent)


def pmtiles_metadata(path: Path) -> bytes:
    """The (decompressed) JSON metadata of a PMTiles v3 archive: tippecanoe's name,
    description, attribution and generator_options (its command line) among them."""
    with _pmtiles_archive(path) as (header, read):
        return _unpack(read(*header["metadata"]), header["internal_compression"])


def tile_zxy(tile_id: int) -> tuple[int, int, int]:
    """Zoom, column and row of a PMTiles tile id (PMTiles v3: tiles are numbered zoom by zoom,
    each zoom along a Hilbert curve)."""
    z, start = _zoom_and_first_id(tile_id)
    t, x, y, s = tile_id - start, 0, 0, 1
    while s < 1 << z:
        rx = 1 & (t // 2)
        ry = 1 & (t ^ rx)
        if ry == 0:
            if rx == 1:
                x, y = s - 1 - x, s - 1 - y
            x, y = y, x
        x, y, t, s = x + s * rx, y + s * ry, t // 4, s * 2
    return z, x, y


def mvt_rings(encoded: bytes) -> list[list[tuple[int, int]]]:
    """The rings of an encoded MVT polygon in tile units: MoveTo (1) and LineTo (2) with
    zigzag-coded deltas from a cursor kept across the feature, ClosePath (7)."""
    ints, pos = [], 0
    while pos < len(encoded):
        v, pos = _varint(encoded, pos)
        ints.append(v)
    rings, ring, x, y, i = [], [], 0, 0, 0
    while i < len(ints):
        command, count = ints[i] & 7, ints[i] >> 3
        i += 1
        if command in (1, 2):
            if i + 2 * count > len(ints):
                raise ValueError("truncated MVT geometry")
            for _ in range(count):
                x += (ints[i] >> 1) ^ -(ints[i] & 1)
                y += (ints[i + 1] >> 1) ^ -(ints[i + 1] & 1)
                i += 2
                if command == 1:
                    if ring:
                        rings.append(ring)
                    ring = [(x, y)]
                else:
                    ring.append((x, y))
        elif command == 7:
            if ring:
                rings.append(ring)
            ring = []
        else:
            raise ValueError(f"MVT command {command} is not a polygon's")
    if ring:
        rings.append(ring)
    return rings


def _mvt_polygon(rings: list, dx: float, dy: float):
    """A (valid) polygon of MVT rings shifted by (dx, dy): a ring of positive area in tile
    units (y down) begins a polygon, a negative one is a hole of the last (MVT 2.1, 4.3.4.4)."""
    shapely = _shapely()
    polygons: list[tuple[list, list]] = []
    for ring in rings:
        if len(ring) < 3:
            continue
        xs, ys = np.array(ring, dtype=float).T
        area = float(np.dot(xs, np.roll(ys, -1)) - np.dot(np.roll(xs, -1), ys))
        points = np.column_stack([xs + dx, ys + dy])
        if area > 0:
            polygons.append((points, []))
        elif area < 0 and polygons:
            polygons[-1][1].append(points)
    if not polygons:
        return None
    parts = [shapely.Polygon(shell, holes) for shell, holes in polygons]
    return shapely.make_valid(parts[0] if len(parts) == 1 else shapely.MultiPolygon(parts))


def tile_geometries(entries: list, layer: str) -> tuple[list, np.ndarray, int, int]:
    """(geoid, cell), polygon in world tile units (column * extent + x, row * extent + y) of
    every feature of ``layer`` in PMTiles entries of one zoom (:func:`pmtiles_tile_entries`),
    the pieces of a polygon cut at tile edges joined; with the zoom and the tiles' extent."""
    shapely = _shapely()
    pieces: dict[tuple[str, str], list] = {}
    zoom, extents = 0, set()
    for tile_id, run, tile in entries:
        features = [(attrs, mvt_rings(geometry), extent) for attrs, kind, geometry, extent
                    in mvt_layer_features(tile, layer) if kind == 3]
        zoom = _zoom_of(tile_id)
        if run > 4 ** zoom:
            raise ValueError(f"a run of {run} tiles at zoom {zoom}")
        for copy in range(run):  # a run repeats one tile at the ids that follow its own
            _, column, row = tile_zxy(tile_id + copy)
            for attrs, rings, extent in features:
                extents.add(extent)
                polygon = _mvt_polygon(rings, column * extent, row * extent)
                if polygon is not None:
                    key = (str(attrs.get("geoid")), str(attrs.get("cell")))
                    pieces.setdefault(key, []).append(polygon)
    if len(extents) > 1:
        raise ValueError(f"tiles of different extents {sorted(extents)}")
    geoms = [p[0] if len(p) == 1 else shapely.union_all(p) for p in pieces.values()]
    return list(pieces), np.array(geoms, dtype=object), zoom, extents.pop() if extents else 4096
