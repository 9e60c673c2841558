"""Fixtures and checks shared by the scenario catalogue.

* ``scenario_run``: runs a scenario's ``fn`` on ``mwms_cluster`` once per
  key and cluster size, so that a scenario test and its separate culprit
  check (see ``scenarios/meta.py``) share one run instead of paying for two.
* After each scenario test's body has passed, its last run must have ended
  as its ``@scenario(outcome=...)`` declares: the catalogue's table
  (docs/scenarios.md) is rendered from those declarations, so the table
  cannot drift from what the tests see.
* After each scenario test's body has passed, none of its completed runs
  may name a straggler unless its ``@scenario(straggler=True)`` says it has
  one: a balanced run names none (``harness.diagnosis.stragglers``).
* After each scenario test's body has passed, each of its runs' verdict
  must name the rule that decided (a row of ``RULES``) and the stages that
  changed it after (rows of ``STAGES``, in the table's order).
* After each test, no TensorFlow worker may be left running.
* Under pytest-xdist's ``--dist loadgroup`` (the default here: pyproject's
  ``addopts``), each scenario file is one group, so a scenario and its
  culprit check share their run in one pytest process.
"""
from __future__ import annotations

import json
import os

import pytest

from harness.diagnosis.echoes import short_type
from scenarios.meta import culprit_check_of, declared

_LAST_RESULT = "_mwms_scenario_last_result"
HERE = os.path.dirname(os.path.abspath(__file__))


def _group(item) -> str:
    return os.path.basename(str(item.path))


def _plain_nodeid(item) -> str:
    """The test's node id without the group xdist adds to it under loadgroup."""
    suffix = "@" + _group(item)
    return item.nodeid[:-len(suffix)] if item.nodeid.endswith(suffix) else item.nodeid


@pytest.hookimpl(tryfirst=True)   # before xdist reads the groups
def pytest_collection_modifyitems(items):
    """Each scenario file is one xdist group (the session's other tests are
    not touched).  Every test of the catalogue is marked ``catalogue``, and
    ``by_version`` where what it sees differs by TensorFlow version: its
    ``@scenario(on=...)``, a ``by_version`` mark of its own (an error's
    text, say), or the scenario whose culprit check it is.  CI's run on the
    oldest TensorFlow takes those (``-m "not catalogue or by_version"``)."""
    ours = [item for item in items if os.path.dirname(str(item.path)) == HERE]
    by_version = {_plain_name(item) for item in ours if _differs_by_version(item)}
    for item in ours:
        item.add_marker(pytest.mark.xdist_group(_group(item)))
        item.add_marker(pytest.mark.catalogue)
        check_of = culprit_check_of(getattr(item, "function", None))
        scenario_name = f"{item.path}::{check_of}" if check_of else _plain_name(item)
        if scenario_name in by_version and item.get_closest_marker("by_version") is None:
            item.add_marker(pytest.mark.by_version)


def _plain_name(item) -> str:
    return f"{item.path}::{getattr(item, 'originalname', item.name)}"


def _differs_by_version(item) -> bool:
    meta = getattr(getattr(item, "function", None), "scenario", None)
    return item.get_closest_marker("by_version") is not None or bool(meta and meta.elsewhere)


@pytest.fixture(autouse=True)
def _no_worker_left_behind(no_leftover_workers):
    """Every scenario: no TensorFlow process of it outlives it (conftest.py at the root)."""


@pytest.fixture(scope="session")
def _scenario_run_cache():
    return {}


@pytest.fixture
def scenario_run(request, mwms_cluster, _scenario_run_cache):
    """``scenario_run(key, fn, *args, **run_kwargs)``: ``mwms_cluster.run(fn, ...)``,
    cached per ``key`` and number of workers for the whole session.

    ``run_kwargs`` are ``run()``'s (``kwargs=``, ``timeout=``, ``faults=``,
    ``grace=``); a key must always be used with the same ones.  Use it for a
    run whose result a separate culprit check also reads.
    ``scenario_run.shared(key, make)`` caches what ``make()`` returns instead
    (a ``RunResult`` that takes more than one run to make, say).
    """
    def cache_key(key):
        return (request.module.__name__, key, mwms_cluster.num_workers)

    def shared(key, make):
        if cache_key(key) not in _scenario_run_cache:
            _scenario_run_cache[cache_key(key)] = make()
        result = _scenario_run_cache[cache_key(key)]
        setattr(request.node, _LAST_RESULT, result)
        return result

    def run(key, fn, *args, **run_kwargs):
        return shared(key, lambda: mwms_cluster.run(fn, *args, **run_kwargs))

    run.shared = shared
    return run


def _last_result(item):
    result = getattr(item, _LAST_RESULT, None)
    if result is not None:
        return result
    cluster = getattr(item, "funcargs", {}).get("mwms_cluster")
    if cluster is not None and cluster.runs:
        return cluster.runs[-1]
    return None


# Where each scenario's outcome is written as a JSON line, for the table of
# outcomes per TensorFlow version (python -m harness.bench.versions).
OUTCOMES_FILE = "MWMS_SCENARIO_OUTCOMES"


