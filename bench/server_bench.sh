#!/usr/bin/env bash
# End-to-end server benchmark through the real samplerd binary on loopback.
# Usage: bash bench/server_bench.sh [N]   (default N = 1e7)
# Starts samplerd on port 0, runs //bench:server_bench against it, then reports the server's
# resident memory with one job in steady state, in bytes per sample.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N="${1:-10000000}"
bazel build //server:samplerd //bench:server_bench 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -2
log="$(mktemp)"
bazel-bin/server/samplerd --port=0 --max_samples_per_job=2000000000 >"$log" 2>"$log.err" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; rm -f "$log" "$log.err"' EXIT
for _ in $(seq 1 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
address="$(sed -n 's/^samplerd listening on //p' "$log" | head -1)"
[[ -n "$address" ]] || { echo "samplerd did not start:"; cat "$log.err"; exit 1; }
echo "samplerd pid $pid at $address; N = $N; $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
rss_base_kb=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
bazel-bin/bench/server_bench --address="$address" --num_samples="$N"
rss_kb=$(awk '/VmRSS/ {print $2}' /proc/$pid/status)
python3 - "$rss_kb" "$rss_base_kb" "$N" <<'PY'
import sys
rss, base, n = (int(x) for x in sys.argv[1:])
per_sample = (rss - base) * 1024 / n
print(f"| server memory, one job of N = {n:.0e} in steady state (loss policy, every sample seen) | "
      f"{per_sample:.1f} bytes/sample = {per_sample - 8:.1f} beyond the current plan "
      f"(12 loss statistics + 4 weights + 8 next plan computed ahead + N/8 per reporting rank) "
      f"| <= 16 beyond the plan |")
PY
