#!/usr/bin/env python3
"""StarPU's own tiled Cholesky example (cholesky_implicit) as a yardstick.

    python3 bench/starpu/cholesky.py [--quick] [--sizes 2048,4096,8192] [--tiles 256,512]
                                     [--scheds dmda,eager,dmdas] [--repeats 5] [--budget-s 900]

Runs Debian's prebuilt starpu-examples binary (single precision, StarPU 1.3) with
2 CPU workers, no accelerators, OpenBLAS (pthread build, 1 thread per worker) and
a private StarPU home under <repo>/.bench/starpu-home where the calibrated
performance models persist. See bench/starpu/CHOLESKY.md.

stdout: one JSON object per (sched, n, tile):
    {"system": "starpu", "scenario": "cholesky", "sched": "dmda", "n": 2048,
     "tile": 256, "gflops": <median>, "ms": <median>, "repeats": k,
     "runs_gflops": [...], ...}
A row that could not be measured carries "error" (and gflops null). Progress
and StarPU's own chatter go to stderr. Exit status is 0 unless the arguments
are bad.
"""

import argparse
import fcntl
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
STARPU_HOME = REPO_ROOT / ".bench" / "starpu-home"
DEFAULT_BINARY = "/usr/lib/x86_64-linux-gnu/starpu/examples/cholesky_implicit"
# Debian's libopenblas0-pthread ships libblas.so.3 / liblapack.so.3 /
# libopenblas.so.0 in this directory; the alternatives system only symlinks to it.
DEFAULT_BLAS_DIR = "/usr/lib/x86_64-linux-gnu/openblas-pthread"
NCPU = 2
DEFAULT_SIZES = (2048, 4096, 8192)
DEFAULT_TILES = (256, 512)
DEFAULT_SCHEDS = ("dmda", "eager", "dmdas")
# BLAS routines the example's CPU kernels call (potrf is hand-written on top of
# ssyr/sscal unless StarPU was built with MKL, so no LAPACK is involved).
BLAS_SYMBOLS = ("sgemm_", "strsm_", "ssyr_", "sscal_")

