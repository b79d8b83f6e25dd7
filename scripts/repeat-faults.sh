#!/usr/bin/env bash
# Runs every fault-injection test N times in a row (default 20), one at a
# time, and prints how many passed and the figures each run printed.
#
#   scripts/repeat-faults.sh [-n TIMES] [-r] [TEST_NAME_SUBSTRING...]
#
# -r uses a release build. Prints one line per test (passes/runs, wall
# seconds) and the figures its runs printed, each number as
# [min / median / max]; the logs are in target/fault-repeats/. Exits
# non-zero if any run failed.
set -euo pipefail
times=20
profile=()
while getopts "n:r" opt; do
  case $opt in
    n) times=$OPTARG ;;
    r) profile=(--release) ;;
    *) echo "usage: $0 [-n TIMES] [-r] [TEST...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
tests=(
  cluster::a_killed_worker_is_named_within_two_seconds_and_the_rest_goes_on
  cluster::a_stopped_worker_is_lost_at_its_health_deadline
  cluster::a_control_call_to_a_hung_worker_returns_at_the_health_deadline
  cluster::a_crashed_workers_last_words_are_in_the_error
  cluster::workers_spawned_by_a_killed_driver_exit_on_their_own
  cluster::a_killed_driver_leaves_nothing_held_on_its_workers
  orphans::a_killed_driver_takes_its_sleeping_and_spinning_workers_and_their_files
  orphans::the_next_driver_sweeps_a_dead_drivers_folder_and_keeps_a_live_ones
  cluster::with_the_retry_policy_output_tasks_rerun_elsewhere_and_inout_tasks_never
  cluster::views_larger_than_a_message_travel_in_chunks
  faults::a_worker_restarted_on_its_unix_socket_rejoins
  faults::a_worker_restarted_on_its_tcp_port_rejoins
  faults::a_connection_cut_mid_stream_is_detected_and_the_work_finishes_elsewhere
  faults::a_hung_worker_that_wakes_up_rejoins
  faults::a_worker_hung_while_a_view_is_staged_to_it_is_lost_at_the_deadline
  faults::a_worker_hung_while_a_view_is_on_its_data_connection_is_lost_at_the_deadline
  faults::a_worker_hung_while_a_buffer_is_passed_to_it_is_lost_at_the_deadline
  faults::a_crashed_spawned_worker_is_restarted_once_and_rejoins
  faults::a_worker_that_comes_back_with_fewer_callables_is_not_taken_back
  faults::hosts_in_network_namespaces_survive_a_link_going_down
  faults::a_worker_that_never_answers_fails_the_start_instead_of_hanging
  worker::a_dropped_session_is_cleaned_up
  worker::a_session_without_a_task_stream_is_ended_after_the_grace_period
  worker::sigterm_finishes_in_flight_work_and_exits_zero
  worker::a_panicking_kernel_fails_only_its_task
  sessions::a_session_cannot_name_another_sessions_imports_or_device_buffers_over_unix
  sessions::a_session_cannot_name_another_sessions_device_buffers_over_tcp
  leaks::no_byte_of_an_ended_session_reaches_the_next
  partial::partial_writers_keep_untouched_elements_on_every_link_with_two_clients
  quarantine::a_hung_unix_worker_s_late_write_never_lands_on_a_reported_result
  quarantine::failing_at_once_names_the_quarantine_and_the_fence_lifts_it
  quarantine::a_hung_tcp_worker_is_fenced_at_once_and_its_late_result_is_dropped
  quarantine::a_link_cut_mid_task_leaves_the_overwrite_in_place
  quarantine::a_killed_unix_worker_is_fenced_when_its_process_is_seen_dead
  quarantine::a_retry_of_a_quarantined_task_waits_for_the_fence
  quarantine::differential_with_a_stopped_worker_never_reports_success_with_different_bytes
  quarantine::differential_with_a_stopped_worker_holding_dirty_bytes_never_reports_success_with_different_bytes
  cluster::a_killed_worker_takes_its_dirty_bytes_and_nobody_reads_them_stale
  cluster::a_remote_worker_keeps_the_tiles_it_was_sent
  fence::a_lost_session_is_ended_on_reconnect_and_its_queued_tasks_never_start
  fence::the_instance_tells_a_restarted_worker_from_the_same_one
  seals::an_unsealed_memfd_is_refused_and_shrinking_it_leaves_the_worker_serving
  seals::a_posix_shm_object_without_its_descriptor_is_refused_and_shrinking_it_leaves_the_worker_serving
  seals::a_posix_shm_object_is_copied_and_a_shrink_mid_task_fails_only_that_task
  seals::a_sealed_import_in_use_cannot_be_shrunk
  timeout::a_spawned_worker_running_a_timed_out_task_is_killed_and_restarted
  timeout::a_connected_unix_worker_keeps_a_timed_out_task_s_bytes_quarantined_until_it_ended
  timeout::an_in_process_worker_keeps_a_timed_out_task_s_bytes_quarantined_until_its_kernel_ends
  timeout::a_tcp_worker_s_timed_out_task_is_fenced_at_once_and_its_late_result_dropped
  graphs::a_graph_task_past_its_timeout_fails_the_run_saying_so
)
if [ $# -gt 0 ]; then
  picked=()
  for t in "${tests[@]}"; do
    for want in "$@"; do
      case $t in *"$want"*) picked+=("$t") ;; esac
    done
  done
  tests=("${picked[@]}")
