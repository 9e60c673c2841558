"""The diagnosis text: a worker's line is shortened in its error text only,
never in its ``<- culprit`` mark or its step tally; a collective mismatch is
a cause of the worker that reports it, not an echo.  The texts are
TensorFlow 2.21's, measured on 2 workers (the frames TensorFlow lists after
"defined at" are cut to the user's).  Fast, no TensorFlow."""
from __future__ import annotations

import dataclasses
import re

import pytest

from harness.core.protocol import WorkerError
from harness.diagnosis import diagnose, is_echo
from harness.diagnosis.echoes import collective_mismatch, error_text, is_collective_mismatch
from harness.diagnosis.facts import FAILED_MISMATCH, facts_of
from harness.diagnosis.observations import Call, CollectiveOp, TracedFunction
from harness.diagnosis.render import CULPRIT_MARK, MAX_WIDTH, fit, worker_line
from observations import UNHEALTHY, blocked, raised, returned, run, with_ledger

_REPEAT = "The error could be from a previous operation. Restart your program to reset."
SHAPE = ("Shape mismatch in the collective instance 138. Op at device "
         "/job:worker/replica:0/task:0/device:CPU:0 expected shape [43706] but another member in "
         "the group expected shape []")
TYPES = "Collective instance 140 expected type 0 and data_type 9 but got type 0 and data_type 1"

# The MWMS custom-loop tutorial, worker 1 skipping step 7: worker 0 noticed
# the shapes differ; worker 1 was aborted by it ("remote target" task 0).
SHAPE_NOTICED = WorkerError("InvalidArgumentError", (
    "Graph execution error:\n\nDetected at node rm_sprop/CollectiveReduceV2 defined at (most "
    "recent call last):\n  File \"/work/main/scenarios/tutorial_jobs/ctl_checkpoint.py\", line "
    f"142, in train_step\n\nCollective ops is aborted by: {SHAPE}. This is likely due to "
    f"different input shapes at different members of the collective op.\n{_REPEAT}\n\t "
    "[[{{node rm_sprop/CollectiveReduceV2}}]] [Op:__inference_train_step_1010]"))
SHAPE_RELAYED = WorkerError("InvalidArgumentError", (
    "{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/"
    "replica:0/task:1/device:CPU:0}} Collective ops is aborted by: Collective ops is aborted by: "
    f"{SHAPE}. This is likely due to different input shapes at different members of the "
    f"collective op.\n{_REPEAT}\nAdditional GRPC error information from remote target "
    "/job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:"
    "Error received from peer  {grpc_status:3, grpc_message:\"Collective ops is aborted by: "
    f"{SHAPE}. This is likely due to different input shapes at different members of the "
    f"collective op.\\n{_REPEAT}\"}}\n{_REPEAT} [Op:CollectiveReduceV2] name: "))
# tf_keras fit with uneven data: worker 0 (out of batches) all-reduces an
# int64 counter while worker 1 all-reduces float32 gradients.
TYPES_NOTICED = WorkerError("InternalError", (
    "{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/"
    f"replica:0/task:0/device:CPU:0}}}} Collective ops is aborted by: {TYPES}\n{_REPEAT} "
    "[Op:CollectiveReduceV2] name: "))
TYPES_RELAYED = WorkerError("InternalError", (
    "Graph execution error:\n\nDetected at node CollectiveReduceV2 defined at (most recent call "
    "last):\n  File \"/work/main/scenarios/test_keras.py\", line 48, in fit\n\nCollective ops is "
    f"aborted by: Collective ops is aborted by: {TYPES}\n{_REPEAT}\nAdditional GRPC error "
    "information from remote target /job:worker/replica:0/task:0 while calling "
    "/tensorflow.WorkerService/RecvBuf:\n:UNKNOWN:Error received from peer  {grpc_message:"
    f"\"Collective ops is aborted by: {TYPES}\\n{_REPEAT}\", grpc_status:13}}\n{_REPEAT}\n\t "
    "[[{{node CollectiveReduceV2}}]] [Op:__inference_train_function_1119]"))
