"""The file faults' parts that need no TensorFlow: what counts as a write
under the run's directory, the faults' checks, and their text."""
import os
import types

import pytest

from harness import faults_text
from harness.errors import FaultError
from harness.faults import DiskFull, TornWrite
from harness.worker import files


@pytest.mark.parametrize("mode,flags,writes,truncates", [
    ("r", None, False, False), ("rb", None, False, False), ("w", None, True, True),
    ("wb", None, True, True), ("a", None, True, False), ("x", None, True, False),
    ("r+", None, True, False), (None, os.O_RDONLY, False, False),
    (None, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, True, True),
    (None, os.O_RDWR, True, False), (None, os.O_WRONLY | os.O_APPEND, True, False),
])
def test_what_opens_for_writing_and_what_truncates(mode, flags, writes, truncates):
    assert files._writes(mode, flags) == writes
    assert files._truncates(mode, flags) == truncates


def test_only_paths_under_the_run_directory_are_touched(tmp_path):
    ctx = types.SimpleNamespace(run_dir=str(tmp_path / "run"))
    inside = files._path(str(tmp_path / "run" / "ckpt" / "state.json"))
    assert files._under_run_dir(inside, ctx)
    assert files._under_run_dir(files._path(os.fsencode(inside)), ctx)
    assert not files._under_run_dir(files._path(str(tmp_path / "run-other" / "x")), ctx)
    assert not files._under_run_dir(files._path(3), ctx)   # a file descriptor
    assert not files._under_run_dir(inside, types.SimpleNamespace(run_dir=None))


def test_the_faults_check_and_print_as_they_are_written():
    TornWrite(0, 2, fraction=0.0).check(2)
    for fraction in (1, 1.5, -0.1, float("nan"), "half"):
        with pytest.raises(FaultError, match="fraction"):
            TornWrite(0, 2, fraction=fraction).check(2)
    plan = (DiskFull(1, 4), TornWrite(0, 2, fraction=0.25, attempt=1))
    assert faults_text.parse_plan(faults_text.plan_line(plan)) == plan
