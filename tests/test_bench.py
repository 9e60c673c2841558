"""Tests of the benchmark: the launcher comparison (``python -m harness.bench``),
the warm run against the floor, the step cost and the recorder's cost.

Most are of its pure parts (statistics, formatting, the run order, the
summary and the table, built from made-up runs) and need no TensorFlow.
One smoke test runs the real thing, harness launcher only, workload 1, one
repeat, in a subprocess, and checks the JSON it writes.
"""
import json
import os
import subprocess
import sys

import pytest

from harness.bench import common
from harness.bench.launchers import compare, table
from harness.bench.launchers.plan import make_workloads, schedule


# -- statistics -----------------------------------------------------------------

def test_quantile_interpolates_like_numpy():
    v = [1.0, 2.0, 3.0, 4.0]
    assert common.quantile(v, 0.5) == 2.5
    assert common.quantile(v, 0.25) == 1.75
    assert common.quantile(v, 0.75) == 3.25
    assert common.quantile([7.0], 0.5) == 7.0
    with pytest.raises(ValueError):
        common.quantile([], 0.5)


def test_stats_ignores_missing_values():
    st = common.stats([3.0, None, 1.0, 2.0])
    assert st == {"n": 3, "median": 2.0, "min": 1.0, "max": 3.0, "q1": 1.5, "q3": 2.5}
    assert common.stats([None, None]) is None
    assert common.stats([]) is None


def test_ratio():
    assert common.ratio(2.0, 0.5) == 4.0
    assert common.ratio(None, 1.0) is None
    assert common.ratio(1.0, None) is None
    assert common.ratio(1.0, 0.0) is None


# -- formatting -------------------------------------------------------------------

def test_fmt_seconds_and_ratio():
    assert table.fmt_seconds(0.4123) == "0.41 s"
    assert table.fmt_seconds(150.2) == "150 s"
    assert table.fmt_seconds(None) == "–"
    assert table.fmt_ratio(1.0) == "1.0×"
    assert table.fmt_ratio(12.34) == "12.3×"
    assert table.fmt_ratio(250.0) == "250×"
    assert table.fmt_ratio(None) == "–"
    assert table.fmt_mib(255.4) == "255"
    assert table.fmt_mib(None) == "–"


def test_fmt_spread():
    assert table.fmt_spread(common.stats([0.4, 0.5, 0.45])) == "0.40–0.50 s"
    assert table.fmt_spread(common.stats([0.4])) == "(1 run)"
    assert table.fmt_spread(None) == "–"


def test_fmt_over_t_says_plus_or_minus():
    assert table.fmt_over_t(0.0912) == "T + 0.09 s"
    assert table.fmt_over_t(-4.49) == "T − 4.49 s"
    assert table.fmt_over_t(None) == "–"
    assert table.fmt_over_t(None, seen=False) == "before the hang began"


def test_fmt_culprits():
    assert table.fmt_culprits([[1], [1]], 1) == "yes (worker 1)"
    assert table.fmt_culprits([[0, 1], [1, 0]], 1) == "ambiguous (workers 0,1)"
    assert table.fmt_culprits([[], []], 1) == "no"
    assert table.fmt_culprits([[1], [0, 1]], 1) == "exact 1/2, among several 1/2"
    assert table.fmt_culprits([], 1) == "–"


def test_fmt_bool_runs():
    assert table.fmt_bool_runs([True, True]) == "yes"
    assert table.fmt_bool_runs([False, None]) == "no"
    assert table.fmt_bool_runs([True, False, True]) == "2/3"
    assert table.fmt_bool_runs([None]) == "–"


# -- run order and options --------------------------------------------------------------

def test_schedule_alternates_launchers_and_caps_hang_runs():
    plan = schedule(["harness", "spawn", "runner"], [1, 4], repeats=3, hang_repeats=2)
    # One cold run per launcher first, of the first completing workload.
    assert plan[:3] == [("harness", 1, -1, True), ("spawn", 1, -1, True), ("runner", 1, -1, True)]
    warm = plan[3:]
    # A B C A B C ...: every consecutive triple is one workload under all three launchers.
    for i in range(0, len(warm), 3):
        triple = warm[i:i + 3]
        assert [t[0] for t in triple] == ["harness", "spawn", "runner"]
        assert len({(t[1], t[2]) for t in triple}) == 1
    assert sum(1 for t in warm if t[1] == 1) == 9
    assert sum(1 for t in warm if t[1] == 4) == 6  # hang_repeats=2 rounds x 3 launchers
    assert not any(t[3] for t in warm)


def test_schedule_gives_the_floor_the_completing_workloads_only():
    plan = schedule(["floor", "harness"], [1, 4], repeats=2, hang_repeats=2)
    assert {t[1] for t in plan if t[0] == "floor"} == {1}
    assert sum(1 for t in plan if t[0] == "harness" and t[1] == 4) == 2


