"""``python -m harness``: the command line (see :mod:`harness.cli`)."""
import sys

from harness.cli import main

if __name__ == "__main__":   # not when a spawned worker imports this as __mp_main__
    sys.exit(main())
