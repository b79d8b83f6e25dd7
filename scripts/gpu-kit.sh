#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs, for a GPU machine without a Rust
# toolchain: the release `strata` binary, the chip test binary (the
# conformance suite), the cross-process test binary and the test worker
# it starts, the `gpu_bench` and `cholesky` examples, stripped, in one
# folder (default target/gpu-kit), with gpu-check.sh beside them; and the
# Python package's wheel with the Python tests that use a GPU.
#
#   scripts/gpu-kit.sh [DIR]
#   scp -r target/gpu-kit gpu-host:   # or any copy; then, there:
#   gpu-kit/gpu-check.sh gpu-kit
#   (or copy target/gpu-kit.tar.gz and `tar -xzf gpu-kit.tar.gz` there)
#
# The binaries load CUDA (libcuda.so.1, libnvrtc.so.13, libcublas.so.13,
# libcusolver.so.12) at run time, so they build here without CUDA; they
# need a glibc no older than this machine's.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/gpu-kit}
mkdir -p "$out"
cargo build --release --locked -p strata-cli
cargo build --release --locked -p strata-examples --example gpu_bench --example cholesky
# The path of the release test binary TEST of package PKG, built.
test_binary() { # PKG TEST
    cargo test --release --locked -p "$1" --test "$2" --no-run --message-format=json 2>/dev/null |
        python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$2"
}
chip=$(test_binary strata-chip-runtime chip)
[ -n "$chip" ] || { echo "gpu-kit: the chip test binary was not built" >&2; exit 1; }
cross=$(test_binary strata-tests cross)
[ -n "$cross" ] || { echo "gpu-kit: the cross test binary was not built" >&2; exit 1; }
cp target/release/strata "$out/strata"
cp target/release/examples/gpu_bench "$out/gpu_bench"
cp target/release/examples/cholesky "$out/cholesky"
cp "$chip" "$out/chip-tests"
cp "$cross" "$out/cross-tests"
cp target/release/strata-test-worker "$out/strata-test-worker"
cp scripts/gpu-check.sh scripts/gpu_dense.py "$out/"
# The Python package as a wheel (abi3: any CPython 3.9+ there), pytest
# and what it needs as pure-Python wheels (the GPU machine may have no
# network), and the Python tests that use a GPU. gpu-check.sh unpacks
# the wheels onto PYTHONPATH: no pip, no venv needed there; numpy (and
# CuPy or PyTorch, for DLPack) come from that machine's Python.
venv=target/kit-venv
[ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet "maturin>=1.5,<2"; }
rm -rf "$out/py" "$out/pytests"
mkdir -p "$out/py" "$out/pytests"
"$venv/bin/maturin" build --release --strip -m python/Cargo.toml -o "$out/py"
"$venv/bin/pip" download --quiet --only-binary :all: -d "$out/py" pytest
cp python/tests/conftest.py python/tests/pykernels.py python/tests/test_cuda.py \
    python/tests/test_dlpack.py "$out/pytests/"
strip "$out/strata" "$out/gpu_bench" "$out/cholesky" "$out/chip-tests" "$out/cross-tests" \
    "$out/strata-test-worker"
# One archive of it too, a quarter of the size, for a copy with a limit.
tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
du -sh "$out" "$out.tar.gz"
