"""The table check (e): tracts.parquet's values, suppression, reasons, intervals, standard
errors and margins against the manifest's rules; and a synthetic folder's rows."""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from .base import (
    FAILURE_REASONS, FLOAT_ATOL, INTERVAL_COLUMNS, MOE90_COLUMNS, MOE90_Z, Mismatch, NO_RECORDS,
    PRIMARY_MECHANISMS, REL_TOL, SE_CAP, SE_COLUMNS, STATUSES, SYNTHETIC_COLUMNS, SYNTHETIC_CSV,
    SYNTHETIC_PARQUET, VALUE_COLUMNS,
)
from .files import readable


def _accounted_columns(m: dict) -> set[str]:
    return {c.strip() for key in m["published_columns"] for c in key.split(",") if c.strip()}


def check_table(folder: Path, m: dict) -> str:
    try:
        df = pq.read_table(readable(folder / "tracts.parquet")).to_pandas()
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"tracts.parquet cannot be read: {err}") from None
    budget, problems = m["budget"], []
    cols = set(df.columns)
    unaccounted = sorted(cols - _accounted_columns(m))
    if unaccounted:
        problems.append(f"columns not accounted for in published_columns: {unaccounted}")
    missing = sorted({"geoid", "cell", "n", "mechanism", "status", "epsilon_spent",
                      "delta_spent", *VALUE_COLUMNS} - cols)
    if missing:
        raise Mismatch(f"columns missing: {missing}")
    suite_steps = {s["estimator"] for s in budget["steps"] if s.get("estimator")}
    suite_cols = [c for c in df.columns if c.endswith(("_p25", "_p75"))
                  and c.rsplit("_", 1)[0] not in ("p25", "p75")]
    unpaid = sorted({c.rsplit("_", 1)[0] for c in suite_cols} - suite_steps)
    if unpaid:
        problems.append(f"suite columns without a budget step: {unpaid}")

    status = df["status"].astype(str)
    if not status.isin(STATUSES).all():
        problems.append(f"unknown statuses {sorted(set(status) - set(STATUSES))}")
    released, suppressed = status == "released", status == "suppressed"
    spent = ~suppressed
    values = df[list(VALUE_COLUMNS)]
    if values[released].isna().any().any():
        problems.append(f"{int(values[released].isna().any(axis=1).sum())} released row(s) "
                        "lack p25/p75")
    if values[~released].notna().any().any():
        problems.append(f"{int(values[~released].notna().any(axis=1).sum())} row(s) not "
                        "released carry p25/p75 values")
    if suite_cols and df.loc[suppressed, suite_cols].notna().any().any():
        problems.append("suppressed rows carry suite values")
    p = df.loc[released]
    for c in ("p25", "p75"):
        if not np.allclose(p[c], p[f"{c}_raw"].clip(0.0, 1.0), rtol=0, atol=0):
            problems.append(f"{c} is not {c}_raw clipped to [0, 1]")
    eps_spent = df["epsilon_spent"].astype(float)
    delta_spent = df["delta_spent"].astype(float)
    if ((eps_spent[suppressed] != 0) | (delta_spent[suppressed] != 0)).any():
        problems.append("suppressed rows with budget spent")
    for col, spent_col in (("epsilon", eps_spent), ("delta", delta_spent)):
        figure = float(budget[f"{col}_per_tract_and_cell"])
        off = int((~np.isclose(spent_col[spent], figure, rtol=REL_TOL, atol=0)).sum())
        if off:
            problems.append(f"{col}_spent differs from the manifest's {figure:.12g} in {off} "
                            "row(s)")
    small = df["n"].astype(int) < int(m["min_n"])
    if (small != suppressed).any():
        problems.append(f"suppression is not 'n < min_n = {m['min_n']}' in "
                        f"{int((small != suppressed).sum())} row(s): it must depend on the "
                        "public n only")
    if (df.loc[suppressed, "mechanism"] != "none").any():
        problems.append("suppressed rows name a mechanism")
    problems += _mechanism_and_reason_problems(df, m)
    problems += _interval_value_problems(df, released)
    problems += _standard_error_problems(df, m)
    counts = m["counts"]
    by_status = {str(k): int(v) for k, v in status.value_counts().items()}
    by_mech = {str(k): int(v) for k, v in df["mechanism"].astype(str).value_counts().items()}
    if by_status != counts["by_status"]:
        problems.append(f"counts by status {by_status} != manifest {counts['by_status']}")
    if by_mech != counts["by_mechanism"]:
        problems.append(f"counts by mechanism {by_mech} != manifest {counts['by_mechanism']}")
    if len(df) != counts["rows"] or df["geoid"].nunique() != counts["tracts"]:
        problems.append(f"{len(df)} rows / {df['geoid'].nunique()} tracts != manifest "
                        f"{counts['rows']} / {counts['tracts']}")
    if sorted(df["cell"].astype(str).unique()) != sorted(m["cells"]):
        problems.append("cells differ from the manifest's")
    if problems:
        raise Mismatch("; ".join(problems))
    statuses = ", ".join(f"{n:,} {k}" for k, n in sorted(by_status.items()))
    return (f"{len(df):,} rows ({statuses}); every column accounted for; values and spend "
            "agree with the statuses and the budget")


