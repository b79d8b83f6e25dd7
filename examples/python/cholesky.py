"""A tiled Cholesky factorization on two simulated chips with strata's
built-in tile kernels, checked against numpy.

    python examples/python/cholesky.py [N] [TILE] [float32|float64]

For each column k of tiles: potrf factors the diagonal tile, trsm solves
the tiles below it, syrk and gemm update the trailing matrix (gemm's second
operand is a transposed view, no copy). strata infers every dependency from
the views and, with its default scheduler, runs the critical path (the
panel chain) first and places each tile task where its performance model
says it finishes first.
"""

import sys
import time

import numpy as np

import strata

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
T = int(sys.argv[2]) if len(sys.argv) > 2 else 256
DTYPE = np.dtype(sys.argv[3] if len(sys.argv) > 3 else "float32")

i, j = np.indices((N, N))
a_host = (1.0 / (i + j + 1) + N * (i == j)).astype(DTYPE)

with strata.Cluster(local=2) as cluster:
    a = cluster.array(a_host)  # one shared buffer; tiles are views of it
    start = time.perf_counter()
    for k in range(0, N, T):
        kk = a[k : k + T, k : k + T]
        cluster.submit("potrf", kk)
        for r in range(k + T, N, T):
            cluster.submit("trsm", kk, a[r : r + T, k : k + T])
        for r in range(k + T, N, T):
            cluster.submit("syrk", a[r : r + T, k : k + T], a[r : r + T, r : r + T])
            for c in range(k + T, r, T):
                # c[r, c] -= a[r, k] @ a[c, k].T
                cluster.submit(
                    "gemm", a[r : r + T, k : k + T], a[c : c + T, k : k + T].T, a[r : r + T, c : c + T], -1.0, 1.0
                )
    summary = cluster.wait_all()
    took = time.perf_counter() - start
    got = np.tril(a.numpy())
    want = np.linalg.cholesky(a_host.astype(np.float64))
    err = np.abs(got - want).max() / np.abs(want).max()
    print(
        f"{summary.succeeded} tasks, {N}x{N} {DTYPE} in {T}x{T} tiles: {took * 1e3:.1f} ms, "
        f"{N**3 / 3 / took / 1e9:.1f} GFlop/s, relative error {err:.1e}"
    )
    assert err < (1e-5 if DTYPE == np.float32 else 1e-12)
