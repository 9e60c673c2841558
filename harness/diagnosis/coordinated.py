"""The verdict on a parameter-server cluster: a pure function of what was
observed.

The chief runs the job (its ``ClusterCoordinator``); the workers and the
parameter servers serve until the harness ends them, so a server's state
at the end is evidence only when it ended otherwise: it died, raised or was
stopped (``down``).  What TensorFlow does then, as the coordinator's own
process shows it:

* a worker that fails costs the coordinator the functions it held: it puts
  each back in its queue (a ``rescheduled`` event on the chief, from
  TensorFlow's own failure handling) and runs it on another worker, so the
  job completes, and a function may have run twice;
* a parameter server that fails is fatal: the coordinator raises an error
  that names it (``/job:ps/replica:0/task:0``).

The rules are a table (:data:`RULES`), tried in order; the first that
answers decides, and ``Verdict.rule`` names it.  A culprit is named only
where the evidence singles one out: one server down, or one of several
named by the coordinator's error; else the verdict cannot tell and lists
the candidates.
"""
from __future__ import annotations

import re
from typing import Callable, List, Optional, Sequence, Tuple

from harness.diagnosis.echoes import error_text, exit_text, short_type
from harness.diagnosis.observations import Outcome, RunObservation, WorkerObservation
from harness.diagnosis.render import CULPRIT_MARK
from harness.diagnosis.render import cut as fitted
from harness.diagnosis.rules_links import silent_workers
from harness.diagnosis.stacks import summarize_stack
from harness.diagnosis.verdict import Verdict
from harness.diagnosis.words import name, names
from harness.core import protocol

# How TensorFlow names a task in an error: /job:ps/replica:0/task:1.
TASK_NAMED = re.compile(r"/job:(chief|worker|ps)/replica:\d+/task:(\d+)")
# The errors of a task not reached (gRPC's status), as TensorFlow raises them.
UNREACHED = frozenset({"UnavailableError", "DeadlineExceededError", "AbortedError",
                       "CancelledError"})
# An address's port in gRPC's text: ipv4:10.77.0.4:28724, 127.0.0.1:28724.
PORT_NAMED = re.compile(r"[\d.\]a-z]:(\d{2,5})\b")


def is_coordinated(obs: RunObservation) -> bool:
    """Whether ``obs`` is of a parameter-server cluster (with its chief)."""
    return bool(obs.serving) and any(kind == "chief" for kind, _ in obs.tasks)


def servers(obs: RunObservation) -> Tuple[WorkerObservation, ...]:
    return tuple(w for w in obs.workers if w.index in obs.serving)


def coordinator(obs: RunObservation) -> WorkerObservation:
    return next(w for w in obs.workers if obs.task(w.index)[0] == "chief")


def cut_off(obs: RunObservation) -> Tuple[int, ...]:
    """The tasks the links tried as the run ended found silent to every
    other task and to the switch, every other link answering
    (:func:`~harness.diagnosis.rules_links.silent_workers`)."""
    return tuple(silent_workers(obs.links, len(obs.workers)) or ())


def down(w: WorkerObservation, cut: Sequence[int] = ()) -> bool:
    """A server that stopped serving: it died or raised (a fault's error
    ends its process), it was seen stopped (SIGSTOP), or it was cut off."""
    return w.died or w.error is not None or w.stopped or w.index in cut


def _when(w: WorkerObservation) -> float:
    """When a server went down, where its end says (infinity: not known;
    one stopped or cut off is ended by the harness at teardown)."""
    times = [w.finish_time] + ([] if w.killed_by_harness else [w.exit_time])
    known = [t for t in times if t is not None]
    return min(known) if known else float("inf")


def _ports(obs: RunObservation) -> dict:
    """Each task's port, as the chief's ``TF_CONFIG`` lists it, to its index."""
    cluster = ((obs.workers[0].tf_config or {}).get("cluster") or {}) if obs.workers else {}
    found = {}
    for kind, addresses in cluster.items():
        for number, address in enumerate(addresses if isinstance(addresses, list) else ()):
            port = str(address).rpartition(":")[2]
            if (kind, number) in obs.tasks and port.isdigit():
                found[port] = obs.tasks.index((kind, number))
    return found


def named_in(obs: RunObservation, text: str) -> Tuple[int, ...]:
    """The processes TensorFlow names in ``text``, by index: as a job
    (``/job:ps/replica:0/task:0``) or by the port of its address (gRPC's
    "failed to connect ... ipv4:10.77.0.4:28724"; each task has a port of
    its own)."""
    found = set()
    for kind, number in TASK_NAMED.findall(text):
        task = (kind, int(number))
        if task in obs.tasks:
            found.add(obs.tasks.index(task))
    ports = _ports(obs)
    found |= {ports[p] for p in PORT_NAMED.findall(text) if p in ports}
    return tuple(sorted(found))


def rescheduled(chief: WorkerObservation, obs: RunObservation) -> List[int]:
    """The process index of the worker behind each function the coordinator
    put back in its queue, in order."""
    found = []
    for e in chief.events:
        if e.kind != protocol.RESCHEDULED or not isinstance(e.data, dict):
            continue
        task = (str(e.data.get("task", "worker")), e.data.get("index"))
        if task in obs.tasks:
            found.append(obs.tasks.index(task))
    return found


