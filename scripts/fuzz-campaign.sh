#!/usr/bin/env bash
# Runs fuzz campaigns one target at a time, each pinned to one core, then
# merges what each found into the committed corpus.
#
#   scripts/fuzz-campaign.sh [-t SECONDS] [-c CPU] [TARGET...]
#
# TARGET is one of tensor, task_args, descriptor, overlap (wire/fuzz) or
# convert (proto/fuzz); the default is the four that parse peer input.
# Needs cargo-fuzz (`cargo install cargo-fuzz`); the fuzz crates use
# nightly-only sanitizer flags, so RUSTC_BOOTSTRAP=1 is set here.
# Each campaign's libFuzzer log goes to target/fuzz-campaign/TARGET.log;
# the script exits non-zero if any campaign found a crash or timeout.
set -euo pipefail
seconds=1800
cpu=1
while getopts "t:c:" opt; do
  case $opt in
    t) seconds=$OPTARG ;;
    c) cpu=$OPTARG ;;
    *) echo "usage: $0 [-t SECONDS] [-c CPU] [TARGET...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(tensor task_args descriptor convert)

root=$(cd "$(dirname "$0")/.." && pwd)
logs=$root/target/fuzz-campaign
mkdir -p "$logs"
export RUSTC_BOOTSTRAP=1
failed=0
for t in "${targets[@]}"; do
  case $t in
    tensor|task_args|descriptor|overlap) crate=$root/wire/fuzz ;;
    convert) crate=$root/proto/fuzz ;;
    *) echo "unknown target: $t" >&2; exit 2 ;;
  esac
  (cd "$crate" && cargo fuzz build -O "$t")
  fresh=$(mktemp -d)
  echo "== $t: $seconds s on cpu $cpu, started $(date -u +%FT%TZ)"
  set +e
  (cd "$crate" && taskset -c "$cpu" cargo fuzz run -O "$t" "$fresh" "corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1) \
      >"$logs/$t.log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.log" | grep -o '[0-9]*$' || true)
  echo "== $t: exit $rc, ${runs:-?} runs, finished $(date -u +%FT%TZ)"
  if [ $rc -ne 0 ]; then
    failed=1
    tail -n 40 "$logs/$t.log"
  else
    # Keep only the inputs that add coverage to the committed corpus.
    (cd "$crate" && cargo fuzz run -O "$t" "corpus/$t" "$fresh" -- -merge=1) >"$logs/$t.merge.log" 2>&1
  fi
  rm -rf "$fresh"
done
exit $failed