def _raised_types(result) -> set:
    """The short type names of what the run's workers raised."""
    return {short_type(w.exception.type_name) for w in result.workers
            if w.exception is not None}


def _record_outcome(item, result, passed: bool) -> None:
    path = os.environ.get(OUTCOMES_FILE)
    if not path or result is None:
        return
    raised = sorted(_raised_types(result))
    line = json.dumps({"test": _plain_nodeid(item), "outcome": str(result.outcome),
                       "error": result.error, "raised": raised,
                       "workers": len(result.workers), "passed": passed,
                       "stragglers": list(result.stragglers),
                       "ended_by": str(getattr(result.observation, "ended_by", ""))})
    with open(path, "a") as f:   # one line per write: xdist workers append side by side
        f.write(line + "\n")


def _check_declared(item, meta) -> None:
    """The test's last run ended as its ``@scenario`` declares, or an AssertionError."""
    result = _last_result(item)
    if result is None:
        raise AssertionError(f"{item.name}: a @scenario test must run its scenario on "
                             f"mwms_cluster (directly or through scenario_run)")
    if result.outcome not in meta.outcomes:
        raise AssertionError(
            f"{item.name}: its last run ended {result.outcome!r}, but @scenario declares "
            f"{' or '.join(meta.outcomes)} (the catalogue in docs/scenarios.md says so too)\n{result.report()}")
    # The declared error is what a failed run raises; a scenario that may
    # also crash (TensorFlow aborting the process) raises nothing then.
    if meta.error is not None and (result.outcome == "failed" or len(meta.outcomes) == 1):
        raised = _raised_types(result)
        if meta.error not in raised and result.error != meta.error:
            raise AssertionError(
                f"{item.name}: @scenario declares error {meta.error!r}, but the workers "
                f"raised {sorted(raised) or 'nothing'}\n{result.report()}")


def _runs(item) -> list:
    """Every run the test made or read (its own and a shared one)."""
    cluster = getattr(item, "funcargs", {}).get("mwms_cluster")
    runs = list(cluster.runs) if cluster is not None else []
    shared = getattr(item, _LAST_RESULT, None)
    if shared is not None and all(shared is not r for r in runs):
        runs.append(shared)
    return runs


def _completed_runs(item) -> list:
    """Every completed run the test made or read."""
    return [r for r in _runs(item) if r.outcome == "completed"]


def _check_deadlocks_only_in_hangs(item, meta) -> None:
    """A run the ledgers declared a certain deadlock belongs to a scenario
    that hangs: in any other (one that completes, or fails by an error of
    TensorFlow's own) the proof was wrong."""
    if "hang" in meta.outcomes:
        return
    for result in _runs(item):
        if getattr(result.observation, "ended_by", None) == "deadlock":
            raise AssertionError(
                f"{item.name}: a run was declared a certain deadlock, but @scenario declares "
                f"{' or '.join(meta.outcomes)}\n{result.report()}")


def _check_verdict_made_by_the_tables(item) -> None:
    """Every run's verdict was decided by a rule of the table, and changed
    after only by stages of the table, in its order."""
    from harness.diagnosis import RULE_NAMES, STAGES
    rules, stages = RULE_NAMES, [s.name for s in STAGES]
    for result in _runs(item):
        for attempt in (*result.attempts, result):
            v = attempt.verdict
            recorded = [s for s in v.stages if s in stages]
            if v.rule not in rules or recorded != list(v.stages) or \
                    sorted(recorded, key=stages.index) != recorded:
                raise AssertionError(
                    f"{item.name}: a verdict's rule {v.rule!r} and stages {v.stages} are not "
                    f"rows of RULES and STAGES in order\n{result.report()}")


def _check_no_straggler(item, meta) -> None:
    """No completed run of a scenario without a straggler names one."""
    if meta.straggler:
        return
    for result in _completed_runs(item):
        if result.stragglers:
            raise AssertionError(
                f"{item.name}: a completed run names the straggler{'s' if len(result.stragglers) > 1 else ''} "
                f"{', '.join(map(str, result.stragglers))}, but @scenario does not say "
                f"straggler=True\n{result.report()}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    fn = getattr(item, "function", None)
    meta = declared(fn)
    passed = False
    try:
        try:
            outcome = yield  # re-raises when the test body failed, skipped or xfailed
        except pytest.skip.Exception:
            passed = True
            raise
        if meta is not None:
            _check_declared(item, meta)
            _check_no_straggler(item, meta)
            _check_deadlocks_only_in_hangs(item, meta)
            _check_verdict_made_by_the_tables(item)
        elif culprit_check_of(fn) is None and item.name.startswith("test_"):
            raise AssertionError(f"{item.name}: every test in scenarios/ is a @scenario or a "
                                 f"@culprit_check (see scenarios/meta.py)")
        passed = True
        return outcome
    finally:
        if meta is not None:
            _record_outcome(item, _last_result(item), passed)
