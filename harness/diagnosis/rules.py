"""The blame rules, as a table: each is a small function of the run's facts
that answers (a :class:`Blame`) or passes (None).  The first row that
applies to the run's situation and answers wins, as with pytest's
``firstresult`` hooks.  Adding a rule is one function plus one row.

The order of the table is the order of trust:

* a death is a cause whatever else happened (``crash``), unless a worker
  found stopped had stopped before anyone died (``stopped_before_deaths``),
  or every worker exited alike, which names no one (``coordinated_exit``),
  or the dead died of TensorFlow aborting a timed-out collective, which
  names no one either (``timed_out_abort``);
* a ``TF_CONFIG`` that disagrees explains a failure or a hang (``config``);
* in a failure, a collective whose shapes differ names the odd shape
  (``shape_mismatch`` from the errors, ``collective_shapes`` from the
  ledgers, which every worker has, from 3 workers up), the sync check
  names who is out of step
  (``sync_check``), else the root error does (``root_error``);
* in a hang, or a failure where every error is an echo, the evidence goes
  from direct to circumstantial: a stopped process; the collective ledgers
  (``collective_counts``: who launched a collective the others did not, or
  did not launch one they did); the odd one out by state among three or
  more (``majority``); the one behind, when it waits outside TensorFlow; a
  split with no majority (``split``, ambiguous); the task the heartbeat
  errors name; a worker stuck mid-loop outside TensorFlow while the others
  wait in it; and last, nobody stands out (``no_evidence``, ambiguous; who
  raised first is not evidence).

A confident wrong culprit is the worst answer: where the evidence is
symmetric (two workers, one finished and one blocked, say: a collective
skipped by one looks exactly like an extra one made by the other), the
answer is ambiguous and names every candidate.

Trade-offs.  Times are the parent's arrival stamps, so "first" is only as
good as a few milliseconds; that is why an echo never beats a root error on
timing alone, and why near-simultaneous deaths are all blamed.  A user
handler that exits within ``SIMULTANEOUS`` s of a peer's death (on a fast
"Socket closed") is blamed too.  The "unhealthy" errors name the task whose
heartbeats stopped, but a worker that simply returned and exited is named
the same way, so the names are used only when the steps show nothing.  The
majority rules assume one faulty worker among N >= 3; two independent faults
can outvote the truth.  With N = 2 and no ledger, a skipped step on one is
indistinguishable from an extra collective on the other (an extra all-reduce
inside a step does not change the reported steps), so such a split is
ambiguous and both are named; the ledger's per-step counts tell them apart.
"""
from __future__ import annotations

import collections
import dataclasses
import re
from typing import Callable, Dict, FrozenSet, Optional, Sequence, Tuple

from .. import protocol
from ..errors import StepDesyncError, odd_ones_out
from ..record import WorkerObservation
from .echoes import (exit_text, is_echo, is_end_of_input, names_unhealthy, short_type,
                     tasks_named)
from . import ledger
from .facts import (CRASHED, DIVERGED, FAILED, FAILED_ECHOES, HANG_, PHASE_RANK, SITUATIONS,
                    Facts, or_inf, phase, reference_steps, where_stopped)
from .stacks import stack_kind, summarize_stack
from .words import names, steps_text

# Deaths closer than this are one event (e.g. a kill fault on two workers);
# TensorFlow's echoes of a death take seconds (heartbeats), so this is safe.
SIMULTANEOUS = 0.5


@dataclasses.dataclass(frozen=True)
class Blame:
    """One rule's conclusion, before it is rendered."""

    culprits: Sequence[int]
    reason: str
    step: Optional[int] = None
    ambiguous: bool = False
    headline: Optional[str] = None   # replaces the generic headline


# ---------------------------------------------------------------- always

def nothing_to_blame(f: Facts) -> Optional[Blame]:
    """A run that completed, or had no workers, blames nobody."""
    if f.outcome == "completed" or not f.workers:
        return Blame((), "")
    return None


