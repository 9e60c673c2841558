"""README.md's example: its code is tests/readme_example.py, and its output
is what the harness really prints for it."""
import inspect
import re
from pathlib import Path

import pytest

import readme_example

README = Path(__file__).resolve().parents[1] / "README.md"


def _block(name: str) -> str:
    text = README.read_text()
    region = text.split(f"<!-- example:{name} -->\n", 1)[1]
    return re.match(r"```[a-z]*\n(.*?)\n```", region, re.S).group(1)


def test_the_code_shown_is_the_code_run():
    assert _block("code") == inspect.getsource(readme_example.train).rstrip()


@pytest.mark.timeout(120)
def test_the_output_shown_is_what_the_harness_prints(mwms_cluster):
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=2)
    result = mwms_cluster.run(readme_example.train, timeout=5)
    assert result.diagnosis == _block("output")
