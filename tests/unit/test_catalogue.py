"""The scenario catalogue's bookkeeping, without any TensorFlow worker: the
table in docs/scenarios.md matches the scenarios' metadata, and every scenario test has
its metadata and docstring parts (see scenarios/meta.py)."""
import os
import subprocess
import sys
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from scenarios import catalogue  # noqa: E402
from scenarios.meta import NO_FIX, culprit_check, culprit_check_of, scenario  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_docs_region_matches_the_rendering():
    with open(catalogue.DOCS, encoding="utf-8") as f:
        region = catalogue.docs_region(f.read())
    assert region == catalogue.render(), (
        "docs/scenarios.md's table is stale: run  python scenarios/catalogue.py --write")


def test_every_scenario_test_has_metadata_and_docstring_parts():
    assert catalogue.problems() == []


def test_the_catalogue_covers_every_file_and_pairs_each_broken_variant():
    entries = catalogue.collect()
    assert {e.file for e in entries} == set(catalogue.scenario_files())
    names = {(e.file, e.name) for e in entries}
    assert len(names) == len(entries)
    for e in entries:
        if e.variant == "broken":
            assert e.fixed_by == NO_FIX or (e.file, e.fixed_by) in names
        else:
            assert e.outcomes == ("completed",)
    rendered = catalogue.render(entries)
    assert all(f"`{e.file}::{e.name}`" in rendered for e in entries)


