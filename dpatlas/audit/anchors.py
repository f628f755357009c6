"""The anchors, run only when given: ``--boundaries`` (every tract of the boundary file once
per cell, polygons its own) and ``--ledger`` (the charge, the published manifest, the cap)."""

from __future__ import annotations

import contextlib
import hashlib
import math
from pathlib import Path

import pyarrow.parquet as pq

from .accounting import _charged, guarantee_from, zcdp_to_epsilon
from .base import AuditUnreadable, MANIFEST, MAX_GEOJSON_BYTES, Mismatch, REL_TOL, close
from .files import _config, _json_object, _sha256, readable
from .geometry import boundary_geometry_problems


def _tree_sha256(path: Path) -> str:
    """sha256 of a file, or of a folder as its sorted relative names and file hashes (what
    the manifest's boundaries.sha256 states: dpatlas/release/manifest.py, tree_sha256)."""
    if path.is_file():
        return _sha256(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(bytes.fromhex(_sha256(f)))
    return h.hexdigest()


def dbf_column(raw: bytes, column: str) -> list[str]:
    """One column of a dBase III table (a shapefile's attributes, .dbf), deleted records left
    out: a 32-byte header (record count, header and record lengths), 32-byte field
    descriptors up to 0x0D, then fixed-width records after a deletion flag."""
    count = int.from_bytes(raw[4:8], "little")
    header_len = int.from_bytes(raw[8:10], "little")
    record_len = int.from_bytes(raw[10:12], "little")
    offset, pos, where = 1, 32, None
    while pos + 32 <= header_len and raw[pos] != 0x0D:
        name = raw[pos:pos + 11].split(b"\0", 1)[0].decode("ascii", "replace")
        width = raw[pos + 16]
        if name == column:
            where = (offset, width)
        offset += width
        pos += 32
    if where is None:
        raise ValueError(f"no column {column!r}")
    values = []
    for i in range(count):
        record = raw[header_len + i * record_len:header_len + (i + 1) * record_len]
        if len(record) < record_len:
            raise ValueError("truncated .dbf")
        if record[:1] != b"*":
            values.append(record[where[0]:where[0] + where[1]].decode("utf-8").strip())
    return values


def _shapefile_geoids(path: Path, column: str) -> list[str]:
    import zipfile

    if path.suffix.lower() == ".shp":
        return dbf_column(path.with_suffix(".dbf").read_bytes(), column)
    with zipfile.ZipFile(path) as z:
        dbfs = [n for n in z.namelist() if n.lower().endswith(".dbf")]
        if len(dbfs) != 1:
            raise ValueError(f"{len(dbfs)} .dbf files in the archive, expected one")
        return dbf_column(z.read(dbfs[0]), column)


def _geopackage_geoids(path: Path, column: str) -> list[str]:
    import sqlite3

    with contextlib.closing(sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)) as db:
        tables = [r[0] for r in db.execute(
            "SELECT table_name FROM gpkg_contents WHERE data_type = 'features'")]
        if len(tables) != 1:
            raise ValueError(f"{len(tables)} feature tables, expected one")
        quoted = '"' + column.replace('"', '""') + '"'
        table = '"' + tables[0].replace('"', '""') + '"'
        return [str(r[0]) for r in db.execute(f"SELECT {quoted} FROM {table}")]