def test_the_floor_runs_the_loop_on_each_worker():
    from harness.bench.launchers.floor import FloorServer
    server = FloorServer()
    try:
        answers = server.run("harness.workloads:allreduce_loop", {"n_steps": 3}, 2)
    finally:
        server.close()
    assert [a["value"] for a in answers] == [2.0, 2.0], answers
    assert all(a["began"] <= a["ended"] for a in answers)
    assert server.proc.poll() is not None
    assert not os.path.exists(server.tmpdir)   # autograph's files went with it


def test_the_warm_benchmark_prints_the_ratio_and_each_phase(capsys):
    from harness.bench import warm
    assert warm.main(["--workers", "2", "--rounds", "1", "--check", "1000"]) == 0
    out = capsys.readouterr().out
    assert "| 2 | " in out and "harness / floor" in out
    for phase in ("launch", "start", "strategy", "steps", "teardown"):
        assert f"| {phase} | " in out
    assert "within the limit of 1000×" in out


def test_the_warm_check_fails_above_its_limit():
    from harness.bench.warm import check
    fig = {"rows": {2: {"ratio": 1.62}, 4: {"ratio": 1.1}}}
    assert check(fig, 1.5) == (False, "warm run at 2 workers: 1.62× the floor, ABOVE the "
                                      "limit of 1.5×")
    assert check(fig, 1.7)[0]


def test_schedule_cold_run_is_a_completing_workload():
    plan = schedule(["harness"], [4], repeats=1, hang_repeats=1)
    assert plan[0] == ("harness", 1, -1, True)
    assert plan[1] == ("harness", 4, 0, False)


def test_parse_args_defaults_and_subsets():
    a = compare.parse_args([])
    assert (a.repeats, a.hang_timeout, a.json) == (5, 10.0, "bench-results.json")
    assert a.launchers == ["floor", "harness", "spawn", "runner", "ray"]
    assert a.workloads == [1, 2, 3, 4, 5]
    a = compare.parse_args(["--launchers", "harness,spawn", "--workloads", "1,4", "--repeats", "2"])
    assert a.launchers == ["harness", "spawn"] and a.workloads == [1, 4] and a.repeats == 2


@pytest.mark.parametrize("argv", [["--launchers", "harness,mpi"], ["--workloads", "6"],
                                  ["--repeats", "0"], ["--hang-timeout", "0"]])
def test_parse_args_rejects_bad_values(argv, capsys):
    with pytest.raises(SystemExit):
        compare.parse_args(argv)


def test_workloads_match_the_issue():
    w = make_workloads(10.0)
    assert (w[1].workers, w[1].kwargs["n_steps"], w[1].expect_hang) == (2, 20, False)
    assert (w[2].workers, w[2].kwargs["n_steps"]) == (4, 20)
    assert (w[3].fn, w[3].workers) == ("seed_training", 2)
    assert w[3].kwargs["epochs"] * w[3].kwargs["steps_per_epoch"] == 100
    assert w[4].expect_hang and w[4].skip == (1, 5) and w[4].hang_timeout == 10.0


# -- summary and table from a made-up results set ------------------------------------------

def _run(launcher, workload, wall, rep=0, cold=False, ok=True, **kw):
    """One raw run as the launchers record it (only the fields the summary reads)."""
    run = dict(launcher=launcher, workload=workload, repeat=rep, cold=cold, ok=ok,
               outcome="completed", wall_s=wall)
    run.update(kw)
    return run


def _hang(launcher, wall, over_t, culprits, stack, gone, rep=0, seen=True):
    """A workload-4 run: reported ``over_t`` past T after the hang began."""
    r = _run(launcher, 4, wall, rep=rep, outcome="hang", culprits=culprits, stack_dumped=stack,
             named_culprit=culprits == [1], gone_after_report_s=gone, hang_start_seen=seen)
    if seen:
        r["detection_over_T_s"] = over_t
        r["report_after_hang_s"] = 10.0 + over_t
    return r


FAKE_RUNS = [
    _run("harness", 1, 5.0, rep=-1, cold=True, pss_bytes=250 << 20),
    _run("runner", 1, 5.5, rep=-1, cold=True, pss_bytes=280 << 20),
    _run("harness", 1, 0.40, pss_bytes=250 << 20), _run("runner", 1, 1.02, pss_bytes=280 << 20),
    _run("harness", 1, 0.44, rep=1, pss_bytes=260 << 20),
    _run("runner", 1, 1.06, rep=1, pss_bytes=290 << 20),
    _run("harness", 1, 9.0, rep=2, ok=False, error="boom"),
    dict(_hang("harness", 10.5, 0.09, [0, 1], True, 0.0), detection_delay_s=0.012),
    _hang("runner", 40.0, 28.8, [], False, 0.2),
]


