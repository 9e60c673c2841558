"""The blame rules, as a table: each is a small function of the run's facts
that answers (a :class:`Blame`) or passes (None).  The first row that
applies to the run's situation and answers wins, as with pytest's
``firstresult`` hooks.  Adding a rule is one function, in the module of
the situations it reads (``rules_any``: any run gone wrong; ``rules_failed``:
a worker raised; ``rules_stuck``: a hang, or errors that name no worker;
``rules_counts``: the ledgers' per-step counts; ``rules_start``: a worker
that joined late; ``rules_names``: an address that did not resolve;
``rules_links``: the links tried as the run ended), plus one row.

The order of the table is the order of trust (``tests/unit/test_rules.py``
holds this list to the table's order):

* nothing went wrong: nobody to blame (``nothing_to_blame``);
* every worker returned, and their collectives reduce the same tensors in
  another order (``collective_order``), before what that does to their
  replicas (``replicas``), before the single-worker reference's verdict on
  the job as a whole (``reference``);
* a worker that started late, or never, while every other worker ended
  waiting for the cluster to form in strategy creation, is the cause of
  whatever they raised or died of (``late_start``);
* a death is a cause whatever else happened, unless a worker found
  stopped had stopped before anyone died (``stopped_before_deaths``), or
  every worker exited alike, which names no one (``coordinated_exit``), or
  the dead died of TensorFlow aborting a timed-out collective, which names
  no one either (``timed_out_abort``), nor does every worker dying of such
  an abort at once, blocked in its collectives (``aborted_together``);
  else the dead (``crash``);
* every worker returned its value, and one or more of them then died at
  exit: those (``died_at_exit``);
* a worker whose address in ``TF_CONFIG`` did not resolve, as the errors
  or the workers' own lookups say, explains a failure or a hang
  (``unresolved_address``); so does a ``TF_CONFIG`` that disagrees
  (``config``);
* in a run that ends without completing on a switched network, a worker
  the links tried as it ended found cut off: neither the switch nor any
  peer reached it, nor it them, while every other link answered
  (``cut_off``), or one whose every link carried 64 kB there and back too
  slowly or not at all while every other link carried it (``throttled``);
* in a failure, a collective whose shapes differ names the odd shape
  (``shape_mismatch`` from the errors, ``collective_shapes`` from the
  ledgers, which every worker has, from 3 workers up), the sync check
  names who is out of step (``sync_check``), else the root error does
  (``root_error``);
* in a hang, or a failure whose errors name no worker (every one an echo,
  or a collective mismatch: the members of a collective disagree, and the
  error does not say which is wrong), the evidence goes from direct to
  circumstantial: a stopped process (``stopped``); a worker that returned
  and left (its process ended) while the others still needed it in a
  collective (``left_early``); the collective ledgers
  (``collective_counts``: who launched a collective the others did not, or
  did not launch one they did; but a worker whose last step holds its
  loop's end while its peers went on is one step short or they are one
  step over, and without a majority it cannot tell); the odd one out by state among three or
  more (``majority``); the one behind, when it waits outside TensorFlow
  (``behind``); a split with no majority (``split``, ambiguous); the task
  the heartbeat errors name (``heartbeat``); a worker stuck mid-loop
  outside TensorFlow while the others wait in it (``outside_tensorflow``);
  and last, nobody stands out (``no_evidence``, ambiguous; who raised
  first is not evidence).

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

import dataclasses
from typing import Callable, FrozenSet, Optional, Sequence, Tuple

from harness.diagnosis.blame import Blame
from harness.diagnosis.facts import (CRASHED, DIVERGED, FAILED, FAILED_ECHOES, FAILED_MISMATCH, HANG_,
                                     SITUATIONS, Facts)
from harness.diagnosis.rules_any import (aborted_together, config, coordinated_exit, crash,
                                         nothing_to_blame, reference, replicas,
                                         stopped_before_deaths, timed_out_abort)
from harness.diagnosis.facts import CRASHED_AT_EXIT
from harness.diagnosis.rules_any import died_at_exit
from harness.diagnosis.rules_any import collective_order
from harness.diagnosis.order import COLLECTIVE_ORDER_DIVERGENCE
from harness.diagnosis.rules_stuck import left_early
from harness.diagnosis.rules_failed import collective_shapes, root_error, shape_mismatch, sync_check
from harness.diagnosis.rules_names import unresolved_address
from harness.diagnosis.rules_start import late_start
from harness.diagnosis.rules_counts import collective_counts
from harness.diagnosis.rules_links import cut_off, throttled
from harness.diagnosis.rules_stuck import (behind, heartbeat, majority, no_evidence,
                                           outside_tensorflow, split, stopped)


@dataclasses.dataclass(frozen=True)
class Rule:
    name: str
    when: FrozenSet[str]          # the situations (see harness.diagnosis.facts) it applies to
    blame: Callable[[Facts], Optional[Blame]]
    # The error type of a run it decides, where no worker raised one (else
    # the run's first cause is).
    error: Optional[str] = None


_ALL = frozenset(SITUATIONS)
_TROUBLE = frozenset({FAILED, FAILED_ECHOES, FAILED_MISMATCH, HANG_})
_FAILED_ANY = frozenset({FAILED, FAILED_ECHOES, FAILED_MISMATCH})
_STUCK = frozenset({HANG_, FAILED_ECHOES, FAILED_MISMATCH})

RULES: Tuple[Rule, ...] = (
    Rule("nothing_to_blame", _ALL, nothing_to_blame),
    Rule("collective_order", frozenset({DIVERGED}), collective_order,
         error=COLLECTIVE_ORDER_DIVERGENCE),
    Rule("replicas", frozenset({DIVERGED}), replicas, error="ReplicaDivergence"),
    Rule("reference", frozenset({DIVERGED}), reference, error="ReferenceMismatch"),
    Rule("late_start", _TROUBLE | frozenset({CRASHED}), late_start),
    Rule("stopped_before_deaths", frozenset({CRASHED}), stopped_before_deaths),
    Rule("coordinated_exit", frozenset({CRASHED}), coordinated_exit),
    Rule("timed_out_abort", frozenset({CRASHED}), timed_out_abort),
    Rule("aborted_together", frozenset({CRASHED}), aborted_together),
    Rule("crash", frozenset({CRASHED}), crash),
    Rule("died_at_exit", frozenset({CRASHED_AT_EXIT}), died_at_exit),
    Rule("unresolved_address", _TROUBLE, unresolved_address),
    Rule("config", _TROUBLE, config),
    Rule("cut_off", _TROUBLE, cut_off),
    Rule("throttled", _TROUBLE, throttled),
    Rule("shape_mismatch", _FAILED_ANY, shape_mismatch),
    Rule("collective_shapes", _FAILED_ANY | _STUCK, collective_shapes),
    Rule("sync_check", frozenset({FAILED}), sync_check),
    Rule("root_error", frozenset({FAILED}), root_error),
    Rule("stopped", _STUCK, stopped),
    Rule("left_early", frozenset({FAILED_ECHOES, HANG_}), left_early),
    Rule("collective_counts", _STUCK, collective_counts),
    Rule("majority", _STUCK, majority),
    Rule("behind", _STUCK, behind),
    Rule("split", _STUCK, split),
    Rule("heartbeat", _STUCK, heartbeat),
    Rule("outside_tensorflow", _STUCK, outside_tensorflow),
    Rule("no_evidence", _STUCK, no_evidence),
)


RULE = {rule.name: rule for rule in RULES}


def first_blame(f: Facts, rules: Sequence[Rule] = RULES) -> Tuple[str, Blame]:
    """The first rule of ``rules`` that applies to the run and answers, and its answer."""
    for rule in rules:
        if f.situation in rule.when:
            found = rule.blame(f)
            if found is not None:
                return rule.name, found
    raise AssertionError(f"no rule answered for a {f.situation} run; "
                         f"the table must end with one that always does")
