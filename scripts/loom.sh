#!/usr/bin/env bash
# Model-checks strata's shared-memory concurrency with loom: every
# interleaving (up to LOOM_MAX_PREEMPTIONS preemptions, default 3) of the
# `loom_models` tests of every crate that declares a loom dependency —
# the DAG's submit gate and buffer holders (strata-orchestrator-core), the
# worker's import registry (strata-worker-core), the chip's arena pool and
# run bump, lanes, completion slots, start gates and device cache
# (strata-chip-runtime),
# the identity mint (strata-wire), the task and completion rings
# (strata-ring). Each structure is written against the
# crate's `sync` shim, which is std outside loom and loom's types under
# `--cfg loom`, so the models check the code that ships.
#
#     scripts/loom.sh                 # every crate
#     scripts/loom.sh strata-wire     # one crate
#
# Builds in its own target dir (target/loom: RUSTFLAGS differ), release.
# CI runs it as is.
set -euo pipefail
cd "$(dirname "$0")/.."
want="${1:-}"
found=0
start=$(date +%s)
for manifest in $(git ls-files '*Cargo.toml' | grep -v '/fuzz/'); do
    grep -q "^\[target.'cfg(loom)'.dependencies\]" "$manifest" || continue
    crate=$(sed -n 's/^name = "\(.*\)"/\1/p' "$manifest" | head -n 1)
    [ -z "$want" ] || [ "$want" = "$crate" ] || continue
    echo "-- $crate"
    t0=$(date +%s)
    out=$(RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" \
        CARGO_TARGET_DIR=target/loom \
        cargo test -p "$crate" --lib --release --locked -- loom_models 2>&1) || { echo "$out"; exit 1; }
    echo "$out" | grep -E "^test |test result"
    if ! echo "$out" | grep -qE "test result: ok\. [1-9][0-9]* passed"; then
        echo "$crate declares loom but ran no loom model" >&2
        exit 1
    fi
    echo "   ($(( $(date +%s) - t0 )) s)"
    found=$((found + 1))
done
[ "$found" -gt 0 ] || { echo "no crate with loom models${want:+ named $want}" >&2; exit 1; }
echo "loom: $found crates model-checked in $(( $(date +%s) - start )) s"
