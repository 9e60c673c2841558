"""Multi-worker training with tf_keras ``model.fit`` and ``BackupAndRestore``.

Written the way TensorFlow's "Multi-worker training with Keras" tutorial
writes its job: the global batch is the per-worker batch times the number of
workers in ``TF_CONFIG``; the model is built and compiled inside
``strategy.scope()``; ``fit`` runs a repeated dataset for ``steps_per_epoch``
batches an epoch with a ``BackupAndRestore`` callback (a restarted job resumes
from the last finished epoch; the backup is deleted when ``fit`` ends); then
every worker calls ``model.save`` (saving can run collectives), the chief into
``--model-dir``, the others into a temporary directory they delete.

It needs tf_keras: run it with ``TF_USE_LEGACY_KERAS=1`` (Keras 3's ``fit``
does not run under MultiWorkerMirroredStrategy).  The data are synthetic
MNIST-shaped arrays (28x28 images, 10 classes), made here: nothing is
downloaded.

    TF_USE_LEGACY_KERAS=1 python keras_fit.py --model-dir /tmp/keras --epochs 3
"""
import argparse
import json
import os
import sys

PER_WORKER_BATCH_SIZE = 64
NUM_CLASSES = 10


def mnist_like(num_examples=4096, seed=0):
    """MNIST's shapes and types, made up: ``x`` uint8 (n, 28, 28), ``y``
    uint8 (n,).  Each class is a fixed random 28x28 pattern plus noise."""
    import numpy as np
    rng = np.random.default_rng(seed)
    patterns = np.random.default_rng(1234).integers(0, 256, (NUM_CLASSES, 28, 28))
    y = rng.integers(0, NUM_CLASSES, num_examples)
    x = (patterns[y] + rng.integers(0, 256, (num_examples, 28, 28))) // 2
    return x.astype(np.uint8), y.astype(np.uint8)


def mnist_dataset(batch_size):
    import numpy as np
    import tensorflow as tf
    x_train, y_train = mnist_like()
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(len(x_train), seed=7).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    import tensorflow as tf
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(NUM_CLASSES),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.01),
        metrics=["accuracy"])
    return model


def _is_chief(task_type, task_id):
    # Note: there is no chief task in this cluster's TF_CONFIG, so worker 0
    # is the chief.
    return task_type is None or task_type == "chief" or (task_type == "worker"
                                                         and task_id == 0)


def _get_temp_dir(dirpath, task_id):
    import tensorflow as tf
    temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True,
                        help="the chief saves MODEL_DIR/model.keras; the backup is "
                             "MODEL_DIR/backup while fit runs")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=5)
    parser.add_argument("--no-backup", action="store_true",
                        help="leave BackupAndRestore out (a restarted job starts over)")
    return parser.parse_args(argv)


def main(argv=None):
    """Fit, then save.  Returns the loss of each epoch this run fitted (fewer
    than ``--epochs`` when ``BackupAndRestore`` resumed an interrupted job)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # Seeded weights: every run fits the same losses, so a test can check
    # that they fall.
    tf.keras.utils.set_random_seed(0)

    global_batch_size = PER_WORKER_BATCH_SIZE * num_workers
    multi_worker_dataset = mnist_dataset(global_batch_size)

    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = build_and_compile_cnn_model()

    callbacks = [] if args.no_backup else [tf.keras.callbacks.BackupAndRestore(
        backup_dir=os.path.join(args.model_dir, "backup"))]
    history = multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs,
                                     steps_per_epoch=args.steps_per_epoch,
                                     callbacks=callbacks, verbose=0)
    losses = [round(float(v), 6) for v in history.history["loss"]]
    print("losses:", losses, flush=True)

    task_type, task_id = (strategy.cluster_resolver.task_type,
                          strategy.cluster_resolver.task_id)
    write_model_path = write_filepath(os.path.join(args.model_dir, "model.keras"),
                                      task_type, task_id)
    multi_worker_model.save(write_model_path)
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(os.path.dirname(write_model_path))
    return losses


if __name__ == "__main__":
    main()
