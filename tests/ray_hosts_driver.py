"""The driver of ``tests/test_ray.py``'s test of nodes that share nothing:
``python tests/ray_hosts_driver.py USER_NS NET_NS GCS RAY_TMPDIR MARKER``.

It joins the bridge's namespace, where the cluster's head node is (a Ray
driver needs a raylet on its own host), runs each case of
:data:`CASES` on the cluster at ``GCS`` and prints one JSON line per case
(its verdict, and whether each blocked worker's stack came back), then one
of what each worker saw of its host: its network namespace, its address,
and whether it sees the file ``MARKER`` of the controller's ``/tmp``.
"""
import json
import os
import sys

WORKERS = 2


def where_am_i(marker):
    """This worker's network namespace, its address in TF_CONFIG, and
    whether the controller's file ``marker`` is there for it."""
    import harness
    ctx = harness.context()
    config = json.loads(os.environ["TF_CONFIG"])
    return (os.readlink("/proc/self/ns/net"), config["cluster"]["worker"][ctx.index],
            os.path.exists(marker))


def main(user_ns, net_ns, gcs, ray_tmpdir, marker):
    from harness.core import linux
    linux.enter_namespaces(user_ns, net_ns)   # first, while single-threaded
    os.environ["RAY_TMPDIR"] = ray_tmpdir
    from harness.controller import Cluster
    from harness.settings import RunSettings
    from harness.workloads import allreduce_loop
    from test_ray import ALIKE_CASES, HOSTS_TIMEOUT
    cluster = Cluster(RunSettings(workers=WORKERS, timeout=HOSTS_TIMEOUT, grace=3, network="host",
                                  backend="ray", ray_address=gcs))
    for case, faults in ALIKE_CASES.items():
        result = cluster.run(allreduce_loop, args=(6,), faults=faults)
        v = result.verdict
        print(json.dumps({"case": case, "verdict": [v.outcome, list(v.culprits), v.ambiguous],
                          "stacks": ["quick_execute" in (w.stack or "") for w in result.workers],
                          "diagnosis": result.diagnosis}), flush=True)
    seen = cluster.run(where_am_i, args=(marker,))
    print(json.dumps({"case": "where", "outcome": seen.outcome,
                      "workers": seen.return_values}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:6])