def test_summarize_uses_warm_ok_runs_and_ratios_against_the_harness():
    s = table.summarize(FAKE_RUNS, ["harness", "runner"], [1, 4])
    h1, r1 = s["harness"]["1"], s["runner"]["1"]
    assert h1["wall"]["n"] == 2 and h1["wall"]["median"] == pytest.approx(0.42)
    assert h1["failed"] == 1 and h1["runs"] == 3
    assert h1["cold_s"] == 5.0 and r1["cold_s"] == 5.5
    assert h1["ratio_vs_harness"] == pytest.approx(1.0)
    assert r1["ratio_vs_harness"] == pytest.approx(1.04 / 0.42)
    assert r1["cold_ratio_vs_harness"] == pytest.approx(1.1)
    assert h1["pss_mib"] == pytest.approx(255.0)
    h4, r4 = s["harness"]["4"], s["runner"]["4"]
    assert h4["detection_over_T"]["median"] == pytest.approx(0.09)
    assert r4["detection_over_T"]["median"] == pytest.approx(28.8)
    assert h4["culprits"] == [[0, 1]] and r4["stack_dumped"] == [False]
    assert r4["gone_after_report"]["max"] == pytest.approx(0.2)
    assert h4["cold_s"] is None


def test_render_table_rows_and_cells():
    s = table.summarize(FAKE_RUNS, ["harness", "runner"], [1, 4])
    text = table.render_table(s, make_workloads(10.0))
    lines = text.splitlines()
    assert lines[0] == table.TABLE_HEADER
    assert len(lines) == 2 + 4
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert all(len(c) == lines[0].count("|") - 1 for c in cells)
    h1, r1, h4, r4 = cells
    assert h1[:7] == ["harness", "1: 2 workers, 20 all-reduce steps (1 failed)", "0.42 s",
                      "0.40–0.44 s", "1.0×", "5.00 s", "255"]
    assert r1[0] == "runner" and r1[4] == "2.5×" and r1[5] == "5.50 s"
    assert h4[7:] == ["T + 0.09 s (declared T + 0.01 s)", "ambiguous (workers 0,1)", "yes",
                      "0.00 s"]
    assert r4[7:] == ["T + 28.80 s", "no", "no", "0.20 s"]
    assert r4[4] == "3.8×"


def test_render_table_when_a_launcher_fired_before_the_hang_began():
    runs = [_hang("spawn", 10.0, None, [], False, 0.03, seen=False)]
    s = table.summarize(runs, ["spawn"], [4])
    text = table.render_table(s, make_workloads(10.0))
    assert "before the hang began" in text
    assert "| – |" in text  # no harness figure to compare with
    runs.append(_hang("spawn", 10.0, -2.0, [], False, 0.03, rep=1))
    text = table.render_table(table.summarize(runs, ["spawn"], [4]), make_workloads(10.0))
    assert "T − 2.00 s (1/2 before the hang began)" in text


def test_notes_and_machine_line():
    s = table.summarize(FAKE_RUNS, ["harness", "runner"], [1])
    notes = table.render_notes(s, {"overhead_pss_mib": {"harness": 256.0, "runner": 777.0},
                                   "launcher_startup_s": {"runner": 2.5}}, compare.NOTES)
    assert "harness 256 MiB" in notes and "runner 777 MiB" in notes
    assert "runner 2.50 s" in notes and "30 s" in notes
    line = common.machine_line({"cores": 2, "ram_gib": 23.5, "cpu_model": "Xeon", "python": "3.11.7",
                               "tensorflow": "2.21.0", "keras": "3.15.1",
                               "load_avg": [3.0, 2, 1], "load_avg_end": [2.5, 2, 1]})
    assert line.startswith("Machine: 2 cores, 23.5 GiB RAM, Xeon; Python 3.11.7, TensorFlow 2.21.0")
    assert "load 3.0 at start, 2.5 at end" in line


def test_machine_info_does_not_import_tensorflow():
    code = ("import sys; from harness import workloads; "
            "from harness.bench import common; "
            "from harness.bench.launchers import compare, workers; "
            "m = common.machine_info(); assert m['cores'] and m['python']; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# -- the real thing, once ------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_smoke_harness_workload_1(tmp_path):
    out, md = tmp_path / "bench.json", tmp_path / "bench.md"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench", "--repeats", "1", "--launchers", "harness",
         "--workloads", "1", "--json", str(out), "--markdown", str(md)],
        capture_output=True, text=True, timeout=280, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    for key in ("machine", "settings", "workloads", "runs", "summary", "markdown",
                "overhead_pss_mib", "launcher_errors"):
        assert key in data, key
    assert data["launcher_errors"] == {}
    runs = data["runs"]
    assert [(r["launcher"], r["workload"], r["cold"]) for r in runs] == [
        ("harness", 1, True), ("harness", 1, False)]
    assert all(r["ok"] and r["outcome"] == "completed" for r in runs)
    assert all(r["pss_bytes"] > 0 for r in runs)
    fig = data["summary"]["harness"]["1"]
    assert fig["wall"]["n"] == 1 and fig["wall"]["median"] > 0 and fig["cold_s"] > 0
    assert table.TABLE_HEADER in proc.stdout
    assert md.read_text() == data["markdown"]


