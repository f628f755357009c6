import numpy as np
import pytest

from mechanisms.noise import SeededRandomness


@pytest.fixture
def rand():
    return SeededRandomness(20261121)


def line_tract(n: int, seed: int = 0, slope: float = 0.4, noise: float = 0.15):
    rng = np.random.default_rng(seed)
    x = np.round(rng.uniform(0, 1, n), 2)
    y = np.clip(0.3 + slope * x + rng.normal(0, noise, n), 0, 1)
    return x, y


def write_config(path, base: dict, **over) -> "Path":
    """Write a release config: ``base`` with top-level sections updated (dicts merged) by ``over``."""
    import yaml

    cfg = dict(base)
    for key, value in over.items():
        cfg[key] = {**cfg.get(key, {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(cfg))
    return path
