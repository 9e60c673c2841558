"""One attempt of a run: start the workers, watch them, stop them, decide.

An attempt is what a cluster manager starts once: a fresh process per
worker on the run's ports.  :func:`run_attempt` returns its
:class:`~harness.result.RunResult`; :mod:`harness.controller.cluster`
starts attempts again while the run's ``restarts`` allow.
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from harness import plan as plan_module
from harness.controller.ledger_view import LedgerView
from harness.controller.outcome import attempt_story, judge, with_task_history
from harness.controller.phases import Clock, worker_phases
from harness.controller.replicas import compare as compare_replicas
from harness.controller.request import RunRequest
from harness.controller.restarts import POLICIES, TaskRestarter, incarnation_plan, specs_dir
from harness.controller.teardown import dump_stacks, stop_workers
from harness.controller.watch import TrackedWorker, WatchLoop
from harness.core import progress, protocol, serialize
from harness.diagnosis.observations import EndedBy, LinkProbe, RunObservation, WorkerObservation
from harness.diagnosis.stragglers import slow_collectives
from harness.errors import hide_in_setup_errors
from harness.faults import Fault
from harness.launch import scratch
from harness.launch.base import Launcher, WorkerHandle
from harness.network import RunNetwork
from harness.result import RunResult, WorkerResult

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

# Logs past this are kept as head + tail, so a worker that prints without end
# cannot swallow the parent's memory.
LOG_HEAD = 64 * 1024
LOG_TAIL = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Job:
    """What every attempt of one ``run`` call shares: the request, each
    worker's environment, the run's network and the namespaces each worker
    joins in it, for a single-worker reference the N it stands for, and the
    run's directory (``context().run_dir``)."""

    request: RunRequest
    envs: Tuple[dict, ...]
    network: RunNetwork
    netns: Optional[tuple] = None
    reference_workers: int = 0
    run_dir: str = ""


def read_capped(path: str, head: int = LOG_HEAD, tail: int = LOG_TAIL) -> str:
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size <= head + tail:
                data = f.read()
            else:
                first = f.read(head)
                f.seek(size - tail)
                data = (first + f"\n[... pytest-mwms: {size - head - tail} bytes of log cut; "
                        f"first {head} and last {tail} bytes kept ...]\n".encode() + f.read())
    except OSError:
        return ""
    return data.decode("utf-8", errors="backslashreplace")


def worker_specs(job: Job, attempt: int, configs: Sequence[Optional[dict]],
                 plan: Sequence[Fault], files: str) -> List[protocol.WorkerSpec]:
    """Each worker's spec for this attempt; its files go in ``files``.  The
    payload carries this process's multiprocessing authkeys, which a worker
    takes before it unpickles ``fn`` and its arguments."""
    req = job.request
    n = req.settings.workers
    payload = serialize.with_authkeys(req.payload)
    # What a worker calls the cluster's size: the tasks in the collectives.
    replicas = req.settings.shape.training
    shape = req.settings.shape
    specs = [protocol.WorkerSpec(
        index=i, num_workers=replicas, payload=payload, tf_config=configs[i], env=job.envs[i],
        log_path=os.path.join(files, f"worker-{i}.log"),
        stack_path=os.path.join(files, f"worker-{i}.stack"),
        faults=plan_module.for_worker(plan, i), sync_check=req.sync_check,
        progress_path=os.path.join(files, f"worker-{i}.progress"), ledger=req.ledger,
        step_function=req.step_fn, attempt=attempt,
        replicas_path=os.path.join(files, f"worker-{i}.npz") if req.fingerprint else "",
        reference_workers=job.reference_workers, exit_on_return=req.exit_on_return,
        netns=job.netns[i] if job.netns else None, run_dir=job.run_dir,
        watch_state=req.watch_state)
        for i in range(n)]
    # A parameter-server cluster's servers run no fn: no ledger, no checks;
    # their steps are read from the coordinator's (the chief's, process 0)
    # progress map.
    return [dataclasses.replace(s, serves_for=specs[0].progress_path, ledger=None,
                                sync_check=False, replicas_path="")
            if shape.serves(s.index) else
            dataclasses.replace(s, coordinates=True,
                                holds=plan_module.coordinator_holds(plan, shape))
            if shape.coordinated else s
            for s in specs]