def stopped_before_deaths(f: Facts) -> Optional[Blame]:
    """A worker found stopped (SIGSTOP) whose progress ended before any
    worker died: the deaths are its consequences (a survivor can die of
    SIGSEGV aborting the collective that timed out waiting for it).  The
    run is still ``crashed``; the culprit is the stopped worker."""
    died = [w for w in f.workers if w.died and w.exit_time is not None]
    found = [w for w in f.workers if w.stopped and not w.died]
    if not died or not found:
        return None
    first_death = min(w.exit_time for w in died)
    culprits = [w for w in found if w.last_seen < first_death]
    if not culprits:
        return None
    return Blame([w.index for w in culprits],
                 f"stopped (SIGSTOP) {where_stopped(culprits[0])} before any worker died; "
                 f"{names([w.index for w in died])} died after it", culprits[0].last_step)


def replicas(f: Facts) -> Optional[Blame]:
    """Every worker returned, but they hold different models (the replica
    check).  Blame the odd ones out where a strict majority agrees and each
    odd one is alone; otherwise (two workers, two sides of two, every worker
    on its own) it cannot tell, and names them all.  The majority rule
    assumes one faulty worker: two that went wrong the same way outvote
    the truth."""
    if f.obs.replicas is None or f.obs.replicas.divergence is None:
        return None
    found = f.obs.replicas.divergence
    sides = [tuple(s) for s in found.sides]
    biggest = sides[0]
    majority_holds = len(biggest) * 2 > f.obs.num_workers and all(
        len(s) == 1 for s in sides[1:]) and sum(len(s) == len(biggest) for s in sides) == 1
    if majority_holds:
        odd = sorted(w for s in sides[1:] for w in s)
        return Blame(odd, f"holds a different {found.variable} from the majority "
                          f"({names(list(biggest))})",
                     headline=f"replicas diverged; culprit: {names(odd)} against the "
                              f"majority; {found.detail}")
    every = sorted(w for s in sides for w in s)
    return Blame(every, "the workers split with no majority: the check cannot tell which "
                        "side is right", ambiguous=True,
                 headline=f"replicas diverged; cannot tell which of {names(every)}; "
                          f"{found.detail}")


def reference(f: Facts) -> Optional[Blame]:
    """Every worker returned and they agree, but not with the single-worker
    reference (``run(reference=True)``): the job as a whole computes
    something else than one worker would, as a loss scaled per replica or
    data read unsharded make it.  No worker stands out: every one is named
    and it cannot tell."""
    check = f.obs.reference
    if check is None or not check.differs:
        return None
    every = [w.index for w in f.workers]
    return Blame(every, "every worker holds the same result, which is not the single-worker "
                        "reference's: the job's code, not one worker, differs", ambiguous=True,
                 headline=f"the run differs from its single-worker reference: {check.detail}")


def coordinated_exit(f: Facts) -> Optional[Blame]:
    """Every worker exited with the same status, not by a signal, at the
    same step, and none raised: the job ended itself on every worker
    (``PreemptionCheckpointHandler`` exits every worker with 42 once its
    checkpoint is saved, whichever worker got the notice).  Nothing singles
    one out, not even the order: the handler's exits spread over 0.6 s with
    4 workers on 2 cores, the notified worker last, and a user's exit on a
    peer's closed connection follows it within milliseconds too.  It cannot
    tell, and names all (the text says who exited first)."""
    ws = f.workers
    if len(ws) < 2 or not all(w.died and w.error is None for w in ws):
        return None
    codes = {w.exit_code for w in ws}
    if len(codes) != 1 or next(iter(codes)) <= 0 or len({w.last_step for w in ws}) != 1:
        return None
    code, where = next(iter(codes)), where_stopped(ws[0])
    first = min(ws, key=lambda w: or_inf(w.exit_time))
    return Blame([w.index for w in ws],
                 f"every worker exited with status {code} {where}: the job ended itself "
                 f"everywhere (PreemptionCheckpointHandler exits every worker with 42 after "
                 f"its checkpoint), so no worker stands out ({names([first.index])} exited "
                 f"first, which proves nothing)", ws[0].last_step,
                 ambiguous=True, headline=f"all {len(ws)} workers exited with status {code} "
                 f"{where}; cannot tell which worker caused it")


