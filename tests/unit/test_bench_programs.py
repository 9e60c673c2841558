"""The benchmark's programs as users, CI and the docs call them, with no
TensorFlow: every ``harness.bench`` module or name and every
``harness/bench`` path written in the docs, CI, the tests or the code
exists, and every program's ``--help`` names the command that runs it."""
import ast
import importlib
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "harness" / "bench"
SOURCES = sorted({ROOT / "README.md", ROOT / "pyproject.toml", *(ROOT / "docs").glob("*.md"),
                  *(ROOT / ".ci").iterdir(), *(ROOT / "scenarios").rglob("*.py"),
                  *(ROOT / "tests").rglob("*.py"), *(ROOT / "harness").rglob("*.py"),
                  *BENCH.rglob("*.sh")} - {pathlib.Path(__file__).resolve()})
MODULE = re.compile(r"\bharness\.bench(?:[.:]\w+)*")
PATH = re.compile(r"\bharness/bench(?:/[\w.]+)*")

pytestmark = pytest.mark.timeout(60)


def _file_of(module: str):
    """The source file of a ``harness.bench`` module, or None."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _top_level_names(path: pathlib.Path) -> set:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


def _resolves(reference: str) -> bool:
    """``harness.bench.a.b`` or ``harness.bench.a:b``: the longest module
    prefix is a file of the checkout, and what follows it one of its names."""
    parts = reference.replace(":", ".").split(".")
    for cut in range(len(parts), 1, -1):
        path = _file_of(".".join(parts[:cut]))
        if path is not None:
            rest = parts[cut:]
            return not rest or (len(rest) == 1 and rest[0] in _top_level_names(path))
    return False


def test_every_benchmark_module_and_path_named_exists():
    stale = []
    for source in SOURCES:
        if not source.is_file():
            continue
        text = source.read_text(errors="replace")
        where = source.relative_to(ROOT)
        stale += [f"{where}: {m}" for m in MODULE.findall(text) if not _resolves(m)]
        stale += [f"{where}: {p}" for p in PATH.findall(text)
                  if not (ROOT / p.rstrip(".")).exists()]
    assert not stale, "\n".join(stale)


def test_a_stale_reference_is_found():
    assert _resolves("harness.bench.launchers.workers.measured_run")
    assert _resolves("harness.bench.launchers.workers:measured_run")
    assert _resolves("harness.bench.warm")
    assert not _resolves("harness.bench.step_cost")
    assert not _resolves("harness.bench.warm.nothing_of_that_name")


# Programs without options: their one argument is a path.
NO_HELP = {"harness.bench.picture"}     # tests/unit/test_docs.py runs it


def _programs():
    """``(command's module, module holding main)`` of every program: the
    modules run as ``__main__``, and the package's own."""
    out = []
    for path in sorted(BENCH.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        text = path.read_text()
        if path.name == "__main__.py":
            entry = next(node.module for node in ast.parse(text).body
                         if isinstance(node, ast.ImportFrom)
                         and any(a.name == "main" for a in node.names))
            out.append((module.rpartition(".")[0], entry))
        elif _runs_as_main(text) and module not in NO_HELP:
            out.append((module, module))
    return out


def _runs_as_main(text: str) -> bool:
    """Whether the module ends in ``if __name__ == "__main__":``."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and getattr(node.test.left, "id", None) == "__name__"
               for node in ast.parse(text).body)


def test_the_programs_are_found():
    programs = dict(_programs())
    assert programs["harness.bench"] == "harness.bench.launchers.compare"
    assert {"harness.bench.warm", "harness.bench.cost.step", "harness.bench.cost.replica",
            "harness.bench.recorder.cost", "harness.bench.accuracy", "harness.bench.versions",
            "harness.bench.gpu"} <= set(programs)


@pytest.mark.parametrize("command,entry", _programs())
def test_every_program_answers_help_with_its_own_command(command, entry, capsys):
    with pytest.raises(SystemExit) as done:
        importlib.import_module(entry).main(["--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: python -m {command} ")
