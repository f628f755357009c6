"""``README.md``: the human-readable codebook in every release folder.

What the release is (``publish.title``, ``description``, ``notice``, ``measure``), what every
value estimates (:data:`mechanisms.estimand.ESTIMAND`), how to read its interval, standard
error and margin of error, suppression and the model's flags, how to load the tables with
their types, the licence, the citation and the contact; and every column of every published
table with its Table Schema description (read from the ``<stem>.schema.json`` files staged
beside it, so the codebook cannot disagree with them). Metadata about the files, outside the
privacy accounting: it is written from the public config and the public schemas only.
"""

from __future__ import annotations

import json
from pathlib import Path

from mechanisms.estimand import ESTIMAND, INTERVAL_MEANING, SE_MEANING

from dpatlas.publication import state_parts
from dpatlas.core.config import DEFAULT_LICENSE, READER_METADATA_KEYS
from dpatlas.publication import static_map
from dpatlas.publication.datapackage import TABLES

CODEBOOK_FILE = "README.md"
# Columns read as text, so codes keep their leading zeros and tracts join their counties.
TEXT_COLUMNS = ("geoid", "county", "state")


def published_metadata(folder: Path) -> dict:
    """What the release in ``folder`` tells its readers: its ``config.json``'s title,
    description, measure, notice and contact (those set; empty for a release without them)."""
    try:
        publish = json.loads((Path(folder) / "config.json").read_text()).get("publish") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    return {k: publish[k] for k in READER_METADATA_KEYS
            if isinstance(publish.get(k), str) and publish[k].strip()}


def release_title(release_id: str, publish: dict) -> str:
    """The release's title: ``publish.title`` when set, else one naming the release."""
    return publish.get("title") or f"dpatlas release {release_id}"


def _table_columns(folder: Path, stem: str) -> list[dict] | None:
    schema_path = Path(folder) / f"{stem}.schema.json"
    if not schema_path.is_file():
        return None
    return json.loads(schema_path.read_text())["fields"]


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _table_section(stem: str, unit: str, fields: list[dict]) -> list[str]:
    dtypes = ", ".join(f'"{c}": str' for c in TEXT_COLUMNS
                       if c in {f["name"] for f in fields})
    lines = [f"### {stem}.csv (one row per {unit} and cell)", "",
             f"Also as `{stem}.parquet` (GeoParquet, with each {unit}'s boundary); Table "
             f"Schema in `{stem}.schema.json`. Load it with its codes as text:", "",
             "```python", "import pandas as pd",
             f'{stem} = pd.read_csv("{stem}.csv", dtype={{{dtypes}}})', "```", "",
             "| column | type | description |", "|---|---|---|"]
    for field in fields:
        lines.append(f"| `{field['name']}` | {field.get('type', 'any')} | "
                     f"{_one_line(field.get('description', ''))} |")
    return lines + [""]


def build_codebook(folder: Path, release_id: str, config: dict) -> str:
    """The codebook (Markdown) of the release staged in ``folder``; ``config``: the published
    config (``config.json``)."""
    publish = config.get("publish") or {}
    lines = [f"# {release_title(release_id, publish)}", ""]
    if publish.get("notice"):
        lines += [f"> **Notice:** {_one_line(publish['notice'])}", ""]
    if publish.get("description"):
        lines += [_one_line(publish["description"]), ""]
    lines += [f"Release `{release_id}`. Every value is a differentially private release or "
              "post-processing of one; `manifest.json` states the guarantee, the budget spent "
              "and every file's sha256 (this file's too).", ""]
    lines += ["## The measure", ""]
    if publish.get("measure"):
        lines += [_one_line(publish["measure"]), ""]
    lines += [f"Every value, interval, standard error and margin of error, direct and "
              f"model-based, estimates one thing, the {_one_line(ESTIMAND)}.", "",
              "## How sure the values are", "",
              f"- Interval (`*_lo`, `*_hi`): a {INTERVAL_MEANING}; its level is in the "
              "column's description.",
              f"- SE (`*_se`): the {SE_MEANING}.",
              "- MOE (`*_moe90`): a 90% margin of error (the ACS convention: 1.645 standard "
              "errors); value ± MOE is a 90% interval.",
              "- Suppressed rows (`status` not released) carry no value: too few records "
              "(`n` below the minimum) or too little budget; `reason` says which.",
              "- Model columns (`*_model`, with their flags): a small-area model fitted to "
              "the published direct values (post-processing, no further privacy cost); a "
              "flag marks where the model may not apply.", ""]
    lines += ["## Tables", ""]
    for stem, unit in TABLES:
        fields = _table_columns(folder, stem)
        if fields is not None:
            lines += _table_section(stem, unit, fields)
    lines += static_map.codebook_lines(folder)
    lines += state_parts.codebook_lines(folder)
    licence = publish.get("license") or DEFAULT_LICENSE
    lines += ["## Licence, citation, contact", "",
              f"- Licence: {licence} (https://spdx.org/licenses/{licence}.html)",
              f"- Cite as: {_one_line(publish['citation'])}" if publish.get("citation")
              else f"- Cite as: {release_title(release_id, publish)}, release {release_id}",
              ]
    if publish.get("contact"):
        lines.append(f"- Contact: {_one_line(publish['contact'])}")
    return "\n".join(lines) + "\n"


def write_codebook(folder: Path, release_id: str, config: dict) -> str:
    """Write ``README.md`` into ``folder``; its name (for the manifest)."""
    (Path(folder) / CODEBOOK_FILE).write_text(build_codebook(folder, release_id, config),
                                              encoding="utf-8")
    return CODEBOOK_FILE