# A worker killed by one of these while its peers' collectives timed out
# died of TensorFlow aborting the collective, not of a fault of its own.
ABORT_SIGNALS = (-11, -6)    # SIGSEGV, SIGABRT


def timed_out_abort(f: Facts) -> Optional[Blame]:
    """Deaths by SIGSEGV or SIGABRT at the moment peers' collectives timed
    out (``DeadlineExceededError`` "Collective has timed out", within
    ``SIMULTANEOUS`` s): TensorFlow can crash a worker aborting a timed-out
    collective, so the dead are not the cause, and the worker the
    collective waited for (cut off, stopped) is not among the evidence.  It
    cannot tell, and names every worker."""
    died = [w for w in f.workers if w.died]
    timeouts = [w.finish_time for w in f.workers if w.error is not None
                and w.finish_time is not None
                and "collective has timed out" in w.error.message.lower()]
    if not died or not timeouts or not all(
            w.exit_code in ABORT_SIGNALS and w.exit_time is not None
            and abs(w.exit_time - min(timeouts)) <= SIMULTANEOUS for w in died):
        return None
    return Blame([w.index for w in f.workers],
                 f"{names([w.index for w in died])} died ({exit_text(died[0].exit_code)}) as "
                 f"the collectives timed out: TensorFlow can crash a worker aborting a "
                 f"timed-out collective, and the worker they waited for is not known",
                 died[0].last_step, ambiguous=True,
                 headline=f"{names([w.index for w in died])} died "
                          f"({exit_text(died[0].exit_code)}) as the others' collectives "
                          f"timed out; cannot tell which worker they waited for")


def crash(f: Facts) -> Optional[Blame]:
    """The first death(s).  A later death that made no progress after a
    peer's earlier error or death is a consequence (user code exiting on
    TensorFlow's echo); deaths within ``SIMULTANEOUS`` s count as one."""
    died = sorted((w for w in f.workers if w.died), key=lambda w: or_inf(w.exit_time))
    if not died:
        return None
    roots = [w for w in f.workers if w.error is not None and not is_echo(w.error)]
    times = [w.exit_time for w in died if w.exit_time is not None]
    times += [w.finish_time for w in roots if w.finish_time is not None]
    t0 = min(times) if times else None

    def consequence(w: WorkerObservation) -> bool:
        if t0 is None or w.exit_time is None or w.exit_time <= t0 + SIMULTANEOUS:
            return False
        return not any(e.kind == protocol.STEP and e.time > t0 for e in w.events)

    culprits = [w for w in died if not consequence(w)]
    if not culprits:   # every death came after a peer's own root error
        first = min(roots, key=lambda w: or_inf(w.finish_time))
        return Blame([first.index], f"raised {first.error} before any worker died",
                     first.last_step, headline=f"{names([w.index for w in died])} died "
                     f"after {names([first.index])} raised {first.error}; culprit: "
                     f"{names([first.index])} (its error came first)")
    parts = [f"{names([w.index])} died ({exit_text(w.exit_code)}) {where_stopped(w)}"
             for w in culprits]
    later = [w.index for w in died if w not in culprits]
    head = "; ".join(parts)
    if f.echoes and culprits[0].exit_time is not None:
        dt = min(or_inf(w.finish_time) for w in f.echoes) - culprits[0].exit_time
        kinds = "/".join(sorted({short_type(w.error.type_name) for w in f.echoes}))
        head += f"; {names([w.index for w in f.echoes])} reported it as {kinds}" + (
            f" {dt:.1f}s later" if dt != float("inf") else "")
    if later:
        head += f"; {names(later)} died later (likely a consequence)"
    return Blame([w.index for w in culprits], "died", culprits[0].last_step, headline=head)


def config(f: Facts) -> Optional[Blame]:
    """Workers whose ``TF_CONFIG`` disagrees with the others' (see :mod:`.configs`)."""
    issues = f.config_issues
    if not issues:
        return None
    detail = ("; ".join(next(iter(issues.values()))) if len(issues) == 1 else "; ".join(
        f"{names([i])}: {', '.join(v)}" for i, v in sorted(issues.items())))
    tie = f.config_tie
    return Blame(sorted(issues), ("the TF_CONFIG cluster lists disagree and none has a "
                                  "majority, so it cannot tell which is wrong: "
                                  if tie else "") + detail, ambiguous=tie)


