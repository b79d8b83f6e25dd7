"""numpy kernels for bench/python/python_bench.py: the tile operations a
Python user would write, run by strata's worker processes (a module of its
own, so that spawned workers can import it).

Each gets numpy arrays over the task's views, strided as the views are,
and writes its output in place.
"""

import numpy as np

import strata

try:  # A triangular solve is BLAS's trsm; numpy alone has only a general solve.
    from scipy.linalg import solve_triangular
except ImportError:  # pragma: no cover - the bench venv has scipy
    solve_triangular = None


@strata.kernel("bench.matmul_acc", args=("a:r", "b:r", "c:rw"))
def matmul_acc(a, b, c):
    c += a @ b


@strata.kernel("bench.potrf", args=("a:rw",))
def potrf(a):
    a[...] = np.linalg.cholesky(a)


@strata.kernel("bench.trsm", args=("l:r", "b:rw"))
def trsm(l, b):
    # b <- b . l^-T, that is (l^-1 . b^T)^T
    if solve_triangular is not None:
        b[...] = solve_triangular(l, b.T, lower=True, check_finite=False).T
    else:
        b[...] = np.linalg.solve(np.tril(l), b.T).T


@strata.kernel("bench.syrk", args=("a:r", "c:rw"))
def syrk(a, c):
    c -= a @ a.T


@strata.kernel("bench.gemm_nt", args=("a:r", "b:r", "c:rw"))
def gemm_nt(a, b, c):
    # c <- c - a . b^T
    c -= a @ b.T


@strata.kernel("bench.jacobi", args=("src:r", "dst:w"))
def jacobi(src, dst):
    # dst is src's interior, one element in from every side of src.
    dst[...] = 0.25 * (src[:-2, 1:-1] + src[2:, 1:-1] + src[1:-1, :-2] + src[1:-1, 2:])


@strata.kernel("bench.add", args=("a:r", "b:r", "c:w"))
def add(a, b, c):
    np.add(a, b, out=c)


@strata.kernel("bench.noop1", args=("x:r",))
def noop1(x):
    pass


@strata.kernel("bench.noop3", args=("x:r", "y:r", "out:w"))
def noop3(x, y, out):
    pass


ALL = [matmul_acc, potrf, trsm, syrk, gemm_nt, jacobi, add, noop1, noop3]
