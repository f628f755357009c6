"""Move dpatlas's flat modules into packages by concern, and rewrite every reference to them.

    python tools/relayout.py          # from the repository's root; uses `git mv`

Re-runnable on code merged later (written against the flat layout): it moves the files still
at their old place, and rewrites, in every Python, Markdown, YAML and make file,

- relative imports inside dpatlas (and relative imports of a moved module anywhere) into
  absolute ones, resolved against the module's OLD name (merged lines were written for it);
- dotted module names (``import``/``from`` statements, monkeypatch and mock targets,
  ``python -m`` lines) and ``dpatlas/x.py`` paths in prose;
- ``from dpatlas import feed`` style imports of a moved module, and imports of the few names
  that moved to another module (``NAME_MOVES``).

It is idempotent: a name already in the new layout is left as it is, so a second run changes
nothing.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

# Old module -> new module. A package moves with its files (dpatlas.webmap).
MODULE_MOVES = {
    # core: shared by every layer, imports only mechanisms
    "dpatlas.config": "dpatlas.core.config",
    "dpatlas.ids": "dpatlas.core.ids",
    "dpatlas.files": "dpatlas.core.files",
    "dpatlas.hashing": "dpatlas.core.hashing",
    # release: the stages of one release, in the flow's order, and its run state
    "dpatlas.ingest": "dpatlas.release.ingest",
    "dpatlas.validate": "dpatlas.release.validate",
    "dpatlas.contributions": "dpatlas.release.contributions",
    "dpatlas.selection": "dpatlas.release.selection",
    "dpatlas.allocate": "dpatlas.release.allocate",
    "dpatlas.estimate": "dpatlas.release.estimate",
    "dpatlas.preflight": "dpatlas.release.preflight",
    "dpatlas.state": "dpatlas.release.run_state",
    "dpatlas.manifest": "dpatlas.release.manifest",
    "dpatlas.synthesize": "dpatlas.release.synthetic_data",
    "dpatlas.crash": "dpatlas.release.crash",
    "flows.outcome": "dpatlas.release.outcome",
    "flows.events": "dpatlas.release.events",
    # publication: the published files and where they are served
    "dpatlas.publish": "dpatlas.publication.tract_files",
    "dpatlas.geography": "dpatlas.publication.geography",
    "dpatlas.tiles": "dpatlas.publication.tiles",
    "dpatlas.webmap": "dpatlas.publication.webmap",
    "dpatlas.stac": "dpatlas.publication.stac",
    "dpatlas.feed": "dpatlas.publication.feed",
    "dpatlas.withdraw": "dpatlas.publication.withdraw",
    "dpatlas.serve": "dpatlas.publication.serve",
    # the independent audit: one file that imports nothing of ours
    "dpatlas.audit": "dpatlas.audit.checks",
    # evaluation: research on synthetic data, never imported by the release path
    "dpatlas.synth": "dpatlas.evaluation.synthetic_input",
    "dpatlas.stress": "dpatlas.evaluation.stress",
    "dpatlas.calibrate": "dpatlas.evaluation.calibrate",
    "dpatlas.evaluate": "dpatlas.evaluation.evaluate",
    "dpatlas.rule_eval": "dpatlas.evaluation.rule_eval",
    "dpatlas.rule_stress": "dpatlas.evaluation.rule_stress",
    "dpatlas.interval_eval": "dpatlas.evaluation.interval_eval",
    # the command line
    "dpatlas.cli": "dpatlas.cli.commands",
    "dpatlas.demo": "dpatlas.cli.demo",
    "dpatlas.prefect_server": "dpatlas.cli.prefect_server",
}

# Old modules that were packages (folders): a path ``dpatlas/webmap/`` means the old one.
OLD_PACKAGES = ("dpatlas.webmap",)

# Files written for the new layout, where ``dpatlas.cli`` or ``dpatlas.audit`` names the new
# package (the same name as an old module): never rewritten.
NEW_LAYOUT_FILES = {"dpatlas/cli/__init__.py", "dpatlas/cli/__main__.py",
                    "dpatlas/audit/__init__.py", "tests/integration/test_operator_errors.py",
                    "tests/integration/test_layers.py", "tools/import_graph.py"}

# Moved as a file, but imported as before: the package re-exports its public names.
FILE_ONLY_MOVES = {"dpatlas.ledger": "dpatlas.ledger.store"}

# (module after the move, name) -> the module that defines the name now.
_THRESHOLD_READER = ("DEFAULT_THRESHOLDS", "resolve_threshold", "resolve_schedule")
NAME_MOVES = {
    **{("dpatlas.evaluation.calibrate", n): "dpatlas.release.thresholds"
       for n in _THRESHOLD_READER},
    **{("dpatlas.release.estimate", n): "dpatlas.core.columns"
       for n in ("RESULT_COLUMNS", "INTERVAL_COLUMNS")},
    ("tasks.validate", "BoundaryCoverageError"): "dpatlas.release.validate",
}

PACKAGE_DOCS = {
    "dpatlas.core": "Shared by every layer: the config, ids, atomic files, hashes, column names "
                    "and the operator-error base.",
    "dpatlas.release": "The stages of one release (ingest, validate, contributions, plan, "
                       "selection, estimate, manifest), its run state and its outcome.",
    "dpatlas.publication": "The published files and their homes: tract files, geography, tiles, "
                           "web map, STAC, feed, withdrawal, serving.",
    "dpatlas.ledger": "The privacy budget ledger: its store, charges and leases.",
    "dpatlas.audit": "The independent audit of a published release (imports nothing of ours).",
    "dpatlas.evaluation": "Research on synthetic input: calibration, evaluations, stress "
                          "scenarios. Never imported by the release path.",
    "dpatlas.cli": "The ``dpatlas`` command line.",
}

TEXT_GLOBS = ("**/*.py", "**/*.md", "**/*.yaml", "**/*.yml", "Makefile", ".ci/run")
SKIP_DIRS = {".venv", ".git", "build", "node_modules", "__pycache__"}
SELF = Path(__file__).resolve()

_ALL = {**MODULE_MOVES, **FILE_ONLY_MOVES}
_NEW_ONLY = sorted(set(_ALL.values()) - set(_ALL), key=len, reverse=True)
_OLD = sorted(MODULE_MOVES, key=len, reverse=True)


def _starts(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _is_new(name: str) -> bool:
    return any(_starts(name, new) for new in _NEW_ONLY)


def new_name(name: str, moves: dict[str, str] = MODULE_MOVES) -> str:
    """A dotted name in the new layout (unchanged when it already is, or never moved)."""
    if _is_new(name):
        return name
    for old in sorted(moves, key=len, reverse=True):
        if _starts(name, old):
            return moves[old] + name[len(old):]
    return name


def old_module_of(path: Path) -> str:
    """The module a file was before the move (what its relative imports were written for)."""
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    module = ".".join(parts)
    for old, new in sorted(_ALL.items(), key=lambda kv: len(kv[1]), reverse=True):
        if _starts(module, new):
            return old + module[len(new):]
    return module


# --- moving files -------------------------------------------------------------------------------

def _file_of(old: str, new: str) -> Path:
    """The old module's file, or its folder for a package that moves whole (not a module that
    became a package of its own name: dpatlas/audit.py -> dpatlas/audit/checks.py)."""
    base = Path(*old.split("."))
    if base.is_dir() and not _starts(new, old):
        return base
    return base.with_suffix(".py")


def _target_of(old: str, new: str) -> Path:
    base = Path(*new.split("."))
    return base if _file_of(old, new).is_dir() else base.with_suffix(".py")


def _ensure_package(package: Path) -> None:
    init = package / "__init__.py"
    if package.name == "dpatlas" or init.exists():
        return
    package.mkdir(parents=True, exist_ok=True)
    doc = PACKAGE_DOCS.get(".".join(package.parts), "")
    init.write_text(textwrap.fill(f'"""{doc}"""', 100) + "\n" if doc else "")
    subprocess.run(["git", "add", str(init)], check=True)


def move_files() -> None:
    for old, new in _ALL.items():
        src, dst = _file_of(old, new), _target_of(old, new)
        if not src.exists() or dst.exists():
            continue
        _ensure_package(dst.parent)
        subprocess.run(["git", "mv", str(src), str(dst)], check=True)
        print(f"moved {src} -> {dst}")
    for package in PACKAGE_DOCS:
        _ensure_package(Path(*package.split(".")))


# --- rewriting ----------------------------------------------------------------------------------

_FROM = re.compile(r"^(?P<indent>[ \t]*)from[ \t]+(?P<module>\.*[\w.]*)[ \t]+import[ \t]+"
                   r"(?P<names>\([^)]*\)|(?:[^\n#\\]|\\\n)*?)(?P<comment>[ \t]*#[^\n]*)?$", re.M)
_DOTTED = re.compile(r"(?<![\w.])(?:dpatlas|flows|tasks)(?:\.\w+)+")
_PATH = re.compile(r"(?<![\w/.-])((?:dpatlas|flows)(?:/\w+)+)(\.py\b|/)")


def _absolute(module: str, importer: str, is_package: bool) -> str:
    dots = len(module) - len(module.lstrip("."))
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[:len(base) - (dots - 1)]
    rest = module[dots:]
    return ".".join(base + ([rest] if rest else []))


def _names(text: str) -> list[tuple[str, str | None]]:
    """``a, b as c`` -> [(a, None), (b, c)] (comments inside parentheses dropped)."""
    text = re.sub(r"#[^\n]*", "", text.strip("()")).replace("\\\n", " ")
    out = []
    for item in filter(None, (t.strip() for t in text.replace("\n", " ").split(","))):
        name, _, alias = item.partition(" as ")
        out.append((name.strip(), alias.strip() or None))
    return out


def _fmt(indent: str, module: str, names: list[tuple[str, str | None]], comment: str) -> str:
    items = [f"{n} as {a}" if a else n for n, a in names]
    line = f"{indent}from {module} import {', '.join(items)}{comment}"
    if len(line) <= 100 or len(items) == 1:
        return line
    head = f"{indent}from {module} import ("
    lines, current = [], head
    for i, item in enumerate(items):
        piece = item + (", " if i < len(items) - 1 else ")")
        if len(current) + len(piece.rstrip()) > 100:
            lines.append(current.rstrip())
            current = " " * len(head)
        current += piece
    lines.append(current + comment)
    return "\n".join(lines)


def _split_from(m: re.Match, importer: str, is_package: bool, rel_all: bool) -> str:
    indent, module, comment = m["indent"], m["module"], m["comment"] or ""
    if module.startswith("."):
        absolute = _absolute(module, importer, is_package)
        if not (rel_all or new_name(absolute) != absolute
                or any(new_name(f"{absolute}.{n}") != f"{absolute}.{n}"
                       for n, _ in _names(m["names"]))):
            return m[0]
        module = absolute
    if all(_is_new(f"{module}.{n}") for n, _ in _names(m["names"])):
        return m[0]  # `from dpatlas.audit import checks`: the package in the new layout
    module = new_name(module)
    groups: dict[str, list[tuple[str, str | None]]] = {}
    for name, alias in _names(m["names"]):
        moved = new_name(f"{module}.{name}")
        if moved != f"{module}.{name}":  # `from dpatlas import feed`: a moved module
            parent, _, leaf = moved.rpartition(".")
            groups.setdefault(parent, []).append((leaf, alias or (name if leaf != name
                                                                  else None)))
        else:
            target = NAME_MOVES.get((module, name), module)
            groups.setdefault(target, []).append((name, alias))
    if list(groups) == [m["module"]]:
        return m[0]
    if list(groups) == [module]:  # only the module's name changed: keep the layout if it fits
        return _renamed(m, module, groups[module], comment)
    return "\n".join(_fmt(indent, mod, names, comment if i == len(groups) - 1 else "")
                     for i, (mod, names) in enumerate(groups.items()))


def _renamed(m: re.Match, module: str, names: list[tuple[str, str | None]],
             comment: str) -> str:
    """The statement with its module renamed, continuation lines shifted to stay aligned; one
    that no longer fits in 100 columns (and has no comment inside) is wrapped anew."""
    shift = len(module) - len(m["module"])
    first, *rest = m[0].replace(f"from {m['module']} import", f"from {module} import", 1
                                ).split("\n")
    pad = " " * max(shift, 0)
    rest = [pad + line if shift >= 0 else line[min(-shift, len(line) - len(line.lstrip())):]
            for line in rest]
    lines = [first, *rest]
    if max(map(len, lines)) <= 100 or "#" in m["names"]:
        return "\n".join(lines)
    return _fmt(m["indent"], module, names, comment)


def _rewrite_dotted(m: re.Match) -> str:
    """A dotted name, except the module of a ``from`` statement, which _split_from has done (it
    knows that ``from dpatlas.audit import checks`` names the new package, not the old module)."""
    line_start = m.string.rfind("\n", 0, m.start()) + 1
    if re.fullmatch(r"[ \t]*from[ \t]+", m.string[line_start:m.start()]):
        return m[0]
    return new_name(m[0])


def _rewrite_path(m: re.Match) -> str:
    module = m[1].replace("/", ".")
    if m[2] == "/" and not any(_starts(module, old) for old in OLD_PACKAGES):
        return m[0]  # a folder: dpatlas/cli/ is the new package (the old cli was a file)
    moved = new_name(module, _ALL if m[2] == ".py" else MODULE_MOVES)
    if moved == module and m[2] == ".py":
        return m[0]
    return moved.replace(".", "/") + m[2]


def rewrite(text: str, path: Path) -> str:
    python = path.suffix == ".py"
    importer = old_module_of(path) if python else ""
    in_dpatlas = path.parts[0] == "dpatlas"
    text = _FROM.sub(lambda m: m[0] if m["module"].startswith(".") and not python else
                     _split_from(m, importer, path.name == "__init__.py", in_dpatlas), text)
    text = _DOTTED.sub(_rewrite_dotted, text)
    return _PATH.sub(_rewrite_path, text)


def text_files() -> list[Path]:
    seen = set()
    for pattern in TEXT_GLOBS:
        for path in Path().glob(pattern):
            if (SKIP_DIRS & set(path.parts) or path.resolve() == SELF or not path.is_file()
                    or path.as_posix() in NEW_LAYOUT_FILES):
                continue
            seen.add(path)
    return sorted(seen)


def main() -> None:
    if not Path("pyproject.toml").is_file():
        sys.exit("run from the repository's root")
    move_files()
    for path in text_files():
        before = path.read_text()
        after = rewrite(before, path)
        if after != before:
            path.write_text(after)
            print(f"rewrote {path}")


if __name__ == "__main__":
    main()
