"""Where the checkout is, for tests that read its files or run its scripts."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # tests/support/paths.py -> the checkout
# Runs the dpatlas command line with a crash injected (a fault hook, not an environment variable).
CRASH_AT = REPO / "tests" / "support" / "crash_at.py"
