"""Issue 21 item 8: the declared dependencies say what they are. Every runtime dependency is
imported by the shipped packages, test-only tools are in the ``test`` extra, and every
dependency of pyproject.toml is pinned exactly in requirements.lock (the tested set)."""

from __future__ import annotations

import ast
import re
import tomllib
from importlib.metadata import packages_distributions

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.paths import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SHIPPED = ("dpatlas", "mechanisms", "flows", "tasks", "data_contracts", "deploy")
# Declared, never imported, and why (each must say so in pyproject.toml too).
NOT_IMPORTED = {"fastapi": "a constraint: Prefect's server breaks on fastapi 0.151+",
                "libpysal": "data only: its bundled example shapefiles (real state and county "
                            "outlines) are read from its package folder; importing it takes "
                            "seconds"}


def _requirements(specs: list[str]) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in map(Requirement, specs)}


RUNTIME = _requirements(PYPROJECT["project"]["dependencies"])
EXTRAS = {extra: _requirements(specs)
          for extra, specs in PYPROJECT["project"]["optional-dependencies"].items()}


def _imported_modules(folders) -> set[str]:
    """Top-level module names imported anywhere under ``folders`` (absolute imports)."""
    names = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def _modules_of_distributions() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            out.setdefault(canonicalize_name(dist), set()).add(module)
    return out


def _locked() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line.strip())
        if match:
            pins[canonicalize_name(match[1])] = match[2]
    return pins


def test_every_runtime_dependency_is_imported_by_the_shipped_packages():
    imported = _imported_modules(SHIPPED)
    modules = _modules_of_distributions()
    unused = sorted(name for name in RUNTIME
                    if name not in NOT_IMPORTED and not modules.get(name, set()) & imported)
    assert not unused, f"declared in [project] dependencies, imported by no shipped module: {unused}"
    for name, why in NOT_IMPORTED.items():  # the exception is still needed, and explained
        assert name in RUNTIME and not modules[name] & imported, (name, why)
    assert "numpy" in RUNTIME and "numpy" in modules["numpy"]  # the mapping itself works


def test_test_tools_are_in_the_test_extra_not_the_runtime():
    for tool in ("playwright", "opendp", "pytest"):
        assert tool not in RUNTIME and tool in EXTRAS["test"], tool
    # opendp earns its place: the tests use it.
    assert "opendp" in _imported_modules(["tests"])


def test_the_postgres_extra_brings_psycopg():
    req = EXTRAS["postgres"]["psycopg"]
    assert "binary" in req.extras


def test_every_declared_dependency_is_pinned_in_the_lock_within_its_range():
    pins = _locked()
    declared = {**RUNTIME, **{n: r for reqs in EXTRAS.values() for n, r in reqs.items()}}
    missing = sorted(n for n in declared if n not in pins)
    assert not missing, f"not pinned in requirements.lock: {missing}"
    outside = {n: (str(r.specifier), pins[n]) for n, r in declared.items()
               if not r.specifier.contains(pins[n], prereleases=True)}
    assert not outside, f"requirements.lock pins outside pyproject's range: {outside}"
    assert "psycopg-binary" in pins  # psycopg[binary]'s extra is locked too
