"""The metadata every scenario test carries: the single source of truth for
the catalogue's table (docs/scenarios.md) and for the outcome the test must see.

``@scenario(outcome=..., source=..., fixed_by=...)`` on a test function:

``outcome``
    What the scenario's run ends as on every TensorFlow minor that ``on``
    does not name: one of
    ``completed``, ``failed``, ``crashed``, ``hang``, or a tuple of them when
    TensorFlow is not deterministic here (the docstring must then say so).
    ``scenarios/conftest.py`` checks, after the test body passed, that the
    test's last ``mwms_cluster.run`` ended as declared, so the table cannot
    drift from what the tests see.
``source``
    Where users hit it: a TensorFlow or Keras issue (``tensorflow#34568``,
    ``keras#20585``), a rule of the seed article (``seed rule 2``) or its
    example, or the MWMS documentation.
``fixed_by``
    For a broken variant: the name of the test in the same file that shows
    the fix and completes, or :data:`NO_FIX` when no change makes it
    complete (a frozen worker: the best a job can do is fail fast, as the
    docstring's ``Fix:`` says).  None for a fixed variant (which must
    declare ``completed``).
``error``
    Optional: the error type the run's failing workers raise (shown in the
    table and checked after the run).
``straggler``
    Optional, True for a scenario with a straggler (a worker the others
    wait for at every step, see ``harness.diagnosis.stragglers``): any
    other scenario's completed runs must name none, which
    ``scenarios/conftest.py`` checks after the test body passed.
``on``
    Optional: where another TensorFlow minor ends otherwise, its outcome
    and error there, keyed by the minor or a range of minors:
    ``on={"2.15": dict(outcome="completed")}``,
    ``on={"2.15-2.17": dict(outcome="failed", error="ValueError")}``.
    ``outcome`` and ``error`` are those of every other minor of the range
    (``harness.core.versions``); the docstring's ``TensorFlow:`` paragraph
    says what differs and why.

A scenario's culprit expectation lives in the scenario test, or in a
separate test decorated ``@culprit_check("test_scenario_name")`` that
shares its run (``scenario_run`` in ``scenarios/conftest.py``).  A culprit
check asserts strictly what holds at each worker count: the culprit alone
(``assert_culprit``), or, at a count where the evidence really is
symmetric, that the diagnosis cannot tell and names exactly the candidates
(``assert_cannot_tell``).  It is never marked xfail.

Every scenario test's docstring has a first line (the mistake, or for a
fixed variant what it does right) and three labelled paragraphs:
``TensorFlow:`` (what TensorFlow does), ``Source:`` (where users hit it)
and ``Fix:``.  ``tests/unit/test_catalogue.py`` enforces all of this.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Tuple, Union

from harness.core import versions
from harness.core.versions import Minor
from harness.diagnosis.observations import OUTCOMES

# fixed_by for a broken variant that no fix turns into a completed run.
NO_FIX = "no fix completes"

# Keras 2 on the installed TensorFlow: tf_keras (TF_USE_LEGACY_KERAS=1) from
# 2.16, plain tf.keras on 2.15 (see harness.core.versions).  The scenarios
# that say "tf_keras" mean this.
INSTALLED_MINOR = versions.installed_minor()
KERAS_2 = versions.keras2_env(INSTALLED_MINOR)
KERAS_2_PACKAGE = versions.keras2_package(INSTALLED_MINOR)
DEFAULT_IS_KERAS_3 = versions.keras_of(INSTALLED_MINOR, legacy=False) == "keras3"


def use_keras2(monkeypatch) -> None:
    """Make the run's workers see Keras 2 as ``tf.keras``."""
    for name, value in KERAS_2.items():
        monkeypatch.setenv(name, value)


DOC_LABELS = ("TensorFlow:", "Source:", "Fix:")


