"""The documentation stays true, with no TensorFlow and no cluster: the
generated options table matches its one declaration, the reference
docstrings name every fault, argument and field, every relative link in
README.md and docs/ leads somewhere, every page keeps to the public line,
and README.md keeps what .ci/run reads from it.  (The scenario table has
its own check, in test_catalogue.py; ``mkdocs build --strict`` checks the
rendered site.)"""
import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 200
# Pages about the internal engine, for contributors: how the harness works,
# how to change it, and how its figures were measured (those two name the
# code they time).  Their prose may name internal modules; every other
# page's names only the public line.  On every page, what a ::: directive
# renders and what a Python block imports is public.
INTERNALS_PAGES = ("contributors.md", "how-it-works.md", "benchmark.md", "accuracy.md")

pytestmark = pytest.mark.timeout(60)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _region(text: str, name: str) -> str:
    start, end = f"<!-- {name}:start -->\n", f"\n<!-- {name}:end -->"
    assert start in text and end in text, f"no <!-- {name}:start --> ... end region"
    return text.split(start, 1)[1].split(end, 1)[0]


def _code_words(doc: str) -> set:
    """The identifiers inside the docstring's code spans (``x``, `x`, and
    the targets of roles such as :attr:`x`): where a name is named."""
    spans = re.findall(r"`+([^`]+)`+", doc or "")
    return {word for span in spans for word in re.findall(r"[A-Za-z_]\w*", span)}


# ------------------------------------------------------------------ options

def test_options_table_is_generated_from_the_one_declaration():
    from harness.settings import options_markdown
    region = _region(_read(DOCS / "options.md"), "options")
    assert region == options_markdown(), (
        "docs/options.md's table is stale: run  python -m harness.settings --write docs/options.md")


def test_every_option_has_a_row_in_the_options_table():
    from harness.settings import OPTIONS
    rows = _region(_read(DOCS / "options.md"), "options").splitlines()[2:]
    for option in OPTIONS:
        assert any(row.startswith(f"| `{option.flag}=") and f"| `{option.ini}` |" in row
                   for row in rows), f"{option.flag} ({option.ini}) has no row"


def test_the_marker_line_names_the_marker_keys():
    from harness.settings import MARKER_KEYS
    line = re.search(r"`@pytest\.mark\.mwms\(([^`]*)\)`", _read(DOCS / "usage.md"), re.S)
    assert line, "docs/usage.md does not show the marker's signature"
    named = tuple(re.findall(r"(\w+)=", line.group(1)))
    assert named == MARKER_KEYS, f"docs/usage.md names {named}; the marker takes {MARKER_KEYS}"


# ------------------------------------------------------------------ faults