MEASURED = {"shape, noticed": (SHAPE_NOTICED, SHAPE), "shape, relayed": (SHAPE_RELAYED, SHAPE),
            "types, noticed": (TYPES_NOTICED, TYPES), "types, relayed": (TYPES_RELAYED, TYPES)}


# ---------------------------------------------------------------- mismatches

@pytest.mark.parametrize("error,sentence", list(MEASURED.values()), ids=list(MEASURED))
def test_a_measured_collective_mismatch_is_a_cause_not_an_echo(error, sentence):
    assert is_collective_mismatch(error) and not is_echo(error)
    assert collective_mismatch(error.message) == sentence
    assert error_text(error) == f"{error.type_name}: {sentence}"


@pytest.mark.parametrize("message", [
    "Instance 7 already has source 0, received second claim from 1",
    "Instance 7 found no source for broadcast.  This could mean that there were group_size=2 "
    "BcastRecvs but no BcastSend.",
])
def test_a_broadcast_whose_members_disagree_is_a_mismatch_too(message):
    assert is_collective_mismatch(WorkerError("InternalError", f"[_Derived_]{message}"))


@pytest.mark.parametrize("type_name,message", [
    ("UnavailableError", "Collective ops is aborted by: Socket closed"),
    ("InternalError", "[_Derived_]Collective ops is aborted by: connection reset by peer"),
    ("UnavailableError", UNHEALTHY.format(1)),
])
def test_a_peer_failure_reported_is_still_an_echo(type_name, message):
    error = WorkerError(type_name, message)
    assert is_echo(error) and not is_collective_mismatch(error)
    assert error_text(error) == str(error)


def _skipped_step(n: int, errors) -> tuple:
    """``n`` workers of a custom loop in which the last skipped step 7: it
    reached the epoch's metric read (one more collective) in step 8, while
    the others ran step 9; ``errors[i]`` is what worker i raised."""
    last = n - 1
    ws = [with_ledger(raised(i, n, e.type_name, e.message, 1.0 + i / 100,
                             steps=range(9 if i == last else 10)),
                      {s: 2 if (i == last and s == 8) else 1 for s in range(9 if i == last else 10)})
          for i, e in enumerate(errors)]
    return run(*ws)


def _line_of(text: str, index: int) -> str:
    return next(ln for ln in text.splitlines()
                if re.match(rf"  workers? (\d+,)*{index}(,\d+)*: ", ln))


@pytest.mark.parametrize("errors", [(SHAPE_NOTICED, SHAPE_RELAYED), (TYPES_RELAYED, TYPES_NOTICED)],
                         ids=["shapes", "types"])
def test_a_step_short_at_two_workers_cannot_tell_and_keeps_every_line_whole(errors):
    """With 2 workers, the one a step short (it skipped one, its last step
    holds the epoch's end) looks the same as a peer with a step more
    (uneven data): it cannot tell, and names both."""
    obs = _skipped_step(2, errors)
    assert facts_of(obs).situation == FAILED_MISMATCH
    v = diagnose(obs)
    assert (v.outcome, v.culprits, v.ambiguous, v.rule) == ("failed", (0, 1), True,
                                                          "collective_counts")
    assert "worker 1 ended its loop after step 8" in v.text and "worker 0 went on to step 9" \
        in v.text
    assert v.error == errors[0].type_name
    for i, steps in ((0, "10 steps (0-9)"), (1, "9 steps (0-8)")):
        line = _line_of(v.text, i)
        assert line.endswith(f"; ran {steps}" + CULPRIT_MARK), line
        assert collective_mismatch(errors[i].message) in line, line
    assert "echo" not in v.text and "no root error" not in v.text, v.text
    root = v.text.splitlines()[-1]
    assert root.startswith("root error: ") and "reported by workers 0,1" in root, root
    assert "the members of a collective disagree" in root
    assert all(len(ln) <= MAX_WIDTH for ln in v.text.splitlines())


