"""The benchmark scripts import no other benchmark script (issue 34, item 5): what two of them
share lives in a ``_``-prefixed helper module (benchmarks/_measure.py, benchmarks/_national.py),
so running, reading or changing one script never runs another's module code."""

from __future__ import annotations

import ast

from tests.support.paths import REPO

BENCHMARKS = REPO / "benchmarks"


def _imported_names(tree: ast.AST) -> set[str]:
    """Top-level names a module imports anywhere (also inside functions, and by
    ``importlib.import_module("name")``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(str(node.args[0].value).split(".")[0])
    return names


def test_no_benchmark_script_imports_another():
    scripts = {path.stem: path for path in BENCHMARKS.glob("*.py")
               if not path.name.startswith("_")}
    assert {"bench_floor", "bench_national"} <= set(scripts)
    imports = {name: _imported_names(ast.parse(path.read_text(), str(path)))
               for name, path in scripts.items()}
    crossing = {name: sorted(names & (set(scripts) - {name}))
                for name, names in imports.items() if names & (set(scripts) - {name})}
    assert not crossing, f"benchmark scripts importing other scripts: {crossing}"
    assert "_measure" in imports["bench_floor"] and "_national" in imports["bench_national"]