# ---------------------------------------------------------------- failed

_SHAPE_RE = re.compile(r"Op at device /job:worker/replica:\d+/task:(\d+)\S* expected shape "
                       r"(\[[^\]]*\]) but another member in the group expected shape "
                       r"(\[[^\]]*\])")


def shape_mismatch(f: Facts) -> Optional[Blame]:
    """Collectives that paired tensors of different shapes.

    TensorFlow's "Shape mismatch in the collective instance" names the task
    that noticed and its own shape, and the other shape.  Collected over all
    errors, that is each task's shape; the odd one out against a strict
    majority (N >= 3) is the worker whose collective differed: a different
    batch size, or a collective the others did not make.  Two workers are
    symmetric (each only sees that the other differs): no verdict here.
    """
    known: Dict[int, str] = {}
    other_shapes = set()
    for w in f.workers:
        for task, mine, other in _SHAPE_RE.findall((w.error.message or "") if w.error else ""):
            known[int(task)] = mine
            other_shapes.add(other)
    n = f.obs.num_workers
    if not known or n < 3:
        return None
    shapes = ", ".join(f"{names([t])} {s}" for t, s in sorted(known.items()))
    counts = collections.Counter(known.values())
    top, hits = counts.most_common(1)[0]
    if len(counts) > 1 and 2 * hits > len(known):
        odd = sorted(t for t, v in known.items() if v != top)
    elif len(counts) == 1 and len(known) == n - 1 and other_shapes - {top}:
        odd = sorted(set(range(n)) - set(known))
    else:
        return None
    steps = [w.last_step for w in f.workers if w.index in odd]
    return Blame(odd, f"its collective had a different shape from the others' ({shapes}; "
                 f"majority {top})", steps[0] if steps else None,
                 headline=f"{names(odd)}: collective shape differs from the other workers' "
                          f"(Shape mismatch; majority shape {top})")


def collective_shapes(f: Facts) -> Optional[Blame]:
    """From the ledgers, N >= 3: the worker whose n-th collective has another
    kind or shape than the majority's (a different batch size, a collective
    the others did not make), whatever the errors happened to report."""
    found = ledger.odd_collective(f.workers)
    if found is None:
        return None
    odd, number, majority = found
    w = f.worker(odd[0])
    mine = ledger.sequence(w)[number - 1]
    return Blame(odd, f"its collective #{number} is {mine[0]} in `{mine[1]}`, where the others' "
                 f"is {majority}", mine[2] if mine[2] is not None else w.last_step)


def sync_check(f: Facts) -> Optional[Blame]:
    """The opt-in sync check saw workers at different steps.  Every worker
    raises the same StepDesyncError, computed from the same all-reduced
    vector, and its ``steps`` field (worker i's step at the check) is the
    observation to read."""
    if not f.roots:
        return None
    first = f.roots[0]
    if short_type(first.error.type_name) != StepDesyncError.__name__:
        return None
    steps = list((first.error.fields or {}).get("steps") or [])
    message = first.error.message or ""
    odd = odd_ones_out(steps)
    if odd:
        step = min(steps)
        return Blame(list(odd), f"out of step (sync check: {message})", step,
                     headline=f"{names(odd)} out of step with the others "
                              f"(sync check at step {step})")
    everyone = list(range(len(steps))) or [w.index for w in f.workers]
    return Blame(everyone, f"cannot tell which side is wrong with no majority: {message}",
                 min(steps) if steps else None, ambiguous=True,
                 headline="workers out of step and no majority (sync check); "
                          "it cannot tell which side is wrong")


