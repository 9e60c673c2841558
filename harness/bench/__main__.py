"""``python -m harness.bench``: see :mod:`harness.bench`."""
import sys

from . import main

sys.exit(main())
