#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs, for a GPU machine without a Rust
# toolchain: the release `strata` binary, the chip test binary (the
# conformance suite), the cross-process test binary and the test worker
# it starts, the `gpu_bench` and `cholesky` examples, stripped, in one
# folder (default target/gpu-kit), with gpu-check.sh beside them.
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
cp scripts/gpu-check.sh "$out/gpu-check.sh"
strip "$out/strata" "$out/gpu_bench" "$out/cholesky" "$out/chip-tests" "$out/cross-tests" \
    "$out/strata-test-worker"
# One archive of it too, a quarter of the size, for a copy with a limit.
tar -czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
du -sh "$out" "$out.tar.gz"
