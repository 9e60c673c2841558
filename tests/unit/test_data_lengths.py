"""The length of the dataset each worker distributed, on hand-made
observations: a line when they differ, none otherwise."""
import dataclasses

import pytest

from harness.diagnosis.data import data_lines, length
from harness.diagnosis.observations import Event
from observations import returned

pytestmark = pytest.mark.timeout(30)


def distributing(w, *cardinalities):
    events = tuple(Event(0.3, "dataset", data={"cardinality": c}) for c in cardinalities)
    return dataclasses.replace(w, events=w.events + events)


def test_a_workers_length_is_its_first_datasets_as_tensorflow_knows_it():
    assert length(returned(0, 2)) is None
    assert length(distributing(returned(0, 2), 8, 3)) == 8
    assert length(distributing(returned(0, 2), -2)) is None      # TensorFlow could not say
    assert length(distributing(returned(0, 2), -1)) == -1        # repeated for ever


def test_a_line_only_when_the_lengths_differ():
    same = [distributing(returned(i, 3), 8) for i in range(3)]
    assert data_lines(same) == []
    assert data_lines([returned(0, 2), distributing(returned(1, 2), 8)]) == []
    uneven = [distributing(returned(0, 3), 8), distributing(returned(1, 3), 16),
              distributing(returned(2, 3), 8)]
    assert data_lines(uneven) == [
        "data: the workers distributed datasets of different lengths (workers 0,2: 8 elements; "
        "worker 1: 16 elements), so they run different numbers of steps"]
    forever = [distributing(returned(0, 2), -1), distributing(returned(1, 2), 1)]
    assert "worker 0: repeated for ever; worker 1: 1 element)" in data_lines(forever)[0]
