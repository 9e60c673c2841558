"""Option parsing, TF_CONFIG generation, fault validation: no TensorFlow.
(Ports have their own tests, in test_ports.py.)"""
import json

import pytest

from harness import faults
from harness import plan as plan_module
from harness.core import tfconfig
from harness.faults import FaultError
from harness.launch.devices import (device_assignment, gpu_assignment, shared_assignment,
                                    visible_gpus, worker_environments)
from harness.settings import SettingError, parse_marker
from harness.validators import max_workers, parse_choice, parse_seconds, parse_workers


@pytest.mark.parametrize("value,expected", [("2", 2), (4, 4), (" 3 ", 3), ("1", 1)])
def test_parse_workers_accepts(value, expected):
    assert parse_workers(value, limit=16) == expected


@pytest.mark.parametrize("value", ["0", "-1", "abc", "1000", "2.5", "", True, 2.5])
def test_parse_workers_rejects_with_option_and_range(value):
    with pytest.raises(SettingError) as e:
        parse_workers(value, limit=16)
    assert "--mwms-workers" in str(e.value)
    assert "16" in str(e.value)


def test_max_workers_by_cores_and_memory():
    assert max_workers(cpu_count=2, mem_bytes=24 << 30) == 16
    assert max_workers(cpu_count=64, mem_bytes=2 << 30) == 4
    assert max_workers(cpu_count=256, mem_bytes=1 << 40) == 64


@pytest.mark.parametrize("value", ["0", "-3", "abc", "nan", "inf", "86401", "1e308"])
def test_parse_seconds_rejects(value):
    with pytest.raises(SettingError, match="--mwms-timeout"):
        parse_seconds(value, "--mwms-timeout")


def test_parse_seconds_zero_only_when_allowed():
    assert parse_seconds("0", "--mwms-grace", allow_zero=True) == 0
    assert parse_seconds("2.5", "--mwms-timeout") == 2.5


def test_parse_choice():
    assert parse_choice("GPU", "--mwms-devices", ("cpu", "gpu")) == "gpu"
    with pytest.raises(SettingError, match="--mwms-devices: 'tpu' is not one of cpu, gpu"):
        parse_choice("tpu", "--mwms-devices", ("cpu", "gpu"))


def test_parse_marker():
    assert parse_marker({"workers": 3, "timeout": 5}) == {"workers": 3, "timeout": 5.0}
    with pytest.raises(SettingError, match="unknown argument.*wokers"):
        parse_marker({"wokers": 3})
    with pytest.raises(SettingError, match="keyword arguments only"):
        parse_marker({}, (3,))
    with pytest.raises(SettingError, match=r"mwms\(workers=...\)"):
        parse_marker({"workers": 0})


def test_gpu_assignment_splits_evenly():
    assert gpu_assignment(2, ["0", "1", "2", "3"]) == ["0,1", "2,3"]
    assert gpu_assignment(3, ["0", "1", "2", "3"]) == ["0", "1", "2"]
    with pytest.raises(SettingError, match="only 1 GPU"):
        gpu_assignment(2, ["0"])
    with pytest.raises(SettingError, match="no GPU is visible"):
        gpu_assignment(2, [])


def test_gpu_assignment_points_a_short_machine_at_sharing():
    with pytest.raises(SettingError, match="or gpu-shared to share"):
        gpu_assignment(2, ["0"])


@pytest.mark.parametrize("place,named", [("command line", "--mwms-devices"),
                                         ("ini", "ini mwms_devices"), ("cli", "--devices")])
def test_a_gpu_error_names_the_option_as_the_user_set_it(place, named, monkeypatch):
    from harness.settings import read_settings
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(SettingError, match=f"^{named}=gpu: no GPU is visible"):
        read_settings(lambda o: ("gpu" if o.name == "devices" else o.default, place))


def test_shared_assignment_gives_every_worker_every_gpu():
    assert shared_assignment(3, ["0"]) == ["0", "0", "0"]
    assert shared_assignment(2, ["1", "3"]) == ["1,3", "1,3"]
    with pytest.raises(SettingError, match="no GPU is visible"):
        shared_assignment(2, [])
    with pytest.raises(SettingError, match="^--mwms-devices=gpu-shared: no GPU is visible"):
        device_assignment(2, "gpu-shared", {"CUDA_VISIBLE_DEVICES": ""})