def boundary_geoids(path: Path, column: str) -> list[str]:
    """The GEOIDs of a boundary file in a format the release reads: GeoParquet, GeoJSON,
    GeoPackage, a zipped or bare shapefile (AuditUnreadable otherwise)."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return [str(v) for v in pq.read_table(path, columns=[column]).column(column)
                    .to_pylist()]
        if suffix in (".geojson", ".json"):
            features = _json_object(path, path.name, AuditUnreadable,
                                    MAX_GEOJSON_BYTES).get("features") or []
            return [str((f.get("properties") or {}).get(column)) for f in features]
        if suffix in (".zip", ".shp"):
            return _shapefile_geoids(path, column)
        if suffix == ".gpkg":
            return _geopackage_geoids(path, column)
    except AuditUnreadable:
        raise
    except Exception as err:  # noqa: BLE001 - the anchor itself cannot be read
        raise AuditUnreadable(f"--boundaries {path}: cannot be read ({type(err).__name__}: "
                              f"{err})") from None
    raise AuditUnreadable(f"--boundaries {path}: not a boundary file the release could have "
                          "read (.parquet, .geojson, .json, .gpkg, .zip, .shp)")


def check_boundaries(folder: Path, m: dict, path: Path) -> str:
    """The boundary file the release names (by sha256) has every tract exactly once per
    cell in the table: no released row deleted, none added."""
    problems = []
    stated = (m.get("boundaries") or {}).get("sha256")
    digest = _tree_sha256(path)
    if digest != stated:
        problems.append(f"{path.name} has sha256 {digest[:12]}..., the manifest's boundaries "
                        f"{str(stated)[:12]}...: not the file this release was made from")
    try:
        cfg = _config(folder)
        column = (cfg.get("boundaries") or {}).get("geoid_column") or "GEOID"
    except Mismatch:
        column = "GEOID"
    geoids = boundary_geoids(path, column)
    try:
        table = pq.read_table(readable(folder / "tracts.parquet"),
                              columns=["geoid", "cell"]).to_pylist()
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    cells = [str(c) for c in m["cells"]]
    counts: dict[tuple[str, str], int] = {}
    for r in table:
        key = (str(r["geoid"]), str(r["cell"]))
        counts[key] = counts.get(key, 0) + 1
    want = {(g, c) for g in geoids for c in cells}
    missing = sorted(want - set(counts))
    extra = sorted(set(counts) - want)
    twice = sorted(k for k, v in counts.items() if v > 1)
    for what, keys in (("missing", missing), ("not in the boundaries", extra),
                       ("more than once", twice)):
        if keys:
            problems.append(f"{len(keys)} (tract, cell) row(s) {what}, e.g. {keys[0]}")
    problems += boundary_geometry_problems(folder, m, path, column)
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{len(set(geoids)):,} boundary tracts x {len(cells)} cell(s): exactly one row "
            "each; every polygon of tracts.parquet, tracts.geojson and tracts.pmtiles (its "
            "lowest zoom) is its boundary tract's (within tolerance)")


def _ledger_rows(url: str, release_id: str, dataset: str) -> tuple[dict | None, list[dict],
                                                                  tuple | None, tuple]:
    """(release row, its charges, the dataset's cap, the dataset's spend) from a ledger
    (dpatlas/ledger/store.py's tables), read only."""
    import sqlalchemy as sa

    try:
        parsed = sa.engine.make_url(url)
    except Exception:  # noqa: BLE001 - a malformed URL
        raise AuditUnreadable("--ledger: not a database URL (sqlite:///FILE or "
                              "postgresql+psycopg://...)") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if not db or db == ":memory:" or not Path(db).is_file():
            raise AuditUnreadable(f"--ledger: no ledger file {db!r}")
        url = f"sqlite:///file:{Path(db).resolve()}?mode=ro&uri=true"
    elif parsed.get_backend_name() != "postgresql":
        raise AuditUnreadable(f"--ledger: backend {parsed.get_backend_name()!r} is not a ledger "
                              "(sqlite or postgresql)")
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            def rows(sql, **kw):
                return [dict(r._mapping) for r in conn.execute(sa.text(sql), kw)]
            release = rows("SELECT release_id, dataset, status, manifest_sha256 FROM "
                           "ledger_releases WHERE release_id = :r", r=release_id)
            charges = rows("SELECT cell, step, guarantee_type, epsilon, delta, rho FROM "
                           "ledger_charges WHERE release_id = :r ORDER BY seq", r=release_id)
            cap = rows("SELECT cap_epsilon, cap_delta FROM ledger_caps WHERE dataset = :d",
                       d=dataset)
            spent = rows("SELECT c.guarantee_type AS kind, c.epsilon AS e, c.delta AS d, "
                         "c.rho AS rho FROM ledger_charges c JOIN ledger_releases r ON "
                         "r.release_id = c.release_id WHERE r.dataset = :d", d=dataset)
    except sa.exc.SQLAlchemyError as err:
        raise AuditUnreadable(f"--ledger: cannot be read ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})") from None
    finally:
        engine.dispose()
    return (release[0] if release else None, charges,
            (cap[0]["cap_epsilon"], cap[0]["cap_delta"]) if cap else None,
            lifetime_spend(spent))


def lifetime_spend(charges: list[dict]) -> tuple[float, float]:
    """A dataset's (ε, δ) over its ledger charges (dicts with kind, e, d, rho): δ summed; ε
    summed (basic composition), or, when tighter, the zCDP charges' ρ summed and converted once
    at the sum of their δ, plus the other charges' ε. Both bound the same total δ."""
    eps = math.fsum(float(c["e"]) for c in charges)
    delta = math.fsum(float(c["d"]) for c in charges)
    zcdp = [c for c in charges if c["kind"] == "zcdp" and c["rho"] is not None]
    rho = math.fsum(float(c["rho"]) for c in zcdp)
    zcdp_delta = math.fsum(float(c["d"]) for c in zcdp)
    if rho > 0 and 0 < zcdp_delta < 1:
        others = math.fsum(float(c["e"]) for c in charges
                           if not (c["kind"] == "zcdp" and c["rho"] is not None))
        eps = min(eps, others + zcdp_to_epsilon(rho, zcdp_delta))
    return eps, delta


def _rho_problems(charges: list[dict], m: dict) -> list[str]:
    """A zCDP charge's stored ρ is its step's (the lifetime spend composes these ρ)."""
    steps = {s.get("step"): guarantee_from(s.get("guarantee")) for s in m["budget"]["steps"]}
    off = [c for c in charges if c["guarantee_type"] == "zcdp"
           and (c["step"] not in steps or steps[c["step"]].kind != "zcdp"
                or c["rho"] is None or not close(float(c["rho"]), steps[c["step"]].rho))]
    if not off:
        return []
    return [f"{len(off)} zCDP charge(s) whose rho is not their step's, e.g. "
            f"{off[0]['cell']} / {off[0]['step']}: rho {off[0]['rho']!r}"]


def check_ledger(folder: Path, m: dict, url: str) -> str:
    """The ledger charged this release exactly what its steps cost, published this manifest
    (by sha256), and the dataset's spend is within its cap."""
    rid, entry = m.get("release_id"), m["ledger_entry"]
    dataset = entry.get("dataset")
    release, charges, cap, spent = _ledger_rows(url, str(rid), str(dataset))
    if release is None:
        raise Mismatch(f"release {rid!r} is not in the ledger")
    problems = []
    if release["dataset"] != dataset:
        problems.append(f"the ledger charged dataset {release['dataset']!r}, the manifest says "
                        f"{dataset!r}")
    if release["status"] != "published":
        problems.append(f"the ledger's status is {release['status']!r}, not published")
    if release["manifest_sha256"] != _sha256(folder / MANIFEST):
        problems.append("manifest.json is not the manifest the ledger recorded as published "
                        "(sha256 differs)")
    conv = float(m["budget"].get("conversion_delta") or 0.0)
    want = {}
    for s in m["budget"]["steps"]:
        want[s.get("step")] = _charged(guarantee_from(s.get("guarantee")), conv)
    got: dict[tuple[str, str], tuple[float, float]] = {}
    for c in charges:
        got[(str(c["cell"]), str(c["step"]))] = (float(c["epsilon"]), float(c["delta"]))
    expected = {(str(cell), step): v for cell in m["cells"] for step, v in want.items()}
    if set(got) != set(expected):
        problems.append(f"the ledger charged {len(got)} (cell, step) pair(s), the manifest's "
                        f"steps need {len(expected)}: "
                        f"{sorted(set(got) ^ set(expected))[:3]}")
    else:
        off = [k for k, (e, d) in expected.items()
               if not (close(got[k][0], e) and close(got[k][1], d))]
        if off:
            k = off[0]
            problems.append(f"{len(off)} charge(s) differ from the steps' guarantees, e.g. "
                            f"{k}: ledger {got[k]}, recomputed ({expected[k][0]:.12g}, "
                            f"{expected[k][1]:.6g})")
    problems += _rho_problems(charges, m)
    if cap is None:
        problems.append(f"dataset {dataset!r} has no cap in the ledger")
    else:
        for what, used, limit in (("epsilon", spent[0], cap[0]), ("delta", spent[1], cap[1])):
            if used > float(limit) * (1 + REL_TOL):
                problems.append(f"the dataset's {what} spend {used:.12g} is over its cap "
                                f"{float(limit):.12g}")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"the ledger published this manifest and charged {len(charges)} step(s) as "
            f"recomputed; dataset {dataset!r} spent ({spent[0]:.6g}, {spent[1]:.3g}) of its "
            f"cap ({float(cap[0]):.6g}, {float(cap[1]):.3g})")
