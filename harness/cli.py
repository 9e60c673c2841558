"""The command line, for people outside pytest: ``python -m harness run``.

::

    python -m harness run -n 3 --timeout 30 --fault "Crash(worker=1, step=5)" train.py -- --epochs 2
    python -m harness run -m package.train -- --epochs 2
    python -m harness explore -n 3 --restarts 1 --budget 120 train.py -- --epochs 2
    python -m harness record --dir DIR -- train.py --epochs 2
    python -m harness analyze DIR [DIR ...]
    pip install "$(python -m harness keras2)"

starts one cluster, runs the script (or module) on every worker as
``Cluster.run_script`` does, prints the diagnosis (and, unless the run
completed, each failing worker's log tail), then one line saying where the
run went; ``explore`` searches for a plan of faults the script does
not survive (:meth:`harness.controller.cluster.Cluster.explore`), and exits
1 when it found one, printed as a ``faults=[...]`` line; ``record`` and ``analyze`` are the job recorder's
(:mod:`harness.record.commands`); ``keras2`` prints what gives Keras 2 beside the installed
TensorFlow (tf_keras of the same minor; on 2.15 its own ``keras``).  ``run`` exits 0 only when the outcome is the one ``--expect`` names
(``completed`` by default), 1 when it is another, and 2 for a usage error
(a bad option value, a bad fault, a missing script), before any process
starts.

The options are the pytest plugin's, declared once in
:data:`harness.settings.OPTIONS`, without the ``mwms-`` prefix (``--workers``
or ``-n``, ``--timeout``, and so on for each), with the same defaults and
the same checks.  ``--fault``
takes a fault of :mod:`harness.faults` as its constructor call (the form a
fault prints as), read by :func:`parse_fault`, which evaluates nothing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, List, Optional, Sequence, Tuple

from harness import faults as faults_module
from harness import plan as plan_module
from harness import faults_text
from harness.diagnosis.observations import OUTCOMES, Outcome
from harness.errors import HarnessError, UsageError
from harness.report.pytest_report import timeline_stem, wants_timeline
from harness.settings import OPTIONS, Option, RunSettings, read_settings
from harness.validators import parse_choice

PROG = "python -m harness"
# Options of `run` that take a value: the scan that finds where the script
# starts skips their values.
_VALUE_FLAGS = {"-n", "--fault", "--expect", "--budget", "--shrink-budget", "--property",
                "--kinds", "--max-faults", "--seed",
                *(o.flag.replace("--mwms-", "--") for o in OPTIONS)}



def output_lines(result) -> List[str]:
    """What each worker printed (stdout and stderr, TensorFlow's own logging
    included), each line after its worker's tag, ``[w0]``, as torchrun's
    ``--tee`` does: on every outcome, since the logs go with the run."""
    out = []
    for w in result.workers:
        kind, index = result.observation.task(w.index)
        tag = f"[w{index}]" if kind == "worker" else f"[{kind}]"
        out += [f"{tag} {line}" for line in w.log.rstrip("\n").splitlines()]
    return out


def _size(settings: RunSettings) -> str:
    """``2 workers``, or ``4 tasks (chief:1,worker:2,evaluator:1)``."""
    if settings.cluster is None:
        return f"{settings.workers} workers"
    return f"{settings.workers} tasks ({settings.cluster})"

def parse_fault(text: str) -> faults_module.Fault:
    """A fault from its constructor call, e.g. ``"Crash(worker=1, step=5)"``
    (:func:`harness.faults_text.parse`, which evaluates nothing)."""
    return faults_text.parse(text, "--fault")


def _parser(command: str = "run") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{PROG} {command}", allow_abbrev=False,
        usage=f"{PROG} {command} [options] (SCRIPT | -m MODULE) [--] [ARG ...]",
        description=DESCRIPTIONS[command])
    _cluster_options(p)
    if command == "explore":
        _explore_options(p)
    else:
        _run_options(p)
    p.add_argument("-m", "--module", metavar="MODULE",
                   help="run this module as `python -m MODULE` does, instead of a script")
    return p


DESCRIPTIONS = {
    "run": "Run a Python script (or module) on N TensorFlow worker processes that "
           "form one MultiWorkerMirroredStrategy cluster (TF_CONFIG is set for "
           "each), print the diagnosis, and exit 0 when the outcome is the one "
           "expected. Everything after the script or module (after an optional --) "
           "is the script's own arguments.",
    "explore": "Search for a fault the script does not survive (or that the diagnosis gets "
               "wrong): run it once without faults, then with plans of faults drawn at any "
               "worker and step until one breaks the property or the budget is spent; "
               "shrink it and print it as a faults=[...] line. Exit 0 when no plan broke "
               "the property, 1 when one did. Everything after the script or module "
               "(after an optional --) is the script's own arguments.",
}


def _explore_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--property", default="survives", choices=("survives", "detected"),
                   help="survives: every plan's run completes (after --restarts); detected: "
                        "every run that does not complete names a faulted worker "
                        "(default survives)")
    p.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                   help="seconds of search (default 60)")
    p.add_argument("--shrink-budget", type=float, default=None, metavar="SECONDS",
                   help="seconds to shrink a failing plan (default: the budget)")
    p.add_argument("--kinds", default=None, metavar="KIND,KIND",
                   help="the fault kinds to draw, e.g. Crash,Pause (default: for survives "
                        "Crash,RaiseError,Delay,Pause,Preempt; for detected every "
                        "step-keyed kind)")
    p.add_argument("--max-faults", type=int, default=1, metavar="N",
                   help="the most faults in one plan (default 1)")
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="draw the same plans as a search with this seed (default: a fresh "
                        "seed, printed)")


def _run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fault", action="append", default=[], metavar="FAULT",
                   help="a fault of harness.faults as its constructor call, e.g. "
                        "\"Crash(worker=1, step=5)\"; may repeat. Step-keyed faults act at "
                        "the steps the workers report (harness.context().steps(), ...)")
    p.add_argument("--check-replicas", action="store_true",
                   help="when the script returns, check that every worker holds the same "
                        "model (see run(check_replicas=True))")
    p.add_argument("--expect", default=Outcome.COMPLETED, metavar="|".join(OUTCOMES),
                   help="the outcome that makes the exit status 0 (default completed)")


def _cluster_options(p: argparse.ArgumentParser) -> None:
    for o in OPTIONS:
        flags = ["-n", "--workers"] if o.name == "workers" else []
        flags = flags or [o.flag.replace("--mwms-", "--")]
        p.add_argument(*flags, dest=o.field, metavar=o.metavar,
                       default=None,
                       help=f"{o.help} (default {o.default_text})".replace("%", "%%"))


def split_command(argv: Sequence[str]) -> Tuple[List[str], Optional[str], Optional[str],
                                                List[str]]:
    """``run``'s arguments as (harness options, script, module, script arguments).

    The harness's options come first; the script path (the first word that
    is not an option or an option's value), or ``-m MODULE``, ends them, as
    on python's own command line.  A ``--`` right after the script or module
    is dropped; a ``--`` before it ends the options, so the next word is
    the script.
    """
    argv = list(argv)
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            if i + 1 >= len(argv):
                break
            return argv[:i], argv[i + 1], None, _script_args(argv[i + 2:])
        if word in ("-m", "--module"):
            if i + 1 >= len(argv):
                raise UsageError(f"{word} needs a module name")
            return argv[:i], None, argv[i + 1], _script_args(argv[i + 2:])
        if word.startswith("--module="):
            return argv[:i], None, word.split("=", 1)[1], _script_args(argv[i + 1:])
        if word.startswith("-") and word != "-":
            i += 2 if word in _VALUE_FLAGS else 1
            continue
        return argv[:i], word, None, _script_args(argv[i + 1:])
    return argv, None, None, []


def _script_args(rest: List[str]) -> List[str]:
    return rest[1:] if rest[:1] == ["--"] else rest


def settings_from_args(ns: argparse.Namespace) -> RunSettings:
    """The run's settings from the options, through the plugin's pipeline."""
    def lookup(option: Option) -> Tuple[Any, str]:
        given = getattr(ns, option.field)
        if given is None:
            return option.default, "cli"
        return (os.path.abspath(given) if option.directory and given else given), "cli"

    return read_settings(lookup)


# A status line on a terminal is redrawn at every report; elsewhere (a log,
# a CI job) a plain line is printed at most this often.
PLAIN_EVERY = 5.0


def format_progress(p) -> str:
    """One line from a :class:`~harness.controller.Progress`:
    ``attempt 0 | 12.3s | w0 step 41, w1 step 41, w2 returned | idle 0.2s of 30s``."""
    workers = ", ".join(
        f"w{i} " + (state if state != "running" else
                    "started" if step is None else f"step {step}")
        for i, (step, state) in enumerate(zip(p.steps, p.states)))
    return (f"harness: attempt {p.attempt} | {p.elapsed:.1f}s | {workers} | "
            f"idle {p.idle:.1f}s of {p.timeout:g}s")


class StatusLine:
    """``run(progress=...)`` for the command line: on a terminal, one line
    redrawn in place (so a run that may hang shows it is alive); otherwise
    a plain line every :data:`PLAIN_EVERY` seconds."""

    def __init__(self, stream=None, clock=time.monotonic):
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.clock = clock
        self.shown = 0        # the width drawn on the terminal
        self.last_plain = None

    def __call__(self, progress) -> None:
        text = format_progress(progress)
        if self.tty:
            self.stream.write("\r" + text.ljust(self.shown))
            self.shown = len(text)
        elif self.last_plain is None or self.clock() - self.last_plain >= PLAIN_EVERY:
            self.stream.write(text + "\n")
            self.last_plain = self.clock()
        self.stream.flush()

    def close(self) -> None:
        """Wipe the terminal's line before the verdict is printed."""
        if self.tty and self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0