def root_error(f: Facts) -> Optional[Blame]:
    """The worker(s) whose error is a cause, earliest first, plus every worker
    that raised the same type (a bug in common code hits everyone).  Input
    that ran out (``StopIteration``, ``OutOfRangeError``) is a cause only
    when no other error explains it: a peer's error about how the data was
    split says why one worker got nothing."""
    if not f.roots:
        return None
    roots = [w for w in f.roots if not is_end_of_input(w.error)] or list(f.roots)
    first = roots[0]
    kind = short_type(first.error.type_name)
    same = [w.index for w in roots if short_type(w.error.type_name) == kind]
    head = f"{names(same)} raised {first.error} (root error"
    if f.echoes:
        kinds = "/".join(sorted({short_type(w.error.type_name) for w in f.echoes}))
        head += f"; {names([w.index for w in f.echoes])} reported it as {kinds}"
    return Blame(same, f"raised {first.error}", first.last_step, headline=head + ")")


# ---------------------------------------------------------------- stuck

def stopped(f: Facts) -> Optional[Blame]:
    """A worker found stopped (SIGSTOP) cannot take part in anything."""
    found = [w for w in f.workers if w.stopped and not w.died]
    if not found:
        return None
    return Blame([w.index for w in found], f"stopped (SIGSTOP) {where_stopped(found[0])}",
                 found[0].last_step)


def _counted(n: int) -> str:
    return "no collective" if n == 0 else f"{n} collective{'s' if n != 1 else ''}"


def collective_counts(f: Facts) -> Optional[Blame]:
    """From the ledgers: who launched more or fewer collectives than the rest.

    Where steps are known, the first step at which the workers launched
    different numbers of collectives; the odd one out against a strict
    majority (N >= 3), else the one whose count at that step differs from
    its own usual count (a skipped step launches none, an extra all-reduce
    one more), which names the culprit even with 2 workers.  Without steps,
    totals: the minority against a strict majority, else it cannot tell.
    Loops that legitimately vary (an epoch-end metric read) vary alike on
    every worker, so they do not count as a difference.
    """
    comp = f.comparable
    if len(comp) < 2 or any(w.ledger is None for w in comp) \
            or not any(ledger.has_ledger(w) for w in comp):
        return None
    by_step = {w.index: ledger.counts_by_step(w) for w in comp}
    if all(v is not None for v in by_step.values()) and all(w.steps for w in comp):
        common = set.intersection(*(set(v) for v in by_step.values()))
        differ = sorted(s for s in common if len({v[s] for v in by_step.values()}) > 1)
        if not differ:
            return None
        s = differ[0]
        at = {i: v[s] for i, v in by_step.items()}

        def others(odd):   # what the rest launched at that step, grouped by count
            rest = collections.defaultdict(list)
            for i, n in at.items():
                if i not in odd:
                    rest[n].append(i)
            return "; ".join(f"{names(idx)} launched {n}" for n, idx in sorted(rest.items()))
        top, hits = collections.Counter(at.values()).most_common(1)[0]
        if len(comp) >= 3 and 2 * hits > len(comp):
            odd = sorted(i for i, n in at.items() if n != top)
            return Blame(odd, f"launched {_counted(at[odd[0]])} in step {s}, where "
                         f"{others(odd)}", s)
        usual = {i: ledger.usual(by_step[i], s) for i in at}
        deviants = [i for i, n in at.items() if usual[i] is not None and n != usual[i]]
        if len(deviants) == 1:
            i = deviants[0]
            return Blame([i], f"launched {_counted(at[i])} in step {s}, and {usual[i]} in each of "
                         f"its other steps; in step {s} {others([i])}", s)
        told = "; ".join(f"{names([i])} launched {n}" for i, n in sorted(at.items()))
        return Blame(sorted(at), f"the workers launched different numbers of collectives in "
                     f"step {s} ({told}), and it cannot tell which count is wrong", s,
                     ambiguous=True)
    totals = {w.index: ledger.total_launched(w) for w in comp}
    if len(set(totals.values())) == 1:
        return None
    told = "; ".join(f"{names([i])} launched {n}" for i, n in sorted(totals.items()))
    top, hits = collections.Counter(totals.values()).most_common(1)[0]
    if len(comp) >= 3 and 2 * hits > len(comp):
        odd = sorted(i for i, n in totals.items() if n != top)
        return Blame(odd, f"launched {totals[odd[0]]} collectives where the others launched "
                     f"{top} ({told})", f.worker(odd[0]).last_step)
    return Blame(sorted(totals), "the workers launched different numbers of collectives and, "
                 "with no steps to place them and no majority, it cannot tell a missing one "
                 f"from an extra one ({told})", None, ambiguous=True)


