"""The corpus's section of ``docs/accuracy.md``, made from its JSON
document alone (pure: no TensorFlow, no run)."""
from __future__ import annotations

import json
from typing import Dict, List, Sequence

from harness.bench.common import made_on
from harness.bench.corpus import FAMILIES, Answer, Case

START, END = "<!-- corpus:start -->", "<!-- corpus:end -->"
BROKEN = (Answer.NAMED, Answer.CANNOT_TELL, Answer.WRONG, Answer.DID_NOT_BREAK)
HEAD = ("| {} | cases | broken runs | named exactly | cannot tell (truth among the candidates) "
        "| wrong | did not break | fixed twins that did not complete "
        "| named, of the broken runs |")
RULE = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"


def case_entry(case: Case) -> dict:
    """What the document keeps of a case: enough to print its line."""
    return {"name": case.name, "family": case.family, "source": case.source,
            "summary": case.summary, "sizes": list(case.sizes), "chief": case.chief}


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _count(rows: Sequence[dict], answer: Answer) -> int:
    return sum(1 for r in rows if r["answer"] == answer.value)


def _cells(rows: Sequence[dict]) -> List[str]:
    broken = [r for r in rows if r["variant"] == "broken"]
    failed = [r for r in broken if r["answer"] != Answer.DID_NOT_BREAK.value]
    named = _count(broken, Answer.NAMED)
    share = f"{100 * named / len(failed):.0f} %" if failed else "–"
    return ([str(len({r["case"] for r in rows})), str(len(broken))]
            + [str(_count(broken, a)) for a in BROKEN] + [str(_count(rows, Answer.TWIN_FAILED)),
                                                          share])


def _line(label: str, rows: Sequence[dict]) -> str:
    return f"| {label} | " + " | ".join(_cells(rows)) + " |"


def family_table(rows: Sequence[dict]) -> str:
    lines = [HEAD.format("family"), RULE]
    for family in FAMILIES:
        mine = [r for r in rows if r["family"] == family]
        if mine:
            lines.append(_line(family, mine))
    lines.append(_line("**all**", rows))
    return "\n".join(lines)


def _shape(row: dict) -> str:
    return f"{row['workers']}, a chief" if row["chief"] else str(row["workers"])


def size_table(rows: Sequence[dict]) -> str:
    lines = [HEAD.format("tasks"), RULE]
    for shape in sorted({_shape(r) for r in rows}, key=lambda s: (int(s.split(",")[0]), s)):
        lines.append(_line(shape, [r for r in rows if _shape(r) == shape]))
    return "\n".join(lines)


def _answers(case: str, rows: Sequence[dict]) -> str:
    mine = [r for r in rows if r["case"] == case and r["variant"] == "broken"]
    return "; ".join(f"{_shape(r)}: {r['answer']}" + (
        f" ({','.join(map(str, r['culprits']))})" if r["answer"] == Answer.CANNOT_TELL.value
        else "") for r in mine)


def case_list(doc: dict) -> List[str]:
    by_case: Dict[str, dict] = {c["name"]: c for c in doc["cases"]}
    truths: Dict[str, List[str]] = {}
    for r in doc["runs"]:
        if r["variant"] == "broken":
            truths.setdefault(r["case"], [])
            if r["truth"] not in truths[r["case"]]:
                truths[r["case"]].append(r["truth"])
    lines = []
    for family in FAMILIES:
        for name, c in by_case.items():
            if c["family"] == family and name in truths:
                lines.append(f"- `{name}` ({family}): {c['summary']} Truth: "
                             f"{' / '.join(truths[name])}. Source: {c['source']}. "
                             f"Verdicts: {_answers(name, doc['runs'])}.")
    return lines


def markdown(doc: dict) -> str:
    """The corpus section of docs/accuracy.md."""
    rows = doc["runs"]
    m = doc["machine"]
    lines = [f"Made by `{doc['command']}` on {doc['date']}: {len(doc['cases'])} cases, "
             f"{len(rows)} runs in {made_on(doc)}, the workers on CPU; Python {m['python']}, TensorFlow "
             f"{m['tensorflow']}, Keras {m.get('keras')}.", "",
             family_table(rows), "", "By cluster:", "", size_table(rows)]
    bad = [r for r in rows if r["answer"] in (Answer.WRONG.value, Answer.DID_NOT_BREAK.value,
                                              Answer.TWIN_FAILED.value)]
    if bad:
        lines += ["", "Errors (each run's report is in the JSON):", ""]
        lines += [f"- `{r['case']}` ({r['variant']}), {_shape(r)} tasks: {r['answer']}: "
                  f"{r['outcome']}, culprits {r['culprits']}, truth {r['truth']}" for r in bad]
    lines += ["", "The cases:", ""] + case_list(doc)
    return "\n".join(lines)
