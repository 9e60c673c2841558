"""``harness record`` and ``harness analyze``: the recorder's command line.

``record`` exits with the script's own status; ``analyze`` exits 0 when the
files show a run that completed, 1 when they show another outcome (or a job
still running, or a task that left no files), and 2 for bad input: a
missing or empty directory, a torn or foreign file, one that is not a
regular file of the recording or is larger than its kind allows, a value
of the wrong type or out of range (:mod:`harness.record.files` reads a
recording as untrusted input), and with ``--require-all`` a task that left
no files.  Each problem is one line, with the characters a terminal would
act on escaped, as is everything else printed from the files.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from typing import List, Optional, Sequence, Tuple

from harness.errors import SettingError

PROG = "python -m harness"
# What follows each command's name on its usage line (and the top-level one's).
RECORD_USAGE = "--dir DIR [--timeout S] (SCRIPT | -m MODULE) [--] [ARG ...]"
ANALYZE_USAGE = "[--require-all] [--timeline PATH] DIR [DIR ...]"


def _record_parser(prog: str = PROG) -> argparse.ArgumentParser:
    from harness.record.recorder import DEFAULT_TIMEOUT
    p = argparse.ArgumentParser(
        prog=f"{prog} record", allow_abbrev=False, usage=f"{prog} record {RECORD_USAGE}",
        description="Run a training script in this process, as `python SCRIPT` would, with "
                    "the recorder on: this task's steps, calls of collective-launching "
                    "functions, TF_CONFIG and, on a dump, every thread's stack go to files "
                    "in DIR, for `harness analyze`. The exit status is the script's.")
    p.add_argument("--dir", required=True, metavar="DIR",
                   help="the directory for this task's files (made if missing)")
    p.add_argument("--timeout", default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds without progress before a dump is written; 0: only on "
                        f"SIGUSR2 and at exit (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("-m", dest="module", metavar="MODULE",
                   help="run this module as `python -m MODULE` does, instead of a script")
    return p


def split_record(argv: Sequence[str]) -> Tuple[List[str], Optional[str], Optional[str], List[str]]:
    """(recorder options, script, module, script arguments): the options
    end at the script (the first word that is neither an option nor its
    value), at ``-m MODULE``, or at ``--``."""
    argv, i = list(argv), 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest = argv[i + 1:]
            return argv[:i], (rest[0] if rest else None), None, rest[1:]
        if word == "-m":
            if i + 1 >= len(argv):
                return argv, None, None, []
            rest = argv[i + 2:]
            return argv[:i], None, argv[i + 1], rest[1:] if rest[:1] == ["--"] else rest
        if word.startswith("-"):
            i += 1 if "=" in word or word in ("-h", "--help") else 2
            continue
        rest = argv[i + 1:]
        return argv[:i], word, None, rest[1:] if rest[:1] == ["--"] else rest
    return argv, None, None, []


def _user_frames(tb):
    """The traceback from the script's own frames on, as `python SCRIPT` prints it."""
    # runpy is frozen from Python 3.11 on: its frames' file is "<frozen runpy>".
    skip = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), runpy.__file__,
            "<frozen runpy>")
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(skip):
        tb = tb.tb_next
    return tb


def record_command(argv: Sequence[str], prog: str = PROG) -> int:
    from harness.record.recorder import install
    from harness.record import files
    from harness.record.settings import check_dir, check_timeout
    from harness.worker.main import worker_error
    from harness.worker.script import ScriptMain, exit_ok
    options, script, module, args = split_record(argv)
    parser = _record_parser(prog)
    ns = parser.parse_args(options)
    if script is None and module is None:
        parser.error("a script (or -m MODULE) to run is needed")
    if script is not None and not os.path.isfile(script):
        parser.error(f"SCRIPT: {script!r}: no such file (looked for "
                     f"{os.path.abspath(script)!r})")
    try:
        recorder = install(check_dir(ns.dir, "--dir"), check_timeout(ns.timeout, "--timeout"))
    except SettingError as e:
        parser.error(str(e))
    except OSError as e:
        parser.error(f"--dir: cannot make {e.filename or ns.dir}: {e.strerror}")
    main = ScriptMain(path=os.path.abspath(script) if script else None, argv=tuple(args),
                      module=module, cwd=os.getcwd())
    try:
        main()
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if exit_ok(e.code) else 1)
        recorder.exited(files.EXITED, status)
        raise
    except BaseException as e:
        recorder.exited(files.RAISED, 1, worker_error(e))
        if isinstance(e, KeyboardInterrupt):
            raise
        traceback.print_exception(type(e), e, _user_frames(e.__traceback__))
        return 1
    recorder.exited(files.RETURNED, 0)
    return 0


