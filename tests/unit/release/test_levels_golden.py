"""The county and state estimates are pinned bit for bit: issue 22's speed-ups of the level
estimation (unit labels grouped as fixed-width text) must not move a single value.

``data/levels_golden.csv`` was written BEFORE those changes, by main's ``estimate_levels`` (at
de13102; the file is unchanged there) with ``.venv/bin/python -m
tests.unit.release.test_levels_golden`` (``write_golden`` below): two states, two cells, a
fixed noise seed, at full float64 precision (``%.17g`` round-trips exactly). Rewritten at
issue 32, whose interval step changed on purpose (a third draw, the total error, standard
errors): from then on it pins that code the same way. Rewritten at issue 33, whose level
rows state their own steps' spend: only epsilon_spent changed (the values are the same)."""

from pathlib import Path

import numpy as np
import pandas as pd

from dpatlas.core.config import parse_config
from dpatlas.release.allocate import plan
from dpatlas.release.levels import estimate_levels
from mechanisms.noise import default_randomness

GOLDEN = Path(__file__).parent / "data" / "levels_golden.csv"


def golden_records() -> pd.DataFrame:
    """Two states of 12 counties (a few below min_n), two cells, records in no order."""
    rng = np.random.default_rng(22)
    frames = []
    for state in ("06", "17"):
        for c in range(12):
            k = int(rng.choice([3, 300, 1500]))
            x = rng.uniform(0, 1, k)
            y = np.clip(0.3 + 0.4 * x + rng.normal(0, 0.2, k), 0, 1)
            geoid = [f"{state}{2 * c + 1:03d}{t:06d}" for t in rng.integers(0, 6, k)]
            frames.append(pd.DataFrame({"geoid": geoid, "cell": rng.choice(["f", "m"], k),
                                        "x": x, "y": y}))
    return pd.concat(frames, ignore_index=True).sample(frac=1.0, random_state=3,
                                                        ignore_index=True)


def estimates() -> pd.DataFrame:
    budget = plan(parse_config({"input": {"path": "x"}, "boundaries": {"path": "b"},
                                "selection": {"rule": "dp", "threshold": 3.0},
                                "levels": ["tract", "county", "state"]}), 3.0)
    return estimate_levels(golden_records(), budget, default_randomness(2022), 20)


def write_golden() -> None:
    GOLDEN.parent.mkdir(exist_ok=True)
    with open(GOLDEN, "w") as out:
        out.write("# estimate_levels on test_levels_golden.golden_records(), seed 2022, "
                  "written by the code of issue 32 (intervals of the total error), "
                  "epsilon_spent by issue 33's (each level's own steps)\n")
        estimates().to_csv(out, index=False, float_format="%.17g")


def test_the_level_estimates_are_identical_to_the_golden_file():
    want = pd.read_csv(GOLDEN, comment="#", dtype={"geoid": str, "cell": str},
                       keep_default_na=False, na_values=[""])
    got = estimates()
    assert (got["status"] == "released").sum() > 20 and (got["status"] == "suppressed").any()
    got = pd.read_csv(pd.io.common.StringIO(got.to_csv(index=False, float_format="%.17g")),
                      dtype={"geoid": str, "cell": str}, keep_default_na=False, na_values=[""])
    pd.testing.assert_frame_equal(got, want, check_exact=True)


if __name__ == "__main__":
    write_golden()