def run_attempt(launcher: Launcher, job: Job, attempt: int, configs: Sequence[Optional[dict]],
                plan: Sequence[Fault], files: str) -> RunResult:
    """One attempt: start the workers, watch them, stop them, decide.
    Under ``restart_policy="task"``, a worker that crashed or failed is
    restarted within the attempt (:mod:`harness.controller.restarts`)."""
    req = job.request
    specs = worker_specs(job, attempt, configs, plan, files)
    readers = []
    for spec in specs:
        with scratch.named_if_full("make the workers' progress files"):
            progress.create(spec.progress_path)
        readers.append(progress.Reader(spec.progress_path))
    clock = Clock()
    launched = start = clock.last
    handles: List[WorkerHandle] = []
    tracked: List[TrackedWorker] = []
    ended_by, timeout = EndedBy.HANG, req.settings.timeout

    def track(h: WorkerHandle, reader: progress.Reader) -> TrackedWorker:
        return TrackedWorker(h, WorkerObservation(
            index=h.index, tf_config=job.network.logical(configs[h.index]), ledger=req.ledger),
            LedgerView(start), reader, pid=getattr(h, "pid", None),
            serves=bool(specs[h.index].serves_for))

    def start_again(index: int, incarnation: int) -> TrackedWorker:
        """Worker ``index``'s next process: the same TF_CONFIG, its own files."""
        spec = worker_specs(job, incarnation, configs,
                            plan_module.in_attempt(req.plan, incarnation),
                            specs_dir(files, index, incarnation))[index]
        with scratch.named_if_full("make a restarted worker's progress file"):
            progress.create(spec.progress_path)
        readers.append(progress.Reader(spec.progress_path))
        specs[index] = spec
        handle = launcher.start([spec])[0]
        handles.append(handle)
        return track(handle, readers[-1])

    restarter = task_restarter(req, start_again, lambda w, k: ended_result(w, specs[w.index], k))
    try:
        handles.extend(launcher.start(specs))
        # The clock of the run starts once the workers exist: a forkserver
        # still importing TensorFlow (the first run of a session) is no
        # hang of theirs.
        start = clock.mark("launch")
        job.network.workers_started()
        tracked = [track(h, readers[h.index]) for h in handles]
        loop = WatchLoop(tracked, req.settings, start, req.progress, attempt, job.network,
                         restarter, req.exit_on_return, req.end_when_certain)
        ended_by = loop.loop()
        timeout = loop.timeout   # the progress callback may have set it
        # The run's clock (events, hang detection) and the user's (the
        # whole call, a cold forkserver's wait included).
        # The workers' phases come from their events (worker_phases).
        duration = clock.skip() - start
        total = time.monotonic() - launched
        for worker in tracked:
            worker.stop_reading()
        if ended_by != EndedBy.ALL_FINISHED:
            dump_stacks(tracked, specs)
        clock.mark("stacks")
        links, links_note = probe_links(job.network, ended_by, tracked)
        if job.network.has_links and (links or links_note):
            clock.mark("links")
    finally:
        # The live processes: a restarted worker's ended ones are gone already.
        stop_workers(tracked, [h for h in handles if restarter is None
                               or all(h is not e for e in restarter.ended)], start)
        clock.mark("teardown")
    obs = RunObservation(
        num_workers=req.settings.workers, timeout=timeout,
        grace=req.settings.grace, ended_by=ended_by, duration=duration, workers=tuple(
            w.observation(stack=read_capped(specs[w.index].stack_path)) for w in tracked),
        replicas=check_replicas(tracked, specs, req.tolerance, req.settings.shape.training),
        exit_on_return=req.exit_on_return, tasks=task_names(req.settings.shape),
        links=links, links_note=links_note,
        serving=tuple(i for i in range(len(specs)) if req.settings.shape.serves(i)))
    for reader in readers:
        reader.close()
    obs = probe_slow_run(job.network, obs, clock)
    result = attempt_result(obs, req.plan, plan, restarter, tracked, specs, total, attempt)
    clock.mark("diagnosis")
    return dataclasses.replace(result, phases={**worker_phases(obs), **clock.phases})


def probe_links(network: RunNetwork, ended_by: str,
                tracked: List[TrackedWorker]) -> Tuple[Tuple[LinkProbe, ...], str]:
    """The cluster's links tried while the workers of an attempt that did
    not complete are still as they ended (a hung one still listens), or why
    they were not; nothing for an attempt whose every worker returned."""
    if ended_by == EndedBy.ALL_FINISHED and all(
            t.seen.returned and t.seen.error is None for t in tracked):
        return (), ""
    return links_of(*network.probe_links())


def probe_slow_run(network: RunNetwork, obs: RunObservation, clock: Clock) -> RunObservation:
    """``obs`` with the links tried, where every worker returned but a
    collective was slow on all alike: a slow link shows in the round trips
    (the echoes are the prober's own, so the ended workers need not listen)."""
    if not network.has_links or obs.links or obs.links_note or not slow_collectives(obs):
        return obs
    links, links_note = links_of(*network.probe_links())
    clock.mark("links")
    return dataclasses.replace(obs, links=links, links_note=links_note)


