"""The command line, for people outside pytest: ``harness run`` (or
``python -m harness run``).

::

    harness run -n 3 --timeout 30 --fault "Crash(worker=1, step=5)" train.py -- --epochs 2
    harness run -m package.train -- --epochs 2
    harness explore -n 3 --restarts 1 --budget 120 train.py -- --epochs 2
    harness record --dir DIR -- train.py --epochs 2
    harness analyze DIR [DIR ...]
    pip install "$(harness keras2)"

``run`` starts one cluster, runs the script (or module) on every worker as
``Cluster.run_script`` does, prints what each worker wrote (each attempt's
apart, with its time, when the run restarted), the diagnosis, then one
line saying how the run ended and how long it and each attempt took.
``explore`` searches for a plan of faults the script does not survive
(:meth:`harness.controller.cluster.Cluster.explore`), with a live status
line, and exits 1 when it found one, printed as a ``faults=[...]`` line;
``record`` and ``analyze`` are the job recorder's
(:mod:`harness.record.commands`); ``keras2`` prints what gives Keras 2
beside the installed TensorFlow (tf_keras of the same minor; on 2.15 its
own ``keras``).  ``run`` exits 0 only when the outcome is the one
``--expect`` names (``completed`` by default), 1 when it is another, and 2
for a usage error (a bad option value, a bad fault, a missing script),
before any process starts.

The options are the pytest plugin's, declared once in
:data:`harness.settings.OPTIONS`, without the ``mwms-`` prefix (``--workers``
or ``-n``, ``--timeout``, and so on for each), with the same defaults and
the same checks; an error names the flag as given here.  ``--fault``
takes a fault of :mod:`harness.faults` as its constructor call (the form a
fault prints as), read by :func:`parse_fault`, which evaluates nothing.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from harness import faults as faults_module
from harness import plan as plan_module
from harness import faults_text
from harness.diagnosis.observations import OUTCOMES, Outcome
from harness.errors import HarnessError, UsageError
from harness.record.commands import ANALYZE_USAGE, RECORD_USAGE
from harness.report.console import StatusLine, format_search, output_lines, timing
from harness.report.pytest_report import timeline_stem, wants_timeline
from harness.settings import OPTIONS, Option, RunSettings, read_settings
from harness.validators import DEFAULT_MAX_FAULTS, parse_choice

if TYPE_CHECKING:
    from harness.controller.cluster import Cluster
    from harness.controller.scripts import ScriptMain
    from harness.result import RunResult

PROG = "python -m harness"
SCRIPT_USAGE = "[options] (SCRIPT | -m MODULE) [--] [ARG ...]"
# Options of `run` that take a value: the scan that finds where the script
# starts skips their values.
_VALUE_FLAGS = {"-n", "--fault", "--expect", "--budget", "--shrink-budget", "--property",
                "--kinds", "--max-faults", "--seed", "--reproduce", "--order",
                *(o.where("cli") for o in OPTIONS)}


@dataclasses.dataclass(frozen=True)
class Command:
    """One command: what follows its name on the usage line, and what it does."""

    usage: str
    summary: str


COMMANDS: Dict[str, Command] = {
    "run": Command(SCRIPT_USAGE, "run a script (or module) on an N-worker "
                                 "MultiWorkerMirroredStrategy cluster; print the diagnosis"),
    "explore": Command(SCRIPT_USAGE, "search for a fault the script does not survive"),
    "record": Command(RECORD_USAGE, "run one task of a real job with the recorder on"),
    "analyze": Command(ANALYZE_USAGE, "read the recorder's files of a job; print the verdict"),
    "keras2": Command("", "print what gives Keras 2 beside the installed TensorFlow"),
}


def program_name(argv0: str) -> str:
    """How the user started the command line: ``harness`` (the console
    script) or ``python -m harness``, for the usage lines and the replay
    command."""
    return "harness" if os.path.basename(argv0) == "harness" else PROG


def _size(settings: RunSettings) -> str:
    """``2 workers``, or ``4 tasks (chief:1,worker:2,evaluator:1)``."""
    if settings.cluster is None:
        return f"{settings.workers} workers"
    return f"{settings.workers} tasks ({settings.cluster})"

def parse_fault(text: str) -> faults_module.Fault:
    """A fault from its constructor call, e.g. ``"Crash(worker=1, step=5)"``
    (:func:`harness.faults_text.parse`, which evaluates nothing)."""
    return faults_text.parse(text, "--fault")


def _parser(command: str = "run", prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{prog} {command}", allow_abbrev=False,
        usage=f"{prog} {command} {COMMANDS[command].usage}",
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
    p.add_argument("--budget", default="60", metavar="SECONDS",
                   help="seconds of search (default 60)")
    p.add_argument("--shrink-budget", default=None, metavar="SECONDS",
                   help="seconds to shrink a failing plan (default: the budget)")
    p.add_argument("--kinds", default=None, metavar="KIND,KIND",
                   help="the fault kinds to draw, e.g. Crash,Pause (default: for survives "
                        "Crash,RaiseError,Delay,Pause,Preempt; for detected every "
                        "step-keyed kind but DiskFull, TornWrite, LostRename and SlowWrite, "
                        "which act on the job's files)")
    p.add_argument("--max-faults", default=str(DEFAULT_MAX_FAULTS), metavar="N",
                   help=f"the most faults in one plan (default {DEFAULT_MAX_FAULTS}; with 2 and "
                        f"--restarts 2 or more, a second fault acts during recovery)")
    p.add_argument("--seed", default=None, metavar="N",
                   help="draw the same plans as a search with this seed (default: a fresh "
                        "seed, printed)")
    p.add_argument("--reproduce", default="3", metavar="N",
                   help="run the smallest failing plan N times more, to tell a failure that "
                        "reproduces from a race (default 3)")
    p.add_argument("--order", default="guided", metavar="ORDER",
                   help="guided: the search's draws, spread over the job's space and led by "
                        "its writes and restarts; uniform: each plan's kind, worker and step "
                        "drawn uniformly, the baseline (default guided)")


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
        flags = ["-n"] if o.name == "workers" else []
        p.add_argument(*flags, o.where("cli"), dest=o.field, metavar=o.metavar, default=None,
                       help=f"{o.help_for('cli')} (default {o.default_text})".replace("%", "%%"))


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


@dataclasses.dataclass
class _Job:
    """What ``run`` and ``explore`` have once their arguments are checked."""

    ns: argparse.Namespace
    settings: RunSettings
    cluster: Cluster
    main: ScriptMain
    what: str                  # the script, or -m MODULE
    script_args: List[str]


def _job(parser: argparse.ArgumentParser, argv: Sequence[str],
         check: Callable[[argparse.Namespace, RunSettings], None]) -> _Job:
    """The command's arguments checked, its cluster made and its script
    found, before any worker starts; a usage error exits 2 (argparse's
    ``error``), naming the flag or the SCRIPT as given."""
    try:
        options, script, module, script_args = split_command(argv)
        ns = parser.parse_args(options)   # --help exits 0 here; bad syntax exits 2
        if script is None and ns.module is None and module is None:
            raise UsageError("give a script, or -m MODULE")
        module = module or ns.module
        settings = settings_from_args(ns)
        check(ns, settings)
        from harness.launch.state_dir import check_state_dir
        check_state_dir(settings.state_dir, "--state-dir")
        from harness.controller.cluster import Cluster
        from harness.controller.scripts import script_main
        cluster = Cluster(settings)
        main = script_main(script, script_args, module=module,
                           start_method=cluster.launcher.start_method,
                           where="SCRIPT", module_where=f"-m {module}")
    except HarnessError as e:
        parser.error(str(e))   # prints the usage, exits 2
    return _Job(ns, settings, cluster, main, f"-m {module}" if module else str(script),
                script_args)


def write_timeline(result: RunResult, stem: str) -> None:
    """Write the run's timeline and say where; one that cannot be written
    is a warning's line, and the run's verdict and exit status stand."""
    try:
        paths = result.timeline(stem)
    except Exception as e:   # a report never changes what the run decided
        print(f"harness: warning: the timeline could not be written to {stem}: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return
    for path in paths:
        print(f"harness: timeline: {path}")


def run_command(argv: Sequence[str], prog: str = PROG) -> int:
    plan: list = []

    def check(ns: argparse.Namespace, settings: RunSettings) -> None:
        ns.expect = parse_choice(ns.expect, "--expect", OUTCOMES)
        plan.extend(parse_fault(f) for f in ns.fault)
        try:
            plan_module.validate(plan, settings.workers, settings.restarts, settings.shape)
        except faults_module.FaultError as e:
            raise UsageError(f"--fault: {e}") from None

    job = _job(_parser("run", prog), argv, check)
    settings, what = job.settings, job.what
    print(f"harness: running {what} on {_size(settings)} (timeout {settings.timeout:g} s, "
          f"{settings.start_method}, {settings.devices})", flush=True)
    status = StatusLine()
    try:
        # A worker whose script ended exits, as a job's process does.
        result = job.cluster.run(job.main, faults=plan, check_replicas=job.ns.check_replicas,
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
        write_timeline(result, timeline_stem(settings.report_dir, what, 1))
    ok = result.outcome == job.ns.expect
    print(f"harness: {what} on {_size(settings)}: {result.outcome} in {timing(result)}; "
          f"expected {job.ns.expect}: {'ok' if ok else 'NOT OK'}", flush=True)
    return 0 if ok else 1


def _flag(name: str) -> str:
    """explore's setting ``name`` as this command line spells it: ``--shrink-budget``."""
    return "--" + name.replace("_", "-")