def server_line(w: WorkerObservation, cut: Sequence[int], mark: str = "") -> str:
    steps = f" at coordinator step {w.last_step}" if w.last_step is not None else \
        " before the coordinator's first step"
    if w.error is not None:
        state = f"raised{steps}: {error_text(w.error)}"
    elif w.died:
        state = f"died ({exit_text(w.exit_code)}){steps}"
    elif w.stopped:
        state = f"stopped (SIGSTOP){steps}"
    elif w.index in cut:
        state = "cut off: as the run ended no link to or from it answered, every other link did"
    else:
        state = "served until the end"
    return fitted(f"  {name(w.index)}: {state}{mark}")


def chief_line(chief: WorkerObservation, mark: str = "") -> str:
    steps = f"{len(chief.steps)} functions scheduled"
    if chief.error is not None:
        state = f"raised: {error_text(chief.error)}"
    elif chief.returned:
        state = "returned"
    elif chief.died:
        state = f"died ({exit_text(chief.exit_code)})"
    elif chief.stopped:
        state = "stopped (SIGSTOP)"
    else:
        where = summarize_stack(chief.stack) if chief.stack.strip() else "no stack"
        state = f"blocked: {where}"
    return fitted(f"  {name(chief.index)} (the coordinator): {state}; {steps}{mark}")


class Found:
    """What a rule decided: outcome, culprits, headline, whether it cannot tell."""

    def __init__(self, outcome: Outcome, culprits: Sequence[int], headline: str,
                 ambiguous: bool = False, step: Optional[int] = None):
        self.outcome, self.culprits, self.headline = outcome, tuple(sorted(culprits)), headline
        self.ambiguous, self.step = ambiguous, step


def coordinator_crashed(obs: RunObservation, chief: WorkerObservation,
                        gone: Sequence[WorkerObservation], cut: Sequence[int]) -> Optional[Found]:
    if not chief.died:
        return None
    return Found(Outcome.CRASHED, (chief.index,),
                 f"the coordinator ({name(chief.index)}) died ({exit_text(chief.exit_code)})",
                 step=chief.last_step)


def _holds(obs: RunObservation, w: WorkerObservation, cut: Sequence[int]) -> bool:
    """Whether a server that went down holds the job for certain: a
    parameter server (the coordinator cannot go on without it), or a
    worker that is stopped or cut off (its function never returns); a
    worker that died the coordinator goes on without."""
    return obs.task(w.index)[0] == "ps" or w.stopped or w.index in cut


def server_down_coordinator_raised(obs: RunObservation, chief: WorkerObservation,
                                   gone: Sequence[WorkerObservation], cut: Sequence[int]) -> Optional[Found]:
    """Servers went down before the coordinator raised (or at a time not
    known: stopped, cut off): the ones its error names; for an error of
    reaching a task (:data:`UNREACHED`) that names none of them, those
    that hold the job for certain (:func:`_holds`), else it cannot tell
    them from the job.  Any other error that names none is the job's own
    (:func:`coordinator_raised`)."""
    if chief.error is None or not gone:
        return None
    raised_at = chief.finish_time if chief.finish_time is not None else float("inf")
    before = [w for w in gone if _when(w) <= raised_at or _when(w) == float("inf")]
    if not before:
        return None
    named = named_in(obs, f"{chief.error.message}\n{chief.error.traceback}")
    error = short_type(chief.error.type_name)
    culprits = tuple(w.index for w in before if w.index in named)
    vague = False
    if not culprits:
        if error not in UNREACHED:
            return None
        culprits = tuple(w.index for w in before if _holds(obs, w, cut))
        if not culprits:   # only workers died, which the coordinator goes on without
            culprits, vague = (chief.index, *(w.index for w in before)), True
    outcome = Outcome.CRASHED if any(obs.workers[i].died for i in culprits) else Outcome.FAILED
    if len(culprits) == 1:
        w = obs.workers[culprits[0]]
        return Found(outcome, culprits, f"{name(w.index)} stopped serving; the coordinator "
                     f"raised {error}", step=w.last_step)
    what = ("the job's error from the loss of a worker it goes on without" if vague else
            f"which server the coordinator's {error} is about")
    return Found(outcome, culprits, f"cannot tell {what}: "
                 f"{names([i for i in culprits if i in obs.serving])} stopped serving",
                 ambiguous=True)


