"""The recorder and analyzer on jobs started as a job's pods would start
them: N plain ``python -m harness record`` processes, each with its own
``TF_CONFIG``, none started by the harness's launcher.  What ``harness
analyze`` makes of their files must be what the fixture says of the same
bug run under it: the same outcome, culprit, step and blocked call.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from harness.core.linux import wait_gone
from harness.diagnosis import diagnose
from harness.launch.ports import reserve_ports
from harness.network import namespace
from harness.record import analyze, files, judge

pytestmark = pytest.mark.timeout(240)

# The user's training script: an all-reduce of a variable per step, and one
# bug on one worker at one step, chosen by its arguments.
TRAIN = """
import argparse, json, os, signal, time
import tensorflow as tf

p = argparse.ArgumentParser()
p.add_argument("--bug", default="none")
p.add_argument("--worker", type=int, default=1)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--at", type=int, default=4)
a = p.parse_args()
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    w = tf.Variable(1.0)

@tf.function
def step():
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: w * 1.0), axis=None)

for k in range(a.steps):
    if a.bug == "pause" and k == a.at:
        # Every worker is done with the last step before the pause: else a
        # peer may still read that step's data from the stopped process.
        from tensorflow.python.eager import context
        context.context().wait_at_barrier("before-the-pause", 60000)
    if index == a.worker and k == a.at:
        if a.bug.startswith("skip"):
            continue                       # a bad local batch, skipped
        if a.bug == "crash":
            os._exit(1)
        if a.bug == "raise":
            raise ValueError("a bad batch")
        if a.bug == "pause":
            os.kill(os.getpid(), signal.SIGSTOP)
        if a.bug == "slow":
            time.sleep(4)                  # a slow batch: everyone waits, then goes on
    step()
if a.bug == "skip-linger" and index == a.worker:
    time.sleep(600)                        # a checkpoint being written, say