def run_command(argv: Sequence[str]) -> int:
    parser = _parser()
    try:
        options, script, module, script_args = split_command(argv)
        ns = parser.parse_args(options)   # --help exits 0 here; bad syntax exits 2
        if script is None and ns.module is None and module is None:
            raise UsageError("give a script to run, or -m MODULE")
        module = module or ns.module
        settings = settings_from_args(ns)
        expect = parse_choice(ns.expect, "--expect", OUTCOMES)
        plan = [parse_fault(f) for f in ns.fault]
        try:
            plan_module.validate(plan, settings.workers, settings.restarts, settings.shape)
        except faults_module.FaultError as e:
            raise UsageError(f"--fault: {e}") from None
        from harness.launch.state_dir import check_state_dir
        check_state_dir(settings.state_dir, "--state-dir")
        from harness.controller.cluster import Cluster
        from harness.controller.scripts import script_main
        cluster = Cluster(settings)
        main = script_main(script, script_args, module=module,
                           start_method=cluster.launcher.start_method)
    except HarnessError as e:
        parser.error(str(e))   # prints the usage, exits 2
    what = f"-m {module}" if module else script
    print(f"harness: running {what} on {_size(settings)} (timeout {settings.timeout:g} s, "
          f"{settings.start_method}, {settings.devices})", flush=True)
    status = StatusLine()
    try:
        # A worker whose script ended exits, as a job's process does.
        result = cluster.run(main, faults=plan, check_replicas=ns.check_replicas,
                             on_return="exit", progress=status)
    except KeyboardInterrupt:
        status.close()
        print("harness: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    except (HarnessError, ValueError) as e:   # found only once the run starts
        status.close()
        print(f"harness: error: {e}", file=sys.stderr)
        return 2
    status.close()
    for line in output_lines(result):
        print(line)
    print(result.diagnosis)
    if settings.report_dir and wants_timeline(result, settings.report):
        for path in result.timeline(timeline_stem(settings.report_dir, what, 1)):
            print(f"harness: timeline: {path}")
    ok = result.outcome == expect
    print(f"harness: {what} on {_size(settings)}: {result.outcome} in "
          f"{result.duration:.1f} s from the call, start-up included (the run itself: "
          f"{result.observation.duration:.1f} s); expected {expect}: "
          f"{'ok' if ok else 'NOT OK'}", flush=True)
    return 0 if ok else 1


def explore_command(argv: Sequence[str]) -> int:
    """``harness explore``: :meth:`Cluster.explore` over a script."""
    parser = _parser("explore")
    try:
        options, script, module, script_args = split_command(argv)
        ns = parser.parse_args(options)
        if script is None and ns.module is None and module is None:
            raise UsageError("give a script to explore, or -m MODULE")
        module = module or ns.module
        settings = settings_from_args(ns)
        kinds = ns.kinds.split(",") if ns.kinds else None
        from harness.launch.state_dir import check_state_dir
        check_state_dir(settings.state_dir, "--state-dir")
        from harness.controller.cluster import Cluster
        from harness.controller.scripts import script_main
        cluster = Cluster(settings)
        main = script_main(script, script_args, module=module,
                           start_method=cluster.launcher.start_method)
    except HarnessError as e:
        parser.error(str(e))
    what = f"-m {module}" if module else script
    print(f"harness: exploring {what} on {_size(settings)} for {ns.budget:g} s "
          f"(property {ns.property}, restarts {settings.restarts})", flush=True)
    try:
        found = cluster.explore(
            main, property=ns.property, kinds=kinds, max_faults=ns.max_faults,
            restarts=settings.restarts, budget=ns.budget, shrink_budget=ns.shrink_budget,
            seed=ns.seed, check=False, key=f"script {what} {' '.join(script_args)}",
            on_return="exit")
    except KeyboardInterrupt:
        print("harness: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    except HarnessError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        return 2
    print(found.summary())
    if found.failure is not None:
        print("the run of that plan:\n" + found.failure.result.diagnosis)
        print(f"harness: replay it with: {PROG} run -n {settings.workers} --restarts "
              f"{settings.restarts} "
              + " ".join(f'--fault "{f!r}"' for f in found.failure.plan) + f" {what}"
              + (" -- " + " ".join(script_args) if script_args else ""))
    return 1 if found.failure is not None else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} run [options] (SCRIPT | -m MODULE) [--] [ARG ...]",
        description="pytest-mwms outside pytest. `run` runs a script on an N-worker "
                    "MultiWorkerMirroredStrategy cluster; `run --help` lists its options. "
                    "`explore` searches for a fault the script does not survive "
                    "(`explore --help`). "
                    "`record` runs a job's training script with the recorder on, "
                    "`analyze` reads what the recorder left and prints the verdict "
                    "(`record --help`, `analyze --help`). "
                    "`keras2` prints what gives Keras 2 beside the installed TensorFlow "
                    "(tf_keras of its minor).")
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0 if argv else 2
    if argv[0] == "keras2":
        return keras2_command()
    if argv[0] in ("record", "analyze"):
        from harness.record import commands
        return (commands.record_command if argv[0] == "record"
                else commands.analyze_command)(argv[1:])
    if argv[0] == "explore":
        return explore_command(argv[1:])
    if argv[0] != "run":
        top.error(f"unknown command {argv[0]!r}; the commands are `run`, `explore`, "
                  f"`record`, `analyze` and `keras2`")
    return run_command(argv[1:])


def keras2_command() -> int:
    """Print what gives Keras 2 beside the installed TensorFlow (tf_keras of
    its minor; on 2.15 its own keras), for
    ``pip install "$(python -m harness keras2)"``."""
    from harness.core import versions
    version = versions.installed_tensorflow()
    if version is None:
        print("harness: TensorFlow is not installed", file=sys.stderr)
        return 2
    print(versions.keras2_requirement(version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
