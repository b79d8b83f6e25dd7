#!/usr/bin/env bash
# Builds the fake CUDA (chip-runtime/tests/fakecuda: the driver, NVRTC,
# cuBLAS and cuSOLVER over host memory) into target/fakecuda, under every
# name the CUDA chip's loaders look for. With that folder first on
# LD_LIBRARY_PATH, `cuda:0` opens on a machine with no GPU:
#
#   scripts/fakecuda.sh
#   LD_LIBRARY_PATH=$PWD/target/fakecuda STRATA_CHIPS=cuda:0 STRATA_REQUIRE_CUDA=1 \
#       cargo test -p strata-chip-runtime --test chip
#
# Needs a C++17 compiler ($CXX, else g++), at build time and at run time
# (kernel sources are compiled by it).
set -euo pipefail
cd "$(dirname "$0")/.."
src=chip-runtime/tests/fakecuda
out=${1:-target/fakecuda}
mkdir -p "$out"
{
    printf 'R"STRATAFAKE('
    cat "$src/kernel.h"
    printf ')STRATAFAKE"\n'
} > "$out/kernel_h.inc"
"${CXX:-g++}" -std=c++17 -O1 -g -fPIC -shared -pthread -fvisibility=hidden -Wall -Wextra \
    -Wno-unused-parameter -I "$out" -o "$out/libfakecuda.so" "$src/fakecuda.cpp" -ldl
for name in libcuda.so libcuda.so.1 libnvrtc.so libnvrtc.so.13 libcublas.so libcublas.so.13 \
    libcusolver.so libcusolver.so.12; do
    ln -sf libfakecuda.so "$out/$name"
done
echo "fake CUDA in $out"
