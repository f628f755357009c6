"""The schema check (s: the manifest's version, fields, types, id and dates) and the public
check (p: the ``public_values`` and ``public`` sections' fixed keys and meanings)."""

from __future__ import annotations

import re
from pathlib import Path

from .base import CONFIG, Mismatch, PUBLIC_COLUMNS, _is_number, _synthetic
from .names import PUBLIC_COLUMNS_BEFORE_NAMES


# 3: the tract tables carry p25_se, p75_se with the intervals; 4: one estimand, declared by
# every value, interval, SE, margin-of-error and model column (ESTIMAND_ID).
MANIFEST_VERSIONS = (2, 3, 4)
# Release ids (dpatlas/core/ids.py): 1-64 of A-Z a-z 0-9 . _ -, not a name the publish root uses.
RELEASE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RESERVED_IDS = frozenset({"latest", "feed", "index", "collection", "catalog", "tiles", "map",
                          "config", "manifest"})
RESERVED_ID_PREFIXES = ("feed.", "latest.", "index.", "collection.", "catalog.")
RESERVED_ID_SUFFIXES = (".json", ".atom", ".xml", ".html", ".tmp", ".lock", ".pmtiles")
# A PEP 440 release (dpatlas's package version), and a git commit (or none: not a checkout).
PACKAGE_VERSION = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?"
                             r"(\+[A-Za-z0-9]+(\.[A-Za-z0-9]+)*)?")
GIT_COMMIT = re.compile(r"[0-9a-f]{40}")
DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
PUBLIC_VALUES = ["n (records per tract and cell)", "tract boundaries"]
# The `public` section: what the guarantee does not protect (docs/threat-model.md).
PUBLIC_SECTION_KEYS = ("neighbours", "membership", "counts", "columns", "existence", "validity",
                       "input", "timing", "confidential", "threat_model")
N_IS_PUBLIC = "n per tract and cell is public"
# What each statement of the `public` section must say (its fixed meaning).
PUBLIC_SECTION_WORDS = {"neighbours": ("replace-one",), "membership": ("tract", "cell"),
                        "counts": ("n per tract and cell",),
                        "existence": ("depends on the data",),
                        "validity": ("drop", "valid", "public"),
                        "input": ("commitment", "key", "internal"),
                        "timing": ("not protected", "rounded to the day"),
                        "confidential": ("Prefect", "internal folder"),
                        "threat_model": ("docs/threat-model.md",)}

# The input is committed to, never hashed in the clear (dpatlas.release.manifest.input_commitment).
INPUT_COMMITMENT_SCHEME = "hmac-sha256"

# Required fields of a release manifest and their JSON types (None: null allowed).
REQUIRED_FIELDS: dict[str, tuple] = {
    "manifest_version": (int,), "release_id": (str,), "mode": (str,), "started": (str,),
    "published": (str,), "code_version": (dict,), "config_sha256": (str,),
    "config_file": (str,), "input_commitment": (dict,), "boundaries": (dict,),
    "privacy_unit": (str,), "neighbouring_relation": (str,),
    "public_values": (list,), "public": (dict,), "assumptions": (dict,), "profile": (str,),
    "selection": (dict,), "min_n": (int,), "budget": (dict,), "composition": (dict,),
    "cells": (list,), "total_per_person": (dict,), "counts": (dict,),
    "published_columns": (dict,), "intervals": (dict, type(None)),
    "noise_sampler": (dict,), "ledger_entry": (dict,), "files": (dict,),
}
SYNTHETIC_REQUIRED_FIELDS: dict[str, tuple] = {
    "release_id": (str,), "mode": (str,), "created": (str,), "code_version": (dict,),
    "min_n": (int,), "budget": (dict,), "cells": (list,), "total_per_person": (dict,),
    "counts": (dict,), "noise_sampler": (dict,), "ledger_entry": (dict,), "files": (dict,),
}


def release_id_problem(value) -> str | None:
    """Why ``value`` is not a release id (the rule of dpatlas/core/ids.py), or None."""
    if not isinstance(value, str) or not RELEASE_ID.fullmatch(value):
        return f"release_id {value!r} is not 1-64 characters of A-Z a-z 0-9 . _ -"
    low = value.lower()
    if low in RESERVED_IDS or low.startswith(RESERVED_ID_PREFIXES) \
            or low.endswith(RESERVED_ID_SUFFIXES):
        return f"release_id {value!r} is a name the publish root reserves"
    return None


