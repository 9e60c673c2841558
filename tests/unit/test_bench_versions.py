"""The per-version outcome table (python -m harness.bench.versions): fast, no TensorFlow."""
import pytest

from harness.bench import versions as bench


def _result(tf, outcomes):
    return {"tensorflow": tf, "keras": "Keras x", "scenarios": {
        f"scenarios/test_a.py::{name}": {"outcome": o, "error": e, "passed": p, "workers": 2}
        for name, (o, e, p) in outcomes.items()}}


def test_the_table_has_a_column_per_version_and_lists_what_differs_first():
    old = _result("2.15.1", {"test_x": ("completed", None, True), "test_y": ("hang", None, True)})
    new = _result("2.21.0", {"test_x": ("failed", "ValueError", True),
                             "test_y": ("hang", None, False)})
    text = bench.table([old, new], "x86_64, 2 cores", "2026-12-01", 2)
    assert "| Scenario | 2.15.1 | 2.21.0 |" in text
    assert "on 2026-12-01, x86_64, 2 cores; 2 workers" in text
    differ, every = text.split("Every scenario:")
    assert "(1 of 2 scenarios)" in differ
    assert "| `test_a.py::test_x` | completed | failed (ValueError) |" in differ
    assert "test_y" not in differ            # the same outcome; only its test failed
    assert "| `test_a.py::test_y` | hang | hang ✗ |" in every


def test_a_scenario_missing_on_a_version_is_a_dash():
    assert bench.cell(None) == "–"


def test_the_table_replaces_only_what_is_between_the_markers(tmp_path):
    doc = tmp_path / "versions.md"
    doc.write_text(f"intro\n{bench.START}\nold\n{bench.END}\nafter\n")
    bench.write(str(doc), "new")
    assert doc.read_text() == f"intro\n{bench.START}\nnew\n{bench.END}\nafter\n"


def test_minors_that_are_not_minors_in_range_are_a_usage_error(capsys):
    for bad in ("2.x", "2.14", "nonsense"):
        with pytest.raises(SystemExit) as stop:
            bench.main(["--minors", bad])
        assert stop.value.code == 2
        assert f"--minors: {bad} not a minor within tensorflow>=2.15" in capsys.readouterr().err