# -- the launchers' pure helpers ------------------------------------------------------------------

def test_marks_and_hang_start(tmp_path):
    from harness.bench.launchers import measure as bl
    assert bl.read_marks(str(tmp_path), "pid") == {}
    assert bl.read_marks(None, "pid") == {}
    (tmp_path / "pid.0").write_text("123")
    (tmp_path / "pid.1").write_text("456")
    (tmp_path / "pid.2.tmp").write_text("7")      # half-written: ignored
    (tmp_path / "loop_end.1").write_text("100.5")
    assert bl.read_marks(str(tmp_path), "pid") == {0: 123.0, 1: 456.0}
    assert bl.hang_start(str(tmp_path)) == 100.5
    figs = bl.detection_figures(str(tmp_path), report_time=110.6, timeout=10.0)
    assert figs["hang_start_seen"] and figs["detection_over_T_s"] == pytest.approx(0.1)
    assert bl.detection_figures(str(tmp_path / "none"), 1.0, 10.0) == {"hang_start_seen": False}


def test_return_value_checks():
    from harness.bench.launchers import measure as bl
    w1 = make_workloads()[1]
    good = [{"value": 2.0, "pss": 100, "fn_s": 0.2}, {"value": 2.0, "pss": 50, "fn_s": 0.3}]
    assert bl.completed_ok(w1, good)
    assert not bl.completed_ok(w1, good[:1])
    assert not bl.completed_ok(w1, [{"value": 1.0}, {"value": 2.0}])
    assert bl.pss_total(good, 2) == 150
    assert bl.pss_total([{"pss": None}, {"pss": 5}], 2) is None
    assert bl.fn_seconds(good) == 0.3
    assert bl.fn_seconds([]) is None


def test_wait_gone_counts_dead_pids_as_gone():
    from harness.bench.launchers import measure as bl
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    import time
    assert bl.wait_gone([proc.pid], time.monotonic(), limit=1.0) < 1.0
    assert bl.wait_gone([], time.monotonic()) < 1.0


def test_worker_kwargs_give_every_launcher_the_same_user_code_skip(tmp_path):
    from harness.bench.launchers import measure as bl
    w4 = make_workloads()[4]
    kwargs = bl.worker_kwargs(w4, str(tmp_path))
    assert kwargs["skip"] == [1, 5] and kwargs["linger"] > 0
    w1 = make_workloads()[1]
    assert bl.worker_kwargs(w1, str(tmp_path)) == {
        "fn": "allreduce", "kwargs": {"n_steps": 20}, "stamp_dir": str(tmp_path)}


def test_measured_run_outside_the_harness(tmp_path, monkeypatch):
    """Outside a harness worker the steps are range(n), less the skipped one;
    the pid and loop-end marks, PSS and fn_s come from measured_run's steps."""
    from harness.bench.launchers import workers
    monkeypatch.setitem(workers.WORKLOAD_FNS, "count",
                        lambda n_steps, steps: float(len(list(steps(n_steps)))))
    monkeypatch.setenv("TF_CONFIG", json.dumps({"task": {"type": "worker", "index": 1}}))
    out = workers.measured_run("count", {"n_steps": 20}, stamp_dir=str(tmp_path), skip=[1, 5])
    assert out["index"] == 1 and out["value"] == 19.0 and out["fn_s"] >= 0
    assert (tmp_path / "pid.1").read_text() == repr(out["pid"])
    assert float((tmp_path / "loop_end.1").read_text()) > 0
    assert workers.measured_run("count", {"n_steps": 3}, skip=[0, 1])["value"] == 3.0


# -- python -m harness.bench.cost.step: pure parts ----------------------------------------------

from harness.bench.cost import step as sc  # noqa: E402


def test_step_cost_variant_table():
    assert list(sc.VARIANTS)[:3] == ["range", "steps", "sync_check"]
    assert sc.VARIANTS["range"] == ("range", {})
    assert sc.VARIANTS["steps"] == ("steps", {})
    assert sc.VARIANTS["sync_check"] == ("steps", {"sync_check": True})
    assert sc.REFERENCE == "range" and sc.REFERENCE in sc.VARIANTS
    from harness.bench.cost.workers import STEP_KINDS
    assert all(v.steps in STEP_KINDS for v in sc.VARIANTS.values())


def test_step_cost_unsupported_kwargs():
    def run(fn, args=(), kwargs=None, *, timeout=None, sync_check=False):
        pass

    def anything(fn, **kw):
        pass

    def positional_only(fn, ledger, /):
        pass

    assert sc.unsupported_kwargs(run, {"sync_check": True}) == []
    assert sc.unsupported_kwargs(run, {"ledger": False, "sync_check": True}) == ["ledger"]
    assert sc.unsupported_kwargs(anything, {"ledger": "collectives"}) == []
    assert sc.unsupported_kwargs(positional_only, {"ledger": False}) == ["ledger"]


