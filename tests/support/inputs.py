"""Inputs the tests share: a tract's data on a line, and release configs as an operator writes
them (with a ledger cap set the operator's way)."""

import numpy as np


def line_tract(n: int, seed: int = 0, slope: float = 0.4, noise: float = 0.15):
    rng = np.random.default_rng(seed)
    x = np.round(rng.uniform(0, 1, n), 2)
    y = np.clip(0.3 + slope * x + rng.normal(0, noise, n), 0, 1)
    return x, y


TEST_CAP = (10.0, 1e-5)


def write_config(path, base: dict, **over) -> "Path":
    """Write a release config: ``base`` with top-level sections updated (dicts merged) by ``over``.

    Test defaults, unless the test says otherwise: the synthetic data's ``person_id`` column is
    named (so one record per person is checked), the publish root is a test root (seeded noise
    is allowed only there), and the ledger has a lifetime cap (the config's stated cap, else
    TEST_CAP), set the way an operator does, with a reason.
    """
    import copy

    import yaml

    cfg = copy.deepcopy(base)
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    inp = cfg.setdefault("input", {})
    if not cfg.get("privacy", {}).get("assume_one_record_per_person"):
        inp.setdefault("columns", {}).setdefault("person_id", "person_id")
    cfg.setdefault("publish", {}).setdefault("mode", "test")
    path.write_text(yaml.safe_dump(cfg))
    set_test_cap(path)
    return path


def set_test_cap(config_path) -> None:
    """Give the config's ledger dataset a lifetime cap if it has none (test set-up)."""
    from dpatlas.core.config import load_config
    from dpatlas.ledger import Ledger

    cfg = load_config(config_path)
    ledger = Ledger(cfg.ledger.url)
    try:
        if ledger.cap(cfg.ledger.dataset) is None:
            eps = cfg.ledger.cap_epsilon if cfg.ledger.cap_epsilon is not None else TEST_CAP[0]
            delta = cfg.ledger.cap_delta if cfg.ledger.cap_delta is not None else TEST_CAP[1]
            ledger.set_cap(cfg.ledger.dataset, eps, delta, reason="test set-up")
    finally:
        ledger.close()


def levels_release_config(tmp, **publish) -> dict:
    """The config of a seeded release of the synthetic state written to ``tmp/data`` with
    all three levels and the small-area model (``publish``: further publish keys)."""
    return {"input": {"path": str(tmp / "data" / "microdata")},
            "boundaries": {"path": str(tmp / "data" / "tracts.parquet")},
            "privacy": {"epsilon_per_tract": 1.0},
            "selection": {"rule": "dp", "threshold": 3.0},
            "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal"),
                        **publish},
            "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": "il"},
            "partition_tracts": 30, "levels": ["tract", "county", "state"],
            "small_area": {"model": True}}


def basic_release_config(data, tmp, **extra) -> dict:
    """The config of a tract release of ``data`` (write_synthetic's folder) with its work under
    ``tmp``: ε 1 per tract, the dp rule at threshold 3; ``extra``: more top-level keys."""
    return {"input": {"path": str(data / "microdata")},
            "boundaries": {"path": str(data / "tracts.parquet")},
            "privacy": {"epsilon_per_tract": 1.0},
            "selection": {"rule": "dp", "threshold": 3.0},
            "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal")},
            **extra}


def cells_release_config(data, tmp, dataset: str = "cells", **extra) -> dict:
    """The config of a release of generated cells (``data``: write_synthetic's folder with
    ``cells``) with its work under ``tmp``: every level, ε 1 per tract, min_n 20; ``extra``:
    more top-level keys (``small_area``, ``runner``...)."""
    return {"input": {"path": str(data / "microdata"), "columns": {"cell": "cell"}},
            "boundaries": {"path": str(data / "tracts.parquet")},
            "privacy": {"epsilon_per_tract": 1.0},
            "selection": {"rule": "dp", "threshold": 3.0},
            "publish": {"root": str(tmp / "releases"), "internal_root": str(tmp / "internal"),
                        "min_n": 20},
            "ledger": {"url": f"sqlite:///{tmp / 'ledger.db'}", "dataset": dataset},
            "partition_tracts": 25, "levels": ["tract", "county", "state"], **extra}


def write_model_cells_config(tmp, data, dataset: str, **over) -> "Path":
    """A release of generated cells with the small-area model (:func:`cells_release_config`),
    its config written in ``tmp`` (``over``: top-level keys, as :func:`write_config`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = cells_release_config(data, tmp, dataset, small_area={"model": True})
    return write_config(tmp / "config.yaml", cfg, **over)
