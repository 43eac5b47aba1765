#!/usr/bin/env bash
# The end-to-end stage of tools/gpu/run_on_gpu.sh (`run_on_gpu.sh e2e` runs only it): everything
# here comes from the bundle of tools/gpu/make_bundle.sh (built with Bazel on a build machine and
# carried), nothing is compiled. In order, each stage with its own time limit and its expected
# time on the H100 machine (16 cores):
#   1. servers   samplerd --backend=cpu (a) and --backend=cuda (b), port 0 each, the port read
#                from its "samplerd listening on HOST:PORT" line                          ~1 s
#   2. compare   compare_backends a vs b: 37 jobs per N for N in E2E_SIZES, then a subset at
#                E2E_LARGE_N (M = N/10 jobs and two M = N jobs); every shard, importance weight
#                and weight summary equal bit for bit, epoch by epoch                ~20 + ~30 s
#   3. boundary  the epoch boundary (last EndEpoch -> first chunk, loss policy, M = N/10) through
#                the cuda server at E2E_BOUNDARY_N (1e8: ~5 s, 1e9: ~20 s, target 300 ms), and the
#                cpu server at E2E_CPU_BOUNDARY_N (1e8: ~15 s) for contrast
#   4. tests     the GPU tests of the bundle (TESTS.txt: client library device paths,
#                cuda_backend_test once it exists), from runfiles/; a skipped test on a machine
#                with a GPU is a failure                                        ~10-30 s each
#   5. bench     loss_reporter_bench's device_cost (ReportFromDevice's host cost)      ~10 s
#   6. trainer   examples/cpp/run_on_gpu.sh: the NCCL DDP trainer at world size 1, balanced x
#                loss vs uniform, the reporter's cost per step, compute-sanitizer memcheck  ~2 min
# Expected total ~5 minutes; the whole stage stops starting new work past E2E_BUDGET_S (default
# 560 s, under the device tool's 600 s per call), so that the summary is always printed.
#
# Without a GPU it fails fast ("no GPU: ..."), unless neither server is cuda: then it runs as a
# check of its own plumbing (cpu vs cpu; the trainer is skipped and the device cases of the tests
# may skip), e.g. on a build machine:
#   SAMPLERD_E2E_BACKEND_B=cpu E2E_SIZES=1000 E2E_LARGE_N= E2E_BOUNDARY_N=1e6 \
#     E2E_CPU_BOUNDARY_N=1e5 bash tools/gpu/run_on_gpu.sh e2e
#
# Environment: SAMPLERD_BUNDLE (default out/gpu_bundle), OUT (default /tmp/samplerd_gpu_out; this
# stage writes $OUT/e2e/*.log and $OUT/e2e/summary.txt), SAMPLERD_E2E_BACKEND_A (cpu),
# SAMPLERD_E2E_BACKEND_B (cuda), E2E_SIZES (1000,100000,1000000), E2E_LARGE_N (10000000; empty:
# none), E2E_BOUNDARY_N (100000000,1000000000), E2E_CPU_BOUNDARY_N (100000000; empty: none),
# E2E_BUDGET_S (560), E2E_TRAINER_ARGS (extra ddp_trainer flags), E2E_COMPARE_ARGS (extra
# compare_backends flags for the first comparison, e.g. --testonly_b_seed_xor=1 to see it fail).
# Exit status: 0 if every stage passed, 1 if one failed, 2 if it could not start (no GPU, no
# bundle).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2
BUNDLE="${SAMPLERD_BUNDLE:-$ROOT/out/gpu_bundle}"
E2E_OUT="${OUT:-/tmp/samplerd_gpu_out}/e2e"
BACKEND_A="${SAMPLERD_E2E_BACKEND_A:-cpu}"
BACKEND_B="${SAMPLERD_E2E_BACKEND_B:-cuda}"
SIZES="${E2E_SIZES-1000,100000,1000000}"
LARGE_N="${E2E_LARGE_N-10000000}"
BOUNDARY_N="${E2E_BOUNDARY_N-100000000,1000000000}"
CPU_BOUNDARY_N="${E2E_CPU_BOUNDARY_N-100000000}"
BUDGET_S="${E2E_BUDGET_S:-560}"
START=$SECONDS
mkdir -p "$E2E_OUT"

