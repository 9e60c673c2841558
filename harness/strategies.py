"""Hypothesis strategies for fault plans, in hypothesis's style: small,
composable, each argument checked and named when it is wrong.

``faults(workers, steps)`` draws one fault of a kind in ``kinds`` (by
default every step-keyed kind but the network's, which need network
namespaces, and the files', which act only on a job that writes files)
valid for a cluster of ``workers`` running ``steps`` steps;
``plans(workers, steps)`` draws a tuple of them, a plan for ``faults=``.
Hypothesis shrinks what it draws toward fewer faults, a lower worker, an
earlier step, and the simpler kinds (earlier in :data:`STEP_KINDS`), and
a plan prints as the faults' constructor calls, ready to paste::

    from hypothesis import HealthCheck, given, settings
    from harness import strategies

    @settings(max_examples=20, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(plan=strategies.plans(workers=2, steps=10, kinds=["Crash", "Pause"],
                                 for_ever=False))
    def test_the_job_survives_one_fault(mwms_cluster, plan):
        # One cluster object for every example: each run starts fresh processes.
        mwms_cluster.run(train, faults=plan, restarts=1).assert_completed()

Importing this module needs hypothesis (a dependency of the test extra),
not TensorFlow.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from harness import faults as F

__all__ = ["faults", "plans", "KINDS", "STEP_KINDS", "FILE_KINDS"]

# How long a pause or a delay that a job should survive lasts, seconds:
# well under any sensible hang timeout.
SHORT_SECONDS = (0.2, 0.5, 1.0)

# How to draw one fault of a kind at a worker and a step; the flag says
# whether a pause may last for ever.
Builder = Callable[[st.SearchStrategy, st.SearchStrategy, bool], st.SearchStrategy]

# Every step-keyed kind a plan may hold without network namespaces, the
# simpler first (hypothesis shrinks toward the first).
KINDS: Dict[str, Builder] = {
    "Crash": lambda w, s, _: st.builds(F.Crash, w, s, st.sampled_from(F.CRASH_HOW)),
    "RaiseError": lambda w, s, _: st.builds(F.RaiseError, w, s),
    "SkipStep": lambda w, s, _: st.builds(F.SkipStep, w, s),
    "ExtraCollective": lambda w, s, _: st.builds(F.ExtraCollective, w, s),
    "Delay": lambda w, s, _: st.builds(F.Delay, w, s, st.sampled_from(SHORT_SECONDS)),
    # A pause for ever (None) last: it shrinks toward one the job survives.
    "Pause": lambda w, s, for_ever: st.builds(
        F.Pause, w, s, st.sampled_from(SHORT_SECONDS + ((None,) if for_ever else ()))),
    "Preempt": lambda w, s, _: st.builds(F.Preempt, w, s),
    # On the job's files under its run directory: they act only in a job
    # that writes there after their step.
    "DiskFull": lambda w, s, _: st.builds(F.DiskFull, w, s),
    "TornWrite": lambda w, s, _: st.builds(F.TornWrite, w, s),
    "LostRename": lambda w, s, _: st.builds(F.LostRename, w, s),
    "SlowWrite": lambda w, s, _: st.builds(F.SlowWrite, w, s, st.sampled_from(SHORT_SECONDS)),
}
# The kinds that act on the job's files.
FILE_KINDS: Tuple[str, ...] = ("DiskFull", "TornWrite", "LostRename", "SlowWrite")
STEP_KINDS: Tuple[str, ...] = tuple(KINDS)


def _whole(value, name: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidArgument(f"{name}={value!r}: a whole number, {least} or more")
    return value


def chosen_kinds(kinds: Optional[Sequence[str]]) -> Tuple[str, ...]:
    """``kinds`` checked, in the table's order (simpler first); for None,
    every step-keyed kind but the files' (:data:`FILE_KINDS`: they act only
    on a job that writes files, so they are asked for by name)."""
    if kinds is None:
        return tuple(k for k in STEP_KINDS if k not in FILE_KINDS)
    if isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds):
        raise InvalidArgument(f"kinds={kinds!r}: a list of fault kinds' names, such as "
                              f"['Crash', 'Pause']")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise InvalidArgument(f"kinds={list(kinds)!r}: name at least one of "
                              f"{', '.join(STEP_KINDS)}" + (f"; not {unknown}" if unknown else ""))
    return tuple(k for k in STEP_KINDS if k in kinds)   # the table's order: simpler first


def faults(workers: int, steps: int, kinds: Optional[Sequence[str]] = None,
           attempts: int = 1, for_ever: bool = True) -> st.SearchStrategy:
    """One fault of a kind in ``kinds`` at a worker ``0..workers-1`` and a
    step ``0..steps-1``, acting in an attempt ``0..attempts-1`` (with
    ``attempts`` > 1, for a run with ``restarts=attempts - 1``);
    ``for_ever=False`` draws only pauses that end (a job can survive them)."""
    workers, steps = _whole(workers, "workers", 1), _whole(steps, "steps", 1)
    attempts = _whole(attempts, "attempts", 1)
    if not isinstance(for_ever, bool):
        raise InvalidArgument(f"for_ever={for_ever!r}: True or False")
    worker, step = st.integers(0, workers - 1), st.integers(0, steps - 1)
    one = st.one_of(*(KINDS[k](worker, step, for_ever) for k in chosen_kinds(kinds)))
    if attempts == 1:
        return one
    return st.tuples(one, st.integers(0, attempts - 1)).map(
        lambda pair: _in_attempt(*pair))


def _in_attempt(fault: F.Fault, attempt: int) -> F.Fault:
    import dataclasses
    return dataclasses.replace(fault, attempt=attempt)


def plans(workers: int, steps: int, kinds: Optional[Sequence[str]] = None,
          min_faults: int = 0, max_faults: int = 1, attempts: int = 1,
          for_ever: bool = True) -> st.SearchStrategy:
    """A plan: ``min_faults..max_faults`` faults (:func:`faults`), at most
    one per worker and step (which of two faults at one step acts first
    would be a race), as a tuple for ``run(faults=...)``."""
    min_faults = _whole(min_faults, "min_faults", 0)
    max_faults = _whole(max_faults, "max_faults", 0)
    if max_faults < min_faults:
        raise InvalidArgument(f"max_faults={max_faults} is below min_faults={min_faults}")
    return st.lists(faults(workers, steps, kinds, attempts, for_ever), min_size=min_faults,
                    max_size=max_faults,
                    unique_by=lambda f: (f.worker, f.step, f.attempt)).map(tuple)