def _expected_reasons(df, m: dict):
    """The reason each row must give: '' where released; the public n where suppressed; the
    mechanism's own DP failure where failed (None: any of FAILURE_REASONS[mechanism])."""
    status, n = df["status"].astype(str), df["n"].astype(int)
    want = np.where(status == "released", "", None).astype(object)
    suppressed = (status == "suppressed").to_numpy()
    want[suppressed] = np.where(n[suppressed] == 0, NO_RECORDS,
                                f"fewer than {int(m['min_n'])} records")
    return want


def _mechanism_and_reason_problems(df, m: dict) -> list[str]:
    problems = []
    status = df["status"].astype(str).to_numpy()
    mech = df["mechanism"].astype(str).to_numpy()
    reason = df["reason"].fillna("").astype(str).to_numpy()
    ran = status != "suppressed"
    bad_mech = ran & ~np.isin(mech, PRIMARY_MECHANISMS)
    if bad_mech.any():
        problems.append(f"mechanism must be one of {list(PRIMARY_MECHANISMS)} where a tract "
                        f"ran: {sorted(set(mech[bad_mech]))}")
    rule = m["selection"]
    if rule.get("rule") == "public" and isinstance(rule.get("threshold"), (int, float)):
        by_n = np.where(df["n"].astype(float).to_numpy() >= rule["threshold"], "NoisyStats",
                        "DPExpTheilSen")
        if (ran & (mech != by_n)).any():
            problems.append("the public rule's mechanism is not 'NoisyStats if n >= threshold'")
    want = _expected_reasons(df, m)
    fixed = np.array([w is not None for w in want])
    wrong = fixed & (reason != np.array(["" if w is None else w for w in want], dtype=object))
    failed = status == "failed"
    allowed = np.array([r in FAILURE_REASONS.get(k, ()) for r, k in zip(reason, mech)])
    wrong |= failed & ~allowed
    if wrong.any():
        i = int(np.argmax(wrong))
        problems.append(f"{int(wrong.sum())} row(s) give a reason that is not theirs (released: "
                        f"none; suppressed: 'fewer than {m['min_n']} records' or "
                        f"'{NO_RECORDS}'; failed: {FAILURE_REASONS}), e.g. {reason[i]!r} "
                        f"where {status[i]}")
    return problems


def _interval_value_problems(df, released) -> list[str]:
    cols = [c for c in (*INTERVAL_COLUMNS, *SE_COLUMNS, *MOE90_COLUMNS) if c in df.columns]
    if not cols:
        return []
    problems = []
    values = df[cols].astype(float)
    unpaid = values[~released].notna().any(axis=1)
    if unpaid.any():
        problems.append(f"{int(unpaid.sum())} row(s) not released (nothing spent on an "
                        "interval) carry interval values")
    if len(cols) == len(INTERVAL_COLUMNS):
        r = df.loc[released]
        for p in ("p25", "p75"):
            lo, hi, v = r[f"{p}_lo"].astype(float), r[f"{p}_hi"].astype(float), r[p]
            has = lo.notna() & hi.notna()
            bad = has & ~((lo >= 0) & (lo <= v) & (v <= hi) & (hi <= 1))
            if bad.any():
                problems.append(f"{int(bad.sum())} {p} interval(s) do not hold the released "
                                f"{p} inside [0, 1]")
    return problems


# Publish rounds released values to 4 decimals, standard errors up (dpatlas/publication/tract_files.py): a
# fixed rule here, not the manifest's word, so a forger cannot widen the tolerance.
SE_ROUNDING_STEP = 1e-4


def interval_standard_error(lo, hi, level: float):
    """The interval-implied standard error (hi − lo)/(2z), z the standard normal quantile at
    (1 + level)/2 (docs/uncertainty.md section 5)."""
    z = statistics.NormalDist().inv_cdf((1.0 + level) / 2.0)
    return (np.asarray(hi, dtype=float) - np.asarray(lo, dtype=float)) / (2.0 * z)


