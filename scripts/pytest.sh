#!/usr/bin/env bash
# The Python package's tests, as a user gets the package: a fresh venv,
# `pip install ./python` (the extension built in release by maturin), then
# pytest over python/tests (real worker processes). Run from anywhere;
# extra arguments go to pytest. STRATA_PYTHON picks the interpreter
# (default python3, 3.9 or newer).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${STRATA_PYTHON:-python3}
venv=target/pytest-venv
"$py" -m venv --clear "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
"$venv/bin/pip" install --quiet ./python numpy pytest
# From the repository root, so that `import strata` is the installed
# package, not the source folder python/strata.
"$venv/bin/python" -m pytest python/tests -q "$@"