def _day(value, what: str) -> str:
    """The UTC day of a manifest time: a date, or an ISO-8601 time (manifests before the
    times were rounded to the day)."""
    import datetime as dt

    if not isinstance(value, str):
        raise Mismatch(f"{what} {value!r} is not a date")
    try:
        if DAY.fullmatch(value):
            return dt.date.fromisoformat(value).isoformat()
        t = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise Mismatch(f"{what} {value!r} is not a valid date") from None
    if t.tzinfo is None:
        raise Mismatch(f"{what} {value!r} has no time zone")
    return t.astimezone(dt.timezone.utc).date().isoformat()


def _code_version_problem(cv) -> str | None:
    if not isinstance(cv, dict) or set(cv) != {"package", "git_commit"}:
        return f"code_version {cv!r} is not {{package, git_commit}}"
    pkg, commit = cv["package"], cv["git_commit"]
    if not isinstance(pkg, str) or not (pkg == "unknown" or PACKAGE_VERSION.fullmatch(pkg)):
        return f"code_version.package {pkg!r} is not a version"
    if commit is not None and not (isinstance(commit, str) and GIT_COMMIT.fullmatch(commit)):
        return f"code_version.git_commit {commit!r} is not a 40-digit git commit"
    return None


def _required_problems(m: dict, required: dict[str, tuple]) -> list[str]:
    problems = []
    for key, types in required.items():
        if key not in m:
            problems.append(f"{key} missing")
        elif isinstance(m[key], bool) or not isinstance(m[key], types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            problems.append(f"{key} is {type(m[key]).__name__}, expected {wanted}")
    return problems


def _dates_problems(m: dict, keys: tuple[str, ...]) -> list[str]:
    import datetime as dt

    problems, days = [], {}
    for key in keys:
        try:
            days[key] = _day(m.get(key), key)
        except Mismatch as err:
            problems.append(str(err))
    tomorrow = (dt.datetime.now(dt.timezone.utc).date() + dt.timedelta(days=1)).isoformat()
    for key, day in days.items():
        if day > tomorrow:
            problems.append(f"{key} {day} is in the future")
    if len(days) == 2 and days["published"] < days["started"]:
        problems.append(f"published {days['published']} is before started {days['started']}")
    return problems


SHA256 = re.compile(r"[0-9a-f]{64}")
BOUNDARIES_HASHED_AS = ("file", "folder (relative names and contents)")


def _release_field_problems(m: dict) -> list[str]:
    """Fields whose form is fixed: hashes, the config's name, the steps' parameters."""
    problems = []
    if m.get("config_file") != CONFIG:
        problems.append(f"config_file {m.get('config_file')!r} is not {CONFIG!r}")
    if "config_sha256" in m and not (isinstance(m["config_sha256"], str)
                                     and SHA256.fullmatch(m["config_sha256"])):
        problems.append(f"config_sha256 {m['config_sha256']!r} is not a sha256")
    if "input_sha256" in m:
        problems.append("input_sha256 is published: a plain hash of the confidential input is "
                        "a non-DP function of it (publish only input_commitment)")
    c = m.get("input_commitment")
    if isinstance(c, dict) and not (c.get("scheme") == INPUT_COMMITMENT_SCHEME
                                    and isinstance(c.get("value"), str)
                                    and SHA256.fullmatch(c["value"])):
        problems.append(f"input_commitment {c!r} is not an {INPUT_COMMITMENT_SCHEME} value")
    b = m.get("boundaries")
    if isinstance(b, dict):
        if not (isinstance(b.get("sha256"), str) and SHA256.fullmatch(b["sha256"])):
            problems.append(f"boundaries.sha256 {b.get('sha256')!r} is not a sha256")
        if b.get("hashed_as") not in BOUNDARIES_HASHED_AS:
            problems.append(f"boundaries.hashed_as {b.get('hashed_as')!r} is not one of "
                            f"{list(BOUNDARIES_HASHED_AS)}")
        if not isinstance(b.get("file"), str) or not isinstance(b.get("vintage"), str):
            problems.append("boundaries.file and boundaries.vintage must be text")
    budget = m.get("budget")
    for step in (budget.get("steps") or []) if isinstance(budget, dict) else []:
        if not isinstance(step, dict):
            problems.append("a budget step is not an object")
            continue
        eps, delta = step.get("epsilon_param"), step.get("delta_param")
        if not (_is_number(eps) and eps >= 0 and _is_number(delta) and 0 <= delta < 1):
            problems.append(f"step {step.get('step')!r}: epsilon_param {eps!r} / delta_param "
                            f"{delta!r} are not a budget")
        if step.get("estimator") is not None and step.get("step") != \
                f"suite: {step.get('estimator')}":
            problems.append(f"step {step.get('step')!r} names estimator "
                            f"{step.get('estimator')!r}")
    return problems


def check_schema(folder: Path, m: dict) -> str:
    """The manifest's version and required fields, its id (the folder's name), its dates and
    code version (see the module docstring, (s))."""
    if _synthetic(m):
        problems = _required_problems(m, SYNTHETIC_REQUIRED_FIELDS)
        problems += _dates_problems(m, ("created",))
    else:
        version = m.get("manifest_version")
        if version not in MANIFEST_VERSIONS or isinstance(version, bool):
            raise Mismatch(f"manifest_version {version!r} is not one this audit reads "
                           f"({', '.join(map(str, MANIFEST_VERSIONS))}): an older manifest "
                           "lacks required fields, a newer one needs a newer audit")
        problems = _required_problems(m, REQUIRED_FIELDS)
        problems += _dates_problems(m, ("started", "published"))
        # The folder's own name: `latest` (and any other link) names the folder it points to.
        name = folder.resolve().name
        if m.get("release_id") != name:
            problems.append(f"release_id {m.get('release_id')!r} is not the folder's name "
                            f"{name!r}")
        entry = m.get("ledger_entry")
        if isinstance(entry, dict) and entry.get("release_id") != m.get("release_id"):
            problems.append(f"ledger_entry.release_id {entry.get('release_id')!r} is not the "
                            f"release's {m.get('release_id')!r}")
        min_n = m.get("min_n")
        if isinstance(min_n, int) and not isinstance(min_n, bool) and min_n < 2:
            problems.append(f"min_n {min_n} < 2: a regression needs two records")
        problems += _release_field_problems(m)
    bad_id = release_id_problem(m.get("release_id"))
    if bad_id:
        problems.append(bad_id)
    if "code_version" in m:
        bad_cv = _code_version_problem(m["code_version"])
        if bad_cv:
            problems.append(bad_cv)
    if problems:
        raise Mismatch("; ".join(problems))
    if _synthetic(m):
        return f"synthetic manifest: required fields present; id {m['release_id']}"
    return (f"manifest_version {m['manifest_version']}: {len(REQUIRED_FIELDS)} required fields "
            f"present; id {m['release_id']} = folder; {m['started']} <= {m['published']}")


def check_public(folder: Path, m: dict) -> str:
    """What is public is stated with its fixed meaning: the public values, the `public`
    section (docs/threat-model.md), and the assumption that n is public."""
    problems = []
    if m.get("public_values") != PUBLIC_VALUES:
        problems.append(f"public_values {m.get('public_values')!r} != {PUBLIC_VALUES!r}")
    section = m.get("public")
    if not isinstance(section, dict):
        problems.append("no `public` section")
    else:
        if sorted(section) != sorted(PUBLIC_SECTION_KEYS):
            problems.append(f"`public` has keys {sorted(section)}, expected "
                            f"{sorted(PUBLIC_SECTION_KEYS)}")
        if section.get("columns") not in (list(PUBLIC_COLUMNS),
                                          list(PUBLIC_COLUMNS_BEFORE_NAMES)):
            problems.append(f"public.columns {section.get('columns')!r} != "
                            f"{list(PUBLIC_COLUMNS)!r}")
        empty = [k for k in PUBLIC_SECTION_KEYS if k != "columns"
                 and not (isinstance(section.get(k), str) and section[k].strip())]
        if empty:
            problems.append(f"`public` states nothing for {empty}")
        for key, words in PUBLIC_SECTION_WORDS.items():
            text = section.get(key)
            if isinstance(text, str) and text.strip() and not all(w in text for w in words):
                problems.append(f"public.{key} does not say {' / '.join(words)}")
    assumptions = m.get("assumptions")
    unverified = assumptions.get("unverified") if isinstance(assumptions, dict) else None
    if not isinstance(unverified, list) or not isinstance(assumptions.get("verified"), list):
        problems.append("assumptions must list `verified` and `unverified`")
    elif not any(isinstance(a, str) and a.startswith(N_IS_PUBLIC) for a in unverified):
        problems.append(f"the assumption {N_IS_PUBLIC!r} is not listed as unverified")
    elif not all(isinstance(a, str) and a.strip()
                 for a in unverified + assumptions["verified"]):
        problems.append("an assumption is not a text")
    if problems:
        raise Mismatch("; ".join(problems))
    return (f"public: {', '.join(PUBLIC_COLUMNS)} and the existence and timing of the release; "
            "n is public (unverified assumption)")
