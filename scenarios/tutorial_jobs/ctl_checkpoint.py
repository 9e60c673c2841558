"""Multi-worker training with a custom training loop and a CheckpointManager.

Written the way TensorFlow's "Custom training loop with Keras and
MultiWorkerMirroredStrategy" tutorial writes its job: the strategy reads
``TF_CONFIG``; the dataset is sharded with ``distribute_datasets_from_function``;
a ``tf.function`` train step runs ``strategy.run`` and reduces the loss; an
epoch counter lives in the checkpoint, so a restarted job resumes where the
last save left it; and every worker saves (saving can run collectives), the
chief into ``--model-dir``, the others into a temporary directory of their
own that they delete after each save.

The data are synthetic MNIST-shaped arrays (28x28 images, 10 classes), made
here: nothing is downloaded.

    python ctl_checkpoint.py --model-dir /tmp/ckpt --epochs 3 --steps-per-epoch 5

``--save-on chief`` is the mistake the tutorial warns about: only the chief
calls ``save``.  ``--checkpoint-metric`` also puts the training accuracy
metric in the checkpoint (with tf_keras, ``TF_USE_LEGACY_KERAS=1``), so that
saving reads sync-on-read variables: an all-reduce.
"""
import argparse
import json
import os
import sys

PER_WORKER_BATCH_SIZE = 64
NUM_CLASSES = 10


def mnist_like(num_examples=4096, seed=0):
    """MNIST's shapes and types, made up: ``x`` uint8 (n, 28, 28), ``y``
    uint8 (n,).  Each class is a fixed random 28x28 pattern plus noise, so
    the model has something to learn."""
    import numpy as np
    rng = np.random.default_rng(seed)
    patterns = np.random.default_rng(1234).integers(0, 256, (NUM_CLASSES, 28, 28))
    y = rng.integers(0, NUM_CLASSES, num_examples)
    x = (patterns[y] + rng.integers(0, 256, (num_examples, 28, 28))) // 2
    return x.astype(np.uint8), y.astype(np.uint8)


def mnist_dataset():
    import numpy as np
    import tensorflow as tf
    x_train, y_train = mnist_like()
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train), seed=7)


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.repeat().batch(batch_size)


def build_cnn_model():
    import tensorflow as tf
    return tf.keras.Sequential([
        tf.keras.layers.Input(shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(NUM_CLASSES),
    ])


def _is_chief(task_type, task_id, cluster_spec):
    return (task_type is None or task_type == "chief"
            or (task_type == "worker" and task_id == 0
                and "chief" not in cluster_spec.as_dict()))


def _get_temp_dir(dirpath, task_id):
    import tensorflow as tf
    temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True,
                        help="the chief's checkpoints go to MODEL_DIR/ckpt")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=5)
    parser.add_argument("--save-on", choices=("all", "chief"), default="all",
                        help="'chief' is the mistake: only the chief calls save")
    parser.add_argument("--checkpoint-metric", action="store_true",
                        help="also checkpoint train_accuracy (tf_keras only: a Keras 3 "
                             "metric is not trackable)")
    return parser.parse_args(argv)


def main(argv=None):
    """Train, checkpointing at the end of every epoch.  Returns the lines it
    printed (one per epoch run), which the scripts' callers read from the log."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import tensorflow as tf

    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch_size = PER_WORKER_BATCH_SIZE * num_workers

    with strategy.scope():
        multi_worker_dataset = strategy.distribute_datasets_from_function(
            lambda input_context: dataset_fn(global_batch_size, input_context))
        multi_worker_model = build_cnn_model()
        multi_worker_optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                    reduction="none")

    @tf.function
    def train_step(iterator):
        def step_fn(inputs):
            x, y = inputs
            with tf.GradientTape() as tape:
                predictions = multi_worker_model(x, training=True)
                per_example_loss = loss_object(y, predictions)
                loss = tf.nn.compute_average_loss(per_example_loss,
                                                  global_batch_size=global_batch_size)
            grads = tape.gradient(loss, multi_worker_model.trainable_variables)
            multi_worker_optimizer.apply_gradients(
                zip(grads, multi_worker_model.trainable_variables))
            train_accuracy.update_state(y, predictions)
            return loss

        per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
    task_type, task_id = (strategy.cluster_resolver.task_type,
                          strategy.cluster_resolver.task_id)
    cluster_spec = strategy.cluster_resolver.cluster_spec()
    chief = _is_chief(task_type, task_id, cluster_spec)

    checkpoint_dir = os.path.join(args.model_dir, "ckpt")
    checkpointed = {"model": multi_worker_model, "epoch": epoch}
    if args.checkpoint_metric:
        checkpointed["train_accuracy"] = train_accuracy
    checkpoint = tf.train.Checkpoint(**checkpointed)
    write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id, cluster_spec)
    checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir,
                                                    max_to_keep=1)

    # Every worker restores from the chief's directory.
    latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
    if latest_checkpoint:
        checkpoint.restore(latest_checkpoint)

    printed = []
    iterator = iter(multi_worker_dataset)
    for _ in range(int(epoch.numpy()), args.epochs):
        total_loss = 0.0
        num_batches = 0
        for _ in range(args.steps_per_epoch):
            total_loss += train_step(iterator)
            num_batches += 1
        train_loss = total_loss / num_batches
        line = "Epoch: %d, accuracy: %f, train_loss: %f." % (
            epoch.numpy(), train_accuracy.result(), train_loss)
        print(line, flush=True)
        printed.append(line)
        train_accuracy.reset_state()

        epoch.assign_add(1)
        if args.save_on == "all" or chief:
            checkpoint_manager.save()
            if not chief:
                tf.io.gfile.rmtree(write_checkpoint_dir)
    return printed


if __name__ == "__main__":
    main()
