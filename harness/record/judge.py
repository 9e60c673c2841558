"""The verdict on a recorded job: the harness's diagnosis of what
:func:`harness.record.analyze.observe` made of the files, in the job's own
numbering, with the workers that left no files kept among the candidates
(the stage ``missing_workers`` of :mod:`harness.diagnosis.stages` says why).
"""
from __future__ import annotations

from harness.diagnosis import Story, Verdict, conclude, diagnose
from harness.record.analyze import Analysis


def verdict(analysis: Analysis) -> Verdict:
    """The verdict on ``analysis`` (which has an observation)."""
    obs = analysis.observation
    if obs is None:
        raise ValueError("no observation to judge: " + "; ".join(
            analysis.problems or (analysis.running,)))
    return conclude(diagnose(obs), obs, Story(positions=analysis.positions,
                                              missing=analysis.missing))
