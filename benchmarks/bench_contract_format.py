"""What the contract checks' first pass costs in GX's result format ``SUMMARY`` against
``BASIC``, side by side: a published state's tract table (``validate_published``) and a staged
input partition (``validate_input``), each run in a release's GX project as the release runs
them (a Checkpoint), the two formats alternated.

    .venv/bin/python benchmarks/bench_contract_format.py \\
        --tracts REL/tracts/state=06/part-0.parquet --staged INTERNAL/staged/input-06.parquet \\
        [--repeats 3]

``SUMMARY`` makes GX compute, for every row-level expectation, the index list and the pandas
query of its unexpected rows, even when there are none; ``BASIC`` gives the count and a sample
of the values, which is all the first pass reads (a failed row-level expectation is run again
in ``COMPLETE`` for its rows). Each line prints the CPU and the load average: run it alone.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks' _measure
from _measure import measure  # noqa: E402

import data_contracts.api as api  # noqa: E402

FORMATS = {"SUMMARY": {"result_format": "SUMMARY", "partial_unexpected_count": 5},
           "BASIC": {"result_format": "BASIC", "partial_unexpected_count": 5}}


def run(name: str, check, frame: pd.DataFrame, work: Path, repeat: int) -> float:
    """One check of ``frame`` with the first pass in format ``name``, in a new release project
    (a Checkpoint keeps the format it was made with); its CPU seconds."""
    api.FIRST_PASS_FORMAT = FORMATS[name]
    docs = api.ReleaseDocs.in_folder(work / f"{name}-{repeat}")
    with measure(f"{check.__name__} {name} (repeat {repeat + 1})") as m:
        result = check(frame, release=docs, run_name="bench")
    if not result.success:
        raise SystemExit(f"{check.__name__} failed on the benchmark's input: {result.failures}")
    print(m.line(), flush=True)
    return m.cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tracts", type=Path, required=True,
                        help="a published state's tracts (GeoParquet part)")
    parser.add_argument("--staged", type=Path, required=True,
                        help="a staged input partition (internal folder, staged/)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tracts = pd.read_parquet(args.tracts)
    staged = pd.read_parquet(args.staged)
    print(f"tracts: {len(tracts):,} rows; staged: {len(staged):,} records")
    totals: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in FORMATS:
                for check, frame in ((api.validate_published, tracts),
                                     (api.validate_input, staged)):
                    totals.setdefault((check.__name__, name), []).append(
                        run(name, check, frame, Path(tmp), repeat))
    for check in ("validate_published", "validate_input"):
        cpu = {name: min(totals[(check, name)]) for name in FORMATS}
        print(f"{check}: least CPU-s SUMMARY {cpu['SUMMARY']:.2f}, BASIC {cpu['BASIC']:.2f} "
              f"(BASIC / SUMMARY {cpu['BASIC'] / cpu['SUMMARY']:.2f})")


if __name__ == "__main__":
    main()
