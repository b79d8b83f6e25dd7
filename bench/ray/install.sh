#!/usr/bin/env bash
# Create a private virtualenv with Ray (core only) + numpy for bench/ray/ray_bench.py.
# Usage: bash bench/ray/install.sh [VENV_DIR]   (default: .bench/ray-venv, relative to repo root)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-.bench/ray-venv}"
case "$VENV" in
  /*) ;;
  *) VENV="$REPO_ROOT/$VENV" ;;
esac

RAY_SPEC="${RAY_SPEC:-ray>=2.9,<3}"
NUMPY_SPEC="${NUMPY_SPEC:-numpy>=1.24,<3}"
PYTHON="${PYTHON:-python3}"

die() { echo "install.sh: ERROR: $*" >&2; exit 1; }

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import ray, numpy' >/dev/null 2>&1; then
  echo "install.sh: $VENV already has ray $("$VENV/bin/python" -c 'import ray; print(ray.__version__)'); nothing to do."
  exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || die "'$PYTHON' not found (set PYTHON=/path/to/python3)."
PYVER="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
echo "install.sh: creating venv $VENV with $PYTHON ($PYVER)"

if [ ! -x "$VENV/bin/python" ]; then
  mkdir -p "$(dirname "$VENV")"
  "$PYTHON" -m venv "$VENV" || die "could not create venv at $VENV (is the 'venv' module installed?)."
fi

start=$(date +%s)
"$VENV/bin/python" -m pip install --quiet --upgrade pip \
  || die "could not upgrade pip in $VENV (no network access to PyPI?)."
if ! "$VENV/bin/python" -m pip install --quiet --only-binary=ray "$RAY_SPEC" "$NUMPY_SPEC"; then
  die "pip could not install '$RAY_SPEC' for Python $PYVER on $(uname -sm): no network, or no Ray wheel for this Python/platform."
fi
"$VENV/bin/python" -c 'import ray, numpy' \
  || die "ray installed but does not import in $VENV."
end=$(date +%s)

echo "install.sh: installed ray $("$VENV/bin/python" -c 'import ray; print(ray.__version__)') in $((end - start)) s into $VENV"