"""

DUMP_AFTER = 2.0     # the recorder's --timeout in these jobs
# The fixture's hang timeout for the same bugs: a busy machine (CI) once
# spent more than 2 s tracing the step, before any step, and called that the hang.
FIXTURE_TIMEOUT = 8.0
INSTALLED = f"""
import os
import harness.record
harness.record.install(dir=os.environ["RECORD_DIR"], timeout={DUMP_AFTER})
"""


class Job:
    """N plain processes of one MWMS job under ``harness record``; ended
    (every process group, and the recorder's watchers) on every path."""

    def __init__(self, tmp_path, n, args=(), per_host=False, installed=(), script=TRAIN):
        """``installed``: the workers whose script turns the recorder on
        itself (``harness.record.install``), run as plain ``python train.py``."""
        self.n = n
        self.script = tmp_path / "train.py"
        self.script.write_text(script)
        (tmp_path / "train_installed.py").write_text(INSTALLED + script)
        self.switch = namespace.Switch(n) if per_host else None
        # One network namespace for the job, as the harness gives its
        # clusters: the host's ports are other tests' (a Ray cluster's
        # workers reserve theirs in a lock directory of their own).
        self.network = (namespace.Namespace() if not per_host and namespace.available()[0]
                        else None)
        self.reservation = reserve_ports(n)
        hosts = self.switch.hosts if per_host else ["127.0.0.1"] * n
        cluster = [f"{h}:{p}" for h, p in zip(hosts, self.reservation.ports)]
        self.dirs = [tmp_path / (f"host{i}" if per_host else "shared") for i in range(n)]
        # TensorFlow's own temporary files (autograph's) go with the test's.
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir(exist_ok=True)
        self.procs = []
        self.logs = []
        try:
            for i in range(n):
                env = dict(os.environ, TF_CONFIG=json.dumps(
                    {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": i}}),
                    TF_CPP_MIN_LOG_LEVEL="2", TMPDIR=str(self.tmp))
                log = open(tmp_path / f"worker{i}.log", "w")
                self.logs.append(log)
                command = ([sys.executable, str(tmp_path / "train_installed.py"), *args]
                           if i in installed else
                           [sys.executable, "-m", "harness", "record", "--dir", str(self.dirs[i]),
                            "--timeout", str(DUMP_AFTER), str(self.script), *args])
                env["RECORD_DIR"] = str(self.dirs[i])
                self.procs.append(subprocess.Popen(
                    command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=self._joiner(i)))
        except BaseException:
            self.end()
            raise

    def _joiner(self, i):
        from harness.core.linux import enter_namespaces
        paths = (self.switch.paths(i) if self.switch is not None else
                 self.network.paths if self.network is not None else None)
        return None if paths is None else (lambda: enter_namespaces(*paths))

    def folders(self):
        return sorted({str(d) for d in self.dirs})

    def tasks(self):
        tasks, problems = files.read_dirs(self.folders())
        assert not problems, problems
        return tasks

    def wait(self, seconds=120):
        for p in self.procs:
            p.wait(timeout=seconds)

    def wait_for_dumps(self, workers, seconds=90):
        """Until each of ``workers`` has ended (a peer of a crashed worker
        may raise at once: "Connection reset"), or written a no-progress
        dump after its latest progress: quiet since, not in a slow phase
        it has since left (tracing, on a busy machine)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if set(workers) <= {i for i, t in self._by_index().items() if _settled(t)}:
                return
            time.sleep(0.2)
        raise AssertionError(f"workers {workers} neither dumped nor ended in {seconds} s: "
                             f"{self.log_tails()}")

    def _by_index(self):
        tasks, _ = files.read_dirs(self.folders())
        return {t.task[1]: t for t in tasks}

    def wait_for_steps(self, workers, steps, seconds=90):
        """Until each of ``workers`` has recorded ``steps`` steps."""
        deadline = time.monotonic() + seconds
        while True:
            by = self._by_index()
            if all(i in by and any(r.kind == 1 and r.number >= steps - 1 for r in by[i].records)
                   for i in workers):
                return
            assert time.monotonic() < deadline, self.log_tails()
            time.sleep(0.1)

    def analysis(self, lost=()):
        """What ``analyze`` makes of the files, those of the workers ``lost``
        left out (a host lost, a directory not gathered)."""
        analysis = analyze.observe([t for t in self.tasks() if t.task[1] not in lost])
        assert analysis.observation is not None, (analysis.problems, analysis.running)
        return analysis

    def verdict(self):
        return judge.verdict(self.analysis())

    def stop(self, term_first, grace=1.0, after=1.0):
        """End the job as a cluster manager does, ``after`` s from now:
        SIGKILL to every task, or SIGTERM and SIGKILL ``grace`` s later;
        then wait for the watchers to have filed the dumps and the ends."""
        time.sleep(after)
        if term_first:
            for p in self.procs:
                p.send_signal(signal.SIGTERM)
            time.sleep(grace)
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        assert not wait_gone(self._watchers(), 10)

    def log_tails(self):
        for log in self.logs:
            log.flush()
        return "\n".join(f"--- worker {i}\n" + open(log.name).read()[-1500:]
                         for i, log in enumerate(self.logs))

    def end(self):
        pids = []
        for p in self.procs:
            try:
                pids += [c.pid for c in psutil.Process(p.pid).children(recursive=True)]
            except psutil.Error:
                pass
            pids.append(p.pid)
            try:
                os.kill(p.pid, signal.SIGCONT)
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        for p in self.procs:
            p.wait()
        for log in self.logs:
            log.close()
        self.reservation.close()
        for network in (self.switch, self.network):
            if network is not None:
                network.close()
        # The watchers see their task gone within a look, and exit.
        assert not wait_gone(pids + self._watchers(), 10)

    def _watchers(self):
        return [p.pid for p in psutil.process_iter(["cmdline"])
                if "harness.record.watcher" in " ".join(p.info["cmdline"] or ())
                and any(str(d) in " ".join(p.info["cmdline"] or ()) for d in self.dirs)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.end()


def _settled(task):
    if any(e["kind"] == files.EXIT for e in task.events):
        return True
    latest = max((r.time for r in task.records), default=0.0)
    return any(e["kind"] == files.DUMP and "no progress" in e["data"]["reason"]
               and e["time"] > latest for e in task.events)


def _fixture_verdict(mwms_cluster, tmp_path, n, args, **kw):
    mwms_cluster.settings = mwms_cluster.settings.with_overrides(workers=n)
    script = tmp_path / "fixture_train.py"
    script.write_text(TRAIN)
    return mwms_cluster.run_script(str(script), list(args), **kw)


def _ledger_line(text):
    return next((l for l in text.splitlines() if l.startswith("ledger:")), None)


def _same(recorded, fixture):
    assert (recorded.outcome, recorded.culprits, recorded.step) == \
           (fixture.verdict.outcome, fixture.verdict.culprits, fixture.verdict.step), \
        f"analyze:\n{recorded.text}\n\nfixture:\n{fixture.diagnosis}"
    assert _ledger_line(recorded.text) == _ledger_line(fixture.verdict.text), \
        f"analyze:\n{recorded.text}\n\nfixture:\n{fixture.diagnosis}"


# 2 tasks are the skipped-step cases above; CI's time goes to 3 and 4.
@pytest.mark.parametrize("n, term", [(3, True), (4, False)])
def test_a_skipped_step_with_the_skipper_lingering(mwms_cluster, tmp_path, n, term):
    """Then the job is killed (SIGTERM first, at 3 tasks): still the hang,
    and the kill told after it.  Then one task's files are lost: it is
    among the candidates, and no other task is the sole culprit."""
    args = ["--bug", "skip-linger", "--worker", "1"]
    with Job(tmp_path, n, args) as job:
        job.wait_for_dumps(range(n))
        recorded = job.verdict()
        # A dump asked for now: worker 0 writes it while blocked in its collective.
        os.kill(job.procs[0].pid, signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not any(e["kind"] == files.DUMP and e["data"]["reason"] == "SIGUSR2"
                      for e in job._by_index()[0].events):
            assert time.monotonic() < deadline, "no SIGUSR2 dump"
            time.sleep(0.1)
        asked = job._by_index()[0]
        where = next(e["data"] for e in asked.events
                     if e["kind"] == files.DUMP and e["data"]["reason"] == "SIGUSR2")
        text = asked.stacks.encode()[where["offset"]:where["offset"] + where["length"]].decode()
        assert text.startswith("--- dump: SIGUSR2 ---\n"), text
        assert "quick_execute" in text, text    # the main thread, in the collective
        job.stop(term)
        killed = job.analysis()
        lost = {w: judge.verdict(job.analysis(lost=(w,))) for w in (0, 1)}
        stacks = {t.task[1]: t for t in job.tasks()}
    fixture = _fixture_verdict(mwms_cluster, tmp_path, n, args, timeout=FIXTURE_TIMEOUT, grace=2)
    assert recorded.outcome == "hang" and recorded.culprits == (1,), recorded.text
    _same(recorded, fixture)
    after = judge.verdict(killed)
    assert (after.outcome, after.culprits, after.step, _ledger_line(after.text)) == \
        (recorded.outcome, recorded.culprits, recorded.step, _ledger_line(recorded.text)), \
        f"killed:\n{after.text}\n{killed.ending}\n\nalive:\n{recorded.text}"
    assert killed.ending.startswith("then SIGTERM to every task" if term else "then "), \
        killed.ending
    if term:   # TensorFlow 2.21's own handler keeps the process alive: SIGKILL ends it
        assert all("--- dump: SIGTERM ---" in t.stacks for t in stacks.values())
    for w, v in lost.items():
        assert w in v.culprits and v.ambiguous and len(v.culprits) > 1, v.text


def test_a_skipped_step_with_the_skipper_returning(mwms_cluster, tmp_path, n=2):
    args = ["--bug", "skip", "--worker", "1"]
    with Job(tmp_path, n, args) as job:
        job.wait()     # the skipper leaves; TensorFlow fails its peers
        recorded = job.verdict()
    fixture = _fixture_verdict(mwms_cluster, tmp_path, n, args, timeout=30, grace=20)
    assert recorded.culprits == (1,), recorded.text
    _same(recorded, fixture)


def test_an_error_then_the_rest_killed_is_the_error(tmp_path, n=2):
    """Worker 1 raises; its peer waits for it, dumps, and is killed: the
    error, blamed on worker 1."""
    with Job(tmp_path, n, ["--bug", "raise", "--worker", "1"]) as job:
        job.wait_for_dumps(range(n))
        job.stop(term_first=False)
        verdict = job.verdict()
    assert verdict.outcome == "failed" and verdict.culprits == (1,), verdict.text
    assert verdict.error == "ValueError", verdict.text


def test_a_task_killed_while_the_job_progressed_is_a_crash(tmp_path, n=2):
    """The OOM killer's SIGKILL to worker 1 mid-run; its peer then waits or
    raises, and is killed: worker 1's crash."""
    with Job(tmp_path, n, ["--steps", "1000000"]) as job:
        job.wait_for_steps([1], 4)
        job.procs[1].kill()
        job.wait_for_dumps([0])
        job.stop(term_first=False)
        verdict = job.verdict()
    assert verdict.outcome == "crashed" and verdict.culprits == (1,), verdict.text


# A job that saves a checkpoint when it is told to stop (SIGTERM), as
# TensorFlow's fault tolerance tutorial has it; every worker then exits 42.
PREEMPTED = """
import sys, time
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    w = tf.Variable(1.0)
handler = tf.distribute.experimental.PreemptionCheckpointHandler(
    strategy.cluster_resolver, tf.train.Checkpoint(w=w), sys.argv[1])

@tf.function
def step():
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(lambda: w * 1.0), axis=None)

for k in range(1000000):
    handler.run(step)
    time.sleep(0.02)
"""


def test_a_job_that_checkpoints_on_sigterm_still_does(tmp_path):
    checkpoints = tmp_path / "ckpt"
    with Job(tmp_path, 2, [str(checkpoints)], script=PREEMPTED) as job:
        job.wait_for_steps([0, 1], 4)
        job.procs[0].send_signal(signal.SIGTERM)
        job.wait(60)
        assert [p.returncode for p in job.procs] == [42, 42], job.log_tails()
        assert not wait_gone(job._watchers(), 10)
        stopped = job._by_index()[0]
        analysis = job.analysis()
    assert (checkpoints / "checkpoint").exists(), os.listdir(checkpoints)
    where = next(e["data"] for e in stopped.events
                 if e["kind"] == files.DUMP and e["data"]["reason"] == "SIGTERM")
    text = stopped.stacks.encode()[where["offset"]:where["offset"] + where["length"]].decode()
    assert text.startswith("--- dump: SIGTERM ---\n") and "train.py" in text, text
    assert any("worker 0 received SIGTERM" in n for n in analysis.notes), analysis.notes


STOPPED = """
import signal, sys, time

def stop(sig, frame):
    raise ValueError("told to stop")

signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""


def test_sigterm_dumps_then_runs_the_jobs_own_handler(tmp_path):
    """A dump on SIGUSR2 and one on SIGTERM, each after its header line;
    then the job's own SIGTERM handler runs, and its uncaught error's
    traceback starts at the script."""
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED)
    folder = tmp_path / "rec"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "record", "--dir", str(folder),
                             "--timeout", "0", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR2)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    watchers = [p.pid for p in psutil.process_iter(["cmdline"])
                if str(folder) in " ".join(p.info["cmdline"] or ())]
    assert not wait_gone(watchers, 10)
    assert proc.returncode == 1, err
    trace = err[err.index("Traceback (most recent call last):"):].splitlines()
    assert trace[1].startswith(f'  File "{script}", line ') and "<frozen" not in err, err
    assert trace[-1] == "ValueError: told to stop", err
    task, = files.read_dirs([str(folder)])[0]
    # The watcher files a signal's dump; the job's own, at exit, may come first.
    reasons = [e["data"]["reason"] for e in task.events if e["kind"] == files.DUMP]
    assert sorted(reasons) == ["SIGTERM", "SIGUSR2", "at exit"], reasons
    headers = [l for l in task.stacks.splitlines() if l.startswith("--- dump: ")]
    assert sorted(headers) == sorted(f"--- dump: {r} ---" for r in reasons), task.stacks


def _both(mwms_cluster, tmp_path, n, args, **fixture_settings):
    """The verdicts of ``analyze`` once worker 1's peers have dumped or
    ended, and of the fixture on the same bug."""
    with Job(tmp_path, n, args) as job:
        job.wait_for_dumps([i for i in range(n) if i != 1])
        recorded = job.verdict()
    return recorded, _fixture_verdict(mwms_cluster, tmp_path, n, args, **fixture_settings)


@pytest.mark.parametrize("n", [3])   # worker 1 in the middle: a peer on each side
def test_a_crashed_worker(mwms_cluster, tmp_path, n):
    recorded, fixture = _both(mwms_cluster, tmp_path, n, ["--bug", "crash", "--worker", "1"],
                              timeout=30, grace=DUMP_AFTER)
    assert recorded.outcome == "crashed" and recorded.culprits == (1,), recorded.text
    assert "exit status unknown" in recorded.text or "exit code 1" in recorded.text
    assert (recorded.outcome, recorded.culprits, recorded.step) == \
           (fixture.verdict.outcome, fixture.verdict.culprits, fixture.verdict.step), \
        f"analyze:\n{recorded.text}\n\nfixture:\n{fixture.diagnosis}"


@pytest.mark.parametrize("n", [3])
def test_a_paused_worker(mwms_cluster, tmp_path, n):
    recorded, fixture = _both(mwms_cluster, tmp_path, n, ["--bug", "pause", "--worker", "1"],
                              timeout=FIXTURE_TIMEOUT, grace=2)
    assert recorded.outcome == "hang" and recorded.culprits == (1,), recorded.text
    _same(recorded, fixture)


def test_a_clean_run_reads_completed_and_the_command_line_says_so(tmp_path):
    """Worker 1 turns the recorder on from its own code.  Worker 0 spends
    4 s on one batch: the quiet spell writes a dump on both, and the job
    goes on to complete."""
    with Job(tmp_path, 2, ["--bug", "slow", "--worker", "0"], installed=(1,)) as job:
        job.wait()
        assert [p.returncode for p in job.procs] == [0, 0], job.log_tails()
        for t in job.tasks():
            reasons = [e["data"]["reason"] for e in t.events if e["kind"] == files.DUMP]
            assert reasons == [f"no progress for {DUMP_AFTER:g} s", "at exit"], reasons
        out = subprocess.run([sys.executable, "-m", "harness", "analyze", *job.folders(),
                              "--timeline", str(tmp_path / "tl")],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("COMPLETED: all 2 workers returned"), out.stdout
    assert (tmp_path / "tl.svg").exists() and (tmp_path / "tl.trace.json").exists()


@pytest.mark.skipif(not namespace.switch_available()[0], reason=namespace.switch_available()[1])
def test_hosts_that_share_nothing_analyze_as_one_directory(tmp_path):
    """Each task in a network namespace of its own, writing to a directory
    of its own; one task's clock set 40 s off: gathered, the directories
    give the verdict one shared directory gives."""
    args = ["--bug", "skip-linger", "--worker", "1"]
    with Job(tmp_path, 3, args, per_host=True) as job:
        job.wait_for_dumps(range(3))
        per_host = job.verdict()
        shared = tmp_path / "gathered"
        shared.mkdir()
        for d in job.folders():
            for name in os.listdir(d):
                shutil.copy(os.path.join(d, name), shared / name)   # as gathered now
    assert per_host.outcome == "hang" and per_host.culprits == (1,), per_host.text
    tasks, problems = files.read_dirs([str(shared)])
    assert not problems
    gathered = diagnose(analyze.observe(tasks).observation)
    assert (gathered.outcome, gathered.culprits, gathered.step) == \
           (per_host.outcome, per_host.culprits, per_host.step)
    # A host whose clock is 40 s ahead: the analyzer takes it off.
    meta = next(shared.glob("worker-2.*.meta.json"))
    m = json.loads(meta.read_text())
    m["clock"]["wall"] += 40.0
    meta.unlink()
    meta.write_text(json.dumps(m))
    tasks, _ = files.read_dirs([str(shared)])
    skewed = analyze.observe(tasks)
    assert any("worker 2's clock is +40" in n for n in skewed.notes), skewed.notes
    again = diagnose(skewed.observation)
    assert (again.outcome, again.culprits, again.step) == \
           (per_host.outcome, per_host.culprits, per_host.step)