UNCALIBRATED_RE = re.compile(r"Warning: model (\S+) is not calibrated")
# A sample further than STARPU_HISTORY_MAX_ERROR (50%) from the mean is dropped;
# once dropped samples outnumber kept ones StarPU throws the entry away.
FLUSH_RE = re.compile(r"Too big deviation for model (\S+)")
# cholesky_implicit prints "# size\tms\tGFlop/s" then "<n>\t<ms>\t<gflops>".
RESULT_RE = re.compile(r"^\s*(\d+)\s+(\d+(?:\.\d*)?)(?:\s+(\d+(?:\.\d*)?))?\s*$")
SCHED_LIST_RE = re.compile(r"^(\S+)\s+->\s+", re.M)
BINDING_RE = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `([A-Za-z0-9_]+)'")
INIT_RE = re.compile(r"calling init: (\S+)")

_t0 = time.monotonic()


def log(msg):
    print(f"[cholesky {time.monotonic() - _t0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def emit(row):
    print(json.dumps(row), flush=True)


def flops_spotrf(n):
    # Same count StarPU's example uses (FLOPS_SPOTRF): n^3/3 + n^2/2 + n/6.
    n = float(n)
    return n * ((n / 6.0 + 0.5) * n + 1.0 / 3.0) + n * ((n / 6.0) * n - 1.0 / 6.0)


def int_list(text):
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not vals or any(v <= 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return vals


def str_list(text):
    vals = [x for x in text.replace(" ", "").split(",") if x]
    if not vals:
        raise argparse.ArgumentTypeError("empty list")
    return vals


class Budget:
    def __init__(self, seconds):
        self.deadline = time.monotonic() + seconds

    def left(self):
        return self.deadline - time.monotonic()


def base_env(blas_dir):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STARPU_")}
    # Force the BLAS: the binary NEEDs libblas.so.3, which the loader now finds
    # in the OpenBLAS directory before the alternatives symlink in the cache.
    env.pop("LD_PRELOAD", None)
    old = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = blas_dir + (":" + old if old else "")
    env["OPENBLAS_NUM_THREADS"] = "1"
    env["GOTO_NUM_THREADS"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["STARPU_HOME"] = str(STARPU_HOME)
    env["STARPU_NCPU"] = str(NCPU)
    env["STARPU_NCUDA"] = "0"
    env["STARPU_NOPENCL"] = "0"
    # Not STARPU_SILENT: it would also hide the "model ... is not calibrated"
    # warnings the calibration loop relies on. Never STARPU_SSILENT: the example
    # then prints no result line at all.
    return env


def run_example(binary, env, args, timeout):
    """Run once; returns dict(rc, stdout, stderr, wall_s) or raises TimeoutExpired."""
    t = time.monotonic()
    p = subprocess.run([binary, *args], env=env, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, errors="replace", timeout=timeout)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr,
            "wall_s": time.monotonic() - t}


def parse_result(stdout, n):
    """(ms, gflops) from the example's result line; gflops computed if absent."""
    seen_header = False
    for line in stdout.splitlines():
        if "GFlop/s" in line and line.lstrip().startswith("#"):
            seen_header = True
            continue
        m = RESULT_RE.match(line)
        if m and seen_header and int(m.group(1)) == n:
            ms = float(m.group(2))
            gf = float(m.group(3)) if m.group(3) is not None else None
            if gf is None or gf <= 0:
                if ms <= 0:
                    raise ValueError(f"unusable result line {line!r}")
                gf = flops_spotrf(n) / (ms * 1e-3) / 1e9
            return ms, gf
    raise ValueError("no result line for size %d in output: %r" % (n, stdout[-300:]))


def tail(text, k=400):
    text = text.strip()
    return text if len(text) <= k else "..." + text[-k:]


def probe(binary, blas_dir, budget):
    """One small checked run (-check) with loader tracing.

    Returns (blas_info, available_scheds). Raises RuntimeError if the BLAS that
    actually gets bound is not the one in blas_dir or the run fails.
    """
    env = base_env(blas_dir)
    env["STARPU_SCHED"] = "help"     # lists the policies, then runs with the default one
    env["STARPU_CALIBRATE"] = "0"
    env["LD_DEBUG"] = "libs,bindings"
    tmp = tempfile.mkdtemp(prefix="starpu-chol-ld-")
    try:
        env["LD_DEBUG_OUTPUT"] = os.path.join(tmp, "ld")
        r = run_example(binary, env, ["-size", "1024", "-nblocks", "4", "-check"],
                        timeout=max(5.0, min(180.0, budget.left())))
        trace = ""
        for f in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, f), errors="replace") as fh:
                trace += fh.read()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if r["rc"] != 0:
        raise RuntimeError(f"probe run (-size 1024 -nblocks 4 -check) failed rc={r['rc']}: {tail(r['stderr'])}")
    parse_result(r["stdout"], 1024)
    scheds = set(SCHED_LIST_RE.findall(r["stderr"] + "\n" + r["stdout"]))

    real_blas_dir = os.path.realpath(blas_dir)
    exe = os.path.realpath(binary)
    bound = {}
    for m in BINDING_RE.finditer(trace):
        src, dst, sym = m.groups()
        if sym in BLAS_SYMBOLS and os.path.realpath(src) == exe:
            bound[sym] = os.path.realpath(dst)
    missing = [s for s in BLAS_SYMBOLS if s not in bound]
    if missing:
        raise RuntimeError(f"loader trace shows no binding for {missing}; cannot tell which BLAS runs")
    wrong = {s: d for s, d in bound.items() if os.path.dirname(d) != real_blas_dir}
    if wrong:
        raise RuntimeError(f"BLAS symbols bound outside {real_blas_dir}: {wrong}")
    inits = [os.path.realpath(p) for p in INIT_RE.findall(trace)]
    openblas = [p for p in inits if os.path.basename(p).startswith("libopenblas")]
    if not openblas or any(os.path.dirname(p) != real_blas_dir for p in openblas):
        raise RuntimeError(f"libopenblas not loaded from {real_blas_dir} (initialised: {openblas})")
    info = {"libblas": sorted(set(bound.values())), "libopenblas": sorted(set(openblas))}
    return info, scheds


def calibrate(binary, blas_dir, n, tile, budget, max_runs, per_run_cap):
    """Make sure dmda's history-based models are calibrated for this tile size.

    StarPU only warns "model ... is not calibrated" when STARPU_CALIBRATE is 0
    (with 1 every model is in benchmarking mode from the start, so it stays
    quiet), so each round is: a plain dmda run as the check (if it warns, StarPU
    itself forces calibration for that run), then, if it warned, enough
    STARPU_CALIBRATE=1 runs to add STARPU_CALIBRATE_MINIMUM (10) samples per
    kernel (potrf runs only nblocks times per factorisation).

    Returns (runs_done, calibrated, models_still_warning)."""
    nblocks = n // tile
    cal_per_round = -(-10 // nblocks)
    args = ["-size", str(n), "-nblocks", str(nblocks)]
    runs = 0
    models = []

    def once(calibrate_flag):
        nonlocal runs
        left = budget.left()
        if left < 5:
            raise TimeoutError("time budget exhausted during calibration")
        env = base_env(blas_dir)
        env["STARPU_SCHED"] = "dmda"
        env["STARPU_CALIBRATE"] = calibrate_flag
        r = run_example(binary, env, args, timeout=min(per_run_cap, left))
        runs += 1
        if r["rc"] != 0:
            raise RuntimeError(f"calibration run failed rc={r['rc']}: {tail(r['stderr'])}")
        flushed = FLUSH_RE.findall(r["stderr"])
        if flushed:
            log(f"  StarPU flushed noisy history for {sorted(set(flushed))} ({len(flushed)}x)")
        return r

    while runs < max_runs:
        r = once("0")
        models = sorted(set(UNCALIBRATED_RE.findall(r["stderr"])))
        log(f"  check n={n} tile={tile} (run {runs}): "
            + (f"not calibrated: {models}" if models else "all models calibrated")
            + f" ({r['wall_s']:.1f}s)")
        if not models:
            return runs, True, []
        # keep the last allowed run for a check
        for _ in range(min(cal_per_round, max_runs - runs - 1)):
            r = once("1")
            log(f"  calibrate n={n} tile={tile} STARPU_CALIBRATE=1 (run {runs}, {r['wall_s']:.1f}s)")
    return runs, False, models


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int_list, default=None, help="comma-separated N (default 2048,4096,8192)")
    ap.add_argument("--quick", action="store_true", help="N=2048 only")
    ap.add_argument("--tiles", type=int_list, default=list(DEFAULT_TILES), help="comma-separated tile sizes (default 256,512)")
    ap.add_argument("--scheds", type=str_list, default=list(DEFAULT_SCHEDS),
                    help="comma-separated STARPU_SCHED policies (default dmda,eager,dmdas)")
    ap.add_argument("--repeats", type=int, default=5, help="measured runs per (sched, N, tile) (default 5)")
    ap.add_argument("--max-calib-runs", type=int, default=16, help="cap on calibration runs per (N, tile) (default 16)")
    ap.add_argument("--budget-s", type=float, default=900.0, help="total wall-clock budget in seconds (default 900)")
    ap.add_argument("--run-timeout-s", type=float, default=300.0, help="cap on one run of the example (default 300)")
    ap.add_argument("--binary", default=DEFAULT_BINARY, help="cholesky_implicit to run")
    ap.add_argument("--blas-dir", default=DEFAULT_BLAS_DIR, help="directory holding OpenBLAS's libblas.so.3")
    a = ap.parse_args()
    if a.repeats < 1 or a.max_calib_runs < 1 or a.budget_s <= 0:
        ap.error("--repeats, --max-calib-runs and --budget-s must be positive")
    sizes = a.sizes if a.sizes else ([2048] if a.quick else list(DEFAULT_SIZES))
    if a.quick and a.sizes:
        log("--sizes given, --quick ignored")
    budget = Budget(a.budget_s)

    combos = [(n, t) for n in sorted(set(sizes)) for t in sorted(set(a.tiles))]

    def row(sched, n, tile, **kw):
        r = {"system": "starpu", "scenario": "cholesky", "sched": sched, "n": n, "tile": tile,
             "nblocks": n // tile if tile else None, "ncpu": NCPU, "precision": "single"}
        r.update(kw)
        return r

    def fail_all(msg, todo):
        for n, t in todo:
            for s in a.scheds:
                emit(row(s, n, t, gflops=None, ms=None, repeats=0, runs_gflops=[], error=msg))

    if not os.access(a.binary, os.X_OK):
        fail_all(f"{a.binary} not found or not executable (apt-get install starpu-examples)", combos)
        return 0
    if not os.path.exists(os.path.join(a.blas_dir, "libblas.so.3")):
        fail_all(f"{a.blas_dir}/libblas.so.3 missing (apt-get install libopenblas0-pthread)", combos)
        return 0

    STARPU_HOME.mkdir(parents=True, exist_ok=True)
    lock = open(STARPU_HOME / ".lock", "w")
    while True:   # one harness at a time per StarPU home: models are rewritten at shutdown
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if budget.left() < 10:
                fail_all(f"{STARPU_HOME} locked by another run", combos)
                return 0
            log(f"waiting for the lock on {STARPU_HOME} ...")
            time.sleep(5)

    log(f"STARPU_HOME={STARPU_HOME}; LD_LIBRARY_PATH={a.blas_dir}; OPENBLAS_NUM_THREADS=1; "
        f"STARPU_NCPU={NCPU} NCUDA=0 NOPENCL=0; sizes={sizes} tiles={a.tiles} scheds={a.scheds}")
    try:
        blas, available = probe(a.binary, a.blas_dir, budget)
    except Exception as e:  # noqa: BLE001 - every failure becomes an error row
        fail_all(f"BLAS/probe check failed: {e}", combos)
        return 0
    log(f"BLAS verified: {', '.join(BLAS_SYMBOLS)} bound to {blas['libblas']}, "
        f"OpenBLAS core {blas['libopenblas']}; policies known: {len(available)}")
    blas_label = "openblas-pthread (" + ", ".join(blas["libblas"] + blas["libopenblas"]) + ")"

    scheds = list(a.scheds)
    for n, tile in combos:
        if n % tile:
            for s in scheds:
                emit(row(s, n, tile, gflops=None, ms=None, repeats=0, runs_gflops=[],
                         error=f"n={n} is not a multiple of tile={tile}"))
            continue
        if n // tile > 128:   # NMAXBLOCKS in the example's header
            for s in scheds:
                emit(row(s, n, tile, gflops=None, ms=None, repeats=0, runs_gflops=[],
                         error=f"nblocks={n // tile} exceeds the example's limit 128"))
            continue
        log(f"n={n} tile={tile} nblocks={n // tile}: calibrating dmda's models")
        try:
            calib_runs, calibrated, still = calibrate(a.binary, a.blas_dir, n, tile, budget,
                                                      a.max_calib_runs, a.run_timeout_s)
        except subprocess.TimeoutExpired:
            msg = "calibration run timed out (time budget or --run-timeout-s)"
            for s in scheds:
                emit(row(s, n, tile, gflops=None, ms=None, repeats=0, runs_gflops=[], error=msg))
            continue
        except Exception as e:  # noqa: BLE001
            for s in scheds:
                emit(row(s, n, tile, gflops=None, ms=None, repeats=0, runs_gflops=[], error=str(e)))
            continue
        if not calibrated:
            log(f"  still uncalibrated after {calib_runs} runs: {still}; measuring anyway")

        # Round-robin over the policies so background load hits them alike.
        results = {s: {"gf": [], "ms": [], "warn": 0, "err": None} for s in scheds}
        for s in scheds:
            if available and s not in available:
                results[s]["err"] = f"scheduling policy {s!r} not offered by this StarPU"
        for rep in range(a.repeats):
            for s in scheds:
                res = results[s]
                if res["err"] and not res["gf"]:
                    continue
                left = budget.left()
                if left < 5:
                    res["err"] = "time budget exhausted"
                    continue
                env = base_env(a.blas_dir)
                env["STARPU_SCHED"] = s
                env["STARPU_CALIBRATE"] = "0"
                try:
                    r = run_example(a.binary, env, ["-size", str(n), "-nblocks", str(n // tile)],
                                    timeout=min(a.run_timeout_s, left))
                    if r["rc"] != 0:
                        raise RuntimeError(f"rc={r['rc']}: {tail(r['stderr'])}")
                    ms, gf = parse_result(r["stdout"], n)
                except subprocess.TimeoutExpired:
                    res["err"] = "run timed out (time budget or --run-timeout-s)"
                    continue
                except Exception as e:  # noqa: BLE001
                    res["err"] = str(e)
                    continue
                res["gf"].append(gf)
                res["ms"].append(ms)
                res["warn"] += len(UNCALIBRATED_RE.findall(r["stderr"]))
                log(f"  {s:6s} n={n} tile={tile} rep {rep + 1}/{a.repeats}: {gf:.1f} GFlop/s, {ms:.0f} ms")
        load1 = round(os.getloadavg()[0], 2)
        for s in scheds:
            res = results[s]
            out = row(s, n, tile,
                      gflops=round(statistics.median(res["gf"]), 2) if res["gf"] else None,
                      ms=round(statistics.median(res["ms"]), 1) if res["ms"] else None,
                      repeats=len(res["gf"]), runs_gflops=res["gf"], runs_ms=res["ms"],
                      calib_runs=calib_runs, calibrated=calibrated,
                      uncalibrated_warnings=res["warn"], blas=blas_label, load1=load1)
            if res["err"]:
                out["error"] = res["err"]
            emit(out)
    log(f"done, {a.budget_s - budget.left():.0f}s used of {a.budget_s:.0f}s budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