def test_catalogue_imports_no_tensorflow():
    code = ("import sys; from scenarios import catalogue; catalogue.collect(); "
            "catalogue.problems(); print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------- the checks catch mistakes

def _fake_module(monkeypatch, **functions):
    """Make the catalogue see one scenario file holding ``functions``."""
    module = types.ModuleType("scenarios.test_fake")
    for name, fn in functions.items():
        fn.__module__ = module.__name__
        fn.__name__ = name
        setattr(module, name, fn)
    monkeypatch.setattr(catalogue, "scenario_files", lambda: ["test_fake.py"])
    monkeypatch.setattr(catalogue, "_module", lambda filename: module)
    return module


GOOD_DOC = """A worker does something wrong.

    TensorFlow: it hangs.

    Source: seed rule 1.

    Fix: do it right.
    """


def _fn(doc=GOOD_DOC, fixture=True):
    if fixture:
        def test(mwms_cluster):
            pass
    else:
        def test():
            pass
    test.__doc__ = doc
    return test


def _timeout(fn):
    return pytest.mark.timeout(10)(fn)


def test_check_accepts_a_well_formed_pair(monkeypatch):
    _fake_module(
        monkeypatch,
        test_fixed=_timeout(scenario(outcome="completed", source="seed rule 1")(_fn())),
        test_broken=_timeout(scenario(outcome="hang", source="seed rule 1",
                                      fixed_by="test_fixed")(_fn())))
    assert catalogue.problems() == []
    assert [e.variant for e in catalogue.collect()] == ["fixed", "broken"]


@pytest.mark.parametrize("doc,complaint", [
    (None, "no docstring"),
    ("TensorFlow: it hangs.\n\nSource: x.\n\nFix: y.", "open with the mistake"),
    ("Mistake.\n\nSource: x.\n\nFix: y.", "no 'TensorFlow:'"),
    ("Mistake.\n\nTensorFlow: it hangs.\n\nFix: y.", "no 'Source:'"),
    ("Mistake.\n\nTensorFlow: it hangs.\n\nSource: x.", "no 'Fix:'"),
    ("Mistake.\n\nTensorFlow: it hangs.\n\nSource: x.\n\nFix:", "no 'Fix:'"),
    ("x" * 300 + "\n\nTensorFlow: a.\n\nSource: b.\n\nFix: c.", "characters"),
])
def test_check_catches_docstring_without_its_parts(monkeypatch, doc, complaint):
    _fake_module(monkeypatch, test_x=_timeout(
        scenario(outcome="completed", source="seed rule 1")(_fn(doc))))
    found = catalogue.problems()
    assert any(complaint in p for p in found), found


def test_check_catches_a_test_without_metadata(monkeypatch):
    _fake_module(monkeypatch, test_plain=_timeout(_fn()))
    assert any("neither @scenario" in p for p in catalogue.problems())


def test_check_catches_missing_timeout_fixture_and_fix(monkeypatch):
    _fake_module(
        monkeypatch,
        test_a=scenario(outcome="hang", source="s", fixed_by="test_nowhere")(
            _fn(fixture=False)))
    found = " | ".join(catalogue.problems())
    assert "no @pytest.mark.timeout" in found
    assert "mwms_cluster" in found
    assert "fixed_by='test_nowhere'" in found


def test_check_catches_undocumented_nondeterminism(monkeypatch):
    _fake_module(
        monkeypatch,
        test_fixed=_timeout(scenario(outcome="completed", source="s")(_fn())),
        test_flaky=_timeout(scenario(outcome=("hang", "failed"), source="s",
                                     fixed_by="test_fixed")(_fn())))
    assert any("not deterministic" in p for p in catalogue.problems())


def test_check_catches_a_culprit_check_of_nothing(monkeypatch):
    check = pytest.mark.xfail(reason="flaky")(culprit_check("test_gone")(_fn()))
    _fake_module(monkeypatch, test_gone_culprit=_timeout(check))
    found = " | ".join(catalogue.problems())
    assert "not a scenario" in found and "never xfail" in found


def test_scenario_metadata_is_validated_when_declared():
    with pytest.raises(ValueError, match="outcome"):
        scenario(outcome="stuck", source="s")
    with pytest.raises(ValueError, match="fixed variant"):
        scenario(outcome="hang", source="s")
    with pytest.raises(ValueError, match="source"):
        scenario(outcome="completed", source="")


def test_render_escapes_and_counts():
    entries = [catalogue.Entry("test_a.py", "test_x", "broken", ("hang",), "hang", "a|b",
                               "test_y", "Uses ``x | y``."),
               catalogue.Entry("test_a.py", "test_y", "fixed", ("completed",), "completed",
                               "s", None, "Fixed.")]
    text = catalogue.render(entries)
    assert "2 scenarios in 1 files (1 broken variants, 1 fixed)" in text
    assert "| Uses `x \\| y`. | `test_a.py::test_x` | broken (fix: `test_y`) | hang | a\\|b |" \
        in text


def test_write_rewrites_only_the_region(tmp_path, monkeypatch):
    page = tmp_path / "scenarios.md"
    page.write_text(f"before\n{catalogue.START}\nold\n{catalogue.END}\nafter\n")
    monkeypatch.setattr(catalogue, "render", lambda entries=None: "\nnew\n")
    assert catalogue.write_docs(str(page)) is True
    assert page.read_text() == f"before\n{catalogue.START}\nnew\n{catalogue.END}\nafter\n"
    assert catalogue.write_docs(str(page)) is False


def test_every_scenario_checks_that_no_worker_outlives_it():
    """scenarios/conftest.py has an autouse fixture that takes the root
    conftest's no_leftover_workers: every scenario test is checked."""
    import ast
    import pathlib
    tree = ast.parse((pathlib.Path(catalogue.__file__).parent / "conftest.py").read_text())
    autouse = [node for node in tree.body if isinstance(node, ast.FunctionDef)
               and any(isinstance(d, ast.Call) and any(
                   k.arg == "autouse" and getattr(k.value, "value", False) for k in d.keywords)
                   for d in node.decorator_list)]
    assert any("no_leftover_workers" in [a.arg for a in f.args.args] for f in autouse)



def test_the_run_on_the_oldest_tensorflow_takes_the_scenarios_that_differ_by_version():
    """CI's run on the oldest TensorFlow selects ``-m "not catalogue or
    by_version"``: every scenario declaring ``on=``, every test marked
    ``by_version``, the culprit checks of both, and no other catalogue test."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider",
         "--collect-only", "-q", "-m", "not catalogue or by_version", "scenarios/"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    selected = {line for line in out.stdout.splitlines() if line.startswith("scenarios/")}
    tests = {}
    for filename in catalogue.scenario_files():
        module = catalogue._module(filename)
        module_marks = getattr(module, "pytestmark", [])
        module_marks = module_marks if isinstance(module_marks, list) else [module_marks]
        for name in dir(module):
            fn = getattr(module, name)
            if name.startswith("test_") and callable(fn):
                marks = module_marks + list(getattr(fn, "pytestmark", []))
                tests[f"scenarios/{filename}::{name}"] = (fn, marks)
    differing = {key for key, (fn, _) in tests.items()
                 if getattr(fn, "scenario", None) is not None and fn.scenario.elsewhere}
    marked = {key for key, (_, marks) in tests.items()
              if any(m.name == "by_version" for m in marks)}
    chosen = differing | marked
    checks = {key for key, (fn, _) in tests.items()
              if culprit_check_of(fn) and f"{key.split('::')[0]}::{culprit_check_of(fn)}" in chosen}
    assert differing and selected == chosen | checks
