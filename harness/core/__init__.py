"""What the parent side and the worker side share, and nothing else:

- ``protocol``: the messages on a worker's channel, its spec, the enums;
- ``progress``: the per-worker progress map (steps and calls, lock-free);
- ``serialize``: ``fn`` and values across the process boundary (dill);
- ``linux``: process and namespace calls (parent-death signal, reaping);
- ``tfconfig``: ``TF_CONFIG`` for each worker, and the ways to break it;
- ``versions``: the installed TensorFlow (from its metadata), the range
  supported, the Keras it brings and the tf_keras that matches it.

It imports the standard library, ``dill`` and ``psutil`` only: no other
part of the harness, and never TensorFlow.
"""
