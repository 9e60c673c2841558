"""The package's shape, as issue-free code review would check it: imports
run one way, no module or function too long to read, each subpackage says
what it holds, backends are named only by their table."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "harness"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
MAX_TOP_LEVEL = 12


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(), str(MODULES[name]))


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _imports(name: str):
    """(line, imported harness module, names taken) for every import in the
    module, lazy ones in functions included."""
    base = name if _is_package(name) else name.rpartition(".")[0]
    tree = _tree(name)
    # Imports under `if TYPE_CHECKING:` never run: for type checkers and the
    # API docs only.
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and getattr(block.test, "id", None) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES:
                    yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                source = ".".join(parts[:len(parts) - node.level + 1] + [node.module or ""]).rstrip(".")
            else:
                source = node.module or ""
            if not source.startswith("harness"):
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in MODULES:
                    yield node.lineno, full, ()
                else:
                    yield node.lineno, source, (alias.name,)


def import_graph():
    return {name: {target for _, target, _ in _imports(name) if target != name}
            for name in MODULES}


def find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_find_cycle_finds_a_cycle_and_only_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_lazy_imports_included():
    assert find_cycle(import_graph()) is None


def test_the_worker_side_imports_nothing_of_the_parent_side():
    parent = ("harness.controller", "harness.launch", "harness.network", "harness.report",
              "harness.diagnosis", "harness.plugin", "harness.cli")
    for name in MODULES:
        if name.startswith(("harness.worker", "harness.core")):
            for line, target, _ in _imports(name):
                assert not target.startswith(parent), f"{name}:{line} imports {target}"


def _is_bench(name: str) -> bool:
    return name == "harness.bench" or name.startswith("harness.bench.")


def test_nothing_installed_imports_the_benchmark():
    # The wheel leaves harness.bench out (pyproject.toml): an import of it
    # would fail where the plugin is installed.
    for name in MODULES:
        if not _is_bench(name):
            for line, target, _ in _imports(name):
                assert not _is_bench(target), f"{name}:{line} imports {target}"


def test_each_benchmark_family_imports_only_the_shared_library():
    """As harness/bench/__init__.py says: a family (a program or a subpackage
    of harness.bench) imports harness.bench.common and no other family, but
    the warm run and ``python -m harness.bench`` use the launchers'."""
    allowed = {("warm", "launchers"), ("__main__", "launchers")}
    for name in MODULES:
        if name.count(".") >= 2 and _is_bench(name):
            family = name.split(".")[2]
            for line, target, _ in _imports(name):
                if target.count(".") >= 2 and _is_bench(target):
                    other = target.split(".")[2]
                    assert other in (family, "common") or (family, other) in allowed, \
                        f"{name}:{line} imports {target}"


def test_no_private_name_is_taken_across_modules():
    for name in MODULES:
        for line, target, names in _imports(name):
            taken = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not taken, f"{name}:{line} takes {taken} from {target}"
        modules = {alias.asname or alias.name for node in ast.walk(_tree(name))
                   if isinstance(node, ast.ImportFrom) for alias in node.names
                   if f"{node.module}.{alias.name}" in MODULES}
        for node in ast.walk(_tree(name)):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in modules and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                pytest.fail(f"{name}:{node.lineno} reads {node.value.id}.{node.attr}")


def test_few_modules_at_the_top_level():
    top = [n for n in MODULES if n.count(".") == 1 and not _is_package(n)
           and n not in ("harness.__main__",)]
    assert len(top) <= MAX_TOP_LEVEL, sorted(top)


def test_every_subpackage_says_what_it_holds_and_may_import():
    for name in MODULES:
        if _is_package(name) and name != "harness":
            doc = ast.get_docstring(_tree(name)) or ""
            assert len(doc.splitlines()) >= 3, f"{name} has no docstring worth reading"
            assert "import" in doc, f"{name}'s docstring does not say what it may import"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_modules_and_functions_are_short(name):
    lines = MODULES[name].read_text().count("\n")
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines"
    for node in ast.walk(_tree(name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            length = node.end_lineno - start + 1
            assert length <= MAX_FUNCTION_LINES, f"{name}:{node.lineno} {node.name}: {length} lines"


def test_only_the_launch_package_names_a_backend():
    from harness.launch.backends import BACKENDS
    for name in MODULES:
        # harness.validators declares the option's choices (tests/unit/test_settings.py
        # checks them against the table), so that the plugin need not load it.
        if name.startswith("harness.launch") or name == "harness.validators":
            continue
        for node in ast.walk(_tree(name)):
            if isinstance(node, ast.Constant) and node.value in BACKENDS:
                pytest.fail(f"{name}:{node.lineno} names the backend {node.value!r}")