fi

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
cargo build "${profile[@]}" --workspace --bins --quiet
exe=$(cargo test "${profile[@]}" -p strata-tests --test cross --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cross" and m.get("executable"):
        print(m["executable"])')
out=$root/target/fault-repeats
mkdir -p "$out"
failed=0
for t in "${tests[@]}"; do
  log=$out/${t//::/__}.log
  : >"$log"
  pass=0
  start=$(date +%s.%N)
  for i in $(seq 1 "$times"); do
    # A run passes when this one test ran and passed: a name that matches
    # no test (renamed, removed) is a failure, not a pass of nothing.
    run=$("$exe" --exact "$t" --test-threads 1 --nocapture 2>&1) && ok=1 || ok=0
    printf '%s\n' "$run" >>"$log"
    if [ $ok = 1 ] && grep -q "test result: ok. 1 passed" <<<"$run"; then
      pass=$((pass + 1))
    else
      echo "  run $i of $t FAILED or ran no test (see $log)"
      failed=1
    fi
  done
  secs=$(python3 -c "import time; print(f'{time.time() - $start:.1f}')")
  echo "$t: $pass/$times passed in ${secs} s"
  # The figures the runs printed: each number's min / median / max.
  python3 - "$log" <<'PY' || true
import re, statistics, sys
lines = []
for line in open(sys.argv[1], errors="replace"):
    line = line.rstrip()
    if line.startswith("test ") and " ... " in line:
        line = line.split(" ... ", 1)[1]
    if line in ("ok", "") or line.startswith(("running", "test result", "successes", "failures")):
        continue
    if re.search(r"\d+(\.\d+)? ?(ms|s)\b", line) or line.startswith("skipped"):
        lines.append(line)
groups = {}
num = re.compile(r"\d+(?:\.\d+)?")
for line in lines:
    # Only the figures vary between runs; paths and ids are masked too.
    key = num.sub("#", re.sub(r"/tmp/\S+|:\d{4,5}\b", "…", line))
    groups.setdefault(key, []).append([float(x) for x in num.findall(re.sub(r"/tmp/\S+|:\d{4,5}\b", "…", line))])
for key, runs in groups.items():
    cols = list(zip(*[r for r in runs if len(r) == len(runs[0])]))
    out = key
    for c in cols:
        if len(set(c)) == 1:
            out = out.replace("#", f"{c[0]:g}", 1)
        else:
            out = out.replace("#", f"[{min(c):g} / {statistics.median(c):g} / {max(c):g}]", 1)
    print(f"    {len(runs)}× {out[:400]}")
PY
done
exit $failed
