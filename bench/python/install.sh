#!/usr/bin/env bash
# A private virtualenv for bench/python/python_bench.py: strata's Python
# package built from this checkout (pip install ./python, maturin, release),
# numpy, scipy, Dask with distributed, and matplotlib for the plot.
# Usage: bash bench/python/install.sh [VENV_DIR]   (default .bench/py-venv)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-.bench/py-venv}"
case "$VENV" in
  /*) ;;
  *) VENV="$ROOT/$VENV" ;;
esac
PYTHON="${PYTHON:-python3}"

die() { echo "install.sh: ERROR: $*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found (set PYTHON=/path/to/python3)."
if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV" || die "could not create a venv at $VENV (is Python's venv module installed?)."
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip \
  || die "could not upgrade pip in $VENV (no network access to PyPI?)."
"$VENV/bin/python" -m pip install --quiet "numpy>=1.24,<3" "scipy>=1.10" "dask[array,distributed]>=2024.1" "matplotlib>=3.8,<4" \
  || die "pip could not install numpy, scipy, Dask and matplotlib into $VENV."
# Always rebuilt: the package is this checkout's.
"$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$ROOT/python" \
  || die "pip install ./python failed (needs cargo on PATH to build the extension)."
"$VENV/bin/python" -c 'import strata, dask, distributed, scipy, numpy' \
  || die "the packages installed but do not import in $VENV."
echo "install.sh: $VENV has strata, numpy $("$VENV/bin/python" -c 'import numpy; print(numpy.__version__)'), dask $("$VENV/bin/python" -c 'import dask; print(dask.__version__)')"