def links_of(rows: List[list], note: str) -> Tuple[Tuple[LinkProbe, ...], str]:
    """The prober's rows as observations (a worker's with its round trip)."""
    def at(row: list, i: int) -> Optional[float]:
        return None if len(row) <= i or row[i] is None else float(row[i])
    return tuple(LinkProbe(None if row[0] == "switch" else int(row[0]), int(row[1]), row[2],
                           float(row[3]), at(row, 4), at(row, 5)) for row in rows), note


def task_restarter(req: RunRequest, start_again, result_of) -> Optional[TaskRestarter]:
    """The attempt's TaskRestarter, when its policy restarts tasks."""
    policy = POLICIES[req.settings.restart_policy]
    if not policy.restarts_tasks:
        return None
    return TaskRestarter(req.settings.workers, policy.task_restarts(req.settings.restarts),
                         req.restart_on, start_again, result_of,
                         together=req.restart_echoes_together)


def ended_result(worker: TrackedWorker, spec: protocol.WorkerSpec, incarnation: int) -> WorkerResult:
    """What one ended process of a restarted worker leaves in its result."""
    w = worker.observation(stack=read_capped(spec.stack_path))
    return WorkerResult(index=w.index, exception=w.error, exit_code=w.exit_code,
                        log=read_capped(spec.log_path), last_step=w.last_step, stack=w.stack,
                        observation=w, attempt=incarnation, pid=worker.pid)


def attempt_result(obs: RunObservation, whole_plan: Sequence[Fault], plan: Sequence[Fault],
                   restarter: Optional[TaskRestarter], tracked: List[TrackedWorker],
                   specs: Sequence[protocol.WorkerSpec], total: float,
                   attempt: int) -> RunResult:
    """The attempt's result: each worker's, and the verdict on what was
    observed and what the controller knows (the faults of ``plan`` that did
    not act; under ``restart_policy="task"``, each task's processes)."""
    if restarter is None:
        incarnations = [attempt] * len(obs.workers)
        story = attempt_story(obs, plan)
    else:
        incarnations = [restarter.incarnation(i) for i in range(len(obs.workers))]
        story = attempt_story(obs, incarnation_plan(whole_plan, incarnations),
                              restarter.history, restarter.not_restarted, whole_plan)
    workers = tuple(
        WorkerResult(index=w.index, return_value=_load_return(t), exception=w.error,
                     exit_code=w.exit_code, log=read_capped(specs[w.index].log_path),
                     last_step=w.last_step, stack=w.stack, observation=w,
                     attempt=incarnations[w.index], pid=t.pid)
        for w, t in zip(obs.workers, tracked))
    if restarter is not None:
        workers = with_task_history(workers, restarter.history)
    return RunResult(workers=workers, duration=total, observation=obs,
                     verdict=judge(obs, story), attempt=attempt)


def task_names(shape) -> tuple:
    """What the observation records of the cluster's shape: its tasks, but
    for a cluster of workers only."""
    return () if shape.workers_only else shape.tasks


def check_replicas(tracked: List[TrackedWorker], specs, tolerance: Optional[float],
                   training: int):
    """The replica check's finding, when it is on and every training task
    (the first ``training`` workers: an evaluator holds no replica) returned."""
    tracked = [w for w in tracked if w.index < training]
    if tolerance is None or not tracked or not all(
            w.seen.returned and w.seen.error is None for w in tracked):
        return None
    prints, notes = {}, []
    for w in tracked:
        if isinstance(w.replica_prints, tuple):
            prints[w.index] = w.replica_prints
        else:
            notes.append(f"worker {w.index}: {w.replica_prints or 'sent no fingerprints'}")
    files: Dict[int, Any] = {}

    def load(worker: int, number: int):
        import numpy as np
        if worker not in files:
            files[worker] = np.load(specs[worker].replicas_path)
        return files[worker][f"v{number}"]

    try:
        return compare_replicas(prints, load, tolerance, notes)
    finally:
        for f in files.values():
            f.close()


def load_value(path: str, number: int):
    """Variable ``number`` of a worker's fingerprint file."""
    import numpy as np
    with np.load(path) as values:
        return values[f"v{number}"]


def _load_return(worker: TrackedWorker) -> Any:
    if not worker.seen.returned or worker.return_payload is None:
        return None
    return serialize.loads(worker.return_payload)
