"""The scripts under examples/python run and check their results."""

import glob
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = sorted(
    p for p in glob.glob(os.path.join(ROOT, "examples", "python", "*.py")) if not p.endswith("mykernels.py")
)


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_example_runs(path):
    r = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "panicked" not in r.stderr, r.stderr


def test_the_python_benchmark_checks_its_results():
    # bench/python/python_bench.py in quick mode, strata's systems and
    # numpy (Dask is not installed here): every job runs and matches numpy.
    import json

    r = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "python", "python_bench.py"), "--quick",
         "--systems", "strata,strata-py,numpy"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    got = {(row["system"], row["scenario"]) for row in rows}
    for system in ("strata", "strata-py", "numpy"):
        for scenario in ("py-matmul", "py-cholesky", "py-loop"):
            assert (system, scenario) in got, (system, scenario, r.stderr)
    assert ("strata-py", "py-jacobi") in got
    assert all(row["ok"] and row["value"] > 0 for row in rows), rows
