"""The TensorFlow range, read once: pyproject.toml, the docs and the code agree."""
import pathlib
import re
import tomllib

import pytest

from harness import cli
from harness.core import versions

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, minor", [("2.15.1", (2, 15)), ("2.16.0rc0", (2, 16)),
                                         ("2.21", (2, 21)), ("2.9.3", (2, 9))])
def test_minor_of_reads_major_and_minor(text, minor):
    assert versions.minor_of(text) == minor


def test_minor_of_refuses_what_is_not_a_version():
    with pytest.raises(ValueError, match="not a TensorFlow version"):
        versions.minor_of("nightly")


@pytest.mark.parametrize("tf, wanted", [("2.15.1", "keras~=2.15.0"),
                                        ("2.16.2", "tf_keras~=2.16.0"),
                                        ("2.21.0", "tf_keras~=2.21.0"),
                                        ("2.18.0rc1", "tf_keras~=2.18.0")])
def test_keras_2_is_tf_keras_of_the_same_minor_and_on_2_15_its_own_keras(tf, wanted):
    assert versions.keras2_requirement(tf) == wanted


def test_keras_2_on_2_15_and_with_tf_keras_keras_3_otherwise():
    assert versions.keras_of((2, 15), legacy=False) == "keras2"
    assert versions.keras_of((2, 16), legacy=False) == "keras3"
    assert versions.keras_of((2, 21), legacy=True) == "keras2"
    assert versions.keras2_env((2, 15)) == {} and versions.keras2_package((2, 15)) == "keras"
    assert versions.keras2_env((2, 16)) == {"TF_USE_LEGACY_KERAS": "1"}
    assert versions.keras2_package((2, 21)) == "tf_keras"


def test_the_range_is_the_one_pyproject_declares():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    tf = [d for d in project["dependencies"] if re.match(r"tensorflow\b", d)]
    assert tf == [versions.range_text()]
    assert versions.supported(versions.OLDEST) and versions.supported(versions.NEWEST)
    assert not versions.supported((2, 14)) and not versions.supported((2, 22))


def test_no_extra_names_tensorflow_or_tf_keras():
    """Installing an extra must never change the user's TensorFlow."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = [d for deps in extras.values() for d in deps
             if re.match(r"(tensorflow|tf[_-]keras|tf-nightly)\b", d, re.I)]
    assert not named, named


def test_the_cli_prints_what_gives_keras_2(monkeypatch, capsys):
    monkeypatch.setattr(versions, "installed_tensorflow", lambda: "2.17.1")
    assert cli.main(["keras2"]) == 0
    assert capsys.readouterr().out == "tf_keras~=2.17.0\n"
    monkeypatch.setattr(versions, "installed_tensorflow", lambda: None)
    assert cli.main(["keras2"]) == 2
    assert "not installed" in capsys.readouterr().err


def test_an_on_key_that_is_no_version_names_the_scenario_option():
    from scenarios import meta
    for bad in ("2.x", "2.15-two", "3"):
        with pytest.raises(ValueError, match=r"@scenario: on='.*' is not a range of minors"):
            meta.minors(bad)
