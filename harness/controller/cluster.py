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
from typing import Any, Callable, List, Optional, Sequence

from harness import plan as plan_module
from harness.controller.attempt import Job, load_value, run_attempt
from harness.controller.outcome import attempt_story, certain_to_recur, combine_attempts, judge
from harness.diagnosis.story import NotRestarted
from harness.controller.phases import Clock
from harness.controller.replicas import compare_reference
from harness.controller.request import RunRequest, make_request
from harness.controller.restarts import POLICIES
from harness.controller.scripts import script_main
from harness.controller.watch import OnProgress
from harness.core import tfconfig
from harness.diagnosis.observations import Outcome
from harness.errors import SettingError, hide_in_setup_errors
from harness.launch.backends import DEFAULT_BACKEND, launcher_for
from harness.launch.base import Launcher
from harness.launch import scratch
from harness.validators import DEFAULT_MAX_FAULTS
from harness.launch.devices import worker_environments
from harness.result import RunResult
from harness.settings import OPTION, OPTIONS, RunSettings, finish
from harness.validators import DEFAULT_RESTART_ON

# pytest leaves this module's frames out of a setup error's traceback.
__tracebackhide__ = hide_in_setup_errors

# What Cluster(...) takes by keyword: every option by its field name, but
# the reports', which the plugin and `harness run` write (a result draws
# its own: RunResult.timeline()).
# Less free space than this where a run keeps its files, after a run that
# did not complete, and the disk is taken to have ended it.
FULL_ROOM = 64 << 10
KEYWORDS = {o.field: o for o in OPTIONS if o.name not in ("report-dir", "report")}


def settings_of(options: dict) -> RunSettings:
    """``Cluster(**options)``'s settings: each of :data:`KEYWORDS` as given,
    the rest at the option's default, checked as the plugin checks them; a
    bad one is a :class:`~harness.errors.SettingError` naming ``Cluster(name=...)``."""
    unknown = sorted(set(options) - set(KEYWORDS))
    if unknown:
        raise SettingError(f"Cluster: unknown option(s) {', '.join(unknown)}; "
                           f"allowed: {', '.join(KEYWORDS)}")
    values = {}
    for field, option in KEYWORDS.items():
        value = option.parse(options.get(field, option.default), f"Cluster({field}=...)")
        values[field] = os.path.abspath(value) if option.directory and value else value
    return finish(RunSettings(**values), lambda name: f"Cluster({OPTION[name].field}=...)")


