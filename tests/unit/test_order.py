"""Collectives in another order (harness.diagnosis.order): the workers'
labels compared on hand-made observations, and the verdict a run gets
(fast, no TensorFlow)."""
import dataclasses

import pytest

from harness.controller.ledger_view import LedgerView
from harness.core import protocol
from harness.diagnosis import diagnose, order
from harness.diagnosis.observations import CollectiveOp, RunObservation, TracedFunction
from tests.observations import blocked, returned, run, with_ledger

GRADS = ("gradient_tape/mul_4/Mul", "gradient_tape/mul_2/Mul", "gradient_tape/mul/Mul")


def packed(label, shape=(12,), timeout=0.0):
    return CollectiveOp("all-reduce", shape, "float32", tuple(label), timeout)


def worker(i, n, *ops, finished=True, eager=False):
    """Worker ``i`` of ``n`` that ran 3 steps of `step`, whose trace launches
    ``ops``; with ``eager``, also the variable initialisations' eager
    broadcasts (no label)."""
    w = with_ledger((returned if finished else blocked)(i, n, steps=range(3)))
    functions = (TracedFunction(0, "step", ops),)
    if eager:
        functions += (TracedFunction(1, "<eager broadcast>",
                                     (CollectiveOp("broadcast", (4,), "float32"),)),)
    return dataclasses.replace(w, functions=functions)


def loss():
    return packed(("AddN",), shape=())


def cluster(n, odd=(1,), odd_label=GRADS[::-1], **kw):
    """``n`` workers packing GRADS, the workers ``odd`` in ``odd_label``'s order."""
    return [worker(i, n, packed(odd_label if i in odd else GRADS), loss(), **kw)
            for i in range(n)]


def test_the_same_labels_in_the_same_order_say_nothing():
    found = order.check(cluster(3, odd=()))
    assert found == order.OrderCheck()
    assert diagnose(run(*cluster(3, odd=()))).outcome == "completed"


@pytest.mark.parametrize("n", [3, 4])
def test_a_permutation_on_one_worker_names_it_from_three_workers(n):
    found = order.out_of_order(cluster(n))
    assert (found.function, found.collective, found.part, found.parts) == ("step", 1, 1, 3)
    assert (found.culprits, found.ambiguous) == ((1,), False)
    assert dict(found.reduced)[1] == GRADS[2] and dict(found.reduced)[0] == GRADS[0]
    v = diagnose(run(*cluster(n)))
    assert (v.outcome, v.error, v.culprits, v.ambiguous, v.rule) == (
        "failed", "CollectiveOrderDivergence", (1,), False, "collective_order")
    assert v.step == 0
    assert "collective #1 of `step` (all-reduce float32[12]), part 1 of 3" in v.text
    assert f"worker 1 {GRADS[2]}" in v.text and f"worker 0 {GRADS[0]}" in v.text


def test_two_workers_cannot_tell_and_name_both():
    found = order.out_of_order(cluster(2))
    assert (found.culprits, found.ambiguous) == ((0, 1), True)
    v = diagnose(run(*cluster(2)))
    assert (v.outcome, v.error, v.culprits, v.ambiguous) == (
        "failed", "CollectiveOrderDivergence", (0, 1), True)
    assert "cannot tell which of workers 0,1" in v.text.splitlines()[0]


def test_a_split_with_no_majority_cannot_tell():
    found = order.out_of_order(cluster(4, odd=(2, 3)))
    assert (found.culprits, found.ambiguous) == ((0, 1, 2, 3), True)


def test_where_they_part_is_the_first_differing_part_not_the_first_part():
    swapped = (GRADS[0], GRADS[2], GRADS[1])   # only the last two swapped
    found = order.out_of_order(cluster(3, odd_label=swapped))
    assert (found.part, dict(found.reduced)) == (2, {0: GRADS[1], 1: GRADS[2], 2: GRADS[1]})


def test_the_position_counts_the_functions_collectives():
    ws = [worker(i, 3, loss(), packed(GRADS[::-1] if i == 2 else GRADS)) for i in range(3)]
    found = order.out_of_order(ws)
    assert (found.collective, found.culprits) == (2, (2,))


def test_renamed_labels_that_are_no_permutation_say_nothing():
    # Keras's layer-name counters can differ between workers: other names,
    # not another order, and never a refusal.
    renamed = ("gradient_tape/dense_3/MatMul", "gradient_tape/mul_2/Mul", "gradient_tape/mul/Mul")
    for n in (2, 3):
        assert order.out_of_order(cluster(n, odd_label=renamed)) is None
        assert diagnose(run(*cluster(n, odd_label=renamed))).outcome == "completed"


def test_other_shapes_are_left_to_the_shape_rules():
    ws = [worker(i, 3, packed(GRADS[::-1] if i == 1 else GRADS, shape=(16,) if i == 1 else (12,)))
          for i in range(3)]
    assert order.out_of_order(ws) is None


