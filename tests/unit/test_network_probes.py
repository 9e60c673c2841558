"""The network probes' answers travel in the environment: asked again in
this process or in a worker (whose environment is the parent's), a probe
does not start its processes again."""
from __future__ import annotations

import json

from harness.network import namespace as netns


def test_a_probe_runs_once_and_its_answer_is_in_the_environment(monkeypatch):
    monkeypatch.delenv(netns.PROBES_VARIABLE, raising=False)
    calls = []
    monkeypatch.setitem(netns.PROBES, "switch", lambda: calls.append(1) or (False, "no tc"))
    assert netns.switch_available() == (False, "no tc")
    assert netns.switch_available() == (False, "no tc")
    assert calls == [1]
    assert json.loads(netns.os.environ[netns.PROBES_VARIABLE]) == {"switch": [False, "no tc"]}


def test_an_answer_from_the_parent_is_taken_as_it_is(monkeypatch):
    monkeypatch.setenv(netns.PROBES_VARIABLE, json.dumps({"names": [True, ""]}))
    monkeypatch.setitem(netns.PROBES, "names", lambda: 1 / 0)
    assert netns.names_available() == (True, "")


def test_answers_add_up_and_a_torn_variable_is_probed_again(monkeypatch):
    monkeypatch.setenv(netns.PROBES_VARIABLE, "{not json")
    monkeypatch.setitem(netns.PROBES, "namespace", lambda: (True, ""))
    monkeypatch.setitem(netns.PROBES, "names", lambda: (False, "no mount"))
    assert netns.available() == (True, "")
    assert netns.names_available() == (False, "no mount")
    assert json.loads(netns.os.environ[netns.PROBES_VARIABLE]) == {
        "namespace": [True, ""], "names": [False, "no mount"]}
