"""The package's shape, as issue-free code review would check it: imports
run one way, a module or function past the size guide says why, each
subpackage says what it holds, backends are named only by their table."""
import ast
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "harness"
# Sizes are a guide, not a cap: modules split where their roles part.  One
# past the guide warns, asking for a reason (LONG_BY_REASON) or a split;
# past the limit, no reason will do.
MODULE_GUIDE, MODULE_LIMIT = 450, 900
FUNCTION_GUIDE, FUNCTION_LIMIT = 80, 150
# "module" or "module:function" -> why it is one piece past the guide.
LONG_BY_REASON: dict = {
    "harness.controller.cluster:run": "its docstring is the reference of every run() argument, "
                                      "in the groups users think in, which docs/api.md renders",
}
MAX_TOP_LEVEL = 12


class SizeWarning(UserWarning):
    """A module or function past the size guide with no reason given."""


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


_TREES: dict = {}


def _tree(name: str) -> ast.Module:
    if _TREES.get(name) is None:
        _TREES[name] = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    return _TREES[name]


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
    the warm run and ``python -m harness.bench`` use the launchers', and
    the search's benchmark searches the corpus's recovery jobs."""
    allowed = {("warm", "launchers"), ("__main__", "launchers"), ("explore", "corpus")}
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


def sizes(name: str):
    """(key, lines, guide, limit) for the module ``name`` and each of its functions."""
    yield name, MODULES[name].read_text().count("\n"), MODULE_GUIDE, MODULE_LIMIT
    for node in ast.walk(_tree(name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield (f"{name}:{node.name}", node.end_lineno - start + 1, FUNCTION_GUIDE,
                   FUNCTION_LIMIT)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_a_module_or_function_past_the_size_guide_says_why(name):
    for key, lines, guide, limit in sizes(name):
        assert lines <= limit, f"{key}: {lines} lines, past {limit}: split it where its roles part"
        if lines > guide and key not in LONG_BY_REASON:
            warnings.warn(SizeWarning(
                f"{key}: {lines} lines, past the guide of {guide}: split it where its roles "
                f"part, or say in tests/unit/test_layout.py's LONG_BY_REASON why it is one"))


def test_every_reason_for_a_size_is_still_needed():
    long = {key for name in MODULES for key, lines, guide, _ in sizes(name) if lines > guide}
    stale = sorted(set(LONG_BY_REASON) - long)
    assert not stale, f"within the guide now (drop their reasons): {stale}"


def test_the_size_check_warns_and_fails_as_it_says(monkeypatch, tmp_path):
    path = tmp_path / "long.py"
    path.write_text("def f():\n" + "    x = 1\n" * 100)
    monkeypatch.setitem(MODULES, "harness.long", path)
    monkeypatch.setitem(_TREES, "harness.long", None)
    with pytest.warns(SizeWarning, match="harness.long:f: 101 lines"):
        test_a_module_or_function_past_the_size_guide_says_why("harness.long")
    monkeypatch.setitem(LONG_BY_REASON, "harness.long:f", "a table of one hundred rows")
    with warnings.catch_warnings():
        warnings.simplefilter("error", SizeWarning)
        test_a_module_or_function_past_the_size_guide_says_why("harness.long")
    path.write_text("def f():\n" + "    x = 1\n" * 200)
    _TREES["harness.long"] = None
    with pytest.raises(AssertionError, match="past 150"):
        test_a_module_or_function_past_the_size_guide_says_why("harness.long")


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


def test_the_contributors_page_names_every_module():
    """docs/contributors.md's table of the package: a row per top-level
    module and subpackage, and each subpackage's row names its modules."""
    import re
    rows = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| `harness/([\w/.]+?)/?` \| (.*) \|$",
        (ROOT / "docs" / "contributors.md").read_text(), re.M)}
    missing = []
    for name in MODULES:
        parts = name.split(".")[1:]
        if not parts or parts[0] == "bench" or parts == ["__main__"]:
            continue
        if len(parts) == 1:
            key = parts[0] if _is_package(name) else f"{parts[0]}.py"
            if key not in rows:
                missing.append(f"no row for harness/{key}")
        elif not (len(parts) == 2 and parts[1] == "__init__"):
            row = rows.get(parts[0], "")
            own = parts[-1] if not _is_package(name) else f"{parts[-1]}/"
            if f"`{own}`" not in row and f"`{parts[-1]}`" not in row:
                missing.append(f"harness/{parts[0]}/'s row does not name `{own}`")
    assert not missing, "\n".join(missing)
