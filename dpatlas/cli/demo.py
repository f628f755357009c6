"""The embedded default: the synthetic state (North Carolina's real outline and counties,
synthetic tracts and people), its release config and its ledger
cap. One place for `dpatlas demo` and the benchmarks, so a benchmark runs what the demo runs
(a copy of the config in a benchmark went stale once the person id became required)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dpatlas.core.errors import OperatorError

DEMO_CAP_EPSILON, DEMO_CAP_DELTA = 10.0, 1e-5
DEMO_VINTAGE = "synthetic (dpatlas synth, seed 0)"


DEMO_STATE = "37"  # North Carolina: real outline and counties (dpatlas.publication.geography)
# Written first into a folder the demo takes: it then writes its config, data, ledger cap and
# releases there, so it must never take a folder that holds anyone else's.
DEMO_MARKER = ".dpatlas-demo.json"
PROFILES = ("primary", "full-suite")


class DemoFolderInUse(RuntimeError, OperatorError):
    """``dpatlas demo --out`` names a folder the demo did not create; nothing was written."""


def claim_demo_folder(out: Path) -> None:
    """Take ``out`` for the demo: a new or empty folder, or one a demo made (its marker, or,
    made before the marker existed, only the demo's files with the demo's config), and mark
    it. Anything else is refused before a byte is written: the demo would overwrite its
    config, set its ledger's cap and publish its data."""
    if (out / DEMO_MARKER).is_file():
        return
    if out.exists() and not out.is_dir():
        raise DemoFolderInUse(f"--out {out} is a file, not a folder: give a new or empty folder")
    entries = sorted(p.name for p in out.iterdir()) if out.exists() else []
    if entries and not _earlier_demo(out, entries):
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more"
                                          if len(entries) > 5 else "")
        raise DemoFolderInUse(
            f"--out {out} already holds files the demo did not create ({shown}): the demo "
            "writes its own config.yaml, synthetic data, ledger cap and releases there and "
            "would overwrite or publish what is there; give a new or empty folder with --out "
            "(nothing was written)")
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text(json.dumps({"created_by": "dpatlas demo"}) + "\n")


def _earlier_demo(out: Path, entries: list[str]) -> bool:
    """``out`` holds only what a demo of a version before the marker wrote, with its config."""
    import yaml

    if not set(entries) <= {"config.yaml", "data", "releases", "releases-internal",
                            "ledger.db", "ledger.db-journal"} or "config.yaml" not in entries:
        return False
    try:
        found = yaml.safe_load((out / "config.yaml").read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return False
    return any(found == release_config(out / "data", out / "releases", profile=profile,
                                       relative_to=out) for profile in PROFILES)


def demo_data_current(data: Path) -> bool:
    """The demo data exists, is of the demo's state and has the columns this version needs
    (a person id)."""
    import pyarrow.dataset as ds

    if not (data / "tracts.parquet").exists() or not (data / "microdata"
                                                       / f"state={DEMO_STATE}").is_dir():
        return False
    try:
        return "person_id" in ds.dataset(data / "microdata", partitioning="hive").schema.names
    except (OSError, ValueError):
        return False


def generate_demo_data(data: Path) -> dict:
    """Write the default state (seed 0, North Carolina) to ``data``; its summary."""
    from dpatlas.evaluation.synthetic_input import StateParams, write_synthetic

    return write_synthetic(data, [DEMO_STATE], 0, StateParams())


def release_config(data: Path, publish_root: Path, *, profile: str = "primary",
                   vintage: str = DEMO_VINTAGE, relative_to: Path | None = None,
                   **extra) -> dict:
    """The demo's release config for the synthetic data in ``data`` (``extra``: further
    top-level keys, e.g. ``ledger`` or ``runner``). Paths are absolute, or relative to
    ``relative_to`` (the config file's folder, against which a loaded config resolves them)."""
    def where(path: Path) -> str:
        path = path.resolve()
        return str(path) if relative_to is None else os.path.relpath(path, relative_to.resolve())

    return {
        "input": {"path": where(data / "microdata"), "format": "parquet",
                  "columns": {"person_id": "person_id"}},
        "boundaries": {"path": where(data / "tracts.parquet"), "vintage": vintage},
        "privacy": {"epsilon_per_tract": 1.0, "delta": 1e-6},
        # no threshold_file: the calibration shipped with the package
        "selection": {"rule": "dp", "budget_share": 0.1},
        "profile": {"name": profile},
        "validation": {"policy": "fail"},
        "publish": {"root": where(publish_root)},
        # counties and states beside the tracts (issue 20), at the default split
        "levels": ["tract", "county", "state"],
        # model-based tract estimates from the published tables (docs/small-area.md)
        "small_area": {"model": True},
        **extra,
    }


def write_demo_config(out: Path, profile: str = "primary") -> Path:
    """``out/config.yaml`` for the demo data in ``out/data``, releases in ``out/releases``;
    its paths are relative to ``out`` (and its ledger, the default, is ``out/ledger.db``), so
    the demo folder can be moved."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"
    cfg = release_config(out / "data", out / "releases", profile=profile, relative_to=out)
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return config


def ensure_demo_cap(config: Path) -> str | None:
    """Give the config's dataset the demo's lifetime cap if its ledger has none yet (the cap
    is the ledger's, never the config's). Returns what was done, or None."""
    from dpatlas.core.config import load_config
    from dpatlas.ledger import Ledger

    loaded = load_config(config)
    ledger = Ledger(loaded.ledger.url)
    if ledger.cap(loaded.ledger.dataset) is not None:
        return None
    ledger.set_cap(loaded.ledger.dataset, DEMO_CAP_EPSILON, DEMO_CAP_DELTA,
                   reason="dpatlas demo: default lifetime cap for the synthetic state")
    return (f"ledger: lifetime cap of dataset {loaded.ledger.dataset} set to "
            f"eps={DEMO_CAP_EPSILON:g}, delta={DEMO_CAP_DELTA:g} (demo default)")


class DemoArgumentError(ValueError, OperatorError):
    """A `dpatlas demo` argument that cannot be used: refused before anything is written."""


def check_demo_arguments(release_id: str | None, profile: str) -> None:
    """Refuse a bad ``--release-id`` or ``--profile`` first: they were refused only after the
    demo had generated its data and set the ledger's cap, blaming the config it wrote."""
    from typing import get_args

    from dpatlas.core.config import ProfileConfig
    from dpatlas.core.ids import validate_release_id

    if release_id is not None:
        validate_release_id(release_id)
    profiles = get_args(ProfileConfig.model_fields["name"].annotation)
    if profile not in profiles:
        raise DemoArgumentError(f"--profile {profile!r}: use one of {', '.join(profiles)}")
