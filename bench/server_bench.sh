#!/usr/bin/env bash
# End-to-end server benchmark through the real samplerd binary on loopback.
# Usage: bash bench/server_bench.sh [N] [samplerd flags...]   (default N = 1e7)
#   e.g. bash bench/server_bench.sh 10000000 --data_dir=/tmp/samplerd-bench (persistence on)
# Starts samplerd on port 0 and runs //bench:server_bench against it. Memory per sample is
# measured by bench/server_memory.py.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N="${1:-10000000}"
shift || true
bazel build //server:samplerd //bench:server_bench 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -2
log="$(mktemp)"
bazel-bin/server/samplerd --plaintext --port=0 --max_samples_per_job=2000000000 "$@" >"$log" 2>"$log.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; rm -f "$log" "$log.err"' EXIT
for _ in $(seq 1 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
address="$(sed -n 's/^samplerd listening on //p' "$log" | head -1)"
[[ -n "$address" ]] || { echo "samplerd did not start:"; cat "$log.err"; exit 1; }
echo "samplerd pid $pid at $address ${*:-(no extra flags)}; N = $N; $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
bazel-bin/bench/server_bench --address="$address" --num_samples="$N"
echo "(server memory per sample: python3 bench/server_memory.py)"
