"""``python -m harness.bench.picture [record] [PATH]``: the documentation's
timeline picture.

``record`` makes it from a real run (3 workers, worker 1 skips step 5's
all-reduce, ``SkipStep``, the collective ledger at ``"collectives"``) and
keeps what the parent observed as ``PATH.observation.json`` (default
``docs/timeline``); without it, the picture is drawn again from that
record with today's diagnosis and drawing.  Either writes ``PATH.svg``
and ``PATH.trace.json``.  ``tests/unit/test_docs.py`` draws it again and
fails when the files in ``docs/`` differ: a picture that shows a verdict
the harness no longer gives is stale.
"""
from __future__ import annotations

import json
import sys
from typing import Tuple

DEFAULT = "docs/timeline"


def record(path: str) -> None:
    """Run the picture's scenario and keep its observation."""
    from harness.controller import Cluster
    from harness.faults import SkipStep
    from harness.settings import RunSettings
    from harness.workloads import variable_loop
    cluster = Cluster(RunSettings(workers=3, timeout=2, grace=2))
    cluster.run(variable_loop, args=(2,)).assert_completed()    # the forkserver's cold start
    result = cluster.run(variable_loop, args=(10,), faults=[SkipStep(1, 5)],
                         ledger="collectives")
    with open(path + ".observation.json", "w") as f:
        json.dump(result.observation.to_dict(), f, indent=1, sort_keys=True)
        f.write("\n")


def render(path: str) -> Tuple[str, dict]:
    """The picture (SVG text) and the Chrome trace drawn from ``PATH.observation.json``."""
    from harness.diagnosis import diagnose
    from harness.diagnosis.observations import RunObservation
    from harness.report import timeline
    with open(path + ".observation.json") as f:
        obs = RunObservation.from_dict(json.load(f))
    v = diagnose(obs)
    panels = [timeline.panel(obs, v.outcome, v.culprits, v.text, 0, v.ambiguous)]
    return timeline.svg(panels), timeline.chrome_trace(panels)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["record"]:
        argv = argv[1:]
        record(argv[0] if argv else DEFAULT)
    path = argv[0] if argv else DEFAULT
    picture, trace = render(path)
    with open(path + ".svg", "w") as f:
        f.write(picture)
    with open(path + ".trace.json", "w") as f:
        json.dump(trace, f)
    print(f"wrote {path}.svg and {path}.trace.json")


if __name__ == "__main__":
    main()