def _analyze_parser(prog: str = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"{prog} analyze", allow_abbrev=False, usage=f"{prog} analyze {ANALYZE_USAGE}",
        description="Read the recorder's files of every task of a job (one directory, or "
                    "one per host) and print the verdict the harness gives in a test: who, "
                    "which step, which call each worker is blocked in, their stacks. Exit "
                    "status 0: completed; 1: another outcome; 2: bad input.")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="a directory of recorder files")
    p.add_argument("--require-all", action="store_true",
                   help="a task that left no files is bad input (exit status 2); by default "
                        "the others are analysed, and the verdict keeps the missing ones "
                        "among its candidates")
    p.add_argument("--timeline", metavar="PATH",
                   help="also write PATH.trace.json (Perfetto) and PATH.svg, the timeline a "
                        "test's RunResult.timeline() writes")
    return p


def shown(text: str, keep: str = "\n\t") -> str:
    """``text`` with every character a terminal would act on or break a
    line at (but those in ``keep``) written as an escape: what the files
    hold is printed, never obeyed."""
    return "".join(c if c.isprintable() or c in keep else ascii(c)[1:-1] for c in text)


def _say(text: str) -> None:
    print(shown(text))


def _bad_input(problems: Sequence[str]) -> int:
    for line in problems:
        print(f"harness analyze: {shown(line, keep='')}", file=sys.stderr)
    return 2


def _write_timeline(path: str, analysis, verdict) -> str:
    """Write the recording's timeline to ``PATH.trace.json`` and ``PATH.svg``
    and say their names; else the one line that says why it could not be
    written (neither file is left behind: see
    :func:`harness.report.timeline.write_panels`)."""
    from harness.report import timeline
    culprits = tuple(analysis.positions.index(c) for c in verdict.culprits
                     if c in analysis.positions)
    try:
        panel = timeline.panel(analysis.observation, verdict.outcome, culprits, verdict.text,
                               ambiguous=verdict.ambiguous)
        written = timeline.write_panels([panel], path)
    except Exception as e:   # any failure: the one line, not a traceback
        return f"{path}: the timeline could not be written: {type(e).__name__}: {e}"
    for name in written:
        _say(f"timeline: {name}")
    return ""


def analyze_command(argv: Sequence[str], prog: str = PROG) -> int:
    from harness.diagnosis.observations import Outcome
    from harness.record import analyze, files, judge
    ns = _analyze_parser(prog).parse_args(list(argv))
    tasks, problems = files.read_dirs(ns.dirs)
    if problems:
        return _bad_input(problems)
    analysis = analyze.observe(tasks, ns.require_all)
    if analysis.problems:
        return _bad_input(analysis.problems)
    for note in analysis.notes:
        _say(f"note: {note}")
    if analysis.observation is None:
        _say(f"RUNNING: {analysis.running}")
        return 1
    obs = analysis.observation
    verdict = judge.verdict(analysis)
    _say(verdict.text)
    if analysis.ending:
        _say(analysis.ending)
    for w in obs.workers:
        if w.stack:
            _say(f"--- worker {analysis.positions[w.index]} ({analysis.tasks[w.index]}): its "
                 f"stacks at the last dump ---\n{w.stack.rstrip()}")
    if ns.timeline:
        problem = _write_timeline(ns.timeline, analysis, verdict)
        if problem:
            print(f"harness analyze: {shown(problem, keep='')}", file=sys.stderr)
            return 2
    return 0 if verdict.outcome == Outcome.COMPLETED and not analysis.missing else 1