# ---- Can it run? (fast) --------------------------------------------------------------------------
gpu_missing() {  # Empty if a GPU is usable; else why not.
  if ! command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi not found (no NVIDIA driver on this machine)"
  elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "nvidia-smi lists no GPU: $(nvidia-smi -L 2>&1 | head -1)"
  fi
}
NO_GPU="$(gpu_missing)"
if [[ -n "$NO_GPU" && ( "$BACKEND_A" == cuda || "$BACKEND_B" == cuda ) ]]; then
  echo "no GPU: $NO_GPU; the e2e stage needs one for its cuda server (SAMPLERD_E2E_BACKEND_B=cpu runs its cpu-vs-cpu plumbing without one)" | tee "$E2E_OUT/summary.txt" >&2
  exit 2
fi
for bin in samplerd compare_backends ddp_trainer loss_reporter_bench; do
  if [[ ! -x "$BUNDLE/bin/$bin" ]]; then
    echo "e2e: $BUNDLE/bin/$bin missing: make the bundle on a build machine (tools/gpu/make_bundle.sh) and carry it (carry=[\"out/gpu_bundle\"])" | tee "$E2E_OUT/summary.txt" >&2
    exit 2
  fi
done
export LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing="$(ldd "$BUNDLE"/bin/samplerd "$BUNDLE"/bin/compare_backends | grep 'not found' | sort -u)"
if [[ -n "$missing" ]]; then
  echo "e2e: shared libraries not found: $missing" | tee "$E2E_OUT/summary.txt" >&2
  exit 2
fi

# ---- Stages ----------------------------------------------------------------------------------------
ROWS=()
status=0
row() {  # STAGE RESULT SECONDS DETAIL
  ROWS+=("$(printf '%-38s %-7s %6s  %s' "$1" "$2" "$3" "$4")")
  echo "   -> $2 ($3 s) $4"
  [[ "$2" == FAIL || "$2" == TIMEOUT || "$2" == NOTRUN ]] && status=1
  return 0
}

# run_stage NAME LIMIT_S LOG CMD...: runs CMD with its output in LOG under min(LIMIT_S, what is
# left of the budget); sets STAGE_RC and STAGE_S. Returns 1 without running if no time is left.
run_stage() {
  local name="$1" limit="$2" log="$3" left t0
  shift 3
  left=$((BUDGET_S - (SECONDS - START)))
  (( left < limit )) && limit=$left
  if (( limit < 5 )); then
    row "$name" NOTRUN 0 "time budget (E2E_BUDGET_S=$BUDGET_S) spent"
    return 1
  fi
  echo "== $name (limit ${limit} s, log $(basename "$log"))"
  t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$log" 2>&1 </dev/null
  STAGE_RC=$?
  STAGE_S=$((SECONDS - t0))
  return 0
}

result_of() {  # RC -> PASS / TIMEOUT / FAIL
  case "$1" in 0) echo PASS ;; 124|137) echo TIMEOUT ;; *) echo FAIL ;; esac
}

SERVER_PIDS=()
# shellcheck disable=SC2317  # Called by the EXIT trap.
cleanup() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
}
trap cleanup EXIT