def test_missing_labels_are_said_to_be_untold_not_guessed():
    unlabelled = [worker(i, 2, packed(()), eager=True) for i in range(2)]
    found = order.check(unlabelled)
    assert found.divergence is None and found.untold == ("step", "<eager broadcast>")
    # One worker without labels (a collective traced without a graph op):
    # that collective is left out, the others still compared.
    ws = [worker(i, 3, packed(() if i == 0 else GRADS), packed(GRADS[::-1] if i == 1 else GRADS))
          for i in range(3)]
    found = order.check(ws)
    assert (found.divergence.collective, found.divergence.culprits) == (2, (1,))
    assert found.untold == ("step",)
    lines = order.order_lines(unlabelled, untold_too=True)
    assert len(lines) == 1 and "cannot be told" in lines[0] and "`<eager broadcast>`" in lines[0]
    assert order.order_lines(unlabelled) == []


def test_the_replica_checks_divergence_says_when_the_order_cannot_be_told():
    from harness.diagnosis.observations import DivergentVariable, ReplicaCheck
    ws = [worker(i, 2, packed(()), eager=True) for i in range(2)]
    check = ReplicaCheck((3, 3), 1e-6, DivergentVariable("w0", ((0,), (1,)), 0.6, "differs"))
    v = diagnose(dataclasses.replace(run(*ws), replicas=check))
    assert (v.error, v.rule) == ("ReplicaDivergence", "replicas")
    assert "cannot be told" in v.text


def test_the_order_comes_before_the_replica_check():
    from harness.diagnosis.observations import DivergentVariable, ReplicaCheck
    check = ReplicaCheck((3,) * 3, 1e-6, DivergentVariable("w0", ((0, 2), (1,)), 0.6, "differs"))
    v = diagnose(dataclasses.replace(run(*cluster(3)), replicas=check))
    assert (v.error, v.rule, v.culprits) == ("CollectiveOrderDivergence", "collective_order", (1,))


def test_a_run_that_hung_gets_the_order_as_a_line_beside_its_verdict():
    ws = cluster(3, finished=False)
    v = diagnose(run(*ws, ended_by="hang"))
    assert v.outcome == "hang" and v.rule != "collective_order"
    assert any(line.startswith("order: ") and "part 1 of 3" in line for line in v.text.splitlines())


def test_workers_without_a_ledger_or_the_function_are_not_compared():
    ws = cluster(3)
    off = dataclasses.replace(ws[1], ledger=None, functions=())
    assert order.out_of_order([ws[0], off, ws[2]]) is None
    other = dataclasses.replace(ws[1], functions=(TracedFunction(0, "other", (packed(GRADS),)),))
    assert order.out_of_order([ws[0], other]) is None


def test_labels_and_timeouts_travel_from_the_pipe_and_through_a_recording():
    view = LedgerView(start=0.0)
    view.message(protocol.LEDGER_FUNCTION, {"id": 0, "name": "step"})
    view.message(protocol.LEDGER_COLLECTIVE, {
        "function": 0, "trace": 1, "index": 0, "kind": "all-reduce", "shape": [12],
        "dtype": "float32", "label": list(GRADS), "timeout": 7.0})
    view.message(protocol.LEDGER_COLLECTIVE, {   # a worker of an older harness: neither
        "function": 0, "trace": 1, "index": 1, "kind": "all-reduce", "shape": [],
        "dtype": "float32"})
    (f,) = view.functions()
    assert f.collectives == (packed(GRADS, timeout=7.0), CollectiveOp("all-reduce", (), "float32"))
    obs = run(*cluster(2))
    again = RunObservation.from_dict(obs.to_dict())
    assert again.workers[1].functions == obs.workers[1].functions
    assert again.workers[1].functions[0].collectives[0].label == GRADS[::-1]


def test_whole_collectives_of_other_shapes_in_another_order_are_a_line_beside_the_mismatch():
    # One all-reduce per gradient (bytes_per_pack=1), other shapes: TensorFlow
    # raises a shape mismatch itself; the order is said beside the verdict.
    own = [packed((g,), shape=(k,)) for g, k in zip(GRADS, (2, 3, 4))]
    ws = [worker(i, 3, *(own[::-1] if i == 1 else own)) for i in range(3)]
    found = order.out_of_order(ws)
    assert (found.collective, found.part, found.culprits, found.ambiguous) == (1, 0, (1,), False)
    assert found.where == "collective #1 of `step`"
    assert dict(found.reduced)[1] == f"{GRADS[2]} (all-reduce float32[4])"
    assert order.out_of_order(ws[:2]).culprits == (0, 1)
    other = [worker(i, 3, *(own[:2] + [packed(("x",), shape=(9,))] if i == 1 else own))
             for i in range(3)]
    assert order.out_of_order(other) is None     # other collectives, not another order
