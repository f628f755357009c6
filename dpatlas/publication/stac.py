"""A STAC catalogue of the publish root: one Collection, one Item per release (pystac).

Layout beside the feed (names :mod:`dpatlas.core.ids` reserves, so no release can take them)::

    <root>/collection.json        the STAC Collection "dpatlas-releases"
    <root>/catalog/<id>.json      one STAC Item per release listed in the feed

An Item is built from the feed's entry (verified files, status, withdrawal) and the release's
own manifest (``published`` time, ``extent``, guarantee, mode): its id is the release id, its
datetime the publication time, its geometry and bbox the release's footprint, and it has one
asset per published file plus the manifest, each with its media type and the File extension's
``file:checksum`` (a multihash: ``1220`` + the sha256 in hex) and ``file:size``. Asset hrefs
are relative (``../<id>/tracts.csv``), so the catalogue moves with the root. A withdrawn
release keeps its Item, with ``dpatlas:status`` "withdrawn" and the reason and time.

This module only builds documents; :mod:`dpatlas.publication.feed` writes them (atomically, under the
feed's lock) every time it writes feed.json, so the three views never disagree for long.

Validation is offline (:func:`validate_catalog`): pystac ships the STAC core and GeoJSON
schemas; the File extension's schema is not shipped and would be fetched from the network, so
its rules for the two fields used here are restated in :data:`FILE_EXTENSION_SCHEMA` and the
validator refuses to fetch anything.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

COLLECTION_FILE = "collection.json"
ITEMS_DIR = "catalog"
COLLECTION_ID = "dpatlas-releases"
FILE_EXTENSION = "https://stac-extensions.github.io/file/v2.1.0/schema.json"
SHA2_256_MULTIHASH_PREFIX = "1220"  # multihash: code 0x12 (sha2-256), length 0x20 (32 bytes)
MANIFEST = "manifest.json"
WORLD_BBOX = [-180.0, -90.0, 180.0, 90.0]

# Media types (IANA) and STAC asset roles of the published files, by extension.
MEDIA_TYPES = {
    ".parquet": "application/vnd.apache.parquet",
    ".geojson": "application/geo+json",
    ".csv": "text/csv",
    ".png": "image/png",
    ".json": "application/json",
    ".pmtiles": "application/vnd.pmtiles",
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".txt": "text/plain",
}
ROLES = {"tracts.parquet": ["data"], "tracts.geojson": ["data"], "tracts.csv": ["data"],
         "tracts.pmtiles": ["data", "tiles"], "index.html": ["visual"],
         "tracts.schema.json": ["metadata"], "p25_map.png": ["overview", "visual"],
         "config.json": ["metadata"], MANIFEST: ["metadata"]}
TITLES = {"tracts.parquet": "Tracts (GeoParquet)", "tracts.geojson": "Tracts (GeoJSON, RFC 7946)",
          "tracts.csv": "Tracts (CSV)", "tracts.schema.json": "Table Schema of tracts.csv",
          "p25_map.png": "Map of p25", "config.json": "Resolved release config",
          "tracts.pmtiles": "Vector tiles (PMTiles)", "index.html": "Web map (MapLibre)",
          MANIFEST: "Manifest: privacy accounting and file hashes"}

# The county and state files (issue 20, items 1 and 4), declared as the tract files are.
for _stem, _what in (("counties", "Counties"), ("states", "States")):
    ROLES.update({f"{_stem}.parquet": ["data"], f"{_stem}.geojson": ["data"],
                  f"{_stem}.csv": ["data"], f"{_stem}.schema.json": ["metadata"]})
    TITLES.update({f"{_stem}.parquet": f"{_what} (GeoParquet)",
                   f"{_stem}.geojson": f"{_what} (GeoJSON, RFC 7946)",
                   f"{_stem}.csv": f"{_what} (CSV)",
                   f"{_stem}.schema.json": f"Table Schema of {_stem}.csv"})
    ROLES[f"{_stem}.pmtiles"] = ["data", "tiles"]
    TITLES[f"{_stem}.pmtiles"] = f"{_what}: vector tiles (PMTiles)"

# The File extension v2.1.0's rules for the fields used here (file:checksum: lower-case hex
# multihash; file:size: a non-negative integer), and that an object using it declares it.
# Restated rather than fetched so validation needs no network; pystac looks it up by its URI.
_FILE_FIELDS = {
    "type": "object",
    "properties": {
        "file:checksum": {"type": "string", "pattern": "^[a-f0-9]+$"},
        "file:size": {"type": "integer", "minimum": 0},
    },
}
FILE_EXTENSION_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "$id": FILE_EXTENSION,
    "title": "File Info Extension (fields used by dpatlas)",
    "type": "object",
    "required": ["stac_extensions"],
    "properties": {
        "stac_extensions": {"type": "array", "contains": {"const": FILE_EXTENSION}},
        "assets": {"type": "object", "additionalProperties": _FILE_FIELDS},
    },
}


class StacError(RuntimeError):
    """The catalogue cannot be built or does not validate; the message says what is wrong."""


def multihash_sha256(hex_digest: str) -> str:
    """The File extension's ``file:checksum`` for a sha256 given in hex."""
    digest = hex_digest.lower()
    if len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
        raise StacError(f"not a sha256 hex digest: {hex_digest!r}")
    return SHA2_256_MULTIHASH_PREFIX + digest


