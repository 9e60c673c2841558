"""The scenario catalogue as data: collect it, check it, render its documentation page.

Each scenario test carries its metadata (``@scenario`` from
``scenarios/meta.py``) and a structured docstring; this module reads them
without starting any worker or importing TensorFlow.

    python scenarios/catalogue.py            # print the table
    python scenarios/catalogue.py --write    # rewrite docs/scenarios.md's region
    python scenarios/catalogue.py --check    # exit 1 if the page or metadata is off

``tests/unit/test_catalogue.py`` runs the same checks.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import os
import sys
from typing import Iterable, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # run as a script: make ``scenarios`` importable
    sys.path.insert(0, ROOT)

from harness.core import versions  # noqa: E402
from scenarios.meta import NO_FIX, DOC_LABELS, culprit_check_of, declared  # noqa: E402

DOCS = os.path.join(ROOT, "docs", "scenarios.md")
START, END = "<!-- scenarios:start -->", "<!-- scenarios:end -->"
# The catalogue's order, from the seed article's rules to peer faults and
# Keras: files not listed here follow, by name.
FILE_ORDER = ("test_seed.py", "test_tf_config.py", "test_scope.py", "test_collectives.py",
              "test_data.py", "test_chief_only.py", "test_control_flow.py",
              "test_peer_faults.py", "test_keras.py", "test_tutorials.py")
MEASURED_WITH = "TensorFlow 2.21.0, Keras 3.15.1, tf_keras 2.21.0"
MAX_SUMMARY = 200


@dataclasses.dataclass(frozen=True)
class Entry:
    """One scenario test, as the table shows it."""

    file: str
    name: str
    variant: str            # "broken" or "fixed"
    outcomes: Tuple[str, ...]
    outcome_text: str
    source: str
    fixed_by: Optional[str]
    summary: str            # the docstring's first paragraph: the mistake in one line


def scenario_files() -> List[str]:
    names = sorted(f for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py"))
    ordered = [f for f in FILE_ORDER if f in names]
    return ordered + [f for f in names if f not in ordered]


def _module(filename: str):
    return importlib.import_module(f"scenarios.{filename[:-3]}")


def _tests(module) -> list:
    """The module's test functions, in source order."""
    found = [obj for name, obj in vars(module).items()
             if name.startswith("test_") and inspect.isfunction(obj)
             and obj.__module__ == module.__name__]
    return sorted(found, key=lambda fn: fn.__code__.co_firstlineno)


def _paragraphs(doc: str) -> List[str]:
    text = inspect.cleandoc(doc or "")
    return [" ".join(line.strip() for line in p.splitlines()) for p in text.split("\n\n")
            if p.strip()]


def summary(fn) -> str:
    paragraphs = _paragraphs(fn.__doc__)
    return paragraphs[0] if paragraphs else ""


def collect() -> List[Entry]:
    """Every scenario of every file, in catalogue order."""
    entries = []
    for filename in scenario_files():
        for fn in _tests(_module(filename)):
            meta = declared(fn, versions.NEWEST)
            if meta is None:
                continue
            entries.append(Entry(
                file=filename, name=fn.__name__, variant=meta.variant, outcomes=meta.outcomes,
                outcome_text=fn.scenario.outcome_text, source=meta.source, fixed_by=meta.fixed_by,
                summary=summary(fn)))
    return entries


def _marks(fn) -> dict:
    return {m.name: m for m in getattr(fn, "pytestmark", [])}


def problems() -> List[str]:
    """Everything that breaks the catalogue's rules (see ``scenarios/meta.py``)."""
    out = []
    for filename in scenario_files():
        tests = {fn.__name__: fn for fn in _tests(_module(filename))}
        for name, fn in tests.items():
            where = f"{filename}::{name}"
            meta, checks = declared(fn, versions.NEWEST), culprit_check_of(fn)
            if meta is None and checks is None:
                out.append(f"{where}: neither @scenario(...) nor @culprit_check(...)")
                continue
            if "timeout" not in _marks(fn):
                out.append(f"{where}: no @pytest.mark.timeout(...)")
            if "mwms_cluster" not in inspect.signature(fn).parameters:
                out.append(f"{where}: does not take the mwms_cluster fixture")
            if checks is not None:
                target = tests.get(checks)
                if target is None or declared(target, versions.NEWEST) is None:
                    out.append(f"{where}: @culprit_check names {checks!r}, not a scenario "
                               f"of {filename}")
                if _marks(fn).get("xfail") is not None:
                    out.append(f"{where}: a culprit check is never xfail: assert what holds at "
                               f"each N (assert_culprit, or assert_cannot_tell where the "
                               f"evidence is symmetric)")
                continue
            out.extend(f"{where}: {p}" for p in docstring_problems(fn))
            if meta.fixed_by not in (None, NO_FIX):
                fixed = tests.get(meta.fixed_by)
                if fixed is None or declared(fixed, versions.NEWEST) is None or declared(fixed, versions.NEWEST).fixed_by:
                    out.append(f"{where}: fixed_by={meta.fixed_by!r} is not a fixed scenario "
                               f"of {filename}")
            if len(meta.outcomes) > 1 and "deterministic" not in (fn.__doc__ or "").lower():
                out.append(f"{where}: several outcomes declared, but the docstring does not "
                           f"say that TensorFlow is not deterministic here")
    return out


