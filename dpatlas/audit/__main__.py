"""``python -m dpatlas.audit RELEASE_DIR [options]`` (or ``python -m audit`` on a copy of the
folder alone)."""

import sys

from .run import _arguments, main

if __name__ == "__main__":
    args = _arguments(sys.argv[1:])
    raise SystemExit(main(args.folder, allow_test=args.allow_test, ledger=args.ledger,
                          boundaries=args.boundaries))
