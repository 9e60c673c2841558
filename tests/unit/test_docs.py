"""The documentation stays true, with no TensorFlow and no cluster: the
generated options table matches its one declaration, the reference
docstrings name every fault, argument and field, every relative link in
README.md and docs/ leads somewhere, and README.md keeps what .ci/run reads
from it.  (The scenario table has its own check, in test_catalogue.py;
``mkdocs build --strict`` checks the rendered site.)"""
import ast
import dataclasses
import inspect
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 200

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
    """An anchor as Python-Markdown's toc makes it from a heading."""
    text = re.sub(r"[`*_]", "", heading)
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


def test_the_api_page_documents_the_public_line_and_only_it():
    """docs/api.md names every public name (harness.__all__), and its
    reference directives point at public names only."""
    import harness
    text = (ROOT / "docs" / "api.md").read_text()
    missing = [n for n in harness.__all__ if not re.search(rf"\b{re.escape(n)}\b", text)]
    assert not missing, f"docs/api.md does not name {missing}"
    public = {f"harness.{n}" for n in harness.__all__} | {"harness.errors"}
    internal = [t for t in re.findall(r"^::: (\S+)", text, re.M) if t not in public]
    assert not internal, f"docs/api.md documents internal names {internal}"
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
