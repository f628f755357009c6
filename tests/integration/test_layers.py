"""The package's layers, enforced: the import-linter contracts of .importlinter hold, and they
can fail (a forbidden import added to a copy of the code breaks them)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from tests.support.paths import REPO

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")  # the venv's
PACKAGES = ("dpatlas", "flows", "tasks", "deploy", "mechanisms", "data_contracts")
CONTRACTS = 10


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the packages under ``root`` (they shadow the installed ones: the
    editable install's finder comes after the path, and the root is first on the path)."""
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin",
           "COLUMNS": "200"}  # wide: one line per contract in the report
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True,
                          text=True, timeout=300, env=env)


def copy_of_the_code(dest: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(REPO / package, dest / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.js", "*.css", "*.html"))
    shutil.copy(REPO / ".importlinter", dest / ".importlinter")
    return dest


def add_import(module_file: Path, statement: str) -> None:
    module_file.write_text(module_file.read_text() + f"\n{statement}\n")


def broken_contracts_report(code: Path, broken: int) -> str:
    """lint-imports on ``code``, which must fail with ``broken`` contracts broken; its report."""
    run = lint_imports(code)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"Contracts: {CONTRACTS - broken} kept, {broken} broken." in run.stdout
    return run.stdout


def test_every_contract_is_kept():
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in run.stdout


def test_a_forbidden_import_breaks_its_contract(tmp_path):
    code = copy_of_the_code(tmp_path)
    unchanged = lint_imports(code)
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr  # the copy is checked
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in unchanged.stdout

    add_import(code / "dpatlas" / "release" / "allocate.py",
               "import dpatlas.evaluation.synthetic_input  # research code on the release path")
    add_import(code / "mechanisms" / "noise.py", "import dpatlas.core.files")
    # the evaluation contract and the layers (release above evaluation), the acyclic one (an
    # edge both ways between release and evaluation), and mechanisms's own
    report = broken_contracts_report(code, 4)
    assert "The release path never imports the evaluation (research on synthetic input) BROKEN" \
        in report
    assert "mechanisms imports nothing of ours BROKEN" in report
    assert "The audit imports nothing of ours (not even mechanisms: an auditor trusts none of " \
        "it) KEPT" in report  # a contract the added imports do not touch
    assert "dpatlas.release.allocate -> dpatlas.evaluation.synthetic_input" in report
    assert "mechanisms.noise -> dpatlas.core.files" in report


def test_small_area_imports_nothing_of_ours_and_the_audit_may_import_it(tmp_path):
    code = copy_of_the_code(tmp_path)
    add_import(code / "dpatlas" / "audit" / "small_area.py",
               "import dpatlas.small_area  # the audit re-fits the model from the files")
    allowed = lint_imports(code)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert f"Contracts: {CONTRACTS} kept, 0 broken." in allowed.stdout

    add_import(code / "dpatlas" / "small_area" / "model.py", "import mechanisms.noise")
    run = lint_imports(code)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "small_area imports nothing of ours (the audit may import it to re-fit the model " \
        "from the published files) BROKEN" in run.stdout
    assert "dpatlas.small_area.model -> mechanisms.noise" in run.stdout


def test_the_input_checks_and_the_synthetic_geography_never_import_the_publication(tmp_path):
    # Issue 34 item 3: validation and the demo's generator reached into dpatlas.publication
    # for geography; the boundary checks and the synthetic boundaries now share
    # dpatlas.core.places with it instead, and a contract keeps it that way.
    code = copy_of_the_code(tmp_path)
    add_import(code / "dpatlas" / "release" / "boundaries.py",
               "import dpatlas.publication.geojson  # an input check leaning on the publication")
    add_import(code / "dpatlas" / "evaluation" / "synthetic_boundaries.py",
               "import dpatlas.publication.level_files")
    report = broken_contracts_report(code, 1)  # only this one: the layers allow both imports
    assert "The input checks and the synthetic geography never import the publication BROKEN" \
        in report
    assert "dpatlas.release.boundaries -> dpatlas.publication.geojson" in report
    assert "tasks.validate -> dpatlas.release.boundaries" in report  # validation, indirectly
    assert "dpatlas.evaluation.synthetic_boundaries -> dpatlas.publication.level_files" in report


def test_the_audits_modules_are_layered(tmp_path):
    """A reader of tiles importing a check that uses it breaks the audit's layers (and, being
    a cycle, the acyclic contract); the independence contract is untouched by it."""
    code = copy_of_the_code(tmp_path)
    add_import(code / "dpatlas" / "audit" / "tiles.py", "from . import formats  # noqa")
    run = lint_imports(code)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "The audit's modules in layers: run -> checks -> readers -> base BROKEN" in run.stdout
    assert "dpatlas.audit.tiles -> dpatlas.audit.formats" in run.stdout
    assert "No cycles between the subpackages of dpatlas BROKEN" in run.stdout
    assert "The audit imports nothing of ours (not even mechanisms: an auditor trusts none of " \
        "it) KEPT" in run.stdout
    assert f"Contracts: {CONTRACTS - 2} kept, 2 broken." in run.stdout

def test_the_ledger_and_the_cli_keep_their_modules_by_concern(tmp_path):
    """issue 34: the ledger's tables import none of its checks, operations or the Ledger, and a
    command module never imports another (commands.py registers them all)."""
    code = copy_of_the_code(tmp_path)
    add_import(code / "dpatlas" / "ledger" / "schema.py", "import dpatlas.ledger.validation")
    add_import(code / "dpatlas" / "cli" / "ledger_commands.py",
               "import dpatlas.cli.release_commands")
    run = lint_imports(code)
    assert run.returncode == 1, run.stdout + run.stderr
    assert f"Contracts: {CONTRACTS - 2} kept, 2 broken." in run.stdout
    assert "dpatlas.ledger.schema -> dpatlas.ledger.validation" in run.stdout
    assert "dpatlas.cli.ledger_commands -> dpatlas.cli.release_commands" in run.stdout
