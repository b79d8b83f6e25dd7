"""The dense Cholesky baseline as a GPU user gets it from Python: PyTorch's
``torch.linalg.cholesky`` (or CuPy's ``cupy.linalg.cholesky`` where only
CuPy is installed), both cuSOLVER's potrf underneath, on the sizes of the
tiled runs of scripts/gpu-check.sh. Prints ``RESULT name value unit``
lines, the best of three timed runs after one warm-up, or one line
saying why there is none.

    python3 scripts/gpu_dense.py [--quick]
"""

import sys
import time


def sizes(quick):
    if quick:
        return [(1024, "f32"), (1024, "f64")]
    return [(16384, "f32"), (16384, "f64"), (32768, "f32")]


def with_torch(quick):
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no GPU")
    for n, dt in sizes(quick):
        dtype = torch.float32 if dt == "f32" else torch.float64
        g = torch.Generator(device="cuda").manual_seed(7)
        a = torch.rand((n, n), device="cuda", dtype=dtype, generator=g)
        a = a @ a.T / n
        a.diagonal().add_(1.0)
        best = None
        for i in range(4):
            torch.cuda.synchronize()
            t = time.perf_counter()
            l = torch.linalg.cholesky(a)
            torch.cuda.synchronize()
            dt_s = time.perf_counter() - t
            if i > 0:
                best = dt_s if best is None else min(best, dt_s)
        # A residual on a few columns: L @ L.T reproduces A.
        cols = slice(0, 8)
        err = (l @ l[cols].T - a[:, cols]).abs().max().item()
        ok = err <= (2e-2 if dt == "f32" else 1e-9)
        yield n, dt, best, err, ok
        del a, l
        torch.cuda.empty_cache()


def with_cupy(quick):
    import cupy

    for n, dt in sizes(quick):
        dtype = cupy.float32 if dt == "f32" else cupy.float64
        rs = cupy.random.RandomState(7)
        a = rs.random_sample((n, n), dtype=dtype)
        a = a @ a.T / n
        a += cupy.eye(n, dtype=dtype)
        best = None
        for i in range(4):
            cupy.cuda.Device(0).synchronize()
            t = time.perf_counter()
            l = cupy.linalg.cholesky(a)
            cupy.cuda.Device(0).synchronize()
            dt_s = time.perf_counter() - t
            if i > 0:
                best = dt_s if best is None else min(best, dt_s)
        err = float(cupy.abs(l @ l[:8].T - a[:, :8]).max())
        ok = err <= (2e-2 if dt == "f32" else 1e-9)
        yield n, dt, best, err, ok
        del a, l


def main():
    quick = "--quick" in sys.argv[1:]
    for name, run in (("torch", with_torch), ("cupy", with_cupy)):
        try:
            for n, dt, secs, err, ok in run(quick):
                tflops = n**3 / 3 / secs / 1e12
                print(f"RESULT {name}_dense_potrf_{n}_{dt} {tflops:.3f} TFLOP/s")
                if not ok:
                    print(f"CHECK {name} cholesky {n} {dt}: residual {err:.2e} too large")
            return 0
        except ImportError:
            continue
        except Exception as e:  # a GPU-side failure: say it, try the next library
            print(f"CHECK {name} dense potrf: {type(e).__name__}: {e}")
    print("gpu_dense: neither PyTorch nor CuPy with a GPU here: no Python dense baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
