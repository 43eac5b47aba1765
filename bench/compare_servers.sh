#!/usr/bin/env bash
# A/B of two samplerd binaries with the same //bench:server_bench client, alternating runs on one
# machine (compare figures of one run only).
# Usage: bash bench/compare_servers.sh OLD_BINARY "OLD_FLAGS" NEW_BINARY "NEW_FLAGS" [ROUNDS]
#   e.g. bash bench/compare_servers.sh /tmp/samplerd-old "" bazel-bin/server/samplerd "--plaintext"
#   (add --data_dir=DIR to both flag sets to compare with persistence; use distinct dirs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
old_bin=$1 old_flags=$2 new_bin=$3 new_flags=$4 rounds=${5:-2}
bazel build //bench:server_bench 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -1

run() {  # BINARY FLAGS
  local log pid addr
  log=$(mktemp)
  # shellcheck disable=SC2086  # FLAGS is a list of flags.
  "$1" --port=0 --max_samples_per_job=2000000000 $2 >"$log" 2>/dev/null &
  pid=$!
  for _ in $(seq 1 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
  addr=$(sed -n 's/^samplerd listening on //p' "$log" | head -1)
  bazel-bin/bench/server_bench --address="$addr" --num_samples=10000000 --repeats=3 2>/dev/null |
    grep -E '^\{"bench": "(stream_1|stream_64|ingest|boundary)",'
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  rm -f "$log"
}

echo "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
  echo "round $round, old: $old_bin $old_flags"
  run "$old_bin" "$old_flags"
  echo "round $round, new: $new_bin $new_flags"
  run "$new_bin" "$new_flags"
done
