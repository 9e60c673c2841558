"""``python -m harness.bench.picture [PATH]``: the documentation's timeline picture,
made from a real run: 3 workers, worker 1 skips step 5's all-reduce
(``SkipStep``), the collective ledger at ``"collectives"``.  Writes
``PATH.svg`` and ``PATH.trace.json`` (default ``docs/timeline``)."""
from __future__ import annotations

import sys


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    from ..controller import Cluster
    from ..faults import SkipStep
    from ..settings import RunSettings
    from ..workloads import variable_loop
    cluster = Cluster(RunSettings(workers=3, timeout=2, grace=2))
    cluster.run(variable_loop, args=(2,)).assert_completed()    # the forkserver's cold start
    result = cluster.run(variable_loop, args=(10,), faults=[SkipStep(1, 5)],
                         ledger="collectives")
    print(result.diagnosis)
    for path in result.timeline(argv[0] if argv else "docs/timeline"):
        print("wrote", path)


if __name__ == "__main__":
    main()
