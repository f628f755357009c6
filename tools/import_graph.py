"""Print the import graph between the project's packages, one edge a line.

    .venv/bin/python tools/import_graph.py            # dpatlas split by subpackage
    .venv/bin/python tools/import_graph.py --depth 1  # top-level packages only

A node is a top-level package (flows, tasks, mechanisms, ...) or, inside dpatlas, its
direct child (a subpackage, or a module where dpatlas is still flat). An edge ``a -> b`` says
some module of ``a`` imports some module of ``b`` (lazy imports inside functions count:
import-linter sees them too). Run from the repository's root.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import grimp

TOP_LEVEL = ("dpatlas", "flows", "tasks", "mechanisms", "deploy", "data_contracts")


def node_of(module: str, depth: int) -> str:
    """The graph node a module belongs to: its top-level package, or dpatlas's child."""
    parts = module.split(".")
    keep = depth + 1 if parts[0] == "dpatlas" else depth
    return ".".join(parts[:keep])


def edges(depth: int) -> dict[str, set[str]]:
    graph = grimp.build_graph(*TOP_LEVEL, cache_dir=None)
    out: dict[str, set[str]] = defaultdict(set)
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            a, b = node_of(importer, depth), node_of(imported, depth)
            if a != b:
                out[a].add(b)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=1,
                        help="dotted components kept below dpatlas (0: dpatlas as one node)")
    args = parser.parse_args()
    sys.path.insert(0, str(Path.cwd()))
    for a, targets in sorted(edges(args.depth).items()):
        print(f"{a} -> {', '.join(sorted(targets))}")


if __name__ == "__main__":
    main()