def test_device_assignment_reads_the_gpus_only_where_it_hands_them_out():
    env = {"CUDA_VISIBLE_DEVICES": "2,5"}
    assert device_assignment(2, "cpu", env) == ["-1", "-1"]
    assert device_assignment(2, "gpu", env) == ["2", "5"]
    assert device_assignment(2, "gpu-shared", env) == ["2,5", "2,5"]
    # cpu never looks: no GPU visible is no error there
    assert device_assignment(2, "cpu", {"CUDA_VISIBLE_DEVICES": ""}) == ["-1", "-1"]


def test_worker_environments_hand_each_worker_its_share():
    base = {"CUDA_VISIBLE_DEVICES": "0", "TF_CONFIG": "{}", "KEEP": "1"}
    envs = worker_environments(2, "gpu-shared", base)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "0"]
    assert all("TF_CONFIG" not in e and e["KEEP"] == "1" for e in envs)


def test_visible_gpus_from_env():
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,2"}) == ["0", "2"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_tf_config_cluster():
    configs = tfconfig.cluster_configs([20001, 20002, 20003])
    assert [c["task"]["index"] for c in configs] == [0, 1, 2]
    assert all(c["cluster"]["worker"] == ["127.0.0.1:20001", "127.0.0.1:20002",
                                          "127.0.0.1:20003"] for c in configs)
    assert json.loads(tfconfig.dumps(configs[1])) == configs[1]
    with pytest.raises(ValueError):
        tfconfig.tf_config([1, 2], 2)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("worker_pos", ["first", "last"])
@pytest.mark.parametrize("kind", faults.BAD_CONFIG_KINDS)
def test_bad_config_differs_only_for_that_worker(n, worker_pos, kind):
    worker = 0 if worker_pos == "first" else n - 1
    good = tfconfig.cluster_configs([21000 + i for i in range(n)])
    bad = tfconfig.apply_bad_config(good, worker, kind, spare_port=29999)
    for i in range(n):
        if i != worker:
            assert bad[i] == good[i]
    assert bad[worker] != good[worker]
    if kind == "missing":
        assert bad[worker] is None
    elif kind == "wrong_size":
        assert len(bad[worker]["cluster"]["worker"]) == n + 1
    elif kind == "duplicate_index":
        assert bad[worker]["task"]["index"] != worker
    elif kind == "swapped":
        assert sorted(bad[worker]["cluster"]["worker"]) == sorted(good[worker]["cluster"]["worker"])
        own = good[worker]["cluster"]["worker"][worker]
        assert bad[worker]["cluster"]["worker"][worker] != own
    elif kind == "wrong_port":
        assert "127.0.0.1:29999" in bad[worker]["cluster"]["worker"]


def test_faults_are_plain_values():
    f = faults.SkipStep(worker=1, step=5)
    assert f == faults.SkipStep(1, 5) and hash(f) == hash(faults.SkipStep(1, 5))
    assert repr(f) == "SkipStep(worker=1, step=5)"
    assert eval(repr(faults.Pause(0, 3, seconds=None)), vars(faults)) == faults.Pause(0, 3)


@pytest.mark.parametrize("fault,message", [
    (faults.SkipStep(7, 1), "worker 7 does not exist in a cluster of 4"),
    (faults.SkipStep(-1, 1), "does not exist"),
    (faults.SkipStep(0, -2), "step must be an integer from 0 to 1e\\+09"),
    (faults.SkipStep(0, 10**9 + 1), "step must be an integer from 0 to 1e\\+09"),
    (faults.Delay(1, 1, 1e308), r"seconds must be at most 86400 \(a day\), got 1e\+308"),
    (faults.Delay(1, 1, float("inf")), "seconds must be at most 86400"),
    (faults.Pause(0, 1, 86_400.5), "seconds must be at most 86400"),
    (faults.Latency(0, 1, ms=1e9), r"ms must be at most 600000 \(ten minutes\)"),
    (faults.Bandwidth(0, 1, kbps=1e12), "kbps must be at most"),
    (faults.Delay(0, 1, -1.0), "seconds must be 0 or more"),
    (faults.Pause(0, 1, -5), "seconds must be 0 or more"),
    (faults.Crash(0, 1, "explode"), "how must be one of exit, kill, abort"),
    (faults.BadTFConfig(0, "bogus"), "kind must be one of"),
    ("SkipStep(0, 1)", "is not a fault"),
])
def test_bad_faults_rejected(fault, message):
    with pytest.raises(FaultError, match=message):
        plan_module.validate([fault], 4)