def _time(value: str | None) -> datetime:
    try:
        t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise StacError(f"not an ISO-8601 time: {value!r}") from None
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t


def _manifest(root: Path, release_id: str) -> dict:
    """The release's manifest, or {} if it is gone or unreadable (a folder removed by hand
    after it entered the feed): its Item then carries what the feed entry says, and no
    catalogue update is blocked by one damaged release."""
    try:
        manifest = json.loads((root / release_id / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def _asset(release_id: str, name: str, sha256: str, size: int):
    import pystac
    from pystac.extensions.file import FileExtension

    suffix = Path(name).suffix.lower()
    asset = pystac.Asset(href=f"../{release_id}/{name}", title=TITLES.get(name, name),
                         media_type=MEDIA_TYPES.get(suffix), roles=ROLES.get(name, ["data"]))
    FileExtension.ext(asset).apply(checksum=multihash_sha256(sha256), size=int(size))
    return asset


def build_item(root: Path, entry: dict):
    """The STAC Item of one feed entry (``feed.json``'s ``releases[i]``)."""
    import pystac
    from pystac.extensions.file import FileExtension

    rid = entry["release_id"]
    manifest = _manifest(root, rid)
    extent = manifest.get("extent") or {}
    geometry, bbox = extent.get("geometry"), extent.get("bbox")
    status = entry.get("status", "published")
    properties = {
        "title": f"Release {rid}" + (" (withdrawn)" if status == "withdrawn" else ""),
        "description": "Differentially private per-tract income mobility (p25, p75)",
        "dpatlas:status": status,
        "dpatlas:mode": manifest.get("mode"),
        "dpatlas:guarantee": manifest.get("total_per_person"),
        "dpatlas:rounding_decimals": (manifest.get("rounding") or {}).get("decimals"),
    }
    if status == "withdrawn":
        properties["dpatlas:withdrawn_at"] = entry.get("withdrawn_at")
        properties["dpatlas:withdrawn_reason"] = entry.get("withdrawn_reason")
    item = pystac.Item(id=rid, geometry=geometry, bbox=bbox if geometry else None,
                       datetime=_time(manifest.get("published") or entry.get("published")),
                       properties={k: v for k, v in properties.items() if v is not None})
    FileExtension.add_to(item)
    for name, meta in sorted(entry.get("files", {}).items()):
        if _usable_file(name, meta):
            item.add_asset(name, _asset(rid, name, meta["sha256"], meta["bytes"]))  # key: name
    if manifest and _SHA256.fullmatch(str(entry.get("manifest_sha256"))):
        item.add_asset(MANIFEST, _asset(rid, MANIFEST, entry["manifest_sha256"],
                                        (root / rid / MANIFEST).stat().st_size))
    return item


def _collection_extent(items: list):
    import pystac

    boxes = [i.bbox for i in items if i.bbox]
    bbox = ([min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes),
             max(b[3] for b in boxes)] if boxes else WORLD_BBOX)
    times = sorted(i.datetime for i in items)
    interval = [times[0], times[-1]] if times else [None, None]
    return pystac.Extent(pystac.SpatialExtent([bbox]), pystac.TemporalExtent([interval]))


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


def _usable_file(name, meta) -> bool:
    """A file entry a catalogue can point at: a plain file name, a sha256 and a size. The feed
    verifies these when it lists a release; entries written by hand or by older versions may
    hold anything, and are left out of the catalogue rather than written into it."""
    return (isinstance(name, str) and _PLAIN_NAME.fullmatch(name) is not None
            and isinstance(meta, dict) and isinstance(meta.get("sha256"), str)
            and _SHA256.fullmatch(meta["sha256"]) is not None
            and isinstance(meta.get("bytes"), int) and meta["bytes"] >= 0)


def _usable_entry(entry) -> bool:
    from dpatlas.core.ids import InvalidReleaseId, validate_release_id

    try:
        validate_release_id(entry.get("release_id"))
    except InvalidReleaseId:
        return False
    return True


def build_catalog(root: Path, releases: list[dict]) -> dict[str, dict]:
    """Every catalogue document for the feed's ``releases``: {path relative to root: JSON}.

    Self-contained: links and asset hrefs are relative, there are no ``self`` links, so the
    documents are the same bytes wherever the root is mounted. An entry whose id is not a
    valid release id (only a hand-edited or very old feed.json has one) gets no Item: its id
    could not name a file safely.
    """
    import pystac

    root = Path(root)
    items = [build_item(root, entry) for entry in releases
             if isinstance(entry, dict) and _usable_entry(entry)]
    collection = pystac.Collection(
        id=COLLECTION_ID,
        title="dpatlas releases",
        description="Differentially private, map-ready releases of economic mobility per "
                    "census tract: one item per release, withdrawn releases marked.",
        extent=_collection_extent(items),
        license="other",
        catalog_type=pystac.CatalogType.SELF_CONTAINED,
    )
    collection.add_items(items)
    collection.normalize_hrefs(str(root), strategy=_layout())
    docs = {COLLECTION_FILE: collection.to_dict(include_self_link=False, transform_hrefs=True)}
    for item in items:
        docs[f"{ITEMS_DIR}/{item.id}.json"] = item.to_dict(include_self_link=False,
                                                           transform_hrefs=True)
    return docs


def _layout():
    """collection.json at the root, items in catalog/<id>.json (not in the release folders,
    which are immutable once published)."""
    from pystac.layout import CustomLayoutStrategy

    return CustomLayoutStrategy(
        collection_func=lambda col, parent_dir, is_root: f"{parent_dir}/{COLLECTION_FILE}",
        item_func=lambda item, parent_dir: f"{parent_dir}/{ITEMS_DIR}/{item.id}.json",
    )


def render(doc: dict) -> bytes:
    """A catalogue document as the bytes written to disk."""
    return (json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()


# ------------------------------------------------------------------------------- validation


def _offline_validator():
    from pystac.validation import JsonSchemaSTACValidator

    class OfflineValidator(JsonSchemaSTACValidator):
        """pystac's JSON-schema validator with the schemas it ships plus the File extension's
        restated rules; any other schema is an error, never a network fetch."""

        def __init__(self):
            super().__init__()
            self.schema_cache[FILE_EXTENSION] = FILE_EXTENSION_SCHEMA

        def _get_schema(self, schema_uri):
            if schema_uri not in self.schema_cache:
                raise StacError(f"no local schema for {schema_uri}: the catalogue uses a STAC "
                                "version or extension this validator does not know")
            return self.schema_cache[schema_uri]

    return OfflineValidator()


@contextlib.contextmanager
def _registered(validator) -> Iterator[None]:
    from pystac.validation import RegisteredValidator

    previous = RegisteredValidator._validator
    RegisteredValidator.set_validator(validator)
    try:
        yield
    finally:
        RegisteredValidator._validator = previous


def validate_catalog(root: Path) -> int:
    """Validate ``<root>/collection.json`` and every Item it links to with pystac
    (``validate_all``), offline. Returns the number of Items; raises :class:`StacError`."""
    import pystac
    from pystac.errors import STACValidationError

    path = Path(root) / COLLECTION_FILE
    try:
        collection = pystac.Collection.from_file(str(path))
    except (OSError, ValueError, pystac.STACError) as err:
        raise StacError(f"{path} cannot be read as a STAC Collection: {err}") from None
    with _registered(_offline_validator()):
        try:
            pystac.validation.validate_all_dict(json.loads(path.read_text()), str(path))
        except STACValidationError as err:
            raise StacError(f"the STAC catalogue at {root} does not validate: "
                            f"{str(err).splitlines()[0]}") from None
    return len(list(collection.get_items()))