def test_step_cost_skips_variants_run_does_not_accept(capsys):
    def run(self, fn, args=(), kwargs=None, *, timeout=None, sync_check=False):
        pass

    variants = {"range": sc.Variant("range"), "sync_check": sc.Variant("steps", {"sync_check": True}),
                "ledger_off": sc.Variant("steps", {"ledger": False}),
                "both": sc.Variant("steps", {"ledger": "collectives", "x": 1})}
    runnable, skipped = sc.split_supported(variants, run)
    assert runnable == ["range", "sync_check"]
    assert skipped == {"ledger_off": "Cluster.run does not accept ledger yet",
                       "both": "Cluster.run does not accept ledger, x yet"}


def test_step_cost_checks_the_real_cluster_run():
    from harness.controller import Cluster
    runnable, skipped = sc.split_supported(sc.VARIANTS, Cluster.run)
    assert {"range", "steps", "sync_check"} <= set(runnable)
    assert set(runnable) | set(skipped) == set(sc.VARIANTS)


def test_step_cost_schedule_alternates():
    plan = sc.schedule(["range", "steps", "sync_check"], rounds=3)
    assert plan == [(r, v) for r in range(3) for v in ("range", "steps", "sync_check")]
    assert sc.schedule(["range"], 0) == []


def _timed(index, timed_s, loop_s=None, value=2.0, cpu=0.5):
    return {"index": index, "value": value, "timed_s": timed_s,
            "loop_s": timed_s * 1.1 if loop_s is None else loop_s,
            "cpu_timed_s": cpu, "cpu_total_s": cpu + 1.0}


def test_step_cost_worker_figures_take_the_slowest_worker():
    figs = sc.worker_figures([_timed(0, 0.9), _timed(1, 1.0, loop_s=1.2, cpu=0.25)], steps=510,
                             warmup=10, workers=2)
    assert figs["ms_per_step"] == pytest.approx(2.0)                 # 1.0 s / 500 steps
    assert figs["ms_per_step_workers"] == pytest.approx([1.8, 2.0])
    assert figs["loop_ms_per_step"] == pytest.approx(1200.0 / 510)
    assert figs["workers_cpu_ms_per_step"] == pytest.approx(1.5)     # 0.75 s / 500 steps
    assert figs["workers_cpu_total_s"] == pytest.approx(2.75)
    assert sc.worker_figures([_timed(0, 0.9), None], 510, 10, 2) is None
    assert sc.worker_figures([_timed(0, 0.9)], 510, 10, 2) is None
    assert sc.values_ok([_timed(0, 1), _timed(1, 1)], 2)
    assert not sc.values_ok([_timed(0, 1), _timed(1, 1, value=1.0)], 2)
    assert not sc.values_ok([_timed(0, 1)], 2)


def _cost_run(variant, rnd, ms, cpu, ok=True, cold=False):
    return {"variant": variant, "round": rnd, "ok": ok, "cold": cold, "ms_per_step": ms,
            "loop_ms_per_step": ms + 0.1, "parent_cpu_ms_per_step": cpu, "wall_s": 2.0,
            "workers_cpu_ms_per_step": 2 * ms, "other_cpu_share": 0.01 * rnd}


def test_step_cost_other_cpu_share():
    assert sc.other_cpu_share(3.0, 2.0, wall_s=1.0, cores=2) == pytest.approx(0.5)
    assert sc.other_cpu_share(1.9, 2.0, wall_s=1.0, cores=2) == 0.0
    assert sc.other_cpu_share(None, 2.0, 1.0, 2) is None
    assert sc.other_cpu_share(3.0, None, 1.0, 2) is None
    busy = common.machine_busy_seconds()
    assert busy is None or busy > 0


COST_RUNS = [
    _cost_run("range", -1, 9.0, 9.0, cold=True),
    _cost_run("range", 0, 1.6, 0.30), _cost_run("steps", 0, 2.1, 0.50),
    _cost_run("sync_check", 0, 4.0, 0.70),
    _cost_run("range", 1, 1.8, 0.32), _cost_run("steps", 1, 2.5, 0.55),
    _cost_run("sync_check", 1, 4.4, 0.80),
    _cost_run("range", 2, 1.7, 0.31), _cost_run("steps", 2, 2.2, 0.52),
    _cost_run("sync_check", 2, 9.9, 9.9, ok=False),
]


def test_step_cost_paired_differences_match_rounds():
    assert sc.paired_differences(COST_RUNS, "steps") == pytest.approx([0.5, 0.7, 0.5])
    # Round 2's sync_check failed: that round is left out, not paired with another.
    assert sc.paired_differences(COST_RUNS, "sync_check") == pytest.approx([2.4, 2.6])
    assert sc.paired_differences(COST_RUNS, "steps", key="parent_cpu_ms_per_step") == \
        pytest.approx([0.20, 0.23, 0.21])
    assert sc.paired_differences(COST_RUNS, "nothing") == []