def _split(f: Facts) -> bool:
    """At least two comparable workers, not all at the same point."""
    return len(f.comparable) >= 2 and len(f.signature_counts) > 1


def majority(f: Facts) -> Optional[Blame]:
    """With N >= 3, the minority against a strict majority of state signatures."""
    if not _split(f):
        return None
    parts, sig = f.comparable, f.signatures
    top, top_n = f.signature_counts.most_common(1)[0]
    if not (len(parts) >= 3 and 2 * top_n > len(parts)):
        return None
    maj = next(w for w in parts if sig[w.index] == top)
    odd = [w for w in parts if sig[w.index] != top]
    c = odd[0]
    ran = steps_text(c.steps, top[1])
    if not top[0] and sig[c.index][0]:
        why = f"missing from the collective {where_stopped(maj)}: it finished after {ran}"
        step = maj.last_step   # where the others wait for it
    elif top[0]:
        why = (f"blocked {where_stopped(c)} after the others returned with the same steps: it "
               "made a collective call they did not (e.g. an extra all-reduce)"
               if c.steps == top[1]
               else f"blocked {where_stopped(c)} after the others returned; it ran {ran}")
        step = c.last_step
    else:
        why = f"out of step: blocked {where_stopped(c)} while the others are blocked " \
              f"{where_stopped(maj)}"
        step = c.last_step
    return Blame([w.index for w in odd], why, step)


def behind(f: Facts) -> Optional[Blame]:
    """With every comparable worker waiting, the one(s) whose progress stopped earliest."""
    if not _split(f):
        return None
    parts, sig = f.comparable, f.signatures
    if any(s[0] for s in sig.values()):
        return None
    pos = {w.index: (PHASE_RANK.get(sig[w.index][2], -1), len(sig[w.index][1]),
                     w.last_step if w.last_step is not None else -1) for w in parts}
    low = min(pos.values())
    late = [i for i, p in pos.items() if p == low]
    if len(late) == len(parts):
        return None
    # Peers that went on past a collective this worker had to join did not
    # wait for it: with nothing else, being behind proves nothing (a worker
    # that skipped a collective is "ahead" of the one it left waiting).  It
    # is evidence only when the one behind is not in TensorFlow at all.
    if any(stack_kind(f.worker(i).stack) != "other" for i in late):
        return None
    w = next(x for x in parts if x.index == late[0])
    ahead = next(x for x in parts if pos[x.index] != low)
    return Blame(late, f"behind: its progress stopped {where_stopped(w)} while the others "
                 f"went on and are blocked {where_stopped(ahead)}", w.last_step)


def split(f: Facts) -> Optional[Blame]:
    """Workers at different points and no rule above could say which is wrong:
    every side is named, ambiguous."""
    if not _split(f):
        return None
    parts, sig = f.comparable, f.signatures
    ref = reference_steps(parts)
    desc = "; ".join(f"{names([w.index])} ran {steps_text(w.steps, ref)}, and "
                     f"{'returned' if sig[w.index][0] else 'is blocked ' + where_stopped(w)}"
                     for w in parts)
    waiting = [w for w in parts if not sig[w.index][0]]
    why = ("with 2 workers it cannot tell a skipped step on one from an extra collective on "
           "the other: " if len(parts) == 2 else "the workers split with no majority, so it "
           "cannot tell which side is wrong: ") + desc
    return Blame([w.index for w in parts], why,
                 waiting[0].last_step if waiting else None, ambiguous=True)