# start_server NAME BACKEND: sets ADDRESS (empty if it did not come up).
start_server() {
  local name="$1" backend="$2" pid
  "$BUNDLE/bin/samplerd" --plaintext --port=0 --log_level=1 --backend="$backend" \
    >"$E2E_OUT/samplerd_$name.out" 2>"$E2E_OUT/samplerd_$name.log" &
  pid=$!
  ADDRESS=""
  for _ in $(seq 1 400); do
    ADDRESS="$(sed -n 's/^samplerd listening on //p' "$E2E_OUT/samplerd_$name.out" | head -1)"
    [[ -n "$ADDRESS" ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if [[ -n "$ADDRESS" ]]; then
    SERVER_PIDS+=("$pid")
    row "server $name (--backend=$backend)" PASS 0 "$ADDRESS"
  else
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    row "server $name (--backend=$backend)" FAIL 0 \
      "did not start: $(tail -2 "$E2E_OUT/samplerd_$name.log" | tr '\n' ' ')"
  fi
}

echo "== e2e: bundle $(head -1 "$BUNDLE/MANIFEST.txt" 2>/dev/null | sed 's/^# //')"
[[ -z "$NO_GPU" ]] && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[[ -n "$NO_GPU" ]] && echo "== e2e without a GPU ($NO_GPU): servers $BACKEND_A vs $BACKEND_B"

start_server a "$BACKEND_A"
ADDRESS_A="$ADDRESS"
start_server b "$BACKEND_B"
ADDRESS_B="$ADDRESS"
CMP="$BUNDLE/bin/compare_backends"

# 2. Comparison.
# shellcheck disable=SC2086  # E2E_COMPARE_ARGS is a list of flags.
if [[ -n "$ADDRESS_A" && -n "$ADDRESS_B" ]]; then
  if [[ -n "$SIZES" ]] && run_stage "compare N=$SIZES" 200 "$E2E_OUT/compare.log" \
      "$CMP" --a="$ADDRESS_A" --b="$ADDRESS_B" --sizes="$SIZES" --job_prefix=cmp \
      ${E2E_COMPARE_ARGS:-}; then
    row "compare N=$SIZES" "$(result_of "$STAGE_RC")" "$STAGE_S" \
      "$(grep -E '^(EQUAL|DIFFERENCE)|compare_backends:' "$E2E_OUT/compare.log" | tail -1)"
  fi
  if [[ -n "$LARGE_N" ]]; then
    large_filter="-m$((LARGE_N / 10))-,-uniform-loss-norepl-m$LARGE_N-,-static-mult-repl-m$LARGE_N-"
    if run_stage "compare N=$LARGE_N (20 jobs)" 200 "$E2E_OUT/compare_large.log" \
        "$CMP" --a="$ADDRESS_A" --b="$ADDRESS_B" --sizes="$LARGE_N" --job_prefix=cmp-large \
        --job_filter="$large_filter"; then
      row "compare N=$LARGE_N (20 jobs)" "$(result_of "$STAGE_RC")" "$STAGE_S" \
        "$(grep -E '^(EQUAL|DIFFERENCE)|compare_backends:' "$E2E_OUT/compare_large.log" | tail -1)"
    fi
  fi
else
  row "compare" FAIL 0 "not run: a server did not start"
fi

# 3. Epoch boundary: server b (cuda), then server a (cpu) for contrast.
boundary() {  # NAME ADDRESS N
  local name="$1" address="$2" n="$3" log
  log="$E2E_OUT/boundary_${name}_$n.log"
  [[ -n "$address" ]] || { row "boundary $name N=$n" FAIL 0 "server $name did not start"; return; }
  run_stage "boundary $name N=$n" 240 "$log" "$CMP" --a="$address" --boundary_n="$n" \
    --job_prefix="e2e-$name" || return
  local line
  line="$(grep -E '^BOUNDARY|compare_backends:' "$log" | tail -1)"
  row "boundary $name N=$n" "$(result_of "$STAGE_RC")" "$STAGE_S" \
    "$(sed -E 's/^BOUNDARY //; s/ (n|m|world|boundaries)=[0-9]+//g' <<<"$line")"
}
IFS=',' read -r -a boundary_sizes <<<"$BOUNDARY_N"
for n in "${boundary_sizes[@]}"; do boundary b "$ADDRESS_B" "$n"; done
IFS=',' read -r -a cpu_boundary_sizes <<<"$CPU_BOUNDARY_N"
for n in "${cpu_boundary_sizes[@]}"; do boundary a "$ADDRESS_A" "$n"; done

# The servers give back the GPU's memory before the tests run.
for pid in "${SERVER_PIDS[@]}"; do
  kill -TERM "$pid" 2>/dev/null
  wait "$pid"
  rc=$?
  [[ $rc -eq 0 ]] || row "server pid $pid stop" FAIL 0 "exit status $rc on SIGTERM (see samplerd_*.log)"
done
SERVER_PIDS=()

# 4. GPU tests from the bundle (run from runfiles/, where their data is).
while read -r test; do
  [[ -n "$test" ]] || continue
  log="$E2E_OUT/test_$(basename "$test").log"
  tmp="$(mktemp -d)"
  run_stage "test $test" 180 "$log" env -C "$BUNDLE/runfiles" TEST_TMPDIR="$tmp" "./$test" \
    || continue
  rm -rf "$tmp"
  result="$(result_of "$STAGE_RC")"
  passed="$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)"
  # gtest names each skipped test twice (when it runs, and in the list at the end).
  skipped="$(grep -E '^\[  SKIPPED \] [A-Za-z]' "$log" | sed 's/ (.*//' | sort -u | wc -l)"
  detail="${passed:-?} passed, $skipped skipped"
  # gtest prints a skip's reason on the line after "...: Skipped". On a machine with a GPU the
  # only expected skips are the no-GPU paths' own ("a GPU is present"); any other is a device
  # case that did not run.
  unexpected="$(awk 'skip { print; skip = 0 } /: Skipped$/ { skip = 1 }' "$log" \
    | grep -v 'a GPU is present' | head -1)"
  if [[ "$result" == PASS && -z "$NO_GPU" && -n "$unexpected" ]]; then
    result=FAIL
    detail+=", skipped on a machine with a GPU: $unexpected"
  fi
  [[ "$result" != PASS ]] && detail+=" | $(grep -E '^\[  FAILED  \] [A-Za-z]|Failure' "$log" | head -1)"
  row "test $test" "$result" "$STAGE_S" "$detail"
done <"$BUNDLE/TESTS.txt"
grep -q 'cuda_backend_test' "$BUNDLE/TESTS.txt" ||
  row "test kernels/cuda/cuda_backend_test" ABSENT 0 "not in the bundle: the tree it was made from has no //kernels/cuda:cuda_backend_test yet"

# 5. ReportFromDevice's host cost (in-process server).
if run_stage "bench ReportFromDevice" 90 "$E2E_OUT/loss_reporter_bench.log" \
    "$BUNDLE/bin/loss_reporter_bench" --num_samples=2000000 --repeats=1 --report_calls=5000; then
  row "bench ReportFromDevice" "$(result_of "$STAGE_RC")" "$STAGE_S" \
    "$(grep -i 'device_cost' "$E2E_OUT/loss_reporter_bench.log" | tail -1 | cut -c1-150)"
fi

# 6. The trainer (examples/cpp/run_on_gpu.sh: its own samplerd, NCCL found there).
if [[ -n "$NO_GPU" ]]; then
  row "trainer (examples/cpp/run_on_gpu.sh)" SKIP 0 "no GPU: $NO_GPU"
else
  # shellcheck disable=SC2086  # E2E_TRAINER_ARGS is a list of flags.
  if run_stage "trainer (examples/cpp/run_on_gpu.sh)" 300 "$E2E_OUT/trainer_run.log" \
      env OUT="$E2E_OUT/trainer" bash examples/cpp/run_on_gpu.sh "$BUNDLE" ${E2E_TRAINER_ARGS:-}; then
    row "trainer (examples/cpp/run_on_gpu.sh)" "$(result_of "$STAGE_RC")" "$STAGE_S" \
      "$(grep -E '^(balanced accuracy:|reporter cost)' "$E2E_OUT/trainer/summary.txt" 2>/dev/null | tr '\n' ' ' | cut -c1-200)"
  fi
fi

# ---- Summary (last: the device tool returns the end of the output) ----------------------------
{
  echo "== e2e summary ($((SECONDS - START)) s; logs in $E2E_OUT)"
  printf '%-38s %-7s %6s  %s\n' stage result s detail
  printf '%s\n' "${ROWS[@]}"
} | tee "$E2E_OUT/summary.txt"
exit $status