def _standard_error_problems(df, m: dict) -> list[str]:
    """Each published standard error is finite and in [0, SE_CAP] exactly where its row's
    interval is, NaN elsewhere (up to manifest version 3 it was the interval's (hi − lo)/(2z),
    rounded up by less than one step, and is checked so); each 90% margin of error is there
    exactly where its SE is and is ceil(MOE90_Z·se·10⁴)/10⁴."""
    pairs = [p for p in ("p25", "p75") if f"{p}_se" in df.columns
             and {f"{p}_lo", f"{p}_hi"} <= set(df.columns)]
    level = (m.get("intervals") or {}).get("level")
    if not pairs or isinstance(level, bool) or not isinstance(level, (int, float)) \
            or not 0 < level < 1:
        return []  # columns without intervals or a level: the columns check reports it
    problems, geoid = [], df["geoid"].astype(str).to_numpy()

    def report(wrong, what: str, values, want=None) -> None:
        if wrong.any():
            i = int(np.argmax(wrong))
            problems.append(f"{int(wrong.sum())} {what}, e.g. {geoid[i]}: {values[i]!r}"
                            + ("" if want is None else f" for {want[i]!r}"))

    for p in pairs:
        lo, hi = df[f"{p}_lo"].astype(float).to_numpy(), df[f"{p}_hi"].astype(float).to_numpy()
        se = df[f"{p}_se"].astype(float).to_numpy()
        has = ~np.isnan(lo) & ~np.isnan(hi)
        with np.errstate(invalid="ignore"):
            fine = np.isfinite(se) & (se >= 0) & (se <= SE_CAP)
        report(has & ~fine, f"{p}_se value(s) where the interval is published are not finite "
                            f"in [0, {SE_CAP:g}]", se)
        report(~has & ~np.isnan(se), f"{p}_se value(s) where no interval is published", se)
        if m.get("manifest_version") in (2, 3):
            want = interval_standard_error(lo, hi, float(level))
            wrong = has & ~((se >= want - FLOAT_ATOL)
                            & (se <= want + SE_ROUNDING_STEP + FLOAT_ATOL))
            report(wrong, f"{p}_se value(s) are not ({p}_hi - {p}_lo)/(2z) at level "
                          f"{level:g} rounded up to 4 decimals", se, want)
        if f"{p}_moe90" in df.columns:
            moe = df[f"{p}_moe90"].astype(float).to_numpy()
            report(np.isnan(moe) != np.isnan(se), f"{p}_moe90 value(s) are not there exactly "
                                                   f"where {p}_se is", moe)
            want = np.ceil(MOE90_Z * se * 1e4) / 1e4
            with np.errstate(invalid="ignore"):
                wrong = ~np.isnan(moe) & ~np.isnan(se) & ~(np.abs(moe - want) <= FLOAT_ATOL)
            report(wrong, f"{p}_moe90 value(s) are not ceil({MOE90_Z:.4f}·{p}_se, 4 decimals)",
                   moe, want)
    return problems


def check_synthetic_table(folder: Path, m: dict) -> str:
    try:
        df = pq.read_table(readable(folder / SYNTHETIC_PARQUET)).to_pandas()
    except Exception as err:  # noqa: BLE001 - any reader error is a finding
        raise Mismatch(f"{SYNTHETIC_PARQUET} cannot be read: {err}") from None
    problems = []
    if list(df.columns) != SYNTHETIC_COLUMNS:
        raise Mismatch(f"columns {list(df.columns)}, expected exactly {SYNTHETIC_COLUMNS} "
                       "(no person ids, nothing unaccounted for)")
    geoid = df["GEOID"].astype(str)
    bad_geoid = int((~geoid.str.fullmatch(r"\d{11}")).sum())
    if bad_geoid:
        problems.append(f"{bad_geoid} GEOID(s) are not 11 digits")
    extra_cells = sorted(set(df["cell"].astype(str)) - set(m["cells"]))
    if extra_cells:
        problems.append(f"cells not in the manifest: {extra_cells}")
    values = df[["bin_lo", "bin_hi", "x", "y"]].to_numpy(dtype=float)
    if not np.isfinite(values).all():
        problems.append("non-finite values")
    elif not ((df["bin_lo"] >= 0) & (df["bin_lo"] < df["bin_hi"]) & (df["bin_hi"] <= 1)).all():
        problems.append("bins outside 0 <= bin_lo < bin_hi <= 1")
    counts = m["counts"]
    if len(df) != counts["rows"]:
        problems.append(f"{len(df)} rows, manifest says {counts['rows']}")
    try:
        n_csv = sum(1 for _ in open(readable(folder / SYNTHETIC_CSV))) - 1
        header = open(readable(folder / SYNTHETIC_CSV)).readline().strip().split(",")
    except OSError as err:
        raise Mismatch(f"{SYNTHETIC_CSV} cannot be read: {err}") from None
    if header != SYNTHETIC_COLUMNS or n_csv != len(df):
        problems.append(f"{SYNTHETIC_CSV} has columns {header} and {n_csv} rows, the Parquet "
                        f"file {SYNTHETIC_COLUMNS} and {len(df)}")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"{len(df)} rows in {geoid.nunique()} tracts; columns {SYNTHETIC_COLUMNS} only; "
            "CSV agrees")
