"""``datapackage.json``: a Frictionless Data Package describing a release's tables.

One per release folder, beside the files it describes (https://specs.frictionlessdata.io/
data-package/): for every published table (tracts, and counties and states with levels) a
tabular resource for its CSV, with the Table Schema published beside it
(``<stem>.schema.json``, inlined so the package stands alone), and a file resource for its
GeoParquet, whose schema is the same fields plus the geometry; each with its media type, size
and sha256, so ``frictionless validate datapackage.json`` checks every CSV against its schema
and every file against its hash. The package states the data's licence (``publish.license``,
an SPDX id) and how to cite it (``publish.citation``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mechanisms.estimand import ESTIMAND

from dpatlas.publication.state_parts import CSV_PARTS, PARQUET_PARTS, parts_of
from dpatlas.core.config import DEFAULT_LICENSE
from dpatlas.core.hashing import sha256_file

DATAPACKAGE_FILE = "datapackage.json"
# Tables a release may publish, in the package's order, with what a row is.
TABLES = (("tracts", "census tract"), ("counties", "county"), ("states", "state"))
PARQUET_MEDIA_TYPE = "application/vnd.apache.parquet"  # IANA, registered 2024
GEOMETRY_FIELD = {"name": "geometry", "type": "any",
                  "description": "The unit's boundary: WKB (GeoParquet 1.1 metadata), "
                                 "longitude/latitude on WGS 84 (EPSG:4326); public"}


def package_name(release_id: str) -> str:
    """A Data Package name (lower-case letters, digits, ``-._``) for the release."""
    return "dpatlas-" + re.sub(r"[^a-z0-9._-]", "-", release_id.lower())


def licence_entry(spdx_id: str) -> dict:
    """The package's ``licenses`` entry for an SPDX identifier."""
    return {"name": spdx_id, "path": f"https://spdx.org/licenses/{spdx_id}.html",
            "title": f"{spdx_id} (SPDX)"}


def _file_facts(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "hash": f"sha256:{sha256_file(path)}"}


def _table_resources(folder: Path, stem: str, unit: str, files: set[str]) -> list[dict]:
    csv, schema_file, parquet = f"{stem}.csv", f"{stem}.schema.json", f"{stem}.parquet"
    if stem == "tracts" and parts_of(files, CSV_PARTS):
        return _part_resources(folder, files, schema_file)
    if csv not in files or schema_file not in files:
        return []
    schema = json.loads((folder / schema_file).read_text())
    out = [{"name": stem, "type": "table", "path": csv, "format": "csv",
            "mediatype": "text/csv", "encoding": "utf-8",
            "title": f"{stem.capitalize()} (CSV)",
            "description": f"One row per {unit} and cell: differentially private p25 and p75 "
                           f"with their status and budget; Table Schema also in {schema_file}",
            **_file_facts(folder / csv), "schema": schema}]
    if parquet in files:
        out.append({"name": f"{stem}-geoparquet", "type": "file", "path": parquet,
                    "format": "parquet", "mediatype": PARQUET_MEDIA_TYPE,
                    "title": f"{stem.capitalize()} (GeoParquet)",
                    "description": f"The rows of {csv} with each {unit}'s boundary",
                    **_file_facts(folder / parquet),
                    "schema": {**schema, "fields": [*schema["fields"], GEOMETRY_FIELD]}})
    return out


def _part_resources(folder: Path, files: set[str], schema_file: str) -> list[dict]:
    """The tract table of a release of several states: one multi-part resource per format
    (Frictionless: ``path`` a list, the parts read as one table, the CSV parts each with its
    header); each part's sha256 and size are in manifest.json."""
    schema = json.loads((folder / schema_file).read_text())
    return [{"name": "tracts", "type": "table", "path": parts_of(files, CSV_PARTS),
             "format": "csv", "mediatype": "text/csv", "encoding": "utf-8",
             "dialect": {"header": True}, "title": "Tracts (CSV, one file per state)",
             "description": "One row per census tract and cell, one file per state: "
                            "differentially private p25 and p75 with their status and budget; "
                            f"Table Schema also in {schema_file}", "schema": schema},
            {"name": "tracts-geoparquet", "type": "file",
             "path": parts_of(files, PARQUET_PARTS), "format": "parquet",
             "mediatype": PARQUET_MEDIA_TYPE,
             "title": "Tracts (GeoParquet, a dataset partitioned by state)",
             "description": "The rows of the CSV parts with each census tract's boundary",
             "schema": {**schema, "fields": [*schema["fields"], GEOMETRY_FIELD]}}]


def build_datapackage(folder: Path, files: list[str], release_id: str, config: dict) -> dict:
    """The Data Package of the release staged in ``folder`` (``files``: the names published;
    ``config``: the published config, ``config.json``, for dataset, licence and citation)."""
    folder, names = Path(folder), set(files)
    publish, ledger = config.get("publish") or {}, config.get("ledger") or {}
    spdx = publish.get("license") or DEFAULT_LICENSE
    package = {
        "name": package_name(release_id),
        "id": f"urn:dpatlas:release:{release_id}",
        "title": publish.get("title") or f"dpatlas release {release_id}",
        "description": _reader_text(publish) + ("Differentially private income mobility (p25, p75: predicted child "
                        "income rank at parent rank 25 and 75) of dataset "
                        f"{ledger.get('dataset', 'default')}. Every value is a differentially "
                        "private release or post-processing of one; manifest.json states the "
                        "guarantee, the budget spent and every file's sha256. Every value, "
                        "interval, standard error and margin of error, direct and model-based, "
                        f"estimates one thing: the {ESTIMAND}."),
        "keywords": ["differential privacy", "economic mobility", "census tracts"],
        "licenses": [licence_entry(spdx)],
        "resources": [r for stem, unit in TABLES
                      for r in _table_resources(folder, stem, unit, names)],
    }
    if publish.get("citation"):
        package["citation"] = publish["citation"]  # not a spec property: kept as given
    if publish.get("contact"):
        package["contact"] = publish["contact"]    # likewise
    return package


def _reader_text(publish: dict) -> str:
    """The config's notice, description and measure (whichever are set), to lead the
    package's description."""
    parts = [publish.get("notice"), publish.get("description"), publish.get("measure")]
    return "".join(f"{p.strip()} " for p in parts if p)


def write_datapackage(folder: Path, files: list[str], release_id: str, config: dict) -> str:
    """Write ``datapackage.json`` into ``folder``; its name (for the manifest)."""
    package = build_datapackage(folder, files, release_id, config)
    (Path(folder) / DATAPACKAGE_FILE).write_text(
        json.dumps(package, indent=2, ensure_ascii=False) + "\n")
    return DATAPACKAGE_FILE
