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

from dpatlas.publication.cell_tiles import cell_tiles_title, level_of_cell_tiles_file
from dpatlas.publication.tract_values import document_title, is_values_document
from dpatlas.publication.state_parts import PART_NAME  # a state's part, as an asset
from dpatlas.publication import static_map
from dpatlas.publication.codebook import published_metadata

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
    ".md": "text/markdown",  # RFC 7763: the release's README.md codebook
}
# Roles follow the STAC best practices: "data" the tables, "metadata" what describes them,
# "overview" the PNG map, "visual" what is made to be looked at (the web map and its tiles).
ROLES = {"tracts.parquet": ["data"], "tracts.geojson": ["data"], "tracts.csv": ["data"],
         "tracts.pmtiles": ["visual", "tiles"], "index.html": ["visual"],
         "tracts.schema.json": ["metadata"], "p25_map.png": ["overview"],
         "config.json": ["metadata"], "datapackage.json": ["metadata"], MANIFEST: ["metadata"],
         "synthetic.parquet": ["data"], "synthetic.csv": ["data"],
         "synthetic.schema.json": ["metadata"], "README.md": ["metadata"]}
TITLES = {"tracts.parquet": "Tracts (GeoParquet)", "tracts.geojson": "Tracts (GeoJSON, RFC 7946)",
          "tracts.csv": "Tracts (CSV)", "tracts.schema.json": "Table Schema of tracts.csv",
          "p25_map.png": "Map of p25", "config.json": "Resolved release config",
          "tracts.pmtiles": "Vector tiles (PMTiles)", "index.html": "Web map (MapLibre)",
          "datapackage.json": "Frictionless Data Package: every table, its schema and licence",
          MANIFEST: "Manifest: privacy accounting and file hashes",
          "synthetic.parquet": "Synthetic microdata (Parquet)",
          "synthetic.csv": "Synthetic microdata (CSV)",
          "synthetic.schema.json": "Table Schema of synthetic.csv",
          "README.md": "Codebook: what the release is, every column, how to read and cite it"}
# Files a download list offers (the feed's Atom enclosures): the tables, their metadata, the
# PNG map and the tiles; never the web map's page, scripts, styles or its libraries' licences.
DOWNLOAD_SUFFIXES = {".parquet", ".geojson", ".csv", ".json", ".pmtiles", ".png", ".md"}
# The web map's own JSON: its legend and its context outlines (dpatlas.publication.webmap).
WEB_MAP_SUPPORT = {"legend.json", "states_context.geojson"}

# The static maps (dpatlas.publication.static_map): p25_map.png as the web map opens, and the
# direct one beside it where that is the model.
ROLES[static_map.DIRECT_MAP_FILE] = ["overview"]
TITLES.update(static_map.MAP_TITLES)

# The county and state files (issue 20, items 1 and 4), declared as the tract files are.
for _stem, _what in (("counties", "Counties"), ("states", "States")):
    ROLES.update({f"{_stem}.parquet": ["data"], f"{_stem}.geojson": ["data"],
                  f"{_stem}.csv": ["data"], f"{_stem}.schema.json": ["metadata"]})
    TITLES.update({f"{_stem}.parquet": f"{_what} (GeoParquet)",
                   f"{_stem}.geojson": f"{_what} (GeoJSON, RFC 7946)",
                   f"{_stem}.csv": f"{_what} (CSV)",
                   f"{_stem}.schema.json": f"Table Schema of {_stem}.csv"})
    ROLES[f"{_stem}.pmtiles"] = ["visual", "tiles"]
    TITLES[f"{_stem}.pmtiles"] = f"{_what}: vector tiles (PMTiles)"


def asset_roles(name: str) -> list[str]:
    """The STAC roles of a published file: listed ones by name; the web map's scripts, styles
    and page "visual", licence texts "metadata", anything else "data"."""
    if name in ROLES:
        return ROLES[name]
    if level_of_cell_tiles_file(name):  # a level's archive of one cell
        return ROLES["tracts.pmtiles"]
    suffix = Path(name).suffix.lower()
    if name in WEB_MAP_SUPPORT or suffix in (".html", ".js", ".mjs", ".css"):
        return ["visual"]
    return ["metadata"] if suffix == ".txt" else ["data"]


