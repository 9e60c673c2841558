"""The verdict: what the diagnosis concluded of a run, the one record a
result's outcome, culprits and text are read from.  Only the diagnosis
makes or changes one (:func:`harness.diagnosis.diagnose`, then the stages
of :mod:`harness.diagnosis.stages`)."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from harness.diagnosis.observations import Outcome


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the diagnosis concluded; ``text`` says it for a person."""

    outcome: Outcome              # equal to its text: "completed", ...
    culprits: Tuple[int, ...]     # worker indexes blamed, sorted; () when completed
    text: str                     # multi-line, the first thing a person reads
    step: Optional[int] = None    # where things went wrong (blocked / diverged / died)
    error: Optional[str] = None   # type name of the root error, when there is one
    ambiguous: bool = False       # True when the culprit cannot be decided
    rule: str = ""                # the rule that decided (one of RULE_NAMES)
    stages: Tuple[str, ...] = ()  # the stages after the rules that changed it (see STAGES)
    # (fault as it prints, why) for each fault asked for that never acted:
    # the run fails (stage "fault_never_acted").
    faults_never_acted: Tuple[Tuple[str, str], ...] = ()