@dataclasses.dataclass(frozen=True)
class Scenario:
    outcomes: Tuple[str, ...]
    source: str
    fixed_by: Optional[str] = None
    error: Optional[str] = None
    # ((first minor, last minor), outcomes, error) where a minor differs
    elsewhere: Tuple[Tuple[Tuple[Minor, Minor], Tuple[str, ...], Optional[str]], ...] = ()
    straggler: bool = False

    def on(self, minor: Minor) -> "Scenario":
        """What this scenario ends as on TensorFlow ``minor``."""
        for (first, last), outcomes, error in self.elsewhere:
            if first <= minor <= last:
                return dataclasses.replace(self, outcomes=outcomes, error=error, elsewhere=())
        return self

    @property
    def variant(self) -> str:
        return "broken" if self.fixed_by else "fixed"

    @property
    def outcome_text(self) -> str:
        """``failed (ValueError)``, and where another minor differs
        ``failed (ValueError); 2.15: completed``."""
        text = _outcome_words(self.outcomes, self.error)
        for (first, last), outcomes, error in self.elsewhere:
            span = ".".join(map(str, first)) + ("" if first == last else
                                                "-" + ".".join(map(str, last)))
            text += f"; {span}: {_outcome_words(outcomes, error)}"
        return text


def _outcome_words(outcomes: Tuple[str, ...], error: Optional[str]) -> str:
    return " or ".join(outcomes) + (f" ({error})" if error else "")


def _outcomes(outcome: Union[str, Tuple[str, ...]]) -> Tuple[str, ...]:
    outcomes = (outcome,) if isinstance(outcome, str) else tuple(outcome)
    bad = [o for o in outcomes if o not in OUTCOMES]
    if not outcomes or bad:
        raise ValueError(f"@scenario: outcome must be among {OUTCOMES}, got {outcome!r}")
    return outcomes


def minors(spec: str) -> Tuple[Minor, Minor]:
    """``"2.15"`` -> ((2, 15), (2, 15)); ``"2.15-2.17"`` -> ((2, 15), (2, 17))."""
    first, _, last = spec.partition("-")
    try:
        span = versions.minor_of(first), versions.minor_of(last or first)
    except ValueError:
        span = None
    if span is None or not (versions.supported(span[0]) and versions.supported(span[1])) \
            or span[0] > span[1]:
        raise ValueError(f"@scenario: on={spec!r} is not a range of minors within "
                         f"{versions.range_text()}")
    return span


def scenario(outcome: Union[str, Tuple[str, ...]], source: str,
             fixed_by: Optional[str] = None, error: Optional[str] = None,
             on: Optional[Dict[str, dict]] = None, straggler: bool = False):
    """Mark a test function as a catalogue scenario (see the module docstring)."""
    outcomes = _outcomes(outcome)
    if not source or not isinstance(source, str):
        raise ValueError("@scenario: source is required")
    if fixed_by is None and outcomes != ("completed",):
        raise ValueError("@scenario: a fixed variant (no fixed_by) must declare "
                         "outcome='completed'")
    elsewhere = tuple((minors(spec), _outcomes(there["outcome"]), there.get("error"))
                      for spec, there in (on or {}).items())
    meta = Scenario(outcomes, source, fixed_by, error, elsewhere, straggler)

    def mark(fn):
        fn.scenario = meta
        return fn
    return mark


def declared(fn, minor: Optional[Minor] = None) -> Optional[Scenario]:
    """``fn``'s scenario, as it ends on TensorFlow ``minor`` (the installed
    one by default)."""
    meta = getattr(fn, "scenario", None)
    if meta is None:
        return None
    return meta.on(INSTALLED_MINOR if minor is None else minor)


def culprit_check(scenario_test: str):
    """Mark a test as the culprit check of the scenario test ``scenario_test``
    (in the same file); it is not a scenario of its own."""
    def mark(fn):
        fn.culprit_check_of = scenario_test
        return fn
    return mark


def culprit_check_of(fn) -> Optional[str]:
    return getattr(fn, "culprit_check_of", None)


def culprit_from_three(result, worker: int):
    """The culprit check of a scenario whose evidence is symmetric with 2
    workers: "cannot tell" between the two at N = 2, ``worker`` alone from
    3 up (a majority).  Returns the result."""
    if len(result.workers) == 2:
        return result.assert_cannot_tell([0, 1])
    return result.assert_culprit(worker)