def test_three_workers_with_a_skipped_step_name_the_skipper():
    v = diagnose(_skipped_step(3, (SHAPE_NOTICED, SHAPE_RELAYED, SHAPE_RELAYED)))
    assert (v.culprits, v.ambiguous) == ((2,), False)
    assert _line_of(v.text, 2).endswith("; ran 9 steps (0-8)" + CULPRIT_MARK)
    assert "echo" not in v.text


def _traceback(line: int, function: str) -> str:
    return ("Traceback (most recent call last):\n"
            f'  File "/home/me/train.py", line {line}, in {function}\n    step(batch)\n'
            '  File "/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", '
            "line 53, in quick_execute\n")


def test_the_root_error_is_said_at_its_reporters_line_and_the_culprits_own_beside_it():
    """Every worker reports the mismatch, each from its own line: the root
    error's line is the first reporter's, said as its; the culprit's own
    line follows."""
    obs = _skipped_step(3, (SHAPE_NOTICED, SHAPE_RELAYED, SHAPE_RELAYED))
    tracebacks = {0: _traceback(90, "train"), 2: _traceback(77, "evaluate")}
    obs = dataclasses.replace(obs, workers=tuple(
        dataclasses.replace(w, error=dataclasses.replace(w.error, traceback=tracebacks.get(
            w.index, ""))) for w in obs.workers))
    v = diagnose(obs)
    assert v.culprits == (2,)
    lines = v.text.splitlines()
    root = next(i for i, ln in enumerate(lines) if ln.startswith("root error: "))
    assert " at train.py:90 (worker 0's line), reported by workers 0,1,2" in lines[root]
    assert lines[root + 1] == "culprit's line: worker 2 at train.py:77", v.text


def test_an_eager_collective_is_said_with_the_users_line_that_launched_it():
    """The chief saves a checkpoint holding a sync-on-read variable, alone:
    it waits in an eager all-reduce the others never launch; the line is
    its ``save``."""
    site = "train.py:57 in train: checkpoint.save(os.path.join(write_dir, 'ckpt'))"
    eager = TracedFunction(1, "<eager all-reduce>", (CollectiveOp("all-reduce", (), "float32"),))
    chief = with_ledger(blocked(0, 3, steps=range(6)))
    chief = dataclasses.replace(chief, functions=chief.functions + (eager,),
                                calls=chief.calls + (Call(1, 1, 5, began=0.9, site=site),))
    others = [with_ledger(returned(i, 3, steps=range(6), asked=6)) for i in (1, 2)]
    v = diagnose(run(chief, *others, ended_by="hang"))
    assert v.culprits == (0,)
    assert f"in call 1 of `<eager all-reduce>` from {site}" in _line_of(v.text, 0), v.text
    assert f"never launched call 1 of `<eager all-reduce>` from {site}" in v.text


def test_a_mismatch_beside_an_error_of_its_own_leaves_the_blame_to_that_error():
    obs = run(raised(0, 2, "ValueError", "boom", 1.0),
              raised(1, 2, SHAPE_RELAYED.type_name, SHAPE_RELAYED.message, 0.5))
    v = diagnose(obs)
    assert (v.culprits, v.rule, v.error) == ((0,), "root_error", "ValueError")
    assert "root error: ValueError: boom" in v.text


# ---------------------------------------------------------------- widths

def test_fit_shortens_the_detail_alone():
    assert fit("lead: ", "x" * 50, "; rest", width=30) == "lead: " + "x" * 15 + "...; rest"
    assert fit("lead: ", "short", "; rest", width=30) == "lead: short; rest"
    assert fit("a" * 20, "detail", "b" * 20, width=30) == "a" * 20 + "..." + "b" * 20


