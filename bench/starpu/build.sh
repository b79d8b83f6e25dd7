#!/usr/bin/env bash
# Build the StarPU benchmark.  Usage: bench/starpu/build.sh [OUT_DIR]
# OUT_DIR defaults to <repo root>/.bench/starpu; the binary is OUT_DIR/starpu_bench.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT="${1:-$ROOT/.bench/starpu}"

mod=""
if command -v pkg-config >/dev/null 2>&1; then
    for m in starpu-1.4 starpu-1.3; do
        if pkg-config --exists "$m"; then mod="$m"; break; fi
    done
fi
if [ -z "$mod" ]; then
    echo "build.sh: ERROR: no pkg-config module starpu-1.4/starpu-1.3; run bench/starpu/install.sh first" >&2
    exit 1
fi

mkdir -p "$OUT"
# shellcheck disable=SC2046
gcc -O2 -std=gnu11 -Wall -Wextra -o "$OUT/starpu_bench" "$HERE/starpu_bench.c" \
    $(pkg-config --cflags --libs "$mod")
echo "build.sh: built $OUT/starpu_bench against $mod $(pkg-config --modversion "$mod")"