def heartbeat(f: Facts) -> Optional[Blame]:
    """The task the peers' "unhealthy" (stopped heartbeats) errors name most."""
    votes: collections.Counter = collections.Counter()
    for w in f.workers:
        msg = (w.error.message or "") if w.error is not None else ""
        if names_unhealthy(msg):
            votes.update(set(tasks_named(msg)) - {w.index})
    top = max(votes.values(), default=0)
    named = [i for i, c in votes.items() if c == top and 0 <= i < len(f.workers)]
    if not named:
        return None
    return Blame(named, "named as unhealthy (stopped sending heartbeats) by its peers",
                 f.worker(named[0]).last_step)


def outside_tensorflow(f: Facts) -> Optional[Blame]:
    """A live worker whose stack is not in TensorFlow while another's is."""
    live = [w for w in f.workers if not w.finished]
    kinds = {w.index: stack_kind(w.stack) for w in live}
    # One that has left its loop and lingers in Python is no more to blame
    # than one that made an extra collective and waits in TensorFlow for it:
    # the two look the same from here, so only mid-loop counts.
    outside = [i for i, k in kinds.items()
               if k == "other" and phase(f.worker(i)) != protocol.STEPS_DONE]
    if not (outside and "tf" in kinds.values()):
        return None
    w = next(x for x in live if x.index == outside[0])
    return Blame(outside, f"not in TensorFlow ({summarize_stack(w.stack)}) while the "
                 "others wait in a TensorFlow call", w.last_step)


def no_evidence(f: Facts) -> Optional[Blame]:
    """Nothing stands out: every worker that did not return is a candidate,
    ambiguous.  (Who raised first is no evidence: when every error is an
    echo, every worker reports the same failure, and their order is a
    matter of milliseconds.)"""
    pool = [w for w in f.workers if not (w.returned and w.error is None)] or list(f.workers)
    return Blame([w.index for w in pool], "no worker stands out: all stopped at the same point "
                 f"({where_stopped(pool[0])})", pool[0].last_step, ambiguous=True)


# ---------------------------------------------------------------- the table

@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    when: FrozenSet[str]          # the situations (see harness.diagnosis.facts) it applies to
    blame: Callable[[Facts], Optional[Blame]]


_ALL = frozenset(SITUATIONS)
_TROUBLE = frozenset({FAILED, FAILED_ECHOES, HANG_})
_FAILED_ANY = frozenset({FAILED, FAILED_ECHOES})
_STUCK = frozenset({HANG_, FAILED_ECHOES})

RULES: Tuple[Rule, ...] = (
    Rule("nothing_to_blame", _ALL, nothing_to_blame),
    Rule("replicas", frozenset({DIVERGED}), replicas),
    Rule("reference", frozenset({DIVERGED}), reference),
    Rule("stopped_before_deaths", frozenset({CRASHED}), stopped_before_deaths),
    Rule("coordinated_exit", frozenset({CRASHED}), coordinated_exit),
    Rule("timed_out_abort", frozenset({CRASHED}), timed_out_abort),
    Rule("crash", frozenset({CRASHED}), crash),
    Rule("config", _TROUBLE, config),
    Rule("shape_mismatch", _FAILED_ANY, shape_mismatch),
    Rule("collective_shapes", _FAILED_ANY | _STUCK, collective_shapes),
    Rule("sync_check", frozenset({FAILED}), sync_check),
    Rule("root_error", frozenset({FAILED}), root_error),
    Rule("stopped", _STUCK, stopped),
    Rule("collective_counts", _STUCK, collective_counts),
    Rule("majority", _STUCK, majority),
    Rule("behind", _STUCK, behind),
    Rule("split", _STUCK, split),
    Rule("heartbeat", _STUCK, heartbeat),
    Rule("outside_tensorflow", _STUCK, outside_tensorflow),
    Rule("no_evidence", _STUCK, no_evidence),
)


def first_blame(f: Facts, rules: Sequence[Rule] = RULES) -> Tuple[str, Blame]:
    """The first rule of ``rules`` that applies to the run and answers, and its answer."""
    for rule in rules:
        if f.situation in rule.when:
            found = rule.blame(f)
            if found is not None:
                return rule.name, found
    raise AssertionError(f"no rule answered for a {f.situation} run; "
                         f"the table must end with one that always does")