def test_validate_returns_plan():
    plan = [faults.SkipStep(0, 1), faults.Crash(3, 2, "kill")]
    assert plan_module.validate(plan, 4) == tuple(plan)
    assert plan_module.validate(faults.Delay(1, 0, 0.5), 2) == (faults.Delay(1, 0, 0.5),)
    assert plan_module.validate(None, 2) == ()


@pytest.mark.parametrize("place, named", [
    ("command line", "--mwms-timeout"), ("ini", "ini mwms_timeout"), ("cli", "--timeout")])
def test_one_pipeline_names_where_a_bad_value_came_from(place, named):
    from harness.settings import read_settings
    with pytest.raises(SettingError, match=rf"^{named}: 'soon' is not a number of seconds"):
        read_settings(lambda o: ("soon" if o.name == "timeout" else o.default, place))


def test_one_pipeline_gives_the_defaults_and_chooses_the_start_method_by_device():
    from harness.settings import RunSettings, read_settings
    assert read_settings(lambda o: (o.default, "ini")) == RunSettings()


def test_the_marker_takes_exactly_the_options_marked_for_it():
    from harness.settings import MARKER_KEYS, OPTIONS, RunSettings, apply_marker
    assert MARKER_KEYS == tuple(o.field for o in OPTIONS if "marker" in o.places)
    assert apply_marker(RunSettings(), {"workers": "3", "grace": 0}).workers == 3
    with pytest.raises(SettingError, match=r"@pytest.mark.mwms\(timeout=\.\.\.\): 0 is out"):
        apply_marker(RunSettings(), {"timeout": 0})


def test_each_option_s_choices_are_the_rows_of_the_table_they_configure():
    """The choices are declared with the options (the plugin loads nothing
    heavier); each module they configure has exactly these rows."""
    from harness import validators
    from harness.launch.backends import BACKENDS
    from harness.launch.devices import ASSIGNMENTS
    assert tuple(ASSIGNMENTS) == validators.DEVICES
    assert tuple(BACKENDS) == validators.BACKEND_NAMES
    assert validators.DEFAULT_BACKEND in BACKENDS
    from harness.diagnosis.observations import Outcome
    assert {Outcome(v) for v in validators.RESTART_ON.values()} <= set(Outcome)


def test_loading_the_plugin_loads_only_the_options_table():
    import subprocess
    import sys
    code = ("import sys, harness.plugin; print(sorted(m for m in sys.modules "
            "if m.startswith(('harness', 'multiprocess', 'psutil', 'dill', 'numpy', "
            "'tensorflow'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert eval(out) == ["harness", "harness.core", "harness.core.tfconfig", "harness.errors",
                         "harness.plugin", "harness.settings", "harness.validators"]


def test_a_marker_may_list_the_workers_one_test_instance_each():
    from harness.settings import RunSettings, apply_marker, instance_id, marker_instances
    assert parse_marker({"workers": [2, 3]}) == {"workers": (2, 3)}
    instances = marker_instances({"workers": [2, 3], "timeout": 5})
    assert instances == [{"workers": 2}, {"workers": 3}]
    assert [instance_id(i) for i in instances] == ["2workers", "3workers"]
    assert marker_instances({"workers": 3}) == [] and marker_instances({}) == []
    assert apply_marker(RunSettings(), {"workers": [2, 3]}, instance={"workers": 3}).workers == 3
    # Without an instance (a test that takes no cluster), the list changes nothing.
    assert apply_marker(RunSettings(workers=4), {"workers": [2, 3]}).workers == 4


@pytest.mark.parametrize("workers, message", [
    ([], "the list is empty"),
    ([2, "two"], "'two' is not a whole number"),
    ([2, 1000], "1000 is out of range"),
    ([2, 2], "2 is given twice in [2, 2]"),
])
def test_a_bad_list_of_workers_is_named(workers, message):
    with pytest.raises(SettingError) as e:
        parse_marker({"workers": workers})
    assert str(e.value).startswith("@pytest.mark.mwms(workers=...): ") and message in str(e.value)


def test_a_list_of_workers_and_a_cluster_shape_are_refused_together():
    with pytest.raises(SettingError, match="both set the cluster's size"):
        parse_marker({"workers": [2, 3], "cluster": "chief:1,worker:1"})


def test_only_the_options_marked_for_it_take_a_list():
    with pytest.raises(SettingError, match=r"mwms\(timeout=\.\.\.\)"):
        parse_marker({"timeout": [5, 10]})


def test_every_fault_kind_is_on_the_public_line():
    from harness import faults
    assert {cls.__name__ for cls in faults.FAULT_TYPES} <= set(faults.__all__)
