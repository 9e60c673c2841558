"""The verdict on a recorded job: the harness's diagnosis of what
:func:`harness.record.analyze.observe` made of the files, in the job's own
numbering, with the workers that left no files kept among the candidates.

A worker that left no files (a host lost, a directory not gathered) is
not evidence of anything, and it is not innocent either: what it did could
overturn what the others' files show (it may have skipped the step the
others wait in, or raised first).  So the others' verdict is given as what
their files alone show, and the verdict itself cannot tell: its
candidates are the others' culprits and the missing workers.  A confident
wrong culprit is the worst answer.
"""
from __future__ import annotations

import dataclasses

from harness.diagnosis import Verdict, diagnose
from harness.diagnosis.observations import Outcome
from harness.diagnosis.words import names
from harness.record.analyze import Analysis

WHY_MISSING = "a host lost, or its directory not gathered"


def verdict(analysis: Analysis) -> Verdict:
    """The verdict on ``analysis`` (which has an observation): culprits
    as the job numbers its workers; see the module docstring."""
    v = diagnose(analysis.observation)
    positions = analysis.positions or tuple(range(len(analysis.observation.workers)))
    culprits = tuple(sorted(positions[c] for c in v.culprits))
    v = dataclasses.replace(v, culprits=culprits)
    return with_missing(v, analysis.missing)


def with_missing(v: Verdict, missing) -> Verdict:
    """``v``, the verdict on the workers that left files, widened to
    "cannot tell" with the ``missing`` workers among its candidates."""
    if not missing:
        return v
    candidates = tuple(sorted(set(v.culprits) | set(missing)))
    head, _, rest = v.text.partition("\n")
    what = ("whether the job completed" if v.outcome == Outcome.COMPLETED else "who is to blame")
    lines = [f"{v.outcome.upper()}: cannot tell {what}: {names(missing)} left no files "
             f"({WHY_MISSING}), and what {'it' if len(missing) == 1 else 'they'} did could "
             f"overturn what the others' files show; candidates: {names(candidates)}",
             f"  from the others' files alone: {head}"]
    return dataclasses.replace(v, culprits=candidates, ambiguous=True,
                               text="\n".join(lines + ([rest] if rest else [])))
