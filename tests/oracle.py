"""The oracle: from a fault plan to the outcome and culprits it allows.

A plain function, no TensorFlow.  It encodes what TensorFlow 2.21 does with
each fault on the standard workload (a variable in scope and one all-reduce
per step), as measured in tests/test_faults.py, and how faults combine:

* benign faults (a ``Delay``, a ``Pause`` that resumes well before the
  timeout) change nothing;
* a *stopping* fault (``Crash``, ``RaiseError``, a ``Pause`` for ever) at step
  e ends all progress there: every worker reaches step e's boundary, and
  none goes past it, so faults at later steps never fire;
* a *desync* fault (``SkipStep``, ``ExtraCollective``) is silent until the
  end, when one worker waits for a partner that has finished: a hang, unless
  a stopping fault fired first.
"""
from harness import faults
from plans import Plan

# (outcome when the chief is faulted, when another worker is)
CONFIG_OUTCOME = {
    "missing": ("hang", "hang"),
    "wrong_size": ("hang", "failed"),
    "duplicate_index": ("failed", "failed"),
    "swapped": ("failed", "failed"),
    "wrong_port": ("hang", "failed"),
}
AMBIGUOUS_CONFIG_AT_2 = {"swapped", "wrong_port"}


def _stopping(f, timeout):
    if isinstance(f, (faults.Crash, faults.RaiseError)):
        return True
    return isinstance(f, faults.Pause) and (f.seconds is None or f.seconds >= timeout)


def expect(plan: Plan):
    """Return ``(outcome, culprits)`` the plan must produce."""
    n, fs = plan.workers, plan.faults
    configs = [f for f in fs if isinstance(f, faults.BadTFConfig)]
    if configs:
        (f,) = configs
        chief, other = CONFIG_OUTCOME[f.kind]
        outcome = chief if f.worker == 0 else other
        if n == 2 and f.kind in AMBIGUOUS_CONFIG_AT_2:
            return outcome, (0, 1)
        return outcome, (f.worker,)
    stopping = [f for f in fs if _stopping(f, plan.timeout)]
    if stopping:
        first = min(f.step for f in stopping)
        firing = [f for f in stopping if f.step == first]
        for kind, outcome in ((faults.Crash, "crashed"), (faults.RaiseError, "failed"), (faults.Pause, "hang")):
            hit = sorted({f.worker for f in firing if isinstance(f, kind)})
            if hit:
                return outcome, tuple(hit)
    desync = [f for f in fs if isinstance(f, (faults.SkipStep, faults.ExtraCollective))]
    if desync:
        (f,) = desync
        # The collective ledger's per-step counts name the worker whose step
        # launched one collective more or fewer, even with two workers.
        return "hang", (f.worker,)
    return "completed", ()
