"""The Python layer's own figures, one round, printed as one JSON line:
a view by slicing, submit (the call alone, and sustained), a loop of tasks,
dependent hops (the first thousand of a fresh cluster, the next thousand,
then nine thousand),
tiled matmul 1024² in 64² tiles (F32, F64), tiled Cholesky 2048² in 256²
tiles with numpy kernels, and no-op Python kernels on one worker.

    python python/bench/figures.py

Run it against two installs of the package in turn (e.g. two venvs) to
compare them. When this checkout has `target/release/strata-bench`
(`cargo build --release -p strata-tests --bins`), each round of Python
hops is followed by the same hops from the Rust driver
(`strata-bench --scenario hop`), and the ratios are printed.
"""
import json, os, statistics, sys, time, timeit
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench", "python"))  # the kernels, for the workers too
import numpy as np
import strata
import pykernels as pyk
from python_bench import cholesky_strata, matmul_strata

out = {"strata": os.path.dirname(strata.__file__)}
U = "sim:mode=unified"

with strata.Cluster(local=2, device=U) as c:
    a = c.zeros((64, 64), "f32"); b = c.zeros((64, 64), "f32"); o = c.zeros((64, 64), "f32")
    t = timeit.repeat(lambda: a[8:16, 24:32], number=20000, repeat=7)
    out["view_us"] = statistics.median(t) / 20000 * 1e6
    va, vb, vo = a[8:16, 24:32], b[8:16, 24:32], o[8:16, 24:32]
    for _ in range(2000):
        c.submit("add", va, vb, vo)
    c.wait_all()

    def per_submit(batches, each):
        """Median µs per submit over `batches` batches of `each` tasks."""
        got = []
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(each):
                c.submit("add", va, vb, vo)
            got.append((time.perf_counter() - t0) / each * 1e6)
            c.wait_all()
        return statistics.median(got)

    out["submit_us"] = per_submit(5, 20000)
    # The call alone: bursts of 500, fewer than the command channel holds,
    # so the driver's actor never holds the caller up.
    out["submit_burst_us"] = per_submit(40, 500)
    n = 50000
    x = c.zeros((n // 8, 8), "f32"); y = c.zeros((n // 8, 8), "f32"); z = c.zeros((n, 8), "f32")
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        for i in range(n):
            r = i % (n // 8)
            c.submit("add", x[r:r + 1, 0:8], y[r:r + 1, 0:8], z[i:i + 1, 0:8])
        c.wait_all()
        rates.append(n / (time.perf_counter() - t0))
    out["loop_per_s"] = statistics.median(rates)

def hops(n_first=1000, n_second=1000, n_later=9000):
    with strata.Cluster(local=2, device=U) as c:
        x = c.zeros(8, "f32"); y = c.zeros(8, "f32")
        def run(n):
            t0 = time.perf_counter()
            for i in range(n):
                c.submit("axpy", x, y, 0.5, on=i % 2)
            c.wait_all()
            return (time.perf_counter() - t0) / n * 1e6
        return run(n_first), run(n_second), run(n_later)
def rust_hops():
    """The same hops from the Rust driver (`strata-bench --scenario hop`),
    when this checkout has built it: (first 1,000, next 1,000, later)."""
    exe = os.path.join(ROOT, "target", "release", "strata-bench")
    if not os.path.exists(exe):
        return None
    import subprocess
    p = subprocess.run([exe, "--scenario", "hop", "--link", "ring"], capture_output=True, text=True)
    rows = [json.loads(l) for l in p.stdout.splitlines()]
    got = {r["variant"]: r["value"] for r in rows if r["ok"]}
    if p.returncode != 0 or set(got) != {"first-1000", "second-1000", "later"}:
        raise RuntimeError(f"strata-bench --scenario hop failed (exit {p.returncode}): "
                           f"{[r for r in rows if not r['ok']] or p.stderr[-400:]}")
    return got["first-1000"], got["second-1000"], got["later"]
# Python's and Rust's rounds alternated, so that both see the same host.
h, r = [], []
for _ in range(3):
    h.append(hops())
    r.append(rust_hops())
out["hop_first_us"] = statistics.median(a for a, _, _ in h)
out["hop_second_us"] = statistics.median(a for _, a, _ in h)
out["hop_warm_us"] = statistics.median(b for _, _, b in h)
# A fresh cluster's cost: its first 1,000 hops against the next 1,000.
out["hop_first_vs_second"] = statistics.median(p[0] / p[1] for p in h)
if all(r):
    out["rust_hop_first_us"] = statistics.median(a for a, _, _ in r)
    out["rust_hop_second_us"] = statistics.median(a for _, a, _ in r)
    out["rust_hop_warm_us"] = statistics.median(b for _, _, b in r)
    out["rust_hop_first_vs_second"] = statistics.median(q[0] / q[1] for q in r)
    out["hop_first_vs_rust_first"] = statistics.median(p[0] / q[0] for p, q in zip(h, r))
    out["hop_first_vs_rust_warm"] = statistics.median(p[0] / q[2] for p, q in zip(h, r))

def timed(job, inputs, check):
    """Median seconds of three runs after a warm-up, each result checked."""
    runs = []
    for _ in range(4):
        t0 = time.perf_counter()
        got = job(*inputs)
        runs.append(time.perf_counter() - t0)
        assert check(got)
    return statistics.median(runs[1:])

def matmul(c, dt, n=1024, t=64):
    rng = np.random.default_rng(0)
    ah = rng.standard_normal((n, n)).astype(dt); bh = rng.standard_normal((n, n)).astype(dt)
    want = ah @ bh
    return timed(matmul_strata(c, n, t, False, dt), (ah, bh), lambda got: np.abs(got - want).max() < 1e-2)

def cholesky(c, n=2048, t=256):
    i, j = np.indices((n, n)); ah = 1.0 / (i + j + 1) + n * (i == j)
    want = np.linalg.cholesky(ah)
    return timed(cholesky_strata(c, n, t, True), (ah,), lambda got: np.abs(got - want).max() < 1e-8)

with strata.Cluster(local=2, kernels=pyk.ALL) as c:
    out["matmul_f32_s"] = matmul(c, np.float32)
    try:
        out["matmul_f64_s"] = matmul(c, np.float64)
    except Exception as e:
        out["matmul_f64_s"] = f"refused: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    out["cholesky_numpy_kernels_s"] = cholesky(c)

with strata.Cluster(local=1, device=U, kernels=pyk.ALL) as c:
    a = c.zeros((64, 64), "f32"); o = c.zeros((1000, 80), "f32")
    m = 20000
    for name, mk in (("pykernel1", lambda i: (a[0:8, 0:8],)),
                     ("pykernel3", lambda i: (a[0:8, 0:8], a[8:16, 0:8], o[i % 1000, (i // 1000) % 10 * 8:(i // 1000) % 10 * 8 + 8]))):
        args = [mk(i) for i in range(m)]
        call = "bench.noop" + name[-1]
        rates = []
        for _ in range(3):
            t0 = time.perf_counter()
            for i in range(m):
                c.submit(call, *args[i])
            c.wait_all()
            rates.append(m / (time.perf_counter() - t0))
        out[name + "_per_s"] = statistics.median(rates)
print(json.dumps(out))