def test_step_cost_summary_and_table():
    s = sc.summarize(COST_RUNS, ["range", "steps", "sync_check"])
    assert s["range"]["ms_per_step"]["median"] == pytest.approx(1.7)     # cold run left out
    assert (s["range"]["runs"], s["range"]["failed"]) == (3, 0)
    assert "diff_ms_per_step" not in s["range"]
    assert s["steps"]["ms_per_step"]["median"] == pytest.approx(2.2)
    assert s["steps"]["diff_ms_per_step"]["median"] == pytest.approx(0.5)
    assert s["steps"]["diff_parent_cpu_ms_per_step"]["median"] == pytest.approx(0.21)
    assert s["steps"]["diff_workers_cpu_ms_per_step"]["median"] == pytest.approx(1.0)
    assert (s["sync_check"]["runs"], s["sync_check"]["failed"]) == (3, 1)
    assert s["sync_check"]["ms_per_step"]["n"] == 2
    assert s["steps"]["other_cpu_share"]["max"] == pytest.approx(0.02)

    table = sc.render_table(s, sc.VARIANTS, skipped={"ledger_off": "Cluster.run does not "
                                                                   "accept ledger yet"})
    lines = table.splitlines()
    assert lines[0] == sc.TABLE_HEADER
    assert len(lines) == 2 + 4
    ncols = lines[0].count("|") - 1
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert all(len(c) == ncols for c in cells)
    r, st, sy, skip = cells
    assert r == ["range", "`range(n)`", "–", "1.70", "1.60 to 1.80", "(reference)", "3.40",
                 "0.31", "(reference)", "3/3"]
    assert st[:6] == ["steps", "`context().steps(n)`", "–", "2.20", "2.10 to 2.50",
                      "+0.50 (+0.50 to +0.70)"]
    assert st[6:] == ["4.40", "0.52", "+0.21", "3/3"]
    assert sy[2] == "sync_check=True" and sy[-1] == "2/3" and sy[5] == "+2.50 (+2.40 to +2.60)"
    assert skip[0] == "ledger_off" and skip[2] == "ledger=False"
    assert skip[3] == "skipped: Cluster.run does not accept ledger yet"

    notes = sc.render_notes({"workers": 2, "steps": 600, "warmup": 10, "rounds": 1,
                             "cores": 2}, "range", s)
    assert "1 round," in notes and "divided by 590" in notes
    assert "other load" in notes and "at most 2% of the 2 cores" in notes


def test_step_cost_parse_args():
    a = sc.parse_args([])
    assert (a.rounds, a.steps, a.workers, a.warmup) == (5, 600, 2, 10)
    assert a.variants == list(sc.VARIANTS)
    a = sc.parse_args(["--variants", "steps,range", "--rounds", "2", "--steps", "50"])
    assert a.variants == ["steps", "range"] and (a.rounds, a.steps) == (2, 50)
    for bad in (["--variants", "range,bogus"], ["--rounds", "0"], ["--warmup", "600"],
                ["--timeout", "0"]):
        with pytest.raises(SystemExit):
            sc.parse_args(bad)


def test_timed_allreduce_rejects_bad_arguments():
    from harness.bench.cost import workers
    with pytest.raises(ValueError, match="steps_kind"):
        workers.timed_allreduce(10, steps_kind="nope")
    with pytest.raises(ValueError, match="warmup"):
        workers.timed_allreduce(10, warmup=10)


@pytest.mark.timeout(300)
def test_smoke_step_cost(tmp_path):
    """A tiny real run: 1 round of 50 steps, each variant Cluster.run accepts."""
    out, md = tmp_path / "cost.json", tmp_path / "cost.md"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench.cost.step", "--rounds", "1", "--steps", "50",
         "--json", str(out), "--markdown", str(md)],
        capture_output=True, text=True, timeout=280, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    ran = [v for v in sc.VARIANTS if v not in data["skipped"]]
    assert {"range", "steps", "sync_check"} <= set(ran)
    for name in data["skipped"]:
        assert f"skipping variant {name}" in proc.stderr
    assert [(r["round"], r["variant"]) for r in data["runs"]] == sc.schedule(ran, 1)
    assert data["cold"]["ok"] and all(r["ok"] for r in data["runs"])
    for r in data["runs"]:
        assert 0 < r["ms_per_step"] < 1000 and r["parent_cpu_s"] > 0
        assert [w["index"] for w in r["workers"]] == [0, 1]
        assert r["ms_per_step"] == pytest.approx(1000 * max(w["timed_s"] for w in r["workers"]) / 40)
        assert r["workers_cpu_ms_per_step"] > 0
    s = data["summary"]
    assert s["steps"]["diff_ms_per_step"]["n"] == 1 and "diff_ms_per_step" not in s["range"]
    assert sc.TABLE_HEADER in proc.stdout
    assert md.read_text() == data["markdown"]


