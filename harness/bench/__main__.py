"""``python -m harness.bench``: the launcher comparison,
:mod:`harness.bench.launchers.compare`."""
import sys

from harness.bench.launchers.compare import main

sys.exit(main())