def docstring_problems(fn) -> List[str]:
    """The docstring's required parts: a one-line mistake, then ``TensorFlow:``,
    ``Source:`` and ``Fix:`` paragraphs."""
    paragraphs = _paragraphs(fn.__doc__)
    if not paragraphs:
        return ["no docstring"]
    out = []
    first = paragraphs[0]
    if any(first.startswith(label) for label in DOC_LABELS):
        out.append("the docstring must open with the mistake in one line")
    elif len(first) > MAX_SUMMARY:
        out.append(f"the opening line (the mistake) is {len(first)} characters; "
                   f"keep it under {MAX_SUMMARY}")
    for label in DOC_LABELS:
        if not any(p.startswith(label) and p[len(label):].strip() for p in paragraphs[1:]):
            out.append(f"the docstring has no {label!r} paragraph")
    return out


def _cell(text: str) -> str:
    """Markdown table cell: reST ``code`` becomes `code`, pipes are escaped."""
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ")


def render(entries: Optional[Iterable[Entry]] = None) -> str:
    """The page region's content, markers excluded."""
    entries = list(collect() if entries is None else entries)
    files = len({e.file for e in entries})
    broken = sum(e.variant == "broken" for e in entries)
    lines = [
        "",
        f"{len(entries)} scenarios in {files} files ({broken} broken variants, "
        f"{len(entries) - broken} fixed), with the outcome each gets on {MEASURED_WITH}, "
        "with 2 to 4 workers, and where another minor differs, its outcome there "
        "([every minor](versions.md#the-catalogue-on-every-minor)). Generated from each "
        "test's `@scenario(...)` by "
        "`python scenarios/catalogue.py --write`; `tests/unit/test_catalogue.py` fails when it "
        "differs, and each scenario test fails when its run ends otherwise.",
        "",
        "| Scenario | Test | Variant | Outcome | Source |",
        "|---|---|---|---|---|",
    ]
    for e in entries:
        variant = ("fixed" if e.variant == "fixed" else "broken (no fix completes; see its Fix)"
                   if e.fixed_by == NO_FIX else f"broken (fix: `{e.fixed_by}`)")
        lines.append(f"| {_cell(e.summary)} | `{e.file}::{e.name}` | {variant} | "
                     f"{_cell(e.outcome_text)} | {_cell(e.source)} |")
    lines.append("")
    return "\n".join(lines)


def docs_region(text: str) -> str:
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"docs/scenarios.md has no {START} ... {END} region")
    return text[start + len(START):end]


def write_docs(path: str = DOCS) -> bool:
    """Rewrite the region; True when it changed."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    old = docs_region(text)
    new = render()
    if old == new:
        return False
    start = text.find(START) + len(START)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:start] + new + text[text.find(END):])
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="rewrite docs/scenarios.md's region")
    group.add_argument("--check", action="store_true",
                       help="exit 1 when docs/scenarios.md's region or a scenario's metadata "
                            "is off")
    args = parser.parse_args(argv)
    found = problems()
    for p in found:
        print(f"catalogue: {p}", file=sys.stderr)
    if args.write:
        changed = write_docs()
        print("docs/scenarios.md " + ("updated" if changed else "already up to date"))
        return 1 if found else 0
    if args.check:
        with open(DOCS, encoding="utf-8") as f:
            stale = docs_region(f.read()) != render()
        if stale:
            print("catalogue: docs/scenarios.md's table is stale; run "
                  "python scenarios/catalogue.py --write", file=sys.stderr)
        return 1 if found or stale else 0
    print(render())
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
