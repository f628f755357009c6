"""The embedded default: the synthetic state (North Carolina's real outline and counties,
synthetic tracts and people), its release config and its ledger
cap. One place for `dpatlas demo` and the benchmarks, so a benchmark runs what the demo runs
(a copy of the config in a benchmark went stale once the person id became required)."""

from __future__ import annotations

from pathlib import Path

DEMO_CAP_EPSILON, DEMO_CAP_DELTA = 10.0, 1e-5
DEMO_VINTAGE = "synthetic (dpatlas synth, seed 0)"


DEMO_STATE = "37"  # North Carolina: real outline and counties (dpatlas.publication.geography)


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
                   vintage: str = DEMO_VINTAGE, **extra) -> dict:
    """The demo's release config for the synthetic data in ``data`` (``extra``: further
    top-level keys, e.g. ``ledger`` or ``runner``)."""
    from dpatlas.release.thresholds import DEFAULT_THRESHOLDS

    return {
        "input": {"path": str((data / "microdata").resolve()), "format": "parquet",
                  "columns": {"person_id": "person_id"}},
        "boundaries": {"path": str((data / "tracts.parquet").resolve()), "vintage": vintage},
        "privacy": {"epsilon_per_tract": 1.0, "delta": 1e-6},
        "selection": {"rule": "dp", "threshold_file": str(DEFAULT_THRESHOLDS),
                      "budget_share": 0.1},
        "profile": {"name": profile},
        "validation": {"policy": "fail"},
        "publish": {"root": str(publish_root.resolve())},
        # counties and states beside the tracts (issue 20), at the default split
        "levels": ["tract", "county", "state"],
        # model-based tract estimates from the published tables (docs/small-area.md)
        "small_area": {"model": True},
        **extra,
    }


def write_demo_config(out: Path, profile: str = "primary") -> Path:
    """``out/config.yaml`` for the demo data in ``out/data``, releases in ``out/releases``."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"
    cfg = release_config(out / "data", out / "releases", profile=profile)
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
