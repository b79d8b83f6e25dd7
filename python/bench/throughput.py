"""Throughput from Python beside the Rust driver, in the same run.

Submits 100,000 no-op tasks from a Python loop to two local workers
(shared-memory rings, unified sim chips: the Rust scenario's setup), then
runs the Rust driver's own scenario (`strata-bench --scenario throughput
--link ring`, built with `cargo build --release -p strata-tests`), and
prints both rates and the binding's cost per call: Python's submit time
per task minus Rust's.

    python python/bench/throughput.py [--tasks N] [--bench PATH]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import strata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def python_rate(n):
    with strata.Cluster(local=2, device="sim:mode=unified") as c:
        for _ in range(1000):
            c.submit("noop")
        c.wait_all()
        submit = c.submit
        t0 = time.perf_counter()
        for _ in range(n):
            submit("noop")
        submitted = time.perf_counter() - t0
        s = c.wait_all()
        wall = time.perf_counter() - t0
        assert s.succeeded == n, s
        # The binding's own work per call, without the Rust submit: the
        # call, the signature lookup and the Task built (Cluster.task).
        task = c.task
        t0 = time.perf_counter()
        for _ in range(n):
            task("noop")
        own = (time.perf_counter() - t0) * 1e6 / n
    return n / wall, submitted * 1e6 / n, own


def rust_rate(bench):
    out = subprocess.run(
        [bench, "--scenario", "throughput", "--link", "ring"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("scenario", "").startswith("throughput"):
                us = float(r["detail"].split("submit ")[1].split(" us/task")[0])
                return r["value"], us
    raise RuntimeError(f"no throughput line in {out!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--bench", default=os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "strata-bench"))
    a = ap.parse_args()
    py, py_us, own_us = python_rate(a.tasks)
    print(f"python: {py:,.0f} tasks/s ({a.tasks} no-op tasks, 2 local workers); submit {py_us:.2f} us/call")
    print(f"binding alone (Cluster.task: call, signature, Task built; no submit): {own_us:.2f} us/call")
    if not os.path.exists(a.bench):
        print(f"(no {a.bench}: build it with cargo build --release -p strata-tests for the Rust figure)")
        return 0
    rust, rust_us = rust_rate(a.bench)
    print(f"rust:   {rust:,.0f} tasks/s (strata-bench --scenario throughput --link ring); submit {rust_us:.2f} us/call")
    print(f"python/rust: {py / rust:.2f}; submit per call, python minus rust: {py_us - rust_us:+.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