def coordinator_raised(obs: RunObservation, chief: WorkerObservation,
                       gone: Sequence[WorkerObservation], cut: Sequence[int]) -> Optional[Found]:
    """With every server serving as far as the harness saw: the job's own
    error, unless it is one of reaching a task (:data:`UNREACHED`) and
    names a server: one the harness did not see go may still have been
    unreachable, so it cannot tell the job from that server.  An error of
    the job's function names the worker it ran on too, and is the job's."""
    if chief.error is None:
        return None
    error = short_type(chief.error.type_name)
    named = [i for i in named_in(obs, f"{chief.error.message}\n{chief.error.traceback}")
             if i in obs.serving] if error in UNREACHED else []
    if named:
        return Found(Outcome.FAILED, (chief.index, *named), f"the coordinator raised {error} "
                     f"naming {names(named)}, which the harness saw serving: cannot tell the "
                     f"job's error from a server it could not reach", ambiguous=True)
    serving = ("with every server serving" if not gone else
               f"naming none of {names([w.index for w in gone])}, which stopped serving")
    return Found(Outcome.FAILED, (chief.index,),
                 f"the job raised {error} in the coordinator ({name(chief.index)}) {serving}",
                 step=chief.last_step)


def coordinator_stopped(obs: RunObservation, chief: WorkerObservation,
                        gone: Sequence[WorkerObservation], cut: Sequence[int]) -> Optional[Found]:
    if chief.finished or not chief.stopped:
        return None
    return Found(Outcome.HANG, (chief.index,), f"the coordinator ({name(chief.index)}) is "
                 f"stopped (SIGSTOP)", step=chief.last_step)


def coordinator_blocked(obs: RunObservation, chief: WorkerObservation,
                        gone: Sequence[WorkerObservation], cut: Sequence[int]) -> Optional[Found]:
    """The coordinator waits: on the one server down that holds it for
    certain (:func:`_holds`), else it cannot tell, naming every task."""
    if chief.finished:
        return None
    holding = [w for w in gone if _holds(obs, w, cut)]
    if len(holding) == 1:
        w = holding[0]
        return Found(Outcome.HANG, (w.index,), f"the coordinator waits; {name(w.index)} "
                     f"stopped serving", step=w.last_step)
    candidates = ([w.index for w in holding] if holding else
                  [chief.index] + [w.index for w in servers(obs)])
    why = (f"{names(candidates)} stopped serving" if holding else
           f"{names([w.index for w in gone])} died, which the coordinator goes on without"
           if gone else "every server kept serving and the coordinator did not return")
    return Found(Outcome.HANG, candidates, f"the coordinator waits; cannot tell which task "
                 f"holds it: {why}", ambiguous=True)


def coordinator_completed(obs: RunObservation, chief: WorkerObservation,
                          gone: Sequence[WorkerObservation], cut: Sequence[int]) -> Optional[Found]:
    if not chief.returned:
        return None
    return Found(Outcome.COMPLETED, (), f"the coordinator returned in {obs.duration:.1f}s")


Rule = Callable[[RunObservation, WorkerObservation, Sequence[WorkerObservation], Sequence[int]],
                Optional[Found]]
RULES: Tuple[Tuple[str, Rule], ...] = (
    ("coordinator_crashed", coordinator_crashed),
    ("server_down_coordinator_raised", server_down_coordinator_raised),
    ("coordinator_raised", coordinator_raised),
    ("coordinator_stopped", coordinator_stopped),
    ("coordinator_blocked", coordinator_blocked),
    ("coordinator_completed", coordinator_completed),
)


def absorbed_lines(obs: RunObservation, chief: WorkerObservation,
                   gone: Sequence[WorkerObservation]) -> List[str]:
    """What the coordinator did about the workers that went down."""
    back = rescheduled(chief, obs)
    lines = []
    for w in gone:
        count = back.count(w.index)
        if obs.task(w.index)[0] != "worker":
            continue
        if count:
            lines.append(f"the coordinator put {count} function(s) of {name(w.index)} back in "
                         f"its queue and ran them again (each may have run twice)")
        else:
            lines.append(f"the coordinator put back no function of {name(w.index)}")
    return lines


def coordinated_verdict(obs: RunObservation) -> Verdict:
    chief = coordinator(obs)
    cut = cut_off(obs)
    gone = sorted((w for w in servers(obs) if down(w, cut)), key=_when)
    rule, found = next((r, f) for r, fn in RULES if (f := fn(obs, chief, gone, cut)) is not None)
    if found.outcome == Outcome.COMPLETED:
        head = f"COMPLETED: {found.headline}"
        if gone:
            head += f"; {names([w.index for w in gone])} stopped serving and the job went on"
    else:
        who = f"culprit{'s' if len(found.culprits) > 1 else ''}: {names(found.culprits)}"
        why = "ambiguous, see below" if found.ambiguous else found.headline
        head = f"{found.outcome.upper()}: {who} ({why})"
    lines = [fitted(head)]
    if found.ambiguous:
        lines.append(fitted(f"ambiguous: {found.headline}"))
    mark = CULPRIT_MARK if not found.ambiguous else ""
    lines.append(chief_line(chief, mark if chief.index in found.culprits else ""))
    lines += [server_line(w, cut, mark if w.index in found.culprits else "")
              for w in servers(obs)]
    lines += [fitted(f"  {ln}") for ln in absorbed_lines(obs, chief, gone)]
    error = short_type(chief.error.type_name) if chief.error is not None else None
    return Verdict(found.outcome, found.culprits if found.outcome != Outcome.COMPLETED else (),
                   "\n".join(lines), found.step, error, found.ambiguous, rule)
