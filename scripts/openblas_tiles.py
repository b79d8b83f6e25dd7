#!/usr/bin/env python3
"""Single-core GFlop/s of OpenBLAS's tile kernels, to set beside strata's.

    OPENBLAS_NUM_THREADS=1 python3 scripts/openblas_tiles.py   # needs numpy and scipy from PyPI

Times LAPACK's potrf and BLAS's trsm (right side, lower, transposed:
b <- b·l^-T), syrk (lower, c <- c - a·a^T) and gemm (c <- c - a·b) through
SciPy's bindings to the OpenBLAS it ships, on 256² and 512² tiles in
single and double precision, with the same flop counts as strata's bench
(`cargo bench -p strata-chip-runtime --bench chip -- tile_`): n³/3, n³, n³,
2n³. Prints one line per kernel with the median of 7 timed batches.
"""

import os
import statistics
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from scipy.linalg import blas, lapack  # noqa: E402


def median_seconds(fn, reps):
    fn()
    times = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        times.append((time.perf_counter() - t) / reps)
    return statistics.median(times)


def main():
    rng = np.random.default_rng(1)
    for dt, p in ((np.float32, "s"), (np.float64, "d")):
        potrf = getattr(lapack, p + "potrf")
        trsm = getattr(blas, p + "trsm")
        syrk = getattr(blas, p + "syrk")
        gemm = getattr(blas, p + "gemm")
        for n in (256, 512):
            m = rng.random((n, n)).astype(dt)
            spd = np.asfortranarray(m @ m.T / n + np.eye(n, dtype=dt))
            low = np.asfortranarray(np.tril(rng.random((n, n)).astype(dt) * 1e-3) + np.eye(n, dtype=dt))
            a = np.asfortranarray(rng.random((n, n)).astype(dt))
            b = np.asfortranarray(rng.random((n, n)).astype(dt))
            c = np.asfortranarray(rng.random((n, n)).astype(dt))
            reps = max(3, int(2e8 / n**3))
            n3 = float(n) ** 3
            cases = [
                ("potrf", n3 / 3, lambda: potrf(spd, lower=1, overwrite_a=0)),
                ("trsm", n3, lambda: trsm(1.0, low, b, side=1, lower=1, trans_a=1, overwrite_b=1)),
                ("syrk", n3, lambda: syrk(-1.0, a, beta=1.0, c=c, lower=1, overwrite_c=1)),
                ("gemm", 2 * n3, lambda: gemm(-1.0, a, b, beta=1.0, c=c, overwrite_c=1)),
            ]
            for name, flops, fn in cases:
                s = median_seconds(fn, reps)
                print(f"openblas {p}{name} {n}: {flops / s / 1e9:6.1f} GFlop/s ({s * 1e6:8.1f} us)")


if __name__ == "__main__":
    main()
