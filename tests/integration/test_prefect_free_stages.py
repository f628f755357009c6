"""The release's plain stages (tests/unit/release/test_units.py) import no Prefect: checked in a
fresh interpreter, so what this test run already imported cannot hide it."""

import subprocess
import sys

from tests.support.paths import REPO


def test_plain_stages_do_not_import_prefect():
    code = ("import sys, dpatlas.release.allocate, dpatlas.release.selection, dpatlas.release.estimate, "
            "dpatlas.ledger, dpatlas.core.files, dpatlas.release.outcome, dpatlas.release.draws; "
            "print('prefect' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=REPO)
    assert out.stdout.strip() == "False"
