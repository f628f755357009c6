"""The estimate stage before and after its intervals shared the estimates' work (issue 22):
CPU seconds of ``estimate_partition`` on the same national-size chunks, side by side.

Each code version runs in a child process of its own: this worktree, and a baseline commit
(default: de13102, main before the sharing) exported with ``git archive`` to a temporary
folder put first on the child's ``sys.path``. Versions alternate (A B A B …) so that a busy
machine slows both alike; the figure per version is the least CPU time (process time, this
process only: the stage uses no children) over ``--repeat`` runs. The intervals' own share
is the CPU time inside ``dpatlas.release.estimate._intervals`` (present in both versions).
Both versions use the same seeds, so their outputs must be identical: the script checks it.
It also prints each version's peak resident memory (a child's, over all its cases).

    .venv/bin/python benchmarks/bench_intervals.py [--data /tmp/nat-base/data/microdata]
        [--states 06,48] [--tracts 2000] [--epsilon 1,8] [--rules dp,theil-sen]
        [--repeat 3] [--baseline de13102]

``--data`` is the microdata of ``benchmarks/bench_national.py`` (hive partitions by state);
one chunk is the first ``--tracts`` tracts of a state, as the release's partition_tracts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# dp: the national release's rule (threshold of the shipped calibration, rounded); theil-sen:
# every tract DPExpTheilSen, whose interval ends are drawn in large tracts at high ε.
RULES = {"dp": {"rule": "dp", "threshold": 2.79},
         "theil-sen": {"rule": "fixed", "mechanism": "DPExpTheilSen"}}


def child(args) -> None:
    """Runs in the version under test: time estimate_partition on each (state, ε) chunk."""
    import pandas as pd

    import dpatlas.release.estimate as E
    from dpatlas.core.config import parse_config
    from dpatlas.release.allocate import plan
    from mechanisms.noise import SeededRandomness

    spent = {"intervals": 0.0}
    real = E._intervals

    def timed_intervals(*a, **kw):
        t0 = time.process_time()
        try:
            return real(*a, **kw)
        finally:
            spent["intervals"] += time.process_time() - t0

    E._intervals = timed_intervals
    rows = []
    for state in args.states.split(","):
        raw = pd.read_parquet(Path(args.data) / f"state={state}")
        tracts = sorted(raw["geoid"].unique())[:args.tracts]
        raw = raw[raw["geoid"].isin(tracts)]
        df = pd.DataFrame({"geoid": raw["geoid"].astype(str).to_numpy(), "cell": "all",
                           "x": raw["parent_rank"].to_numpy(), "y": raw["child_rank"].to_numpy()})
        for rule, eps in ((r, float(e)) for r in args.rules.split(",")
                          for e in args.epsilon.split(",")):
            cfg = parse_config({"input": {"path": "in.parquet"},
                                "boundaries": {"path": "t.parquet"},
                                "privacy": {"epsilon_per_tract": eps, "delta": 1e-6},
                                "selection": RULES[rule],
                                "publish": {"root": "releases"}}, base=Path("/tmp"))
            budget = plan(cfg, 2.79)
            sel = E.select_partition(df, budget, SeededRandomness(1), 2)
            spent["intervals"] = 0.0
            t0 = time.process_time()
            res = E.estimate_partition(df, sel, budget, SeededRandomness(2), 2)
            total = time.process_time() - t0
            out = Path(args.out) / f"{state}-{rule}-{eps}.parquet"
            res.to_parquet(out, index=False)
            n = df.groupby("geoid").size()
            rows.append({"state": state, "rule": rule, "epsilon": eps, "tracts": int(n.size),
                         "pairs": int((n * (n - 1) // 2).sum()), "cpu_total": total,
                         "cpu_intervals": spent["intervals"], "result": str(out)})
    import resource

    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"module": E.__file__, "rows": rows, "peak_mib": peak_mib}))


def run_version(source: Path, args, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(source))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--out", str(out),
           "--data", args.data, "--states", args.states, "--tracts", str(args.tracts),
           "--epsilon", args.epsilon, "--rules", args.rules]
    done = subprocess.run(cmd, env=env, cwd=source, capture_output=True, text=True, check=True)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(report["module"]).resolve().is_relative_to(source.resolve()):
        raise RuntimeError(f"the child imported {report['module']}, not the code in {source}")
    return report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/tmp/nat-base/data/microdata")
    ap.add_argument("--states", default="06,48")
    ap.add_argument("--tracts", type=int, default=2000)
    ap.add_argument("--epsilon", default="1,8")
    ap.add_argument("--rules", default="dp", help="dp, theil-sen or both (comma-separated)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default="de13102")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        return child(args)
    import numpy as np
    import pandas as pd

    with tempfile.TemporaryDirectory(prefix="bench-intervals-") as tmp:
        base = Path(tmp) / "baseline"
        base.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.baseline],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        versions = {"before": base, "after": ROOT}
        best: dict[tuple, dict] = {}
        peak = {name: 0.0 for name in versions}
        for rep in range(args.repeat):
            for name, source in versions.items():
                report = run_version(source, args, Path(tmp) / f"{name}-{rep}")
                peak[name] = max(peak[name], report["peak_mib"])
                for row in report["rows"]:
                    key = (name, row["state"], row["rule"], row["epsilon"])
                    if key not in best or row["cpu_total"] < best[key]["cpu_total"]:
                        best[key] = row
        print(f"load average {os.getloadavg()[0]:.2f}; CPU seconds (least of {args.repeat}), "
              f"baseline {args.baseline}")
        print(f"{'state':>5} {'rule':>9} {'eps':>4} {'tracts':>6} {'pairs':>10} | {'before':>7} "
              f"{'(intervals)':>11} | {'after':>7} {'(intervals)':>11} | {'ratio':>5} identical")
        for (name, state, rule, eps), b in sorted(best.items()):
            if name != "before":
                continue
            a = best[("after", state, rule, eps)]
            x, y = pd.read_parquet(b["result"]), pd.read_parquet(a["result"])
            same = x.columns.equals(y.columns) and all(
                np.array_equal(x[c].to_numpy(), y[c].to_numpy(),
                               equal_nan=x[c].dtype.kind == "f") for c in x.columns)
            print(f"{state:>5} {rule:>9} {eps:>4g} {b['tracts']:>6} {b['pairs']:>10} | "
                  f"{b['cpu_total']:>7.3f} {b['cpu_intervals']:>11.3f} | {a['cpu_total']:>7.3f} "
                  f"{a['cpu_intervals']:>11.3f} | {b['cpu_total'] / a['cpu_total']:>5.2f} "
                  f"{'yes' if same else 'NO'}")
            if not same:
                raise SystemExit(f"state {state}, {rule}, eps {eps}: the outputs differ")
        print("peak RSS of a child (MiB, all its cases): "
              + ", ".join(f"{name} {mib:.0f}" for name, mib in peak.items()))


if __name__ == "__main__":
    main()
