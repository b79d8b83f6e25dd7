"""Kernels written in Python, run by worker processes beside the built-in
ones; a Python exception fails only its task, with the traceback.

    python examples/python/python_kernel.py
"""

import numpy as np

import strata
from mykernels import check_positive, smooth

rng = np.random.default_rng(1)
field = rng.random((16, 130), dtype=np.float32) + 0.5

with strata.Cluster(local=2, kernels=[smooth, check_positive]) as cluster:
    x = cluster.array(field)
    y = cluster.zeros((16, 128), np.float32)
    # Each worker smooths every other row (stepped views).
    cluster.submit("example.smooth", x[0::2], y[0::2], 0.5)
    cluster.submit("example.smooth", x[1::2], y[1::2], 0.5)
    cluster.wait_all()
    want = 0.5 * field[:, 1:-1] + 0.25 * (field[:, :-2] + field[:, 2:])
    print("max difference from numpy:", np.abs(y.numpy() - want).max())

    bad = cluster.array(np.array([1.0, -2.0, 3.0], np.float32))
    try:
        cluster.submit("example.check_positive", bad).wait()
    except strata.TaskFailed as e:
        print("task failed on", e.worker, "with:")
        print(e.cause.splitlines()[-1])
    cluster.submit("example.check_positive", y).wait()  # the worker goes on
    print("ok")
