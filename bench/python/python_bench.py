"""strata from Python beside Dask and numpy: the same jobs, same run, same data.

    python bench/python/python_bench.py [--quick] [--systems a,b,...] [--repeats N]

Systems (all on two workers or threads, BLAS at one thread each):
  strata            Cluster(local=2), built-in kernels where strata has them
  strata-py         Cluster(local=2), the numpy kernels of pykernels.py
  dask-threads      dask.array, the threaded scheduler, 2 threads
  dask-distributed  dask.array on distributed.LocalCluster, 2 worker processes
  numpy             one numpy call (or numpy's own loop) in this process

Scenarios: tiled matmul, tiled Cholesky, a 2-D Jacobi stencil over tiles
with halo views, and a loop of small-tile tasks. Every result is checked
against numpy; a wrong one is printed with ok=false. Prints one JSON row
per (system, scenario, size) on stdout, the shape scripts/bench.py reads:
value is the median seconds of the job from host numpy arrays to a numpy
result (tasks/s for the loop), cluster start-up not included.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

# One BLAS thread per worker, thread or process: two cores, two workers.
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # pykernels, for this process and (via sys.path) the workers

SYSTEMS = ["strata", "strata-py", "dask-threads", "dask-distributed", "numpy"]
DTYPE = np.float64  # numpy's default, what a user starts with

# (scenario, size parameters): full and quick.
FULL = {
    "matmul": [(1024, 64), (2048, 256)],
    "cholesky": [(2048, 256), (4096, 512)],
    "jacobi": [(2048, 256, 10)],
    # Dask distributed takes ~6 ms a tile here: only the smaller loop.
    "loop": [(2048, ()), (16384, ("dask-distributed",))],
}
QUICK = {
    "matmul": [(256, 64)],
    "cholesky": [(512, 128)],
    "jacobi": [(256, 64, 4)],
    "loop": [(1024, ())],
}
# A system whose single run takes longer than this is run once more at most.
SLOW_S = 8.0


def log(msg):
    print(f"python_bench: {msg}", file=sys.stderr, flush=True)


def rel_err(got, want):
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))


# ---------------------------------------------------------------- the jobs


def matmul_strata(c, n, t, numpy_kernels, dtype=DTYPE):
    def job(a_host, b_host):
        a, b = c.array(a_host), c.array(b_host)
        out = c.zeros((n, n), dtype)
        name = "bench.matmul_acc" if numpy_kernels else "matmul_acc"
        for i in range(0, n, t):
            for j in range(0, n, t):
                for k in range(0, n, t):
                    c.submit(name, a[i : i + t, k : k + t], b[k : k + t, j : j + t], out[i : i + t, j : j + t])
        c.wait_all()
        return out.numpy()

    return job


def matmul_dask(scheduler, t):
    import dask.array as da

    def job(a_host, b_host):
        a = da.from_array(a_host, chunks=t)
        b = da.from_array(b_host, chunks=t)
        return (a @ b).compute(**scheduler)

    return job


def cholesky_strata(c, n, t, numpy_kernels):
    potrf, trsm, syrk = (f"bench.{k}" if numpy_kernels else k for k in ("potrf", "trsm", "syrk"))

    def job(a_host):
        a = c.array(a_host)
        for k in range(0, n, t):
            kk = a[k : k + t, k : k + t]
            c.submit(potrf, kk)
            for r in range(k + t, n, t):
                c.submit(trsm, kk, a[r : r + t, k : k + t])
            for r in range(k + t, n, t):
                c.submit(syrk, a[r : r + t, k : k + t], a[r : r + t, r : r + t])
                for q in range(k + t, r, t):
                    if numpy_kernels:
                        c.submit("bench.gemm_nt", a[r : r + t, k : k + t], a[q : q + t, k : k + t], a[r : r + t, q : q + t])
                    else:
                        c.submit("gemm", a[r : r + t, k : k + t], a[q : q + t, k : k + t].T, a[r : r + t, q : q + t], -1.0, 1.0)
        c.wait_all()
        return np.tril(a.numpy())

    return job


def cholesky_dask(scheduler, t):
    import dask.array as da

    def job(a_host):
        return da.linalg.cholesky(da.from_array(a_host, chunks=t), lower=True).compute(**scheduler)

    return job


def jacobi_numpy(steps):
    def job(u_host):
        src, dst = u_host.copy(), u_host.copy()
        for _ in range(steps):
            dst[1:-1, 1:-1] = 0.25 * (src[:-2, 1:-1] + src[2:, 1:-1] + src[1:-1, :-2] + src[1:-1, 2:])
            src, dst = dst, src
        return src

    return job


def jacobi_strata(c, n, t, steps):
    # Two (n+2)^2 grids with a fixed border; a tile task reads its tile of
    # src with a one-element halo and writes the tile's interior of dst.
    def job(u_host):
        src, dst = c.array(u_host), c.array(u_host)
        for _ in range(steps):
            for i in range(1, n + 1, t):
                for j in range(1, n + 1, t):
                    c.submit("bench.jacobi", src[i - 1 : i + t + 1, j - 1 : j + t + 1], dst[i : i + t, j : j + t])
            src, dst = dst, src
        c.wait_all()
        return src.numpy()

    return job


def jacobi_dask(scheduler, t, steps):
    import dask.array as da

    def step(block):
        out = block.copy()
        out[1:-1, 1:-1] = 0.25 * (block[:-2, 1:-1] + block[2:, 1:-1] + block[1:-1, :-2] + block[1:-1, 2:])
        return out

    def job(u_host):
        # The interior in tiles; the border (zero) is map_overlap's boundary.
        u = da.from_array(u_host[1:-1, 1:-1], chunks=t)
        for _ in range(steps):
            u = u.map_overlap(step, depth=1, boundary=0.0, dtype=u.dtype)
        out = np.zeros_like(u_host)
        out[1:-1, 1:-1] = u.compute(**scheduler)
        return out

    return job


def loop_strata(c, rows, numpy_kernels):
    name = "bench.add" if numpy_kernels else "add"

    def job(a_host, b_host):
        a, b = c.array(a_host), c.array(b_host)
        out = c.zeros(a_host.shape, DTYPE)
        submit = c.submit
        for i in range(0, rows, 8):
            for j in range(0, 64, 8):
                submit(name, a[i : i + 8, j : j + 8], b[i : i + 8, j : j + 8], out[i : i + 8, j : j + 8])
        c.wait_all()
        return out.numpy()

    return job


def loop_numpy(rows):
    def job(a_host, b_host):
        out = np.empty_like(a_host)
        for i in range(0, rows, 8):
            for j in range(0, 64, 8):
                np.add(a_host[i : i + 8, j : j + 8], b_host[i : i + 8, j : j + 8], out=out[i : i + 8, j : j + 8])
        return out

    return job


def loop_dask(scheduler):
    import dask.array as da

    def job(a_host, b_host):
        return (da.from_array(a_host, chunks=8) + da.from_array(b_host, chunks=8)).compute(**scheduler)

    return job


# ---------------------------------------------------------------- running


def measure(job, inputs, want, tol, repeats):
    """Median seconds of `repeats` runs after one warm-up (fewer when slow)."""
    t0 = time.perf_counter()
    got = job(*inputs)
    first = time.perf_counter() - t0
    err = rel_err(got, want)
    ok = err <= tol
    runs = []
    if first > SLOW_S:
        runs.append(first)  # too slow to warm up and repeat
    budget = max(repeats, 1) if first <= SLOW_S else 1
    while len(runs) < budget:
        t0 = time.perf_counter()
        got = job(*inputs)
        runs.append(time.perf_counter() - t0)
        e = rel_err(got, want)
        err, ok = max(err, e), ok and e <= tol
        if sum(runs) > 6 * SLOW_S:
            break
    return statistics.median(runs), runs, ok, err


def scenarios(sizes, systems, repeats, emit):
    # Dask's advice to load data with Dask rather than from host arrays
    # (which is what this compares) and its chunk-count notes, once each.
    warnings.filterwarnings("once")
    import strata
    import pykernels

    rng = np.random.default_rng(7)
    want_strata = any(s.startswith("strata") for s in systems)
    cluster = strata.Cluster(local=2, kernels=pykernels.ALL) if want_strata else None
    threads = {"scheduler": "threads", "num_workers": 2}
    dist = None
    if "dask-distributed" in systems:
        from dask.distributed import Client, LocalCluster

        lc = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
        dist = Client(lc)
    try:
        for n, t in sizes["matmul"]:
            a_host, b_host = rng.standard_normal((n, n)), rng.standard_normal((n, n))
            want = a_host @ b_host
            jobs = {
                "strata": lambda: matmul_strata(cluster, n, t, False),
                "strata-py": lambda: matmul_strata(cluster, n, t, True),
                "dask-threads": lambda: matmul_dask(threads, t),
                "dask-distributed": lambda: matmul_dask({"scheduler": dist}, t),
                "numpy": lambda: (lambda a, b: a @ b),
            }
            run_all("matmul", f"{n}/{t}", {"n": n, "tile": t, "tasks": (n // t) ** 3}, jobs, systems,
                    (a_host, b_host), want, 1e-10, repeats, emit)
        for n, t in sizes["cholesky"]:
            i, j = np.indices((n, n))
            a_host = 1.0 / (i + j + 1) + n * (i == j)
            want = np.linalg.cholesky(a_host)
            k = n // t
            jobs = {
                "strata": lambda: cholesky_strata(cluster, n, t, False),
                "strata-py": lambda: cholesky_strata(cluster, n, t, True),
                "dask-threads": lambda: cholesky_dask(threads, t),
                "dask-distributed": lambda: cholesky_dask({"scheduler": dist}, t),
                "numpy": lambda: np.linalg.cholesky,
            }
            run_all("cholesky", f"{n}/{t}", {"n": n, "tile": t, "tasks": k * (k + 1) * (k + 2) // 6}, jobs,
                    systems, (a_host,), want, 1e-12, repeats, emit)
        for n, t, steps in sizes["jacobi"]:
            u_host = np.zeros((n + 2, n + 2))
            u_host[1:-1, 1:-1] = rng.random((n, n))
            want = jacobi_numpy(steps)(u_host)
            jobs = {
                "strata-py": lambda: jacobi_strata(cluster, n, t, steps),
                "dask-threads": lambda: jacobi_dask(threads, t, steps),
                "dask-distributed": lambda: jacobi_dask({"scheduler": dist}, t, steps),
                "numpy": lambda: jacobi_numpy(steps),
            }
            run_all("jacobi", f"{n}/{t}x{steps}", {"n": n, "tile": t, "steps": steps,
                                                   "tasks": steps * (n // t) ** 2},
                    jobs, systems, (u_host,), want, 1e-12, repeats, emit)
        for tasks, skip in sizes["loop"]:
            rows = tasks // 8 * 8  # one 8x8 tile per task, 8 tiles per 8 rows
            a_host, b_host = rng.random((rows, 64)), rng.random((rows, 64))
            want = a_host + b_host
            jobs = {
                "strata": lambda: loop_strata(cluster, rows, False),
                "strata-py": lambda: loop_strata(cluster, rows, True),
                "dask-threads": lambda: loop_dask(threads),
                "dask-distributed": lambda: loop_dask({"scheduler": dist}),
                "numpy": lambda: loop_numpy(rows),
            }
            run_all("loop", f"{tasks} 8x8", {"tasks": rows}, jobs, [s for s in systems if s not in skip],
                    (a_host, b_host), want, 0.0, repeats, emit, rate=True)
    finally:
        if cluster is not None:
            cluster.close()
        if dist is not None:
            dist.close()
            lc.close()


def run_all(scenario, variant, params, jobs, systems, inputs, want, tol, repeats, emit, rate=False):
    for system in systems:
        if system not in jobs:
            continue
        log(f"{scenario} {variant}: {system}")
        try:
            secs, runs, ok, err = measure(jobs[system](), inputs, want, tol, repeats)
        except Exception as e:  # a system that fails is reported, not fatal
            emit({"system": system, "scenario": f"py-{scenario}", "variant": variant, "params": params,
                  "value": None, "unit": "tasks/s" if rate else "s", "ok": False,
                  "detail": f"{type(e).__name__}: {e}"[:300]})
            continue
        value = params["tasks"] / secs if rate else secs
        emit({"system": system, "scenario": f"py-{scenario}", "variant": variant,
              "params": dict(params, runs_s=[round(r, 4) for r in runs]),
              "value": value, "unit": "tasks/s" if rate else "s", "ok": ok,
              "detail": f"max relative error {err:.1e}"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes, a few seconds per system")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per job after a warm-up (median)")
    a = ap.parse_args()
    systems = [s for s in a.systems.split(",") if s]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown system(s) {unknown}; known: {SYSTEMS}")
    wrong = []

    def emit(row):
        print(json.dumps(row), flush=True)
        if not row["ok"]:
            wrong.append(f"{row['system']} {row['scenario']} {row['variant']}: {row['detail']}")

    scenarios(QUICK if a.quick else FULL, systems, 1 if a.quick else a.repeats, emit)
    if wrong:
        log("wrong or failed: " + "; ".join(wrong))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
