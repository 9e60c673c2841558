"""The blame rules for a run that hung, or failed with errors that name no
worker (echoes, collective mismatches): from direct evidence to
circumstantial.  See :mod:`harness.diagnosis.rules`."""
from __future__ import annotations

import collections
from typing import List, NamedTuple, Optional

from harness.core import protocol
from harness.diagnosis.echoes import names_unhealthy, short_type, tasks_named_unhealthy
from harness.diagnosis import ledger
from harness.diagnosis.facts import (PHASE_RANK, Facts, or_inf, phase, reference_steps,
                                     where_stopped)
from harness.diagnosis.observations import Call, WorkerObservation, error_of
from harness.diagnosis.stacks import stack_kind, summarize_stack
from harness.diagnosis.words import names, steps_text
from harness.diagnosis.blame import Blame
from harness.diagnosis.rules_counts import collective_counts


def stopped(f: Facts) -> Optional[Blame]:
    """A worker found stopped (SIGSTOP) cannot take part in anything."""
    found = [w for w in f.workers if w.stopped and not w.died]
    if not found:
        return None
    return Blame([w.index for w in found], f"stopped (SIGSTOP) {where_stopped(found[0])}",
                 found[0].last_step)


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
    elif top[0] and c.steps == top[1] and ledger.pending_call(c) is None \
            and ledger.has_ledger(c):
        # Its ledger shows no call pending: it is in its own Python code,
        # slow or stuck there, not waiting on a collective.
        why = (f"still in its own code {where_stopped(c)} after the others returned with the "
               f"same steps: in no collective call")
        step = c.last_step
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
    """The task the peers' "unhealthy" (stopped heartbeats) errors name most.

    One peer alone naming tasks that are alive and raised errors of their
    own (their heartbeats to the coordination service failed) cannot tell
    which side lost the link: a cut-off leader names the others exactly as
    the others' being cut off makes it name them (with 2 workers, always
    so).  That is ambiguous, and names both sides."""
    votes: collections.Counter = collections.Counter()
    voters = set()
    for w in f.workers:
        msg = (w.error.message or "") if w.error is not None else ""
        named_by_w = set(tasks_named_unhealthy(msg)) - {w.index} if names_unhealthy(msg) else set()
        if named_by_w:
            voters.add(w.index)
            votes.update(named_by_w)
    top = max(votes.values(), default=0)
    named = [i for i, c in votes.items() if c == top and 0 <= i < len(f.workers)]
    if not named:
        return None
    if len(voters) == 1 and all(f.worker(i).error is not None for i in named):
        sides = sorted(voters | set(named))
        return Blame(sides, f"only {names(list(voters))} named {names(named)} unhealthy, and "
                     f"{names(named)} raised on {'its' if len(named) == 1 else 'their'} own "
                     f"heartbeats: either side may have lost the link",
                     f.worker(named[0]).last_step, ambiguous=True)
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
    echo or a collective mismatch, every worker reports the same failure,
    and their order is a matter of milliseconds.)"""
    pool = [w for w in f.workers if not (w.returned and w.error is None)] or list(f.workers)
    return Blame([w.index for w in pool], "no worker stands out: all stopped at the same point "
                 f"({where_stopped(pool[0])})", pool[0].last_step, ambiguous=True)


def _gone_at(w: WorkerObservation) -> float:
    """When a worker that left was gone: its return, after which its process
    only ends (its sockets close on the way, before the parent sees the exit)."""
    return w.finish_time if w.finish_time is not None else or_inf(w.exit_time)


def _cut_by(call: Call, gone: WorkerObservation) -> bool:
    """Whether ``call`` was still in flight when ``gone`` left: a peer
    reading that call's data from it loses the connection."""
    return call.ended is None or call.ended >= _gone_at(gone)


class Needed(NamedTuple):
    """Where a worker needed the workers that left: call ``number`` of
    ``function`` (``""``: step ``number``, without a ledger); ``cut``: a
    call they made too, but left while it was still reading their data."""
    function: str
    number: int
    cut: bool


def _needed_in(w: WorkerObservation, left: List[WorkerObservation]) -> Optional[Needed]:
    """Where ``w`` needed the workers that ``left``: ``(function, call
    number, cut)`` of its last collective call, which raised or never ended
    and which none of them made, or (``cut``) which every one of them made
    but left while ``w`` was still in it (its data still to be read from
    them); else, without a ledger, ``("", step, False)``, its last step,
    past every one of theirs.  None when they did not leave it waiting
    there."""
    call = ledger.last_call(w)
    if call is not None and (call.ended is None or call.raised):
        name = ledger.function_of(w, call)
        made = [ledger.calls_of(gone, name) >= call.number for gone in left]
        if all(not m or _cut_by(call, gone) for m, gone in zip(made, left)):
            return Needed(name, call.number, all(made))
        return None
    if call is not None and w.error is not None:
        # It raised after its last recorded call ended: in the next one,
        # whose start the ledger missed (a collective aborted at once, its
        # peer's connection reset, can beat the ledger's first marker).
        name = ledger.function_of(w, call)
        if all(ledger.calls_of(gone, name) <= call.number for gone in left):
            return Needed(name, call.number + 1, False)
        return None
    if call is None and w.last_step is not None and all(
            gone.last_step is None or gone.last_step < w.last_step for gone in left):
        return Needed("", w.last_step, False)
    return None


