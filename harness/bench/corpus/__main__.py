"""``python -m harness.bench.corpus``: the corpus of users' bugs,
:mod:`harness.bench.corpus.program`."""
import sys

from harness.bench.corpus.program import main

sys.exit(main())
