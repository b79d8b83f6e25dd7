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
