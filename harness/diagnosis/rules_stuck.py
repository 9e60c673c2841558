"""The blame rules for a run that hung, or failed with errors that name no
worker (echoes, collective mismatches): from direct evidence to
circumstantial.  See :mod:`harness.diagnosis.rules`."""
from __future__ import annotations

import collections
from typing import Collection, Dict, List, NamedTuple, Optional, Sequence, Tuple

from harness.core import protocol
from harness.diagnosis.echoes import names_unhealthy, short_type, tasks_named_unhealthy
from harness.diagnosis import ledger
from harness.diagnosis.facts import (PHASE_RANK, Facts, or_inf, phase, reference_steps,
                                     where_stopped)
from harness.diagnosis.observations import Call, WorkerObservation, error_of
from harness.diagnosis.stacks import stack_kind, summarize_stack
from harness.diagnosis.words import names, steps_text
from harness.diagnosis.blame import Blame


def stopped(f: Facts) -> Optional[Blame]:
    """A worker found stopped (SIGSTOP) cannot take part in anything."""
    found = [w for w in f.workers if w.stopped and not w.died]
    if not found:
        return None
    return Blame([w.index for w in found], f"stopped (SIGSTOP) {where_stopped(found[0])}",
                 found[0].last_step)


def _counted(n: int) -> str:
    return "no collective" if n == 0 else f"{n} collective{'s' if n != 1 else ''}"


def _odd_ones(counts: Dict[int, int]) -> Optional[Tuple[List[int], int]]:
    """The workers off a strict majority's count (N >= 3), and that count."""
    top, hits = collections.Counter(counts.values()).most_common(1)[0]
    if len(counts) < 3 or 2 * hits <= len(counts):
        return None
    return sorted(i for i, n in counts.items() if n != top), top


def _told(counts: Dict[int, int], leave_out=()) -> str:
    """``worker 0 launched 3; worker 1 launched 2``, one part per worker."""
    return "; ".join(f"{names([i])} launched {n}" for i, n in sorted(counts.items())
                     if i not in leave_out)


def _grouped(counts: Dict[int, int], leave_out) -> str:
    """What the workers but ``leave_out`` launched, grouped by count."""
    rest = collections.defaultdict(list)
    for i, n in counts.items():
        if i not in leave_out:
            rest[n].append(i)
    return "; ".join(f"{names(idx)} launched {n}" for n, idx in sorted(rest.items()))


def _lone_deviant(by_step: Dict[int, Dict[int, int]], s: int) -> Optional[Tuple[int, int]]:
    """The one worker whose count at step ``s`` is off its own usual count,
    and that usual count."""
    usual = {i: ledger.usual(counts, s) for i, counts in by_step.items()}
    deviants = [(i, n) for i, n in usual.items() if n is not None and by_step[i][s] != n]
    return deviants[0] if len(deviants) == 1 else None


def _counts_by_step(ws: Sequence[WorkerObservation], functions: Optional[Collection[str]] = None
                    ) -> Optional[Dict[int, Dict[int, int]]]:
    """Each worker's :func:`ledger.counts_by_step`, by index; None when one reported no step."""
    out = {}
    for w in ws:
        counts = ledger.counts_by_step(w, functions)
        if counts is None:
            return None
        out[w.index] = counts
    return out


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
    by_step = _counts_by_step(comp)
    if by_step is not None:
        return _blame_by_step(f, by_step)
    return _blame_by_totals(f, {w.index: ledger.total_launched(w) for w in comp})


def _blame_by_step(f: Facts, by_step: Dict[int, Dict[int, int]]) -> Optional[Blame]:
    """The first step whose counts differ, and who is off there."""
    common = set.intersection(*(set(v) for v in by_step.values()))
    differ = sorted(s for s in common if len({v[s] for v in by_step.values()}) > 1)
    if not differ:
        return None
    s = differ[0]
    at = {i: v[s] for i, v in by_step.items()}
    odd = _odd_ones(at)
    if odd is not None:
        return Blame(odd[0], f"launched {_counted(at[odd[0][0]])} in step {s}, where "
                     f"{_grouped(at, odd[0])}", s)
    lone = _lone_deviant(by_step, s)
    if lone is not None:
        i, usual = lone
        return Blame([i], f"launched {_counted(at[i])} in step {s}, and {usual} in each of "
                     f"its other steps; in step {s} {_grouped(at, [i])}", s)
    deviant = _deviant_in_differing_functions(f, s, list(at))
    if deviant is not None:
        return deviant
    return Blame(sorted(at), f"the workers launched different numbers of collectives in "
                 f"step {s} ({_told(at)}), and it cannot tell which count is wrong", s,
                 ambiguous=True)


def _blame_by_totals(f: Facts, totals: Dict[int, int]) -> Optional[Blame]:
    """Without steps: the minority of the totals against a strict majority."""
    if len(set(totals.values())) == 1:
        return None
    odd = _odd_ones(totals)
    if odd is not None:
        return Blame(odd[0], f"launched {totals[odd[0][0]]} collectives where the others "
                     f"launched {odd[1]} ({_told(totals)})", f.worker(odd[0][0]).last_step)
    return Blame(sorted(totals), "the workers launched different numbers of collectives and, "
                 "with no steps to place them and no majority, it cannot tell a missing one "
                 f"from an extra one ({_told(totals)})", None, ambiguous=True)


def _deviant_in_differing_functions(f: Facts, s: int, workers: List[int]) -> Optional[Blame]:
    """The one worker off its own usual count in step ``s``, counting only
    the functions whose collectives differ between the workers there.

    What every worker launched alike in that step is no evidence either
    way, yet it can make every worker's step look unusual: on TensorFlow
    2.15 Keras 2's optimizer makes its variables in the first call, so
    every worker's step 0 also holds the same initialisation broadcasts."""
    per_fn = {i: ledger.counts_by_function(f.worker(i), s) for i in workers}
    differing = {fn for fn in set().union(*per_fn.values())
                 if len({c.get(fn, 0) for c in per_fn.values()}) > 1}
    if not differing or all(set(c) <= differing for c in per_fn.values()):
        return None   # nothing to leave out: the counts above were these
    scoped = _counts_by_step([f.worker(i) for i in workers], differing)
    lone = _lone_deviant(scoped, s) if scoped is not None else None
    if scoped is None or lone is None:
        return None
    (i, usual), of = lone, ", ".join(f"`{fn}`" for fn in sorted(differing))
    rest = _told({j: scoped[j][s] for j in workers}, leave_out=[i])
    return Blame([i], f"launched {_counted(scoped[i][s])} of {of} in step {s}, and "
                 f"{usual} in each of its other steps; in step {s} {rest} (the "
                 f"collectives every worker launched alike there left out)", s)


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
