"""The blame rules for any run that went wrong: deaths, the replica and
reference checks, ``TF_CONFIG``.  See :mod:`harness.diagnosis.rules`."""
from __future__ import annotations

from typing import Optional

from harness.core import protocol
from harness.diagnosis.observations import Outcome, WorkerObservation, error_of
from harness.diagnosis.echoes import error_text, exit_text, is_echo, short_type
from harness.diagnosis.facts import Facts, or_inf, where_stopped
from harness.diagnosis.words import divergence_text, names
from harness.diagnosis.blame import Blame, SIMULTANEOUS
from harness.diagnosis import ledger, order


def nothing_to_blame(f: Facts) -> Optional[Blame]:
    """A run that completed, or had no workers, blames nobody."""
    if f.outcome == Outcome.COMPLETED or not f.workers:
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
    first_death = min(or_inf(w.exit_time) for w in died)
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
                              f"majority; {divergence_text(found)}")
    every = sorted(w for s in sides for w in s)
    return Blame(every, "the workers split with no majority: the check cannot tell which "
                        "side is right", ambiguous=True,
                 headline=f"replicas diverged; cannot tell which of {names(every)}; "
                          f"{divergence_text(found)}")


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


# The status PreemptionCheckpointHandler exits every worker with, once its
# checkpoint is saved (TensorFlow's default ``exit_fn``).
PREEMPTION_EXIT_CODE = 42
PREEMPTION_EXIT_TEXT = (" (PreemptionCheckpointHandler exits every worker with 42 after its "
                        "checkpoint)")


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
    code = next(iter(codes))
    if len(codes) != 1 or code is None or code <= 0 or len({w.last_step for w in ws}) != 1:
        return None
    where = where_stopped(ws[0])
    first = min(ws, key=lambda w: or_inf(w.exit_time))
    how = PREEMPTION_EXIT_TEXT if code == PREEMPTION_EXIT_CODE else ""
    return Blame([w.index for w in ws],
                 f"every worker exited with status {code} {where}: the job ended itself "
                 f"everywhere{how}, so no worker stands out ({names([first.index])} exited "
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


def aborted_together(f: Facts) -> Optional[Blame]:
    """Every worker died of SIGSEGV or SIGABRT at once (within
    ``SIMULTANEOUS`` s), at the same step, none raised, and each blocked in a
    collective where its ledger says: TensorFlow aborting the collectives
    (a timeout, a peer it lost) crashed them all, so none left an error
    saying whom it waited for.  Nothing singles one out: it cannot tell,
    and names every worker."""
    ws = f.workers
    if len(ws) < 2 or not all(w.died and w.error is None and w.exit_code in ABORT_SIGNALS
                              and w.exit_time is not None for w in ws):
        return None
    times = [or_inf(w.exit_time) for w in ws]
    if max(times) - min(times) > SIMULTANEOUS or len({w.last_step for w in ws}) != 1:
        return None
    if any(ledger.has_ledger(w) and ledger.pending_call(w) is None for w in ws):
        return None
    codes = sorted({exit_text(w.exit_code) for w in ws})
    return Blame([w.index for w in ws],
                 f"every worker died ({', '.join(codes)}) at once {where_stopped(ws[0])}, "
                 f"none raised: TensorFlow can crash every worker aborting their collectives, "
                 f"and the worker they waited for is not known", ws[0].last_step,
                 ambiguous=True,
                 headline=f"all {len(ws)} workers died ({', '.join(codes)}) at once "
                          f"{where_stopped(ws[0])} in their collectives; cannot tell which "
                          f"worker they waited for")


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
        said = error_text(error_of(first))
        return Blame([first.index], f"raised {said} before any worker died",
                     first.last_step, headline=f"{names([w.index for w in died])} died "
                     f"after {names([first.index])} raised {said}; culprit: "
                     f"{names([first.index])} (its error came first)")
    parts = [f"{names([w.index])} died ({exit_text(w.exit_code)}) {where_stopped(w)}"
             for w in culprits]
    later = [w.index for w in died if w not in culprits]
    head = "; ".join(parts)
    if f.echoes and culprits[0].exit_time is not None:
        dt = min(or_inf(w.finish_time) for w in f.echoes) - culprits[0].exit_time
        kinds = "/".join(sorted({short_type(error_of(w).type_name) for w in f.echoes}))
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


def died_at_exit(f: Facts) -> Optional[Blame]:
    """Every worker returned its value, then the process of one or more
    ended by a signal or a non-zero status (an atexit handler, TensorFlow
    tearing down): training completed, and a cluster manager sees a failed
    job (tensorflow#56684, the chief aborting at exit after its peers
    left).  The dead are named; the time from its return to its end is
    said, for a person to tell a slow teardown from a quick abort."""
    dead = [w for w in f.workers if w.died_at_exit]
    if not dead:
        return None
    parts = []
    for w in dead:
        after = (f" {w.exit_time - w.finish_time:.1f}s after it returned"
                 if w.exit_time is not None and w.finish_time is not None else "")
        parts.append(f"{names([w.index])} died at exit ({exit_text(w.exit_code)}){after}")
    return Blame([w.index for w in dead], "; ".join(parts), dead[0].last_step,
                 headline=f"training completed (all {len(f.workers)} workers returned their "
                          f"values), then {'; '.join(parts)}: a cluster manager sees the job "
                          f"fail; culprit{'s' if len(dead) > 1 else ''}: "
                          f"{names([w.index for w in dead])}")


def collective_order(f: Facts) -> Optional[Blame]:
    """Every worker returned, but their collectives reduce the same tensors
    in another order (:mod:`harness.diagnosis.order`): the sums are of
    different tensors on different workers, and nothing in TensorFlow
    notices when the swapped tensors have the same shape.  The workers
    whose order differs from a strict majority's are blamed (from 3
    workers up); else it cannot tell, and names every worker whose order
    differs."""
    found = order.out_of_order(f.workers)
    if found is None:
        return None
    step = order.first_step(f.worker(found.culprits[0]), found.function)
    where = f"the workers' collectives come in another order at {found.where}"
    if not found.ambiguous:
        return Blame(found.culprits, f"packs {found.function}'s collectives in another order "
                                     f"than the majority", step,
                     headline=f"{where} ({order.COLLECTIVE_ORDER_DIVERGENCE}); culprit"
                              f"{'s' if len(found.culprits) > 1 else ''}: "
                              f"{names(list(found.culprits))} against the majority")
    return Blame(found.culprits, "the workers order the same tensors otherwise and no "
                                 "majority stands: it cannot tell which order is right", step,
                 ambiguous=True,
                 headline=f"{where} ({order.COLLECTIVE_ORDER_DIVERGENCE}); cannot tell which "
                          f"of {names(list(found.culprits))}")
