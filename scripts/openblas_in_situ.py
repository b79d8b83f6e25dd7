#!/usr/bin/env python3
"""OpenBLAS's tile kernels in place, on 256² tiles of a large matrix.

    python3 scripts/openblas_in_situ.py [N ...]   # needs numpy; Debian's libopenblas0-pthread

What a tiled Cholesky's kernels cost where they run: on tiles of an N×N
row-major F32 matrix (leading dimension N), a different tile triple each
call, so the tiles come from memory as they do in the factorization, not
from a cache warmed by the call before. Calls Debian's OpenBLAS (the one
StarPU's Cholesky runs over in bench/starpu/) through ctypes, one thread:
`cblas_sgemm` (c ← c − a·bᵀ), `cblas_ssyrk` (lower, c ← c − a·aᵀ) and
`cblas_strsm` (b ← b·l⁻ᵀ). Prints the median µs per call of 5 batches of
600 calls per kernel and N (default 8192 4096 256; at 256 the tiles stay
cached, as in the one-core tile bench).
"""

import ctypes
import statistics
import sys
import time

import numpy as np

LIB = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so"
TILE = 256
ROW_MAJOR, NO_TRANS, TRANS, LOWER, RIGHT, NON_UNIT = 101, 111, 112, 122, 142, 131


def main():
    try:
        lib = ctypes.CDLL(LIB)
    except OSError as e:
        sys.exit(f"openblas_in_situ: cannot load {LIB} ({e}); apt-get install libopenblas0-pthread")
    lib.openblas_set_num_threads(1)
    p, f, i = ctypes.c_void_p, ctypes.c_float, ctypes.c_int
    lib.cblas_sgemm.argtypes = [i, i, i, i, i, i, f, p, i, p, i, f, p, i]
    lib.cblas_ssyrk.argtypes = [i, i, i, i, i, f, p, i, f, p, i]
    lib.cblas_strsm.argtypes = [i, i, i, i, i, i, i, f, p, i, p, i]
    b = TILE
    for n in [int(a) for a in sys.argv[1:]] or [8192, 4096, 256]:
        tiles = n // b
        m = np.random.default_rng(1).random((n, n), dtype=np.float32)
        base = m.ctypes.data

        def tile(r, c):
            return int(base + (int(r) * b * n + int(c) * b) * 4)

        rng = np.random.default_rng(2)
        triples = [tuple(sorted(rng.integers(0, tiles, 3))) for _ in range(2000)]
        calls = {
            "gemm": lambda r, c, k: lib.cblas_sgemm(ROW_MAJOR, NO_TRANS, TRANS, b, b, b, -1.0, tile(r, k), n,
                                                    tile(c, k), n, 1.0, tile(r, c), n),
            "syrk": lambda r, c, k: lib.cblas_ssyrk(ROW_MAJOR, LOWER, NO_TRANS, b, b, -1.0, tile(r, k), n, 1.0,
                                                    tile(r, r), n),
            "trsm": lambda r, c, k: lib.cblas_strsm(ROW_MAJOR, RIGHT, LOWER, TRANS, NON_UNIT, b, b, 1.0,
                                                    tile(k, k), n, tile(r, k), n),
        }
        for name, call in calls.items():
            batches = []
            for _ in range(5):
                t = time.perf_counter()
                for j in range(600):
                    call(*triples[j % len(triples)])
                batches.append((time.perf_counter() - t) / 600 * 1e6)
            print(f"N={n} tile {b} {name}: {statistics.median(batches):.1f} µs")


if __name__ == "__main__":
    main()