def test_alternate_pairs_each_variant_with_the_reference_round_by_round():
    from harness.bench.cost.paired import alternate, render_walls
    order = []
    fig = alternate({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3, "a")
    assert order == ["a", "b"] * 3
    assert fig["a"]["n"] == 3 and fig["paired b"]["n"] == 3 and "paired a" not in fig
    table = render_walls(fig, ("a", "b"), "variant").splitlines()
    assert table[0].startswith("| variant | wall per run, ms") and len(table) == 4


# -- python -m harness.bench.recorder.cost ----------------------------------------------------------

from harness.bench.recorder import cost as rc  # noqa: E402
from harness.bench.recorder import job as rj  # noqa: E402
from harness.bench.recorder import probe as rp  # noqa: E402


def _rc_run(rnd, variant, ms, ok=True, median=None, cpu=1.0):
    return {"round": rnd, "variant": variant, "ok": ok, "ms_per_step": ms,
            "median_step_ms": median or ms, "workers_cpu_ms_per_step": cpu, "wall_s": 9.0}


def test_record_cost_schedule_alternates_without_and_with():
    assert rc.schedule(2) == [(0, "without"), (0, "with"), (1, "without"), (1, "with")]


def test_record_cost_parse_result_takes_the_marked_line():
    line = rj.RESULT_MARK + json.dumps({"index": 1, "timed_s": 2.0})
    assert rj.parse_result(f"tf noise\n{line}\nmore noise\n") == {"index": 1, "timed_s": 2.0}
    assert rj.parse_result("no result here") is None
    assert rj.parse_result(rj.RESULT_MARK + "{torn") is None


def test_record_cost_run_figures_take_the_slowest_process():
    rows = [{"timed_s": 2.0, "steps": 1000, "cpu_s": 1.0, "median_step_s": 0.0019},
            {"timed_s": 3.0, "steps": 1000, "cpu_s": 2.0, "median_step_s": 0.0021}]
    fig = rj.run_figures(rows, 2)
    assert fig["ms_per_step"] == pytest.approx(3.0) and fig["ms_per_step_workers"] == [2.0, 3.0]
    assert fig["median_step_ms"] == pytest.approx(2.1)
    assert fig["workers_cpu_ms_per_step"] == pytest.approx(3.0)
    assert rj.run_figures(rows[:1] + [None], 2) is None
    assert rj.run_figures(rows, 3) is None


def test_record_cost_overhead_is_paired_by_round():
    runs = [_rc_run(0, "without", 2.0), _rc_run(0, "with", 2.02),
            _rc_run(1, "without", 4.0), _rc_run(1, "with", 4.0),
            _rc_run(2, "without", 1.0), _rc_run(2, "with", 9.0, ok=False)]
    assert rc.paired(runs) == pytest.approx([0.02, 0.0])
    assert rc.paired(runs, percent=True) == pytest.approx([1.0, 0.0])
    s = rc.summarize(runs)
    assert (s["with"]["runs"], s["with"]["failed"]) == (3, 1)
    assert s["overhead"]["percent"]["median"] == pytest.approx(0.5)
    assert s["without"]["ms_per_step"]["n"] == 3
    table = rc.render_table(s)
    assert rc.TABLE_HEADER in table and "| with |" in table and "2/3 |" in table
    assert "| per cent of the step | +0.50 (+0.00 to +1.00) |" in table
    rounds = rc.render_rounds(runs).splitlines()
    assert rounds[0] == rc.ROUNDS_HEADER and len(rounds) == 5
    assert rounds[2] == "| 0 | 2.000 | 2.020 | +0.020 | +1.00% | – / – |"
    assert rounds[4] == "| 2 | 1.000 | – | – | – | – / – |"


def test_record_cost_commands_differ_only_by_the_recorder():
    plain = rj.job_command("without", "/t/train.py", "/t/rec", 5, 100)
    recorded = rj.job_command("with", "/t/train.py", "/t/rec", 5, 100)
    assert plain == [sys.executable, "/t/train.py", "5", "100"]
    assert recorded == [sys.executable, "-m", "harness", "record", "--dir", "/t/rec", "--",
                        "/t/train.py", "5", "100"]
    env = rj.job_env([20001, 20002], 1)
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"worker": ["127.0.0.1:20001", "127.0.0.1:20002"]},
        "task": {"type": "worker", "index": 1}}


def test_record_probe_blocks_alternate_on_off_off_on():
    assert rp.block_order(3) == [True, False, False, True, True, False]