def is_download(name: str) -> bool:
    """Whether a published file is a download (data, its metadata, the map image, the tiles),
    as opposed to a part of the web map: the tracts' values documents are the map's (a cell
    and state at a time of what the tables hold; 2,142 of them at 42 cells)."""
    return (Path(name).suffix.lower() in DOWNLOAD_SUFFIXES
            and asset_roles(name) != ["visual"] and not is_values_document(name))


def media_type(name: str) -> str:
    """The IANA media type of a published file (by extension)."""
    return MEDIA_TYPES.get(Path(name).suffix.lower(), "application/octet-stream")


def license_link(spdx_id: str) -> dict:
    """The ``license`` link of a licence's SPDX identifier: its page on spdx.org."""
    return {"rel": "license", "href": f"https://spdx.org/licenses/{spdx_id}.html",
            "type": "text/html", "title": f"Licence: {spdx_id} (SPDX)"}


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


# The Scientific Citation extension v1.0.0, for ``sci:citation`` (publish.citation): its rule
# for that field restated, as the File extension's are, so validation needs no network.
SCI_EXTENSION = "https://stac-extensions.github.io/scientific/v1.0.0/schema.json"
SCI_EXTENSION_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "$id": SCI_EXTENSION,
    "title": "Scientific Citation Extension (fields used by dpatlas)",
    "type": "object",
    "required": ["stac_extensions"],
    "properties": {
        "stac_extensions": {"type": "array", "contains": {"const": SCI_EXTENSION}},
        "properties": {"type": "object",
                       "properties": {"sci:citation": {"type": "string", "minLength": 1}}},
    },
}
# An SPDX identifier as STAC 1.1 allows it in ``license`` (else "other").
_SPDX_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")


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
    asset = pystac.Asset(href=f"../{release_id}/{name}", title=TITLES.get(name) or (
        cell_tiles_title(name) if level_of_cell_tiles_file(name)
        else document_title(name) if is_values_document(name) else name),
                         media_type=MEDIA_TYPES.get(suffix), roles=asset_roles(name))
    FileExtension.ext(asset).apply(checksum=multihash_sha256(sha256), size=int(size))
    return asset


