"""Builders of hand-made run observations, the way the controller would
record them for one fault: for the diagnosis's tests (no process, no
TensorFlow)."""
from __future__ import annotations

from typing import Optional, Sequence

from harness.core.protocol import WorkerError
import dataclasses

from harness.diagnosis.observations import (Call, CollectiveOp, Event, RunObservation, TracedFunction,
                            WorkerObservation)

HOST = "127.0.0.1"

STACK_TF = """\
Thread 0x00007f2b5a7fc640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 622 in wait

Current thread 0x00007f2b6d1f7740 (most recent call first):
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53 in quick_execute
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/tensorflow/python/eager/polymorphic_function/concrete_function.py", line 1688 in _call_flat
  File "/work/main/scenarios/test_steps.py", line 23 in train
  File "/work/main/harness/worker.py", line 140 in _call_fn
  File "/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/multiprocess/process.py", line 314 in _bootstrap
"""

STACK_CREATE = """\
Stack (most recent call first):
  File "/venv/lib/python3.11/site-packages/tensorflow/python/distribute/cluster_resolver/tfconfig_cluster_resolver.py", line 90 in cluster_spec
  File "/venv/lib/python3.11/site-packages/tensorflow/python/distribute/collective_all_reduce_strategy.py", line 420 in _initialize_multi_worker
  File "/venv/lib/python3.11/site-packages/tensorflow/python/distribute/collective_all_reduce_strategy.py", line 190 in __init__
  File "/work/main/scenarios/test_config.py", line 12 in make_strategy
  File "/work/main/harness/worker.py", line 140 in _call_fn
"""

# Python 3.12+ names the thread in brackets; the user's frame is in a sleep.
STACK_SLEEP = """\
Thread 0x00007f2b5a7fc640 [python] (most recent call first):
  File "/work/main/scenarios/test_pause.py", line 31 in train
  File "/work/main/harness/worker.py", line 140 in _call_fn
"""


# ---------------------------------------------------------------- builders

def ports(n: int, base: int = 20000) -> list:
    return [base + i for i in range(n)]


def config(index: int, n: int, port_list: Optional[Sequence[int]] = None) -> dict:
    port_list = list(port_list) if port_list is not None else ports(n)
    return {"cluster": {"worker": [f"{HOST}:{p}" for p in port_list]},
            "task": {"type": "worker", "index": index}}


def events(steps: Sequence[int] = (), n: int = 2, created: Optional[int] = None,
           creating_only: bool = False, done: bool = False, faults=(),
           asked: Optional[int] = None) -> tuple:
    """The phase events a worker reports, 0.1 s apart, plus its faults."""
    out = [Event(0.0, "started"), Event(0.1, "strategy_creating")]
    if creating_only:
        return tuple(out)
    out.append(Event(0.2, "strategy_created", data=n if created is None else created))
    t = 0.3
    for s in steps:
        for f_step, f_repr in faults:
            if f_step == s:
                out.append(Event(t, "fault", step=s, data=f_repr))
        out.append(Event(t, "step", step=s))
        t += 0.1
    if done:
        out.append(Event(t, "steps_done", step=len(steps), data=asked))
    return tuple(out)


def returned(i: int, n: int, steps=range(10), t: float = 2.0, asked: int = 10,
             **kw) -> WorkerObservation:
    kw.setdefault("tf_config", config(i, n))
    return WorkerObservation(i, events=events(list(steps), n, done=True, asked=asked),
                             returned=True,
                             finish_time=t, exit_code=0, exit_time=t + 0.1, **kw)


def blocked(i: int, n: int, steps=range(10), stack: str = STACK_TF, **kw) -> WorkerObservation:
    kw.setdefault("tf_config", config(i, n))
    kw.setdefault("events", events(list(steps), n))
    return WorkerObservation(i, exit_code=-9, exit_time=20.0, killed_by_harness=True,
                             stack=stack, **kw)


def raised(i: int, n: int, type_name: str, message: str, t: float, steps=range(4),
           **kw) -> WorkerObservation:
    kw.setdefault("tf_config", config(i, n))
    kw.setdefault("events", events(list(steps), n))
    return WorkerObservation(i, error=WorkerError(type_name, message, kw.pop("tb", "")),
                             finish_time=t, exit_code=1, exit_time=t + 0.1, **kw)


def died(i: int, n: int, code: int, t: float, steps=range(4), **kw) -> WorkerObservation:
    kw.setdefault("tf_config", config(i, n))
    kw.setdefault("events", events(list(steps), n))
    return WorkerObservation(i, exit_code=code, exit_time=t, **kw)


def run(*workers: WorkerObservation, ended_by: str = "all_finished",
        timeout: float = 10.0) -> RunObservation:
    return RunObservation(num_workers=len(workers), timeout=timeout, grace=5.0,
                          ended_by=ended_by, duration=21.0, workers=tuple(workers))


UNHEALTHY = ("The following tasks are unhealthy (stopped sending heartbeats):\n"
             "/job:worker/replica:0/task:{}\nThe tasks have crashed.")

SKIP5 = [s for s in range(10) if s != 5]


def shape_error(task: int, mine: str, other: str) -> WorkerError:
    return WorkerError(
        "InvalidArgumentError",
        "{{function_node __wrapped__CollectiveReduceV2}} Collective ops is aborted by: Shape "
        f"mismatch in the collective instance 105. Op at device /job:worker/replica:0/task:{task}"
        f"/device:CPU:0 expected shape {mine} but another member in the group expected shape "
        f"{other}. This is likely due to different input shapes at different members of the "
        "collective op.")


ALL_REDUCE = CollectiveOp("all-reduce", (1,), "float32")


def with_ledger(w: WorkerObservation, per_step=None, blocked: bool = False,
                calls_without_steps: int = 0, level: str = "calls") -> WorkerObservation:
    """``w`` with a collective ledger: ``per_step[s]`` calls of `step` (one
    all-reduce each) in step s (default: one in each step ``w`` reported),
    or ``calls_without_steps`` calls outside any step; with ``blocked`` its
    last call never ended."""
    if per_step is None and not calls_without_steps:
        per_step = {s: 1 for s in w.steps}
    slots = ([s for s, k in sorted((per_step or {}).items()) for _ in range(k)]
             + [None] * calls_without_steps)
    calls = []
    for number, step in enumerate(slots, start=1):
        last = number == len(slots)
        calls.append(Call(0, number, step, began=0.3 + number / 100,
                          ended=None if (blocked and last) else 0.3 + number / 100 + 0.005))
    return dataclasses.replace(w, functions=(TracedFunction(0, "step", (ALL_REDUCE,)),),
                               calls=tuple(calls), ledger=level)
