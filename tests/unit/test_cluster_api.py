"""A Cluster is made from the public options by name, as the plugin makes one
from pytest's: the same checks, errors that name ``Cluster(name=...)``, and
today's ``Cluster(RunSettings(...))`` as before.  Nothing here starts a
process."""
import inspect
import os

import pytest

from harness import Cluster, ClusterShape, SettingError
from harness.settings import RunSettings

pytestmark = pytest.mark.timeout(60)


def test_options_by_name_make_the_settings_the_plugin_would():
    cluster = Cluster(workers=3, timeout=10, grace="2.5", start_method="spawn", network="host")
    assert cluster.settings == RunSettings(workers=3, timeout=10.0, grace=2.5,
                                           start_method="spawn", network="host")
    assert cluster.num_workers == 3


def test_unset_options_take_their_defaults():
    assert Cluster(network="host").settings == RunSettings(network="host")


def test_a_shape_sets_the_number_of_workers():
    cluster = Cluster(cluster="chief:1,worker:2", network="host")
    assert cluster.settings.shape == ClusterShape(chief=1, worker=2)
    assert cluster.num_workers == 3


def test_a_directory_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Cluster(state_dir="ports", network="host").settings.state_dir == \
        os.path.join(str(tmp_path), "ports")


@pytest.mark.parametrize("options, named", [
    ({"workers": "many"}, "Cluster(workers=...)"),
    ({"timeout": -1}, "Cluster(timeout=...)"),
    ({"restart_policy": "pod"}, "Cluster(restart_policy=...)"),
    ({"network": "nowhere"}, "Cluster(network=...)"),
])
def test_a_bad_value_names_the_option_as_given(options, named):
    with pytest.raises(SettingError, match=named.replace("(", r"\(").replace(")", r"\)")):
        Cluster(**options)


def test_an_unknown_option_is_refused_with_the_allowed_ones():
    with pytest.raises(SettingError, match=r"unknown option\(s\) wrkers; allowed: workers, "):
        Cluster(wrkers=3)
    # The reports are the plugin's and `harness run`'s, not a Cluster's.
    with pytest.raises(SettingError, match="report_dir"):
        Cluster(report_dir="reports")


def test_options_go_by_keyword():
    with pytest.raises(SettingError, match=r"by keyword \(Cluster\(workers=3\)\), not 3"):
        Cluster(3)


def test_settings_and_options_together_are_refused():
    with pytest.raises(SettingError, match="not both"):
        Cluster(RunSettings(), workers=3)


def test_run_settings_still_make_a_cluster():
    settings = RunSettings(workers=2, timeout=20.0, network="host")
    assert Cluster(settings).settings is settings


def test_run_s_arguments_past_the_call_s_own_are_keyword_only():
    """So their order, the docstring's groups, can change without breaking
    a call."""
    params = list(inspect.signature(Cluster.run).parameters.values())[1:]
    assert [p.name for p in params[:3]] == ["fn", "args", "kwargs"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params[3:])


def test_run_script_takes_run_s_arguments_in_run_s_order():
    run = list(inspect.signature(Cluster.run).parameters)
    shared = [p for p in inspect.signature(Cluster.run_script).parameters if p in run]
    assert shared == sorted(shared, key=run.index)
