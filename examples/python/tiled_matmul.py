"""A tiled matmul on four simulated chips: C = A @ B in 64x64 tiles,
accumulated with matmul_acc; strata orders the accumulations into each C
tile (read-write of the same bytes) and runs different tiles in parallel.

    python examples/python/tiled_matmul.py
"""

import time

import numpy as np

import strata

N, T = 512, 64

rng = np.random.default_rng(0)
a_host = rng.standard_normal((N, N)).astype(np.float32)
b_host = rng.standard_normal((N, N)).astype(np.float32)

with strata.Cluster(local=4) as cluster:
    a = cluster.array(a_host)  # copied once into a shared buffer
    b = cluster.array(b_host)
    c = cluster.zeros((N, N), np.float32)
    start = time.perf_counter()
    for i in range(0, N, T):
        for j in range(0, N, T):
            for k in range(0, N, T):
                # Bare views take their tags from matmul_acc's signature:
                # a, b read (INPUT), c read-written (INOUT).
                cluster.submit("matmul_acc", a[i : i + T, k : k + T], b[k : k + T, j : j + T], c[i : i + T, j : j + T])
    summary = cluster.wait_all()
    took = time.perf_counter() - start
    # c.numpy() is the shared buffer itself, no copy.
    err = np.abs(c.numpy() - a_host @ b_host).max()
    print(f"{summary.succeeded} tasks on {len(cluster.workers)} workers in {took:.2f} s; {summary.edges} edges inferred; max error {err:.2e}")
    assert err < 1e-3