def test_a_long_error_loses_its_text_not_its_mark_or_tally():
    long_echo = WorkerError("UnavailableError",
                            "x" * 2000 + " /job:worker/replica:0/task:0 stopped sending heartbeats")
    ws = [raised(0, 2, "ValueError", "y" * 2000, 1.0, steps=range(10)),
          raised(1, 2, long_echo.type_name, long_echo.message, 2.0, steps=range(10))]
    v = diagnose(run(*ws))
    assert v.culprits == (0,)
    mine, echo = _line_of(v.text, 0), _line_of(v.text, 1)
    assert mine.endswith("y...; ran 10 steps (0-9)" + CULPRIT_MARK), mine
    assert echo.endswith("x... (echo, naming worker 0); ran 10 steps (0-9)"), echo
    assert len(mine) == len(echo) == MAX_WIDTH


def test_worker_line_fits_its_width_by_the_error_text():
    w = raised(0, 2, "ValueError", "z" * 400, 1.0, steps=range(3))
    line = worker_line(w, (0, 1, 2), CULPRIT_MARK, width=80)
    assert re.fullmatch(r"raised at step 2: ValueError: z+\.\.\.; ran 3 steps \(0-2\)"
                        + re.escape(CULPRIT_MARK), line), line
    assert len(line) == 80


# TensorFlow 2.15.1, 3 workers, worker 2 cut off at step 5 for good: the
# others are told of its heartbeat timeout; its own heartbeat call to the
# coordination service (task 0) fails, naming task 0 as the call's target.
HEARTBEAT_TIMEOUT_215 = (
    "Graph execution error:\n\nCollective ops is aborted by: Error reported from "
    "/job:worker/task:2: Task /job:worker/replica:0/task:2 heartbeat timeout. This indicates "
    "that the remote task has failed, got preempted, or crashed unexpectedly. Check the task "
    "logs for an earlier error to debug further.")
OWN_HEARTBEAT_215 = (
    "Graph execution error:\n\nheartbeat timeout\nAdditional GRPC error information from "
    "remote target /job:worker/replica:0/task:0 while calling "
    "/tensorflow.CoordinationService/Heartbeat:\n:{\"description\":\"Deadline Exceeded\"}")


@pytest.mark.parametrize("n", [2, 3])
def test_the_target_of_a_failed_heartbeat_call_is_not_named_unhealthy(n):
    cut = n - 1
    workers = [raised(i, n, "UnavailableError", HEARTBEAT_TIMEOUT_215.replace("task:2", f"task:{cut}"),
                      t=12.0, steps=range(6)) for i in range(cut)]
    workers.append(raised(cut, n, "DeadlineExceededError", OWN_HEARTBEAT_215, t=12.0,
                          steps=range(6)))
    verdict = diagnose(run(*workers))
    if n == 2:
        # Only the leader names its one peer, as it would were its own link
        # cut: cannot tell, and never the leader alone.
        assert verdict.culprits == (0, 1) and verdict.ambiguous, verdict.text
    else:
        assert verdict.culprits == (cut,) and not verdict.ambiguous, verdict.text


def test_many_workers_are_named_by_ranges():
    from harness.diagnosis.words import names
    assert names([1]) == "worker 1" and names([0, 2]) == "workers 0,2"
    assert names([0, 1, 2]) == "workers 0,1,2"   # a short run stays spelled out
    assert names([0] + list(range(2, 256))) == "workers 0,2-255"
    assert names([5, 1, 2, 3, 4, 9]) == "workers 1-5,9"


def test_a_corpus_job_is_the_users_code_the_rest_of_the_harness_is_not():
    """The corpus's jobs stand for users' code: a root error raised in one
    is said at its line, not at none."""
    from harness.diagnosis.stacks import where_raised
    tb = ('  File "/repo/harness/worker/main.py", line 140, in _call_fn\n'
          '  File "/repo/harness/bench/corpus/fit.py", line 42, in uneven_batch\n'
          '  File "/venv/lib/python3.11/site-packages/tf_keras/src/engine/training.py", '
          'line 1800, in fit\n')
    assert where_raised(tb) == " at fit.py:42"
