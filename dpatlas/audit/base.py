"""The names every check shares: the manifest's fixed names and column lists, the report and the
two exceptions (a finding, an unreadable folder)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 * 1024 * 1024   # refused before reading: manifests are ~100 kB
MAX_JSON_DEPTH = 64                     # ours nest 8 deep; deeper is refused, not recursed
MAX_GEOJSON_BYTES = 1 << 33  # the published GeoJSON of a national release is a few GB
CONFIG = "config.json"
SYNTHETIC_KIND = "synthetic microdata"
SYNTHETIC_PARQUET, SYNTHETIC_CSV = "synthetic.parquet", "synthetic.csv"
SYNTHETIC_COLUMNS = ["GEOID", "cell", "bin_lo", "bin_hi", "x", "y"]
REL_TOL = 1e-9
RANDOM_BITS = ("os.urandom", "seeded (test only, NOT FOR RELEASE)")
RANDOM_BITS_MIXED = "mixed (NOT FOR RELEASE): "  # draws from several sources (test mode only)
STATUSES = ("released", "suppressed", "failed")
VALUE_COLUMNS = ("p25", "p75", "p25_raw", "p75_raw")

Check = tuple[str, bool, str]


class AuditUnreadable(Exception):
    """The folder or its manifest cannot be read at all."""


class Mismatch(Exception):
    """A check's finding (the message is the detail line)."""


@dataclass
class AuditReport:
    folder: Path
    checks: list[Check] = field(default_factory=list)
    ok: bool = False
    test: bool = False                  # a test release: its mode line reads TEST
    skipped: list[tuple[str, str]] = field(default_factory=list)  # anchors not given

    def lines(self) -> list[str]:
        def mark(name, good):
            if not good:
                return "FAIL"
            return "TEST" if self.test and name == "mode" else "ok  "
        return [f"{mark(name, good)}  {name}: {detail}" for name, good, detail in self.checks] \
            + [f"skip  {name}: {why}" for name, why in self.skipped]


def close(a: float, b: float, rel: float = REL_TOL) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-300)


# The one estimand's identifier (mechanisms/estimand.py ESTIMAND_ID), its SE cap and the 90%
# margin's z: fixed rules here, not the manifest's word (the audit imports nothing of ours).
ESTIMAND_ID = "tract expected outcome"
SE_CAP = 0.5
MOE90_Z = 1.6448536269514722


def _synthetic(m: dict) -> bool:
    return m.get("kind") == SYNTHETIC_KIND

# Columns published without noise (public under the replace-one relation; status is a
# function of the public n and of DP outputs). Everything else must be paid for.
PUBLIC_COLUMNS = ("geoid", "state", "county", "name", "cell", "n", "status", "geometry")


def _is_number(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


# The budget steps, the columns they pay for, and what a reason may say.
SELECTION_STEP = "selection: noisy n*var(x)"
PRIMARY_STEP = "primary: p25 and p75"
INTERVAL_STEP = "interval: p25 and p75"
INTERVAL_COLUMNS = ("p25_lo", "p25_hi", "p75_lo", "p75_hi")
SE_COLUMNS = ("p25_se", "p75_se")  # post-processing of the interval step
MOE90_COLUMNS = ("p25_moe90", "p75_moe90")  # value ± moe90: 90% margins, from the SEs
SPEND_COLUMNS = ("epsilon_spent", "delta_spent")
PRIMARY_MECHANISMS = ("NoisyStats", "DPExpTheilSen")
# `reason` may say only these: where nothing ran, the public n; where a mechanism failed, the
# DP failure it reports (dpatlas/release/estimate.py, dpatlas/publication/tract_files.py, mechanisms/*). The primary
# mechanisms fail only by a DP output: NoisyStats when its noisy n·var(x) is not positive; the
# exponential-mechanism Theil–Sen never fails (its "no pairs with distinct x" is the
# non-private median's, which is not publishable).
NO_RECORDS = "no records"
FAILURE_REASONS = {"NoisyStats": ("noisy nvar <= 0",)}


FLOAT_ATOL = 1e-9   # the formats print floats from the same float64 (shortest repr)


# Levels: a county is a GEOID's first 5 digits, a state its first 2 (levels.py).
LEVEL_DIGITS = {"county": 5, "state": 2}
LEVEL_STEMS = {"county": "counties", "state": "states"}


# The small-area model's columns (small_area.py).
MODEL_COLUMNS = tuple(f"{q}_model{end}" for q in ("p25", "p75")
                      for end in ("", "_lo", "_hi", "_se", "_z"))
MODEL_PAYER = "post-processing (small_area)"


def _shapely():
    """shapely, imported when polygons are compared (a synthetic folder's audit never is)."""
    import shapely

    return shapely
