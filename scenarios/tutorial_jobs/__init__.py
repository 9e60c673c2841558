"""Training jobs written the way TensorFlow's multi-worker tutorials write
theirs, on synthetic MNIST-shaped data (nothing is downloaded), for
``scenarios/test_tutorials.py``.

Each job is one file that knows nothing of the harness: the strategy reads
``TF_CONFIG`` itself, the steps are a plain ``for`` loop or ``model.fit``,
flags come from ``argparse``.  Each runs both ways from the same code:

* as a script, ``python ctl_checkpoint.py --model-dir DIR`` (what
  ``mwms_cluster.run_script(path, argv)`` does on every worker), or
  ``python -m scenarios.tutorial_jobs.ctl_checkpoint ...`` (``module=``);
* as a function, ``main(argv)`` (what ``mwms_cluster.run(main, args=(argv,))``
  calls), which also returns what the job printed, for the tests to check.

Nothing here imports TensorFlow at import time: the pytest process imports
these modules to hand ``main`` to the workers, and never loads TensorFlow.
"""