def build_item(root: Path, entry: dict):
    """The STAC Item of one feed entry (``feed.json``'s ``releases[i]``)."""
    import pystac

    rid = entry["release_id"]
    manifest = _manifest(root, rid)
    extent = manifest.get("extent") or {}
    geometry, bbox = extent.get("geometry"), extent.get("bbox")
    status = entry.get("status", "published")
    told = published_metadata(root / rid)  # publish.title, notice, description where set
    properties = {
        "title": (told.get("title") or f"Release {rid}")
                 + (" (withdrawn)" if status == "withdrawn" else ""),
        "description": " ".join([*(told[k] for k in ("notice", "description") if k in told),
                                 "Differentially private per-tract income mobility (p25, p75)"]),
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
    _add_files(item, root, entry, manifest)
    _add_license_and_citation(item, manifest)
    return item


def _add_files(item, root: Path, entry: dict, manifest: dict) -> None:
    """Every verified file of the entry, and its manifest (when it could be read), as assets
    (key: the file name)."""
    from pystac.extensions.file import FileExtension

    rid = entry["release_id"]
    FileExtension.add_to(item)
    for name, meta in sorted(entry.get("files", {}).items()):
        if _usable_file(name, meta):
            item.add_asset(name, _asset(rid, name, meta["sha256"], meta["bytes"]))
    if manifest and _SHA256.fullmatch(str(entry.get("manifest_sha256"))):
        item.add_asset(MANIFEST, _asset(rid, MANIFEST, entry["manifest_sha256"],
                                        (root / rid / MANIFEST).stat().st_size))


def _license(manifest: dict) -> str | None:
    value = manifest.get("license")
    return value if isinstance(value, str) and _SPDX_ID.fullmatch(value) else None


def _add_license_and_citation(item, manifest: dict) -> None:
    """The manifest's licence (SPDX id, with a ``license`` link) and citation (the Scientific
    Citation extension's ``sci:citation``); an older manifest has neither."""
    import pystac

    spdx = _license(manifest)
    if spdx is not None:
        item.properties["license"] = spdx
        item.add_link(pystac.Link.from_dict(license_link(spdx)))
    citation = manifest.get("citation")
    if isinstance(citation, str) and citation.strip():
        item.stac_extensions.append(SCI_EXTENSION)
        item.properties["sci:citation"] = citation


def build_synthetic_item(root: Path, entry: dict, source_status: str | None):
    """The STAC Item of a synthetic-microdata entry (``feed.json``'s ``synthetic[i]``): its
    files as assets, the footprint of its source release, a ``derived_from`` link to the
    source's Item (added by :func:`build_catalog`), the source's status."""
    import pystac

    sid, source = entry["release_id"], entry.get("source_release")
    manifest = _manifest(root, sid)
    # The source's footprint, read only for a source the feed lists (a checked id).
    extent = (_manifest(root, source).get("extent") or {}) if source_status else {}
    geometry, bbox = extent.get("geometry"), extent.get("bbox")
    status = source_status or "published"  # a source the feed does not list: as published
    properties = {
        "title": f"Synthetic microdata {sid} of release {source}"
                 + (" (source withdrawn)" if status == "withdrawn" else ""),
        "description": "Differentially private synthetic records (parent rank x, child rank "
                       "y) per tract and cell, drawn by BinAgg's Algorithm 3 from its DP "
                       "summaries; the aggregated regression on a tract's rows is BinAgg's "
                       "estimate",
        "dpatlas:kind": "synthetic microdata",
        "dpatlas:source_release": source,
        "dpatlas:status": status,
        "dpatlas:mode": manifest.get("mode"),
        "dpatlas:guarantee": manifest.get("total_per_person"),
    }
    item = pystac.Item(id=sid, geometry=geometry, bbox=bbox if geometry else None,
                       datetime=_time(manifest.get("created") or entry.get("published")),
                       properties={k: v for k, v in properties.items() if v is not None})
    _add_files(item, root, entry, manifest)
    _add_license_and_citation(item, manifest)
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
    return (isinstance(name, str) and (_PLAIN_NAME.fullmatch(name) is not None
                                       or PART_NAME.fullmatch(name) is not None
                                       or is_values_document(name))
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


def build_catalog(root: Path, releases: list[dict],
                  synthetic: list[dict] | None = None) -> dict[str, dict]:
    """Every catalogue document for the feed's ``releases`` and ``synthetic`` entries:
    {path relative to root: JSON}.

    Self-contained: links and asset hrefs are relative, there are no ``self`` links, so the
    documents are the same bytes wherever the root is mounted. An entry whose id is not a
    valid release id (only a hand-edited or very old feed.json has one) gets no Item: its id
    could not name a file safely.
    """
    import pystac

    root = Path(root)
    items = [build_item(root, entry) for entry in releases
             if isinstance(entry, dict) and _usable_entry(entry)]
    by_id = {item.id: item for item in items}
    status = {e["release_id"]: e.get("status") for e in releases if isinstance(e, dict)}
    for entry in synthetic or []:
        if (isinstance(entry, dict) and _usable_entry(entry)
                and entry["release_id"] not in by_id):
            item = build_synthetic_item(root, entry, status.get(entry.get("source_release")))
            if entry.get("source_release") in by_id:
                item.add_link(pystac.Link("derived_from", by_id[entry["source_release"]],
                                          media_type="application/geo+json",
                                          title="The release it was drawn for"))
            items.append(item)
    licences = {item.properties.get("license") for item in items}
    licence = licences.pop() if len(licences) == 1 and None not in licences else "other"
    collection = pystac.Collection(
        id=COLLECTION_ID,
        title="dpatlas releases",
        description="Differentially private, map-ready releases of economic mobility per "
                    "census tract: one item per release, withdrawn releases marked, and one "
                    "per synthetic-microdata folder drawn for a release.",
        extent=_collection_extent(items),
        license=licence,
        catalog_type=pystac.CatalogType.SELF_CONTAINED,
    )
    if licence != "other":
        collection.add_link(pystac.Link.from_dict(license_link(licence)))
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
            self.schema_cache[SCI_EXTENSION] = SCI_EXTENSION_SCHEMA

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