class Cluster:
    """Runs functions on an N-worker MWMS cluster: the ``mwms_cluster``
    fixture, or one made with ``Cluster(workers=3, timeout=10)``.

    It takes the options of docs/options.md by their field names
    (``workers``, ``cluster``, ``timeout``, ``grace``, ``devices``,
    ``start_method``, ``preload``, ``restarts``, ``restart_policy``,
    ``network``, ``backend``, ``ray_address``, ``ray_nodes``,
    ``state_dir``), each checked as the plugin checks it, the rest at their
    defaults; the fixture's is made from pytest's options and the test's
    ``mwms`` marker.

    ``num_workers`` is N.  :meth:`run` calls ``fn(*args, **kwargs)`` in each
    of N fresh worker processes whose ``TF_CONFIG`` makes them one cluster,
    and returns a :class:`~harness.result.RunResult`.  Each call is a new
    cluster on new ports: TensorFlow configures collective ops once per process,
    for one cluster (more strategies on it run; one on another is refused).
    ``runs`` lists the results of every call so far.
    """

    def __init__(self, settings: Optional[RunSettings] = None,
                 launcher: Optional[Launcher] = None, **options: Any):
        # settings: the plugin's and the command line's way in, every
        # option read and checked already.
        if settings is None:
            settings = settings_of(options)
        elif not isinstance(settings, RunSettings):
            raise SettingError(f"Cluster: give the options by keyword (Cluster(workers=3)), "
                               f"not {settings!r}")
        elif options:
            raise SettingError(f"Cluster: options by keyword ({', '.join(sorted(options))}) "
                               f"or a RunSettings, not both")
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
            env: Optional[dict] = None, step_fn: Optional[str] = None, on_return: str = "stay",
            faults: Sequence = (),
            cluster=None, timeout: Optional[float] = None, grace: Optional[float] = None,
            restarts: Optional[int] = None, restart_on=DEFAULT_RESTART_ON,
            restart_policy: Optional[str] = None, restart_echoes_together: bool = True,
            sync_check: bool = False, ledger=True, check_replicas=False, reference=False,
            progress: Optional[OnProgress] = None,
            end_when_certain: bool = False, watch_state: bool = False) -> RunResult:
        """Run ``fn(*args, **kwargs)`` on every worker and return the verdict.

        Every argument is checked before any process starts; a bad one is a
        :class:`~harness.errors.SettingError` naming it.  Past the call's
        own (``fn``, ``args``, ``kwargs``) every argument is keyword-only, in
        the groups below; docs/api.md, "Arguments, by example", says more.

        What runs:

        - ``fn``, ``args``, ``kwargs``: pickled once, with dill, for every
          worker (a manager's proxies work there).
        - ``env``: environment variables for the workers only.
        - ``step_fn``: where ``fn`` reports no steps of its own, each call
          of a ``tf.function`` that launches collectives is a step;
          ``step_fn`` names the one whose calls are (``"train_step"``).
        - ``on_return``: ``"stay"`` keeps a worker whose ``fn`` returned in
          the cluster until the run is decided; ``"exit"`` ends it, as a
          script ends (a peer still in a collective sees it leave).

        The faults:

        - ``faults``: a plan of :mod:`harness.faults` values.

        The cluster, for this run, in place of the option of the same name:

        - ``cluster``: the shape (``{"chief": 1, "worker": 2}``).
        - ``timeout``: the hang timeout (seconds without progress).
        - ``grace``: how long peers get once one worker has raised or died.
        - ``restarts=K``: a run that ends in an outcome ``restart_on`` names
          (``"crash,fail"``; add ``hang``) starts again, up to K times,
          whole or, with ``restart_policy="task"``, the failed worker only;
          ``RunResult.attempts`` holds every attempt.
        - ``restart_echoes_together=False``: under ``restart_policy="task"``
          a peer's echo of a restarted task's failure is restarted alone, as
          a failure of its own (TensorFlow's runner does so), not with every
          task together.

        The checks:

        - ``sync_check=True``: every step boundary compares the workers'
          step numbers (``StepDesyncError`` names the one out of step).
        - ``ledger``: the collective ledger's level: ``True``/``"calls"``
          (which call of which ``tf.function`` each worker is in),
          ``"collectives"`` (also the collective pending), or ``False``.
        - ``check_replicas``: ``True`` (1e-6) or a tolerance: workers whose
          mirrored variables disagree when ``fn`` returns fail the run.
        - ``reference``: ``True`` (1e-3) or a tolerance: a completed run is
          compared with ``fn`` run once more on one worker standing in for
          the cluster.

        Watching the run:

        - ``progress``: a callable given a :class:`Progress` every half
          second; it may return a new hang timeout, or a :class:`Steer`.
        - ``end_when_certain=True``: a run that provably can never complete
          ends at once, without the grace or the hang timeout.
        - ``watch_state=True``: at each step boundary every worker looks
          for files written under ``harness.context().run_dir`` since the
          last and reports them (events of kind ``"saved"``): where the job
          keeps its state, for :meth:`explore`'s fault points.
        """
        checked = time.monotonic()
        request = make_request(
            self.settings, self.launcher.start_method, fn, args, kwargs, faults=faults,
            sync_check=sync_check, env=env, restart_on=restart_on, timeout=timeout,
            grace=grace, restarts=restarts, restart_policy=restart_policy, ledger=ledger,
            step_fn=step_fn, check_replicas=check_replicas, reference=reference,
            on_return=on_return, progress=progress, cluster=cluster,
            end_when_certain=end_when_certain,
            restart_echoes_together=restart_echoes_together, watch_state=watch_state)
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
            with scratch.named_if_full("make a run's directory"):
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
                    with scratch.named_if_full("make an attempt's directory"):
                        os.mkdir(files, 0o700)
                    clock.mark("setup")
                    attempts.append(run_attempt(self.launcher, job, attempt, configs, plan, files))
                    clock.skip()   # the attempt's own clock has it
                    if attempts[-1].outcome != Outcome.COMPLETED and \
                            scratch.is_full(tmpdir, FULL_ROOM):
                        # A worker that met the full disk (its log, its
                        # TMPDIR, a file of fn's) failed or crashed of it:
                        # the machine's problem, not the worker's.
                        raise scratch.full_error("keep a run's files while it ran")
                    if attempts[-1].verdict.outcome not in request.restart_on:
                        break
                    if attempt + 1 < allowed:
                        not_restarted = certain_to_recur(attempts[-1].observation.workers)
                        if not_restarted:
                            break
                if request.reference_tolerance is not None and \
                        attempts[-1].outcome == Outcome.COMPLETED:
                    attempts[-1] = self._against_reference(job, attempts[-1], plan, files,
                                                           tmpdir, placement.ports[0],
                                                           request.reference_tolerance)
            finally:
                clock.skip()
                shutil.rmtree(tmpdir, ignore_errors=True)
        clock.mark("cleanup")
        return combine_attempts(attempts, request.plan, time.monotonic() - launched, not_restarted,
                                clock.phases)

    def run_script(self, path=None, argv: Sequence[str] = (), *, module: Optional[str] = None,
                   env: Optional[dict] = None, on_return: str = "exit",
                   faults: Sequence = (),
                   cluster=None, timeout: Optional[float] = None, grace: Optional[float] = None,
                   restarts: Optional[int] = None, restart_on=DEFAULT_RESTART_ON,
                   restart_policy: Optional[str] = None,
                   ledger=True, check_replicas=False, reference=False) -> RunResult:
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
                kinds: Optional[Sequence[str]] = None, max_faults: int = DEFAULT_MAX_FAULTS,
                restarts: int = 0, restart_policy: Optional[str] = None,
                budget: float = 60, shrink_budget: Optional[float] = None,
                seed: Optional[int] = None, timeout: Optional[float] = None,
                reproduce: int = 3, order: str = "guided", check: bool = True,
                key: Optional[str] = None, **run_options):
        """Search for a plan of faults that breaks ``property`` on
        ``fn(*args, **kwargs)``; return the :class:`~harness.explore.Exploration`.

        The job runs once without faults (it must complete: that run also
        gives its steps, and how long its start-up and a step take); then
        plans of ``1..max_faults`` faults of ``kinds`` (names of
        :data:`harness.strategies.KINDS`, or the fault classes), at any
        training worker and step, run one after another until one breaks
        the property or ``budget`` seconds are spent.  The plans are drawn
        from ``seed`` (a fresh one when None; the result says which),
        spread over each kind, worker 0 and the other workers, and the
        parts of the job's steps, before going deeper; a plan is never
        run twice (:mod:`harness.explore.space`); ``order="uniform"``
        draws each plan's kind, worker and step uniformly instead, the
        baseline the guided draws are measured against.  With ``max_faults`` > 1
        and ``restarts``, a second fault can act in the restart attempt.
        A failing plan then shrinks for up to ``shrink_budget`` seconds
        (``budget`` when None) to the smallest plan that fails the same
        way (the outcome, the culprits relative to the plan, the error's
        type, the broken promise), and runs ``reproduce`` times more: a
        failure that does not come back every time is reported as racy.
        A search that finds nothing says what its plans covered
        (``Exploration.coverage``), and names what they never reached.

        - ``property="survives"``: every plan's run completes, after up to
          ``restarts`` restarts (``restart_policy`` as in :meth:`run`), and
          ``invariant(result)``, when given, does not raise.  Kinds, by
          default: ``Crash``, ``RaiseError``, ``Delay``, ``Pause`` (one that
          ends) and ``Preempt``.
        - ``property="detected"``: every run that does not complete names
          a worker whose fault acted, or says "cannot tell" with one among
          its candidates; never a culprit no fault acted in.  Kinds, by
          default: every step-keyed kind but the file faults
          (:data:`harness.strategies.FILE_KINDS`), which act only on a job
          that writes files under its ``run_dir``: name them in ``kinds``
          to draw them.

        Each plan's hang timeout is ``timeout``, or from the fault-free run:
        twice its start-up, five times its median wait between steps and
        twice its longest, whichever is most (at least 3 s, at most the
        cluster's).  The jobs keep what must outlive an attempt in
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
                               reproduce=reproduce, order=order, check=check, key=key,
                               **run_options)

    def _against_reference(self, job: Job, result: RunResult, plan, files: str, tmpdir: str,
                           port: int, tolerance: float) -> RunResult:
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
            tolerance)
        obs = dataclasses.replace(result.observation, reference=check)
        return dataclasses.replace(result, observation=obs,
                                   verdict=judge(obs, attempt_story(obs, plan)))
