"""Run the dpatlas command line with a crash injected: ``python tests/support/crash_at.py POINT
ARGS...``
runs ``dpatlas ARGS...`` and kills itself with SIGKILL at the crash point POINT
(dpatlas.release.crash), so production code reads no environment variable for it."""

import sys

from dpatlas.cli.commands import main
from dpatlas.release import crash

if __name__ == "__main__":
    crash.install_fault_hook(crash.sigkill_at(sys.argv[1]))
    sys.argv = ["dpatlas", *sys.argv[2:]]
    main()