def left_early(f: Facts) -> Optional[Blame]:
    """A worker that returned, and whose process ended (``on_return="exit"``,
    as every script's does), while the others still needed it in a
    collective: they fail because it left, or wait for it, and are not to
    blame.  TensorFlow 2.21, measured (a script whose worker 1 runs one
    call of its all-reducing ``step`` fewer, at 2, 3 and 4 workers): the
    workers other than 0 fail within 0.15 s (``UnavailableError``,
    "Connection reset by peer" in ``RecvBuf``, or "Socket closed"), worker
    0, the coordination service's leader, after its heartbeat timeout,
    8.5-10.7 s (``UnavailableError``, "tasks are unhealthy (stopped sending
    heartbeats)").  A call aborted at once can be missing from the ledger:
    a worker that raised after its last recorded call ended raised in the
    next one.

    Where it left is the ledger's: the others' last call of a function,
    raised or pending, is one the leaver never made, or made and left while
    they still read its data (2 runs in about 280 under load); with no ledger,
    their last step is past its last.  From 3 workers up it answers only
    when fewer left than stayed (else those that stayed are the odd ones,
    for the majority rules).  With 2 workers one call more on the one that
    stayed would look the same; the text says so, and names the one that
    left: the one whose process was gone while a collective needed it.
    Where the ledgers' per-step counts (``collective_counts``) name a
    culprit without doubt, they are the better evidence: it answers only
    when they name the same, or no one for sure."""
    obs = f.obs
    left = [w for w in f.workers if w.left_during(obs)]
    stuck = [w for w in f.workers if w.error is not None or not w.finished]
    if not left or not stuck or any(w.died or w.stopped for w in stuck):
        return None
    if len(f.workers) >= 3 and len(left) >= len(stuck):
        return None
    first_gone = min(_gone_at(w) for w in left)
    if any(w.error is not None and (w.finish_time is None or w.finish_time < first_gone)
           for w in stuck):
        return None   # a peer failed before any left: not because it left
    needed = [n for n in (_needed_in(w, left) for w in stuck) if n is not None]
    if len(needed) < len(stuck):
        return None
    name = needed[0].function
    if any(v.function != name for v in needed):
        return None
    numbers = sorted({v.number for v in needed})
    its = "its process" if len(left) == 1 else "their processes"
    if name:
        made = sorted({ledger.calls_of(w, name) for w in left})
        gone = (f"{names([w.index for w in left])} returned and {its} ended after "
                f"{'/'.join(map(str, made))} call{'s' if made != [1] else ''} of `{name}`")
        where = f"in call{'s' if len(numbers) > 1 else ''} {','.join(map(str, numbers))}"
    else:
        made = sorted({len(w.steps) for w in left})
        gone = (f"{names([w.index for w in left])} returned and {its} ended after "
                f"{'/'.join(map(str, made))} step{'s' if made != [1] else ''}")
        where = f"at step{'s' if len(numbers) > 1 else ''} {','.join(map(str, numbers))}"
    raised = [w for w in stuck if w.error is not None]
    waiting = [w for w in stuck if w.error is None]
    then = []
    if raised:
        kinds = "/".join(sorted({short_type(error_of(w).type_name) for w in raised}))
        then.append(f"{names([w.index for w in raised])} then failed {where} with {kinds}")
    if waiting:
        then.append(f"{names([w.index for w in waiting])} "
                    f"{'then ' if not raised else ''}waited {where}")
    culprits = [w.index for w in left]
    reason = "it left while they still needed it in a collective"
    counted = collective_counts(f)
    cut = all(v.cut for v in needed)   # they ended their processes mid-exchange
    if counted is not None and not counted.ambiguous:
        if sorted(counted.culprits) != sorted(culprits):
            return None   # the per-step counts name another: they are the better evidence
        reason += f"; it {counted.reason}"
    elif cut:
        reason = (f"its process ended while they still read its data of call {max(numbers)}, "
                  f"which it had made too")
    elif len(f.workers) == 2:
        reason += f"; with 2 workers one call more on {names([stuck[0].index])} would look the same"
    return Blame(culprits, reason, stuck[0].last_step,
                 headline=f"{gone}; {' and '.join(then)}; culprit"
                          f"{'s' if len(culprits) > 1 else ''}: {names(culprits)} ({reason})")