def explore_command(argv: Sequence[str], prog: str = PROG) -> int:
    """``harness explore``: :meth:`Cluster.explore` over a script."""
    from harness.explore import check_kinds, check_settings
    search: Dict[str, Any] = {}

    def check(ns: argparse.Namespace, settings: RunSettings) -> None:
        search.update(check_settings(dict(property=ns.property, budget=ns.budget,
                                          shrink_budget=ns.shrink_budget,
                                          max_faults=ns.max_faults, seed=ns.seed,
                                          reproduce=ns.reproduce, order=ns.order), _flag))
        search["kinds"] = check_kinds(ns.kinds, search["property"], "--kinds") \
            if ns.kinds else None

    job = _job(_parser("explore", prog), argv, check)
    settings, what = job.settings, job.what
    print(f"harness: exploring {what} on {_size(settings)} for {search['budget']:g} s "
          f"(property {search['property']}, restarts {settings.restarts})", flush=True)
    if search["property"] == "survives" and settings.restarts == 0:
        print("harness: with --restarts 0 nothing restarts the script, so 'survives' asks that "
              "it completes through every fault without one: any crash breaks it; give "
              "--restarts 1 to search its recovery", flush=True)
    status = StatusLine(format=format_search)
    try:
        found = job.cluster.explore(
            job.main, restarts=settings.restarts, check=False, on_return="exit",
            key=f"script {what} {' '.join(job.script_args)}", progress=status, **search)
    except KeyboardInterrupt:
        status.close()
        print("harness: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    except HarnessError as e:
        status.close()
        print(f"harness: error: {e}", file=sys.stderr)
        return 2
    status.close()
    print(found.summary())
    if found.failure is not None:
        which = "the run of that plan" if found.failure.plan else "the fault-free run"
        print(f"harness: what the workers printed in {which}:")
        for line in output_lines(found.failure.result):
            print(line)
        print(f"{which}:\n" + found.failure.result.diagnosis)
        print(f"harness: replay it with: {prog} run -n {settings.workers} --restarts "
              f"{settings.restarts} "
              + " ".join(f'--fault "{f!r}"' for f in found.failure.plan) + f" {what}"
              + (" -- " + " ".join(job.script_args) if job.script_args else ""))
    return 1 if found.failure is not None else 0


def _top_parser(prog: str) -> argparse.ArgumentParser:
    usage = "\n       ".join(f"{prog} {name} {c.usage}".rstrip() for name, c in COMMANDS.items())
    listing = "\n".join(f"  {name:<9}{c.summary}" for name, c in COMMANDS.items())
    return argparse.ArgumentParser(
        prog=prog, usage=usage, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"pytest-mwms outside pytest.\n\ncommands:\n{listing}\n\n"
                    f"`{prog} COMMAND --help` lists a command's options.")


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """The command line: ``argv`` (``sys.argv[1:]``) as ``prog`` (how it
    was started: :func:`program_name`) says it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or program_name(sys.argv[0])
    top = _top_parser(prog)
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0 if argv else 2
    if argv[0] == "keras2":
        return keras2_command()
    if argv[0] in ("record", "analyze"):
        from harness.record import commands
        return (commands.record_command if argv[0] == "record"
                else commands.analyze_command)(argv[1:], prog)
    if argv[0] == "explore":
        return explore_command(argv[1:], prog)
    if argv[0] != "run":
        top.error(f"unknown command {argv[0]!r}; the commands are "
                  f"{', '.join(COMMANDS)}")
    return run_command(argv[1:], prog)


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
