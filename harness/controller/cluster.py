"""The ``mwms_cluster`` fixture's object: :class:`Cluster`.

Each ``run`` checks its arguments into a :class:`~harness.controller.request.RunRequest`,
reserves the workers' addresses through the backend's
:class:`~harness.launch.base.Launcher`, opens the run's network, and runs
attempts (:mod:`harness.controller.attempt`) while restarts are left.
Whatever happens, Ctrl-C included, every worker and all it started is gone,
and the run's temporary directory removed, before ``run`` returns.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from typing import Callable, List, Optional, Sequence

from harness import plan as plan_module
from harness.controller.attempt import Job, load_value, run_attempt
from harness.controller.outcome import attempt_story, certain_to_recur, combine_attempts, judge
from harness.diagnosis.story import NotRestarted
from harness.controller.phases import Clock
from harness.controller.replicas import compare_reference
from harness.controller.request import RunRequest, make_request
from harness.controller.restarts import POLICIES
from harness.controller.scripts import script_main
from harness.controller.watch import Progress
from harness.core import tfconfig
from harness.diagnosis.observations import Outcome
from harness.errors import hide_in_setup_errors
from harness.launch.backends import DEFAULT_BACKEND, launcher_for
from harness.launch.base import Launcher
from harness.launch import scratch
from harness.launch.devices import worker_environments
from harness.result import RunResult
from harness.settings import RunSettings
from harness.validators import DEFAULT_RESTART_ON

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors


class Cluster:
    """The ``mwms_cluster`` fixture: runs functions on an N-worker MWMS cluster.

    ``num_workers`` is N.  :meth:`run` calls ``fn(*args, **kwargs)`` in each
    of N fresh worker processes whose ``TF_CONFIG`` makes them one cluster,
    and returns a :class:`~harness.result.RunResult`.  Each call is a new
    cluster on new ports: TensorFlow configures collective ops once per process,
    for one cluster (more strategies on it run; one on another is refused).
    ``runs`` lists the results of every call so far.
    """

    def __init__(self, settings: RunSettings, launcher: Optional[Launcher] = None):
        self.settings = settings
        self.launcher = launcher or launcher_for(settings)
        self.runs: List[RunResult] = []

    @property
    def num_workers(self) -> int:
        return self.settings.workers

    def __repr__(self) -> str:
        s = self.settings
        return (f"Cluster(workers={s.workers}, timeout={s.timeout:g}, devices={s.devices!r}, "
                f"start_method={s.start_method!r}"
                + (f", backend={s.backend!r})" if s.backend != DEFAULT_BACKEND else ")"))

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None, *,
            timeout: Optional[float] = None, faults: Sequence = (),
            grace: Optional[float] = None, sync_check: bool = False,
            env: Optional[dict] = None, ledger=True,
            step_fn: Optional[str] = None, restarts: Optional[int] = None,
            restart_on=DEFAULT_RESTART_ON, restart_policy: Optional[str] = None,
            check_replicas=False, reference=False, on_return: str = "stay",
            progress: Optional[Callable[[Progress], None]] = None,
            cluster=None, end_when_certain: bool = False) -> RunResult:
        """Run ``fn(*args, **kwargs)`` on every worker and return the verdict.

        Every argument is checked before any process starts; a bad one is a
        :class:`~harness.errors.SettingError` naming it.

        - ``args``, ``kwargs``: pickled once, with dill, for every worker.
          A manager's proxies work in the workers, and so do locks and
          events of a ``spawn`` or ``forkserver`` context; what only a
          forked child could use is refused before any process starts,
          naming the manager's counterpart (:mod:`harness.core.serialize`).
        - ``timeout``: the hang timeout (seconds without progress) for this run.
        - ``grace``: how long peers get once one worker has raised or died.
        - ``faults``: a plan of :mod:`harness.faults` values.
        - ``sync_check=True``: every ``steps()`` boundary all-reduces the
          workers' step numbers, so a divergence fails at once with
          ``StepDesyncError`` naming the worker (one tiny all-reduce per step).
        - ``env``: environment variables for the workers only (each starts
          from the parent's environment as it is at the call).
        - ``ledger``: the collective ledger's level (:mod:`harness.worker.ledger`):
          ``True``/``"calls"`` (the default: which call of which ``tf.function``
          each worker is in), ``"collectives"`` (also which collective is
          pending), or ``False`` (step boundaries only).
        - ``step_fn``: where ``fn`` reports no steps of its own
          (``context().steps()``, the Keras callback), each call of a
          ``tf.function`` that launches collectives is a step (needs the
          ledger); ``step_fn`` names the one function whose calls are steps
          (``"train_step"``; Keras's ``fit`` runs ``"train_function"`` or
          ``"one_step_on_iterator"``).
        - ``restarts=K`` (default ``--mwms-restarts``): a run that ends in an
          outcome ``restart_on`` names (``"crash,fail"``; add ``hang``) is
          started again, whole, up to K times, as a cluster manager would
          (the same ports and ``TF_CONFIG``); ``fn`` reads
          ``context().attempt``, a fault acts in the attempt it names, and
          the result is the last attempt's (all in ``RunResult.attempts``).
          An attempt that failed as every attempt would is not restarted.
          With ``restart_policy="task"`` only the worker that crashed or
          failed is (see docs/api.md, "Restarts").
        - ``check_replicas``: ``True`` (1e-6) or a tolerance (``atol`` and
          ``rtol``; ``0``: bit for bit) fingerprints the mirrored variables
          on every worker when ``fn`` returns; workers that disagree fail
          the run with ``ReplicaDivergence`` (:mod:`harness.controller.replicas`).
        - ``reference``: ``True`` (1e-3, as Keras's correctness tests use)
          or a tolerance runs ``fn`` once more, when the run completed, on
          one worker standing in for the cluster, and compares its variables
          and return value with worker 0's (``ReferenceMismatch``).  ``fn``
          takes its global batch from ``context().global_batch_size(per_worker)``.
        - ``on_return``: ``"stay"`` keeps a worker whose ``fn`` returned in the
          cluster until the run is decided; ``"exit"`` ends it at once, as a
          script ends (a peer still in a collective then sees it leave).
        - ``progress``: a callable given a :class:`Progress` every half second
          (``harness run``'s status line), in the watch loop: a quick one.
        - ``end_when_certain=True``: once a worker that raised, died, or is
          stopped for good provably holds every other up for ever, the run
          ends, without the grace or the hang timeout: the same verdict,
          without the peers' own errors (``explore`` runs its plans so).
        - ``cluster``: this run's shape (``{"chief": 1, "worker": 2}``, see
          the ``cluster`` option), in place of the cluster's.

        Each run's workers share a network namespace of their own when the
        ``network`` setting allows it: see :mod:`harness.network`.
        """
        checked = time.monotonic()
        request = make_request(
            self.settings, self.launcher.start_method, fn, args, kwargs, faults=faults,
            sync_check=sync_check, env=env, restart_on=restart_on, timeout=timeout,
            grace=grace, restarts=restarts, restart_policy=restart_policy, ledger=ledger,
            step_fn=step_fn, check_replicas=check_replicas, reference=reference,
            on_return=on_return, progress=progress, cluster=cluster,
            end_when_certain=end_when_certain)
        self.runs.append(self.submit(request, checked))
        return self.runs[-1]

    def submit(self, request: RunRequest, checked: Optional[float] = None) -> RunResult:
        """Run a checked request: its attempts, then its reference run.
        ``checked``: when the request's checks began (its phase's start)."""
        settings, n = request.settings, request.settings.workers
        clock = Clock()
        launched = clock.last
        if checked is not None:
            clock.add("request", launched - checked)
        attempts: List[RunResult] = []
        not_restarted: Optional[NotRestarted] = None
        with self.launcher.place(n, settings.state_dir) as placement, \
                request.network.open(n, placement.ports) as network:
            # 0700, holds the logs; removed after the run, and by the
            # scratch directory's sweeper if this process is killed.  It is
            # also the workers' TMPDIR (unless env= sets one), so what
            # TensorFlow and fn leave in the temp directory (autograph's
            # generated files: one per traced function per worker) goes too.
            tmpdir = scratch.make_dir("run-")
            envs = tuple({**e, "TMPDIR": tmpdir, **dict(request.env)}
                         for e in worker_environments(n, settings.devices))
            # Where the job keeps what must outlive an attempt (its
            # checkpoints): one directory for every attempt of this run.
            run_dir = os.path.join(tmpdir, "run")
            os.mkdir(run_dir, 0o700)
            job = Job(request, envs, network, network.worker_namespaces(n), run_dir=run_dir)
            clock.mark("setup")
            try:
                # Every attempt on the ports reserved once: a restarted
                # cluster is found at the same addresses, and a port of the
                # last attempt in TIME_WAIT is not probed again.
                allowed = POLICIES[settings.restart_policy].cluster_attempts(settings.restarts)
                for attempt in range(allowed):
                    plan = plan_module.in_attempt(request.plan, attempt)
                    configs = network.new_attempt(attempt, plan_module.configs_under(
                        plan, tfconfig.cluster_configs(placement.ports,
                                                       hosts=network.hosts(placement.hosts),
                                                       shape=settings.shape),
                        placement.spare))
                    files = os.path.join(tmpdir, f"attempt-{attempt}")
                    os.mkdir(files, 0o700)
                    clock.mark("setup")
                    attempts.append(run_attempt(self.launcher, job, attempt, configs, plan, files))
                    clock.skip()   # the attempt's own clock has it
                    if attempts[-1].verdict.outcome not in request.restart_on:
                        break
                    if attempt + 1 < allowed:
                        not_restarted = certain_to_recur(attempts[-1].observation.workers)
                        if not_restarted:
                            break
                if request.reference_tolerance is not None and \
                        attempts[-1].outcome == Outcome.COMPLETED:
                    attempts[-1] = self._against_reference(job, attempts[-1], plan, files,
                                                           tmpdir, placement.ports[0])
            finally:
                clock.skip()
                shutil.rmtree(tmpdir, ignore_errors=True)
        clock.mark("cleanup")
        return combine_attempts(attempts, request.plan, time.monotonic() - launched, not_restarted,
                                clock.phases)

    def run_script(self, path=None, argv: Sequence[str] = (), *, module: Optional[str] = None,
                   env: Optional[dict] = None, faults: Sequence = (),
                   timeout: Optional[float] = None, grace: Optional[float] = None,
                   ledger=True, restarts: Optional[int] = None,
                   restart_on=DEFAULT_RESTART_ON, restart_policy: Optional[str] = None,
                   check_replicas=False, reference=False, on_return: str = "exit",
                   cluster=None) -> RunResult:
        """Run a script on every worker as ``python path argv...`` would, or
        ``python -m module argv...`` with ``module=``; see
        :mod:`harness.controller.scripts`.

        It completes when the script returns or exits with status 0, fails on
        an uncaught exception, and crashes on ``sys.exit(n)``, n != 0.  The
        path, module, ``argv`` (a sequence of str) and ``env`` are checked
        before any process starts; the other arguments are :meth:`run`'s,
        but ``on_return`` is ``"exit"``: a worker whose script ended exits,
        as a job's process does, and its atexit handlers run (``"stay"``
        keeps it in the cluster until the run is decided).
        """
        main = script_main(path, argv, module=module, env=env,
                           start_method=self.launcher.start_method)
        return self.run(main, env=env, faults=faults, timeout=timeout, grace=grace,
                        ledger=ledger, restarts=restarts, restart_on=restart_on,
                        restart_policy=restart_policy, check_replicas=check_replicas,
                        reference=reference, on_return=on_return, cluster=cluster)

    def explore(self, fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None, *,
                property: str = "survives", invariant: Optional[Callable] = None,
                kinds: Optional[Sequence[str]] = None, max_faults: int = 1,
                restarts: int = 0, restart_policy: Optional[str] = None,
                budget: float = 60, shrink_budget: Optional[float] = None,
                seed: Optional[int] = None, timeout: Optional[float] = None,
                check: bool = True, key: Optional[str] = None, **run_options):
        """Search for a plan of faults that breaks ``property`` on
        ``fn(*args, **kwargs)``; return the :class:`~harness.explore.Exploration`.

        The job runs once without faults (it must complete: that run also
        gives its steps, and how long a step takes); then plans of
        ``1..max_faults`` faults of ``kinds`` (names of
        :data:`harness.strategies.KINDS`), at any training worker and step,
        drawn by hypothesis from ``seed`` (a fresh one when None; the
        result says which), run one after another until one breaks the
        property or ``budget`` seconds are spent.  A failing plan then
        shrinks for up to ``shrink_budget`` seconds (``budget`` when None)
        to the smallest plan that fails the same way (the outcome, the
        culprits relative to the plan, the error's type, the broken
        promise).

        - ``property="survives"``: every plan's run completes, after up to
          ``restarts`` restarts (``restart_policy`` as in :meth:`run`), and
          ``invariant(result)``, when given, does not raise.  Kinds, by
          default: ``Crash``, ``RaiseError``, ``Delay``, ``Pause`` (one that
          ends) and ``Preempt``.
        - ``property="detected"``: every run that does not complete names
          a worker whose fault acted, or says "cannot tell" with one among
          its candidates; never a culprit no fault acted in.  Kinds, by
          default: every step-keyed kind.

        Each plan's hang timeout is ``timeout``, or five times the longest
        wait between two steps of the fault-free run (at least 3 s, at
        most the cluster's).  The jobs keep what must outlive an attempt in
        ``harness.context().run_dir``.  A failure is saved in hypothesis's
        example database, and the next search of the same job (``key``, by
        default the function's qualified name and arguments) runs it first.  With
        ``check=True`` a failure raises
        :class:`~harness.errors.ExplorationFailed`, whose message starts
        with the plan as a ``faults=[...]`` line to paste into :meth:`run`;
        with ``check=False`` it is in ``.failure``.  Other keyword
        arguments are :meth:`run`'s, for every plan's run.
        """
        from harness.explore import explore_cluster
        return explore_cluster(self, fn, args, kwargs, property=property, invariant=invariant,
                               kinds=kinds, max_faults=max_faults, restarts=restarts,
                               restart_policy=restart_policy, budget=budget,
                               shrink_budget=shrink_budget, seed=seed, timeout=timeout,
                               check=check, key=key, **run_options)

    def _against_reference(self, job: Job, result: RunResult, plan, files: str, tmpdir: str,
                           port: int) -> RunResult:
        """Run ``fn`` on one worker standing in for the cluster, on the
        run's first port (its processes are gone), and judge ``result``
        again with the comparison in its record."""
        req = job.request
        ref_files = os.path.join(tmpdir, "reference")
        os.mkdir(ref_files, 0o700)
        ref_dir = os.path.join(ref_files, "run")   # fresh: not the run's checkpoints
        os.mkdir(ref_dir, 0o700)
        ref_job = dataclasses.replace(
            job, request=dataclasses.replace(req, settings=req.settings.with_overrides(workers=1,
                                                                                  restarts=0),
                                             sync_check=False),
            envs=job.envs[:1], netns=job.netns[:1] if job.netns else None,
            reference_workers=req.settings.workers, run_dir=ref_dir)
        ref = run_attempt(self.launcher, ref_job, 0, tfconfig.cluster_configs([port]), (),
                          ref_files)
        check = compare_reference(
            result.observation.workers[0], result.workers[0].return_value,
            lambda k: load_value(os.path.join(files, "worker-0.npz"), k),
            ref.outcome, ref.diagnosis, ref.observation.workers[0] if ref.workers else None,
            ref.workers[0].return_value if ref.workers else None,
            lambda k: load_value(os.path.join(ref_files, "worker-0.npz"), k),
            req.reference_tolerance)
        obs = dataclasses.replace(result.observation, reference=check)
        return dataclasses.replace(result, observation=obs,
                                   verdict=judge(obs, attempt_story(obs, plan)))
