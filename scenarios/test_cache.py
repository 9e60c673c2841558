"""``Dataset.cache(filename)``: a cache file is one writer's, and its lock
outlives a killed writer.

While a caching iterator fills ``FILENAME``, TensorFlow holds
``FILENAME_0.lockfile``; a second iterator on the same name fails.  Workers
given one path on a shared file system (the job's command names it once)
fill it at the same moment, and a run killed while filling leaves the
lockfile for its restart to find.  Every scenario here holds for
TensorFlow 2.21, measured.
"""
import glob
import os

import pytest

from harness.faults import Crash
from scenarios.meta import scenario

BATCHES = 8


def train_cached(folder, per_worker=False, clear_stale=False, steps=2 * BATCHES):
    """Each worker caches its examples (32 * BATCHES) to ``folder/cache``,
    or with ``per_worker`` to ``folder/cache-INDEX``; ``clear_stale``
    removes the cache's lockfiles left by an earlier process first.  The
    workers but 0 open their dataset a second after worker 0 has begun
    filling its cache, as workers that load their data a little later do."""
    import time

    import tensorflow as tf

    import harness
    from scenarios import mnist_like
    ctx = harness.context()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    _, _, step = mnist_like.make_training(strategy, global_batch_size=32 * ctx.num_workers)
    x, y = mnist_like.make_data(32 * BATCHES, seed=ctx.index)
    path = os.path.join(folder, f"cache-{ctx.index}" if per_worker else "cache")
    if clear_stale:
        for stale in glob.glob(glob.escape(path) + "*.lockfile"):
            os.remove(stale)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).cache(path).batch(32).repeat()
    if ctx.index > 0:
        time.sleep(1.0)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    for _ in ctx.steps(steps):
        step(next(iterator))
    return sorted(os.listdir(folder))


@pytest.mark.timeout(60)
@scenario(outcome="failed", error="AlreadyExistsError",
          source="mozilla/DeepSpeech#3683, tensorflow#18266",
          fixed_by="test_a_cache_file_per_worker")
def test_workers_share_one_cache_file(mwms_cluster, tmp_path):
    """Every worker caches to the same file name.

    TensorFlow: worker 0's iterator takes the lock and fills the cache;
    every other worker's first batch raises ``AlreadyExistsError`` "There
    appears to be a concurrent caching iterator running - cache lockfile
    already exists".

    Source: mozilla/DeepSpeech#3683, tensorflow#18266.

    Fix: a cache file per worker.
    """
    result = mwms_cluster.run(train_cached, args=(str(tmp_path),), timeout=15, grace=3)
    late = range(1, mwms_cluster.num_workers)
    result.assert_failed(culprits=late, error="AlreadyExistsError")
    assert all("concurrent caching iterator" in result.workers[i].exception.message for i in late)


@pytest.mark.timeout(60)
@scenario(outcome="completed", source="mozilla/DeepSpeech#3683, tensorflow#18266")
def test_a_cache_file_per_worker(mwms_cluster, tmp_path):
    """Each worker caches to a file of its own, ``cache-INDEX``.

    TensorFlow: each cache is filled in the first epoch and read in the
    second; no lockfile is left.

    Source: mozilla/DeepSpeech#3683, tensorflow#18266.

    Fix: this.
    """
    result = mwms_cluster.run(train_cached, args=(str(tmp_path), True), timeout=15)
    result.assert_completed()
    left = result.return_values[0]
    assert not [f for f in left if f.endswith(".lockfile")], left
    assert {f"cache-{i}.index" for i in range(mwms_cluster.num_workers)} <= set(left), left


@pytest.mark.timeout(90)
@scenario(outcome="failed", error="AlreadyExistsError", source="tensorflow#28798",
          fixed_by="test_a_restart_that_clears_its_stale_lockfile")
def test_a_killed_run_leaves_its_cache_lockfile(mwms_cluster, tmp_path):
    """A worker is killed while it fills its own cache (step 3 of the
    first epoch), and the cluster is restarted.

    TensorFlow: the killed process's ``cache-0_0.lockfile`` stays, and so
    do the others', whose processes ended on its death (``UnavailableError``)
    while they filled theirs; in the restart, every worker's first batch
    raises ``AlreadyExistsError`` ("... cache lockfile already exists"),
    though no other iterator runs.

    Source: tensorflow#28798.

    Fix: remove the cache's lockfiles when the job starts (each worker has
    its own path, so none is another's).
    """
    result = mwms_cluster.run(train_cached, args=(str(tmp_path), True), timeout=15, grace=3,
                              restarts=1, faults=[Crash(0, 3, "kill")])
    assert [a.outcome for a in result.attempts] == ["crashed", "failed"], result.diagnosis
    result.assert_failed(culprits=range(mwms_cluster.num_workers), error="AlreadyExistsError")


@pytest.mark.timeout(90)
@scenario(outcome="completed", source="tensorflow#28798")
def test_a_restart_that_clears_its_stale_lockfile(mwms_cluster, tmp_path):
    """The same kill and restart, and the job removes its own cache's
    lockfiles before it makes its dataset.

    TensorFlow: the restart fills the cache again and completes.

    Source: tensorflow#28798.

    Fix: this.
    """
    result = mwms_cluster.run(train_cached, args=(str(tmp_path), True, True), timeout=15,
                              grace=3, restarts=1, faults=[Crash(0, 3, "kill")])
    assert [a.outcome for a in result.attempts] == ["crashed", "completed"], result.diagnosis
    result.assert_completed()