def test_record_probe_figures_pair_on_with_off_blocks():
    def row(blocks, watcher, ledger_s=1e-5):
        return {"probe": {"block": 10, "on": rp.block_order(2), "block_s": blocks,
                          "block_cpu_s": [x / 10 for x in blocks],
                          "cpu_s": {"watcher": watcher},
                          "hook_cpu_s": {"ledger": {"median": ledger_s, "mean": 2 * ledger_s,
                                                    "calls": 20}}}}
    # slowest process per block: 1.0, 0.99 | 1.02, 1.01 -> on 1.0 vs off 0.99, on 1.01 vs off 1.02
    fig = rp.probe_figures([row([1.0, 0.99, 1.0, 1.01], 0.0), row([0.9, 0.9, 1.02, 0.9], 4e-4)])
    assert fig["pairs"] == 2 and fig["block"] == 10
    assert fig["pairs_percent"] == pytest.approx([100 * 0.01 / 0.99, 100 * -0.01 / 1.02])
    assert fig["cpu_us_per_step"] == {"watcher": pytest.approx(10.0)}
    # main-thread CPU per step, on minus off, the mean of the two processes: pair 1
    # (0.1 - 0.099 and 0.09 - 0.09) / 10 steps, pair 2 (0.101 - 0.1 and 0.09 - 0.102) / 10
    assert fig["pairs_main_cpu_us"] == pytest.approx([50.0, -550.0])
    assert fig["hook_cpu_us_per_call"] == {"ledger": {"median": pytest.approx(10.0),
                                                      "mean": pytest.approx(20.0)}}
    assert rp.probe_figures([row([1.0] * 4, 0.0), {"timed_s": 1.0}]) is None
    table = rc.render_probe({"ms_per_step": 10.0, "probe_figures": fig})
    assert "2 pairs of 10-step blocks" in table
    assert "on minus off: median (quartiles) | -250.0 µs (-400.0 to -100.0) | -2.50% |" in table
    assert "| watcher process (10 ms ticks), CPU | 10.0 µs | 0.10% |" in table
    assert "CPU a call: median (mean) | 10.0 µs (20.0) | 0.10% (0.20%) |" in table


def test_record_cost_parse_args():
    a = rc.parse_args([])
    assert (a.rounds, a.workers, a.steps, a.out) == (5, 2, rc.DEFAULT_STEPS,
                                                     "record-cost-results.json")
    assert not a.probe and rc.parse_args(["--probe"]).probe and a.probe_steps == a.steps
    for bad in (["--rounds", "0"], ["--workers", "0"], ["--steps", "0"], ["--warmup", "-1"],
                ["--run-timeout", "0"], ["--probe-steps", str(2 * rp.BLOCK - 1)]):
        with pytest.raises(SystemExit):
            rc.parse_args(bad)


def test_record_cost_end_job_kills_the_process_group():
    from harness.core.linux import alive
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    assert rj.wait_job([proc], 0.2) == "timeout"
    assert rj.end_job([proc], "/nonexistent-record-dir") == []
    assert proc.returncode is not None and not alive(proc.pid)


@pytest.mark.timeout(120)
def test_smoke_record_cost(tmp_path):
    """A tiny real run: 1 round of 50 steps, without and with the recorder,
    then the probed run (one pair of blocks); the recorder saw every step,
    and nothing is left behind."""
    import psutil
    out, temp = tmp_path / "record.json", tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench.recorder.cost", "--rounds", "1", "--steps", "50",
         "--warmup", "5", "--probe", "--out", str(out)],
        capture_output=True, text=True, timeout=110, cwd=str(tmp_path),
        env=dict(os.environ, TMPDIR=str(temp)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert [(r["round"], r["variant"]) for r in data["runs"]] == rc.schedule(1)
    for r in data["runs"]:
        assert r["ok"] and 0 < r["ms_per_step"] < 1000 and r["survivors"] == []
        assert sorted(w["index"] for w in r["workers"]) == [0, 1]
    evidence = data["runs"][1]["recorder"]
    assert evidence["ok"] and [t["steps"] for t in evidence["tasks"]] == [55, 55]
    assert data["summary"]["overhead"]["percent"]["n"] == 1
    probed = data["probe"]
    assert probed["ok"] and probed["recorder"]["ok"], probed.get("error")
    fig = probed["probe_figures"]
    assert fig["pairs"] == 1 and fig["block"] == rp.BLOCK
    assert "mwms-recorder" in fig["cpu_us_per_step"]
    assert set(fig["hook_cpu_us_per_call"]) == {"ledger", "step_boundary"}
    # the hooks were off in one block of the pair: the recorder saw the warm-up and one block
    assert [t["steps"] for t in probed["recorder"]["tasks"]] == [5 + rp.BLOCK] * 2
    assert rc.TABLE_HEADER in proc.stdout and rc.ROUNDS_HEADER in proc.stdout
    assert not list(temp.glob("mwms-record-cost-*"))
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(temp) in " ".join(p.info["cmdline"] or ())]


@pytest.mark.timeout(300)
def test_the_gpu_check_without_a_gpu_writes_why_nothing_ran(tmp_path):
    """Where TensorFlow sees no GPU the check still writes its file: every
    GPU test skipped with its reason, and the benchmark not run, saying why."""
    out = tmp_path / "gpu.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "harness.bench.gpu", "--out", str(out)],
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())
    assert results["machine"]["visible"] == []
    cases = results["tests"]["cases"]
    assert len(cases) >= 10 and {c["outcome"] for c in cases} == {"skipped"}
    assert all("GPU" in c["message"] for c in cases)
    assert results["bench"] == {"skipped": "no GPU visible"}
    assert "written to" in done.stdout