def _class_docstrings(path: Path) -> dict:
    """Each class's own docstring as written (a dataclass without one gets
    its signature as ``__doc__``, which documents nothing)."""
    tree = ast.parse(_read(path))
    return {node.name: ast.get_docstring(node)
            for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def test_every_fault_class_is_documented():
    from harness import faults
    written = _class_docstrings(Path(inspect.getsourcefile(faults)))
    page = _read(DOCS / "faults.md")
    directive = re.search(r"^::: harness\.faults\n((?:[ \t]+.*\n)*)", page, re.M)
    assert directive, "docs/faults.md does not render ::: harness.faults"
    options = directive.group(1)
    for cls in faults.FAULT_TYPES:
        assert written.get(cls.__name__), f"harness.faults.{cls.__name__} has no docstring"
        if "members:" in options:
            assert re.search(rf"\b{cls.__name__}\b", options), (
                f"docs/faults.md renders harness.faults without {cls.__name__}")


def test_bad_tf_config_s_docstring_names_every_kind():
    from harness import faults
    doc = inspect.getdoc(faults.BadTFConfig)
    missing = [k for k in faults.BAD_CONFIG_KINDS if f"``{k}``" not in doc]
    assert not missing, f"BadTFConfig's docstring does not say what {missing} do"


# ------------------------------------------------------------------ run() and RunResult

def _cluster_run():
    """``Cluster.run``'s parameter names and docstring: imported, or read
    from the source where the package does not import."""
    try:
        from harness.controller.cluster import Cluster
    except ImportError:
        for path in sorted((ROOT / "harness" / "controller").glob("*.py")):
            for node in ast.walk(ast.parse(_read(path))):
                if isinstance(node, ast.ClassDef) and node.name == "Cluster":
                    run = next(f for f in node.body
                               if isinstance(f, ast.FunctionDef) and f.name == "run")
                    a = run.args
                    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                    return [n for n in names if n != "self"], ast.get_docstring(run)
        pytest.fail("no class Cluster with a run method in harness/controller/")
    params = [n for n in inspect.signature(Cluster.run).parameters if n != "self"]
    return params, inspect.getdoc(Cluster.run)


def test_every_argument_of_run_is_in_its_docstring():
    params, doc = _cluster_run()
    missing = [p for p in params if p not in _code_words(doc)]
    assert not missing, f"Cluster.run's docstring does not name {missing}"


def test_every_field_of_run_result_is_in_its_docstring():
    from harness.result import RunResult
    missing = [f.name for f in dataclasses.fields(RunResult)
               if f.name not in _code_words(inspect.getdoc(RunResult))]
    assert not missing, f"RunResult's docstring does not name {missing}"


# ------------------------------------------------------------------ links

def _pages():
    return [README] + sorted(DOCS.glob("*.md"))


def _prose(text: str) -> str:
    """The Markdown without its fenced code blocks and code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`+[^`\n]*`+", "", text)


def _slug(heading: str) -> str:
    """An anchor as Python-Markdown's toc makes it from a heading: emphasis
    marks go, a code span's underscores stay."""
    text = "".join(part if inside % 2 else re.sub(r"[*_]", "", part)
                   for inside, part in enumerate(heading.split("`")))
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> tuple:
    """The page's heading anchors, and the objects it renders with ::: (whose
    members' anchors start with the object's name)."""
    text = _read(page)
    # Headings keep their code spans (the toc makes the anchor of their text).
    blocks_out = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    headings = {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", blocks_out, re.M)}
    rendered = tuple(re.findall(r"^::: ([\w.]+)", text, re.M))
    return headings, rendered


def _links(page: Path):
    for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", _prose(_read(page))):
        if not re.match(r"^[a-z]+:", target):
            yield target


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_anchor(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md":
            headings, rendered = _anchors(dest)
            if anchor not in headings and not any(
                    anchor == name or anchor.startswith(name + ".") for name in rendered):
                broken.append(f"{target}: no such heading or rendered object")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_page_is_in_the_site_nav():
    nav = set(re.findall(r"^\s+- [^:]+: (\S+\.md)$", _read(ROOT / "mkdocs.yml"), re.M))
    pages = {p.name for p in DOCS.glob("*.md")}
    assert nav == pages, f"in docs/ but not in the nav: {pages - nav}; in the nav only: {nav - pages}"


def test_snippets_taken_from_the_readme_exist():
    readme = _read(README)
    for page in DOCS.glob("*.md"):
        for section in re.findall(r'^--8<-- "README\.md:(\w+)"$', _read(page), re.M):
            assert f"--8<-- [start:{section}]" in readme and f"--8<-- [end:{section}]" in readme, (
                f"{page.name} includes README.md's section {section!r}, which it does not mark")


# ------------------------------------------------------------------ README.md

def test_readme_is_short():
    lines = len(_read(README).splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines; keep it to {README_MAX_LINES} and move detail into docs/")


def _command_after(heading: str) -> str:
    """The first line of the first ```bash block after the heading that
    starts with ``heading``: what .ci/run's awk takes."""
    lines = _read(README).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    fence = next(i for i in range(start, len(lines)) if lines[i].startswith("```bash"))
    return lines[fence + 1]


def test_readme_keeps_the_commands_ci_and_newcomers_run():
    assert _command_after("## Run the harness") == "pytest -n 3 --dist loadgroup tests/ scenarios/"
    assert _command_after("## Install and run the scenario catalogue") == \
        "pip install -e '.[test]' && pip install \"$(python -m harness keras2)\" && pytest scenarios/"


def test_the_api_page_names_the_public_line():
    """docs/api.md names every public name (harness.__all__) and module."""
    import harness
    text = _read(DOCS / "api.md")
    missing = [n for n in [*harness.__all__, *PUBLIC]
               if not re.search(rf"\b{re.escape(n)}\b", text)]
    assert not missing, f"docs/api.md does not name {missing}"
    for name in harness.__all__:
        assert getattr(harness, name) is not None


def test_the_index_links_every_page():
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    text = (ROOT / "docs" / "index.md").read_text()
    assert [p for p in pages if f"]({p}" not in text] == []


def test_the_timeline_picture_is_what_today_s_harness_draws_of_its_run():
    """docs/timeline.svg is drawn from its run's record with today's
    diagnosis and drawing (``python -m harness.bench.picture`` draws it
    again; ``... picture record`` runs the scenario anew)."""
    import json
    from harness.bench.picture import render
    picture, trace = render(str(ROOT / "docs" / "timeline"))
    assert (ROOT / "docs" / "timeline.svg").read_text() == picture, \
        "docs/timeline.svg is stale: run  python -m harness.bench.picture"
    assert json.loads((ROOT / "docs" / "timeline.trace.json").read_text()) == \
        json.loads(json.dumps(trace))


# ------------------------------------------------------------------ the public line

def _public_modules() -> tuple:
    import harness
    return harness._PUBLIC


PUBLIC = _public_modules()


def _exports(module: str) -> set:
    """What a public module offers: its __all__ (without one, which
    test_every_public_module_has_all fails, its names without an underscore)."""
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    return set(names) if names is not None else {n for n in vars(mod) if not n.startswith("_")}


def _on_the_line(dotted: str) -> bool:
    """Whether ``harness.a.b...`` is public: a public module, a name of one's
    ``__all__``, or an attribute of such a name."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        if module in PUBLIC:
            rest = parts[i:]
            return not rest or rest[0] == "__all__" or rest[0] in _exports(module)
    return False


def _resolve(dotted: str):
    """The object ``harness.a.b...`` names."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def _python_blocks(text: str):
    return re.findall(r"^```(?:python|py)\n(.*?)^```", text, re.M | re.S)


def _harness_names(text: str):
    """Every dotted ``harness.x...`` the text names, but the module a command
    runs (``python -m harness.bench``: a program, not an import)."""
    return re.findall(r"(?<![\w./-])(?<!-m )harness(?:\.\w+)+", text)


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_module_has_all(module):
    mod = importlib.import_module(module)
    assert hasattr(mod, "__all__"), f"{module} is public and has no __all__"
    # A package's __all__ may name its submodules (``from package import *``
    # imports them).
    missing = [n for n in mod.__all__ if not hasattr(mod, n)
               and importlib.util.find_spec(f"{module}.{n}") is None]
    assert not missing, f"{module}.__all__ names {missing}, which it does not have"


def test_the_errors_module_and_the_package_offer_the_same_errors():
    import harness
    from harness import errors
    assert {n for n in harness.__all__ if harness._HOME.get(n) == "harness.errors"} == \
        set(errors.__all__)


def test_every_fault_class_is_public():
    from harness import faults
    assert {cls.__name__ for cls in faults.FAULT_TYPES} <= set(faults.__all__)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_renders_and_imports_public_names_only(page):
    text = _read(page)
    internal = [t for t in re.findall(r"^::: (\S+)", text, re.M) if not _on_the_line(t)]
    assert not internal, f"{page.name} renders internal {internal}"
    for block in _python_blocks(text):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Import):
                taken = [a.name for a in node.names if a.name.split(".")[0] == "harness"]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness"):
                taken = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            internal = [t for t in taken if t not in PUBLIC and not _on_the_line(t)]
            assert not internal, f"{page.name} tells users to import internal {internal}"


@pytest.mark.parametrize("page", [p for p in _pages() if p.name not in INTERNALS_PAGES],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_a_user_s_page_names_the_public_line_only(page):
    internal = sorted({n for n in _harness_names(_read(page)) if not _on_the_line(n)})
    assert not internal, (f"{page.name} names internal {internal}; name the public line, or "
                          f"say it in a page for contributors ({', '.join(INTERNALS_PAGES)})")


def _directive_paragraphs(text: str):
    """Each ::: directive's target, and the paragraph just before it."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        found = re.match(r"^::: (\S+)", line)
        if found:
            end = i
            while end > 0 and not lines[end - 1].strip():
                end -= 1
            start = end
            while start > 0 and lines[start - 1].strip():
                start -= 1
            yield found.group(1), lines[start:end]


@pytest.mark.parametrize("page", [p for p in _pages() if "\n::: " in _read(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_a_sentence_and_a_link_before_each_rendered_reference(page):
    """Read as a file (on GitHub), a page shows a ::: line as it is: a
    sentence before it says what comes there and links its source file (or
    a section); a source file linked is the one the object is defined in."""
    for target, paragraph in _directive_paragraphs(_read(page)):
        assert paragraph and not re.match(r"#|:::|\s|```", paragraph[0]), (
            f"{page.name}: no sentence before ::: {target}")
        links = re.findall(r"\]\(([^)\s]+)\)", _prose("\n".join(paragraph)))
        assert links, f"{page.name}: the sentence before ::: {target} links nothing"
        source = Path(inspect.getsourcefile(inspect.unwrap(_resolve(target)))).resolve()
        for link in links:
            if link.endswith(".py"):
                assert (page.parent / link).resolve() == source, (
                    f"{page.name}: the sentence before ::: {target} links {link}; "
                    f"it is defined in {source.relative_to(ROOT)}")


def test_cluster_takes_every_option_but_the_reports_by_name_and_says_so():
    from harness.controller.cluster import KEYWORDS, Cluster
    from harness.settings import OPTIONS
    assert set(KEYWORDS) == {o.field for o in OPTIONS} - {"report_dir", "report"}
    missing = [k for k in KEYWORDS if k not in _code_words(inspect.getdoc(Cluster))]
    assert not missing, f"Cluster's docstring does not name {missing}"


def test_run_s_docstring_names_its_arguments_in_the_signature_s_order():
    """The signature's order is the docstring's groups (what runs, the
    faults, the cluster, the checks, watching the run): a new argument goes
    in its group in both."""
    params, doc = _cluster_run()
    spans = [set(re.findall(r"[A-Za-z_]\w*", s)) for s in re.findall(r"`+([^`]+)`+", doc)]
    first = {p: next(i for i, words in enumerate(spans) if p in words) for p in params}
    order = sorted(params, key=lambda p: (first[p], params.index(p)))
    assert order == params, f"Cluster.run's docstring names them in the order {order}"
