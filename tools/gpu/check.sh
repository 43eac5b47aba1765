#!/usr/bin/env bash
# The GPU machine's calls: every check of the CUDA code, value first, within a time budget.
# It compiles nothing: it runs the bundle tools/gpu/make_bundle.sh built on a build machine
# (carried as out/gpu_bundle.tgz and unpacked under /tmp; tools/gpu/README.md gives the
# device-tool call).
#
#   bash tools/gpu/check.sh [--stages=1,3] [--budget=360] [--rehearse] [--bundle=DIR]
#
# Two calls cover everything: the first (the default stages 1-7, budget 360 s, ~5-6 minutes)
# is the full check; the second, at once after it (the machine still warm),
# `--stages=8 --budget=400` (~5 minutes expected, 6.7 at most) runs the two long ones that a
# first call cannot hold: identity at N = 1e8 and racecheck over all of --quick.
#
# Stages, in this order (seconds measured on the H200 machine, 2026-11-26; 1-6 came to ~160 s
# with the ncu step, leaving stage 7 ~200 s of the default budget):
#   1  the GPU and driver; identity_test (device == host reference) for N <= IDENTITY_SMALL_N:
#      every weight pattern, both index widths, every shard layout                       13
#   2  compute-sanitizer memcheck of identity_test --quick (N <= 5000)                    3
#   3  samplerd --backend=cuda against --backend=cpu through compare_backends at each N of
#      COMPARE_SIZES (every shard, importance weight and weight summary, bit for bit; mixture
#      jobs' windows and group status too), then mixture_window_test (the device window ==
#      the CPU's) and cuda_backend_test (CudaBackend == CpuBackend in process)             22
#   4  the N = 1e9 table: gpu_benchmark (three plan modes, three recomputes, the summary) and
#      torch's anchors (bench/torch_anchors.py) at BENCH_SIZES, same GPU, same run; then
#      where the time goes: each operation of PROFILE_OPS under ncu at PROFILE_N, one line
#      per kernel (tools/gpu/profile_table.py); then a mixture job's window (N = 1e12 in 1e4
#      groups) through the CUDA backend at each M of MIXTURE_M, its CPU anchor (PlanWindow on
#      every core) in the same run (bench/mixture_window_benchmark)          16 + 57 + ?
#   5  the epoch boundary through samplerd --backend=cuda at BOUNDARY_N                   13
#   6  the trainer library's device tests (TESTS.txt), ReportFromDevice's host cost
#      (loss_reporter_bench), the DDP trainer at world size 1 (examples/cpp/run_on_gpu.sh)   41-59
#   7  identity_test for IDENTITY_SMALL_N < N <= IDENTITY_MID_N (N = 1e7: 11 cases, done
#      within 105 s on 2026-11-26, when N = 1e8 had also started in that time), own limit 150
#   8  not in the default stages: the second call. Side by side (one GPU, 16 cores: the
#      identity's host references run on one core, the racecheck mostly on the GPU), each
#      under its own limit:
#      8.1 compute-sanitizer racecheck of all of identity_test --quick (N <= 5000, 12 sizes):
#          N <= 1000 (7 sizes) took 135 s, ~19 s a size, so ~250 s expected; limit 360
#      8.2 identity_test for IDENTITY_MID_N < N <= IDENTITY_LARGE_N (N = 1e8 alone: 11 cases
#          whose host references run on one core, ~1 s per 1e7 samples and pass, ~10x those of
#          N = 1e7): ~300 s expected; limit 420 (a cut run says how far it got)
#      So the second call: `--stages=8 --budget=400`, timeout_s 440 (both steps' expected times
#      fit; a longer one is cut at the budget, saying how far it got); with the first call's
#      ~7 minutes (start included) ~14 of the session's 15 minutes of device time.
#
# A stage starts only while at least MIN_START_S (10 s) of the budget is left; each of its steps
# runs under its own limit, cut to what is left of the budget. A failure never stops the run:
# the next step and stage start. Each step's result is appended to $OUT/summary.txt as it
# finishes (PASS, FAIL, TIMEOUT: its own limit; CUT: the budget; SKIP: with the reason; NOTRUN:
# no budget left), with its first failure (for identity: "[kernel] case: index K: device X,
# reference Y"); every log goes into $OUT/logs.tgz after each stage (the device tool returns at
# most 8 files). Printed last: the stages' results and the table of stages 4-6 (bench_table.py).
#
# --stages=LIST   only these stages (default 1-7; the second call --stages=8; the re-run after
#                 a fix, e.g. --stages=1,3)
# --budget=S      the time budget in seconds (default 360; env CHECK_BUDGET_S)
# --rehearse      on a machine without a GPU: every stage's plumbing with CPU stand-ins (two CPU
#                 servers, torch on the CPU at small N) and small sizes; what needs the GPU says
#                 SKIP with the reason, so that only the GPU is left to chance (env CHECK_REHEARSE=1)
# --bundle=DIR    the bundle (default out/gpu_bundle, else out/gpu_bundle.tgz unpacked; env
#                 SAMPLERD_BUNDLE)
# Sizes (env): IDENTITY_SMALL_N (1000003), IDENTITY_MID_N (10000000), IDENTITY_LARGE_N
# (100000000), COMPARE_SIZES
# (100000,1000000), BENCH_SIZES (10000000,100000000,1000000000), BOUNDARY_N (1000000000),
# PROFILE_OPS (gpu_benchmark's names, comma-separated), PROFILE_N (100000000), MIXTURE_M
# (10000000,100000000).
# CHECK_TESTONLY_STAGE_S=S: each stage only waits S seconds (the test of the budget logic).
#
# Without a GPU (and without --rehearse) every stage is SKIP with the reason, at once.
# Exit status: 0 every step ran and passed (a rehearsal's GPU-only steps may be SKIP); 1 a step
# failed; 2 bad flags or no bundle; 3 no failure, but something did not run (no GPU, the budget).
# shellcheck disable=SC2317  # The stages are called by name ("stage_$n").
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 2

usage() { sed -n '2,/^# shellcheck/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
STAGES="${CHECK_STAGES:-1,2,3,4,5,6,7}"
BUDGET_S="${CHECK_BUDGET_S:-360}"
REHEARSE="${CHECK_REHEARSE:-0}"
BUNDLE="${SAMPLERD_BUNDLE:-$ROOT/out/gpu_bundle}"
for arg in "$@"; do
  case "$arg" in
    --stages=*) STAGES="${arg#--stages=}" ;;
    --budget=*) BUDGET_S="${arg#--budget=}" ;;
    --rehearse) REHEARSE=1 ;;
    --bundle=*) BUNDLE="${arg#--bundle=}" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check.sh: unknown argument '$arg' (--stages=1,3 --budget=S --rehearse --bundle=DIR; --help)" >&2; exit 2 ;;
  esac
done
if ! [[ "$STAGES" =~ ^[1-8](,[1-8])*$ ]]; then
  echo "check.sh: --stages=$STAGES: a comma-separated list of stage numbers 1 to 8" >&2
  exit 2
fi
if ! [[ "$BUDGET_S" =~ ^[0-9]+$ ]]; then
  echo "check.sh: --budget=$BUDGET_S: seconds, a whole number" >&2
  exit 2
fi
[[ "$REHEARSE" == 1 ]] || REHEARSE=0

OUT="${OUT:-/tmp/samplerd_check_out}"
mkdir -p "$OUT"
WORK="$(mktemp -d -t samplerd_check.XXXXXX)"
LOGS="$WORK/logs"
mkdir -p "$LOGS"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
MIN_START_S=10
START=$SECONDS

# Sizes: the rehearsal's are small (a build machine's CPU stands in for the GPU).
IDENTITY_SMALL_N="${IDENTITY_SMALL_N:-1000003}"
IDENTITY_MID_N="${IDENTITY_MID_N:-10000000}"
IDENTITY_LARGE_N="${IDENTITY_LARGE_N:-100000000}"
if [[ $REHEARSE == 1 ]]; then
  COMPARE_SIZES="${COMPARE_SIZES:-1000,100000}"
  BENCH_SIZES="${BENCH_SIZES:-100000}"
  BOUNDARY_N="${BOUNDARY_N:-1000000}"
  MIXTURE_M="${MIXTURE_M:-100000}"
else
  COMPARE_SIZES="${COMPARE_SIZES:-100000,1000000}"
  BENCH_SIZES="${BENCH_SIZES:-10000000,100000000,1000000000}"
  BOUNDARY_N="${BOUNDARY_N:-1000000000}"
  MIXTURE_M="${MIXTURE_M:-10000000,100000000}"
fi
# Step 4.3: the operations profiled under ncu (those that missed their target on the first run,
# 2026-11-26), at PROFILE_N (1e8: a tenth of the table's N, kernels ~1/10 of the time; ncu
# replays each launch).
PROFILE_OPS="${PROFILE_OPS:-no_replacement_M=N,no_replacement_M=N/10_weighted,replacement_M=N_weighted,recompute_loss,recompute_loss_base}"
PROFILE_N="${PROFILE_N:-100000000}"

# ---- Where it runs ----------------------------------------------------------------------------
gpu_missing() {  # Empty if a GPU is usable; else why not.
  if ! command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi not found (no NVIDIA driver on this machine)"
  elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "nvidia-smi lists no GPU: $(nvidia-smi -L 2>&1 | head -1)"
  fi
}
NO_GPU="$(gpu_missing)"
[[ -x /usr/local/cuda/bin/compute-sanitizer ]] && PATH="$PATH:/usr/local/cuda/bin"
# python3 with torch: the GPU machine's; on a machine without a GPU (a rehearsal) the project's
# venv when python3 has no torch (the check imports torch: seconds, so not on the GPU machine).
PY="${CHECK_PYTHON:-python3}"
if [[ -z "${CHECK_PYTHON:-}" && -n "$NO_GPU" && -x "$ROOT/.venv/bin/python" ]] &&
  ! python3 -c 'import torch' >/dev/null 2>&1; then
  PY="$ROOT/.venv/bin/python"
fi

# "${HOST[@]}" CMD...: CMD with the machine's own LD_LIBRARY_PATH (unset if it had none).
HOST_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
HOST=(env -u LD_LIBRARY_PATH)
[[ -n "$HOST_LD_LIBRARY_PATH" ]] && HOST=(env LD_LIBRARY_PATH="$HOST_LD_LIBRARY_PATH")

# ---- Rows ---------------------------------------------------------------------------------------
STATUS=0      # 1: a failure; 3: something did not run.
STAGE_ROWS=() # One per stage, for the closing table.
declare -A STAGE_COUNT  # Result -> rows of the current stage.
incomplete() { [[ $STATUS -eq 0 ]] && STATUS=3; }

# row ID NAME RESULT SECONDS DETAIL: one line of summary.txt, written at once.
row() {
  local line
  line="$(printf '%-5s %-36s %-7s %5s  %s' "$1" "$2" "$3" "$4" "$5")"
  echo "$line" >>"$SUMMARY"
  echo "   -> $3 ($4 s) $5"
  STAGE_COUNT[$3]=$((${STAGE_COUNT[$3]:-0} + 1))
  case "$3" in
    FAIL|TIMEOUT) STATUS=1 ;;
    CUT|NOTRUN) incomplete ;;
    SKIP) [[ $REHEARSE == 1 ]] || incomplete ;;
  esac
  return 0
}

left() { echo $((BUDGET_S - (SECONDS - START))); }

# step_limit ID NAME LIMIT_S: STEP_LIMIT = min(LIMIT_S, the budget left), STEP_CUT=1 when the
# budget is the smaller. Returns 1, with a NOTRUN row, when less than MIN_START_S is left.
step_limit() {
  STEP_LIMIT="$3"
  STEP_CUT=0
  if (($(left) < MIN_START_S)); then
    row "$1" "$2" NOTRUN 0 "budget spent ($BUDGET_S s)"
    return 1
  fi
  if (($(left) < STEP_LIMIT)); then
    STEP_LIMIT=$(left)
    STEP_CUT=1
  fi
}

# step ID NAME LIMIT_S LOG CMD...: runs CMD (output in LOG) under step_limit's limit. Sets
# STEP_RC and STEP_S, and STEP_CUT=1 when the budget (not LIMIT_S) was the limit. Returns 1,
# with a NOTRUN row, when less than MIN_START_S is left.
step() {
  local id="$1" name="$2" log="$4" t0
  step_limit "$1" "$2" "$3" || return 1
  shift 4
  echo "== $id $name (limit $STEP_LIMIT s, log $(basename "$log"))"
  t0=$SECONDS
  timeout --kill-after=5 "$STEP_LIMIT" "$@" >"$log" 2>&1 </dev/null
  STEP_RC=$?
  STEP_S=$((SECONDS - t0))
  return 0
}

# step_start ID NAME LIMIT_S LOG CMD...: step's limit and NOTRUN, but CMD runs in the
# background, beside what starts after it (stage 8); step_wait ID LOG then waits for it and sets
# what step sets. Its exit status and seconds go to LOG.rc as it ends.
declare -A BACKGROUND_PID BACKGROUND_CUT
step_start() {
  local id="$1" name="$2" log="$4"
  step_limit "$1" "$2" "$3" || return 1
  shift 4
  echo "== $id $name (limit $STEP_LIMIT s, log $(basename "$log"); in the background)"
  rm -f "$log.rc"
  (
    t0=$(date +%s)
    timeout --kill-after=5 "$STEP_LIMIT" "$@" >"$log" 2>&1 </dev/null
    rc=$?
    echo "$rc $(($(date +%s) - t0))" >"$log.rc"
  ) &
  BACKGROUND_PID[$id]=$!
  BACKGROUND_CUT[$id]=$STEP_CUT
}

step_wait() {
  wait "${BACKGROUND_PID[$1]}"
  STEP_RC=1 STEP_S=0
  [[ -s "$2.rc" ]] && read -r STEP_RC STEP_S <"$2.rc"
  STEP_CUT="${BACKGROUND_CUT[$1]}"
  return 0
}

# The result of the last step from its exit status: PASS, FAIL, TIMEOUT (its own limit) or CUT.
step_result() {
  case "$STEP_RC" in
    0) echo PASS ;;
    124|137) if [[ $STEP_CUT == 1 ]]; then echo CUT; else echo TIMEOUT; fi ;;
    *) echo FAIL ;;
  esac
}

# "; exit N: its last line" when the last step failed, for a row's detail.
failure_tail() {
  [[ $STEP_RC -eq 0 ]] || echo "; exit $STEP_RC: $(tail -1 "$1" | cut -c1-160)"
}

# The first line of LOG matching the pattern (grep -E), cut to 220 characters.
first_line() { grep -E -m1 -- "$2" "$1" 2>/dev/null | cut -c1-220; }
last_line() { grep -E -- "$2" "$1" 2>/dev/null | tail -1 | cut -c1-220; }

# gtest_verdict LOG: sets VERDICT and DETAIL for a gtest binary's run (the last step). With a
# GPU, a skip is a failure unless it is one the GPU machine expects (the no-GPU paths' own "a GPU
# is present", the opt-in SAMPLERD_GPU_WIDE cases); without one, a run with skips is SKIP.
EXPECTED_GPU_SKIPS='a GPU is present|SAMPLERD_GPU_WIDE=1 runs it'
gtest_verdict() {
  local log="$1" passed skipped failed reason first
  VERDICT="$(step_result)"
  passed="$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)"
  skipped="$(grep -Eo '^\[  SKIPPED \] [0-9]+ tests?,' "$log" | grep -Eo '[0-9]+' | tail -1)"
  failed="$(grep -Eo '^\[  FAILED  \] [0-9]+ tests?,' "$log" | grep -Eo '[0-9]+' | tail -1)"
  DETAIL="${passed:-0} passed, ${skipped:-0} skipped, ${failed:-0} failed"
  if [[ -z "$passed" && -z "$skipped" ]]; then
    [[ "$VERDICT" == PASS ]] && VERDICT=FAIL
    DETAIL="exit $STEP_RC, no gtest summary; last line: $(tail -1 "$log" | cut -c1-160)"
  elif [[ "$VERDICT" == PASS && "${skipped:-0}" -gt 0 ]]; then
    # gtest prints a skip's reason on the line after "...: Skipped".
    reason="$(awk 'skip { print; skip = 0 } /: Skipped$/ { skip = 1 }' "$log")"
    if [[ -n "$NO_GPU" ]]; then
      VERDICT=SKIP
      DETAIL+=" ($(head -1 <<<"$reason" | cut -c1-160))"
    else
      reason="$(grep -Ev "$EXPECTED_GPU_SKIPS" <<<"$reason" | head -1 | cut -c1-160)"
      if [[ -n "$reason" ]]; then
        VERDICT=FAIL
        DETAIL+=", skipped on a machine with a GPU: $reason"
      fi
    fi
  fi
  if [[ "$VERDICT" != PASS && "$VERDICT" != SKIP ]]; then
    first="$(first_line "$log" '^FAIL |^\[  FAILED  \] [A-Za-z]|Failure$')"
    [[ -n "$first" ]] && DETAIL+=" | first: $first"
  fi
  return 0
}

gtest_row() {  # ID NAME LOG
  gtest_verdict "$3"
  row "$1" "$2" "$VERDICT" "$STEP_S" "$DETAIL"
}

# identity_row ID NAME LOG: gtest's verdict with identity_test's own counts, its first mismatch
# ("[kernel] case: index K: device X, reference Y") and how far a cut run got.
identity_row() {
  local counts first reached
  gtest_verdict "$3"
  counts="$(last_line "$3" '^identity: ')"
  first="$(first_line "$3" '^FAIL ')"
  reached="$(last_line "$3" '^n=[0-9]+ done' | sed 's/ done.*//')"
  if [[ -n "$counts" ]]; then
    DETAIL="$counts"
  elif [[ "$VERDICT" == CUT || "$VERDICT" == TIMEOUT ]]; then
    DETAIL="reached ${reached:-nothing} before the limit; $DETAIL"
  fi
  [[ -n "$first" && "$DETAIL" != *"first: "* ]] && DETAIL+=" | first: ${first#FAIL }"
  row "$1" "$2" "$VERDICT" "$STEP_S" "$DETAIL"
}

# ---- Processes ----------------------------------------------------------------------------------
SERVER_PIDS=()
# shellcheck disable=SC2317  # Called by the EXIT trap.
cleanup() {
  local pid
  for pid in "${SERVER_PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${SERVER_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# start_server ID NAME BACKEND: sets ADDRESS (empty, with a FAIL row, if it did not come up).
start_server() {
  local id="$1" name="$2" backend="$3" pid
  "$BUNDLE/bin/samplerd" --plaintext --port=0 --log_level=1 --backend="$backend" \
    >"$LOGS/samplerd_$name.out" 2>"$LOGS/samplerd_$name.log" &
  pid=$!
  ADDRESS=""
  for _ in $(seq 1 400); do
    ADDRESS="$(sed -n 's/^samplerd listening on //p' "$LOGS/samplerd_$name.out" | head -1)"
    [[ -n "$ADDRESS" ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if [[ -n "$ADDRESS" ]]; then
    SERVER_PIDS+=("$pid")
  else
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    row "$id" "samplerd --backend=$backend" FAIL 0 \
      "did not start: $(tail -2 "$LOGS/samplerd_$name.log" | tr '\n' ' ' | cut -c1-200)"
  fi
}

# stop_servers ID: SIGTERM to every server; a non-zero exit status is a failure.
stop_servers() {
  local pid rc
  for pid in "${SERVER_PIDS[@]}"; do
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    [[ $rc -eq 0 ]] || row "$1" "samplerd stop (pid $pid)" FAIL 0 "exit status $rc on SIGTERM (samplerd_*.log)"
  done
  SERVER_PIDS=()
}

# The backend of the server that stands for the GPU: cuda, or cpu in a rehearsal.
GPU_BACKEND=cuda
[[ $REHEARSE == 1 ]] && GPU_BACKEND=cpu

# ---- Stages --------------------------------------------------------------------------------------
STAGE_NAMES=(""
  "GPU, identity at small N"
  "memcheck at small N"
  "cuda server == cpu server"
  "the N = 1e9 table, torch, ncu per kernel"
  "epoch boundary, cuda server"
  "trainer library, ReportFromDevice, DDP"
  "identity at N = 1e7"
  "racecheck --quick, identity 1e8 (call 2)")

stage_1() {
  local detail result=PASS missing
  missing="$(find "$BUNDLE/bin" "$BUNDLE/runfiles" -type f -exec ldd {} + 2>/dev/null |
    grep 'not found' | grep -v -e libnccl -e libcuda.so | sort -u | tr -s ' \t\n' ' ')"
  detail="bundle: $(head -1 "$BUNDLE/MANIFEST.txt" | sed 's/^# //')"
  if [[ -n "$missing" ]]; then
    result=FAIL
    detail+="; shared libraries not found: $missing"
  fi
  if [[ -n "$NO_GPU" ]]; then
    row 1.1 "bundle (no GPU: rehearsal)" "$result" 0 "$detail"
  else
    {
      nvidia-smi
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
      command -v compute-sanitizer && compute-sanitizer --version
      cat "$BUNDLE/MANIFEST.txt"
    } >"$LOGS/gpu.log" 2>&1
    detail="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1); $detail"
    row 1.1 "GPU, driver, bundle" "$result" 0 "$detail"
  fi
  if step 1.2 "identity N <= $IDENTITY_SMALL_N" 150 "$LOGS/identity_small.log" \
      "$IDENTITY" --max_n="$IDENTITY_SMALL_N"; then
    identity_row 1.2 "identity N <= $IDENTITY_SMALL_N" "$LOGS/identity_small.log"
  fi
}

# sanitizer ID TOOL LIMIT_S [ARGS...]: compute-sanitizer TOOL over identity_test --quick ARGS.
sanitizer() {
  sanitizer_start "$@" && sanitizer_row "$1" "$2"
}

# sanitizer_start ID TOOL LIMIT_S [ARGS...]: the sanitizer's run in the background (step_start);
# returns 1 when it did not start (its row written: not found, no budget).
sanitizer_start() {
  local id="$1" tool="$2" limit="$3"
  shift 3
  if ! command -v compute-sanitizer >/dev/null; then
    if [[ -n "$NO_GPU" ]]; then
      row "$id" "$tool, identity --quick" SKIP 0 "no GPU: $NO_GPU; compute-sanitizer not found either"
    else
      row "$id" "$tool, identity --quick" FAIL 0 "compute-sanitizer not found"
    fi
    return 1
  fi
  step_start "$id" "$tool, identity --quick" "$limit" "$LOGS/$tool.log" \
    compute-sanitizer --tool "$tool" --error-exitcode 99 "$IDENTITY" --quick "$@"
}

# sanitizer_row ID TOOL: waits for sanitizer_start's run, then its row.
sanitizer_row() {
  local id="$1" tool="$2" log="$LOGS/$2.log" detail
  step_wait "$id" "$log"
  # The test's own verdict (a skip on a machine with a GPU is a failure), then the sanitizer's.
  gtest_verdict "$log"
  detail="$(last_line "$log" 'ERROR SUMMARY'); $DETAIL"
  local first
  first="$(first_line "$log" '^========= (Invalid|Race|Error|Program hit)|^FAIL ')"
  [[ -n "$first" && "$detail" != *"first: "* ]] && detail+=" | first: $first"
  if [[ -n "$NO_GPU" ]]; then
    row "$id" "$tool, identity --quick" SKIP "$STEP_S" "no GPU: $NO_GPU; compute-sanitizer ran (exit $STEP_RC): $detail"
  else
    row "$id" "$tool, identity --quick" "$VERDICT" "$STEP_S" "$detail"
  fi
}

stage_2() { sanitizer 2.1 memcheck 150; }

stage_3() {
  local a b n k=0
  start_server 3.0 a cpu
  a="$ADDRESS"
  start_server 3.0 b "$GPU_BACKEND"
  b="$ADDRESS"
  if [[ -n "$a" && -n "$b" ]]; then
    IFS=',' read -r -a sizes <<<"$COMPARE_SIZES"
    for n in "${sizes[@]}"; do
      k=$((k + 1))
      step "3.$k" "compare cpu vs $GPU_BACKEND N=$n" 150 "$LOGS/compare_$n.log" \
        "$BUNDLE/bin/compare_backends" --a="$a" --b="$b" --sizes="$n" --job_prefix="cmp$n" || continue
      row "3.$k" "compare cpu vs $GPU_BACKEND N=$n" "$(step_result)" "$STEP_S" \
        "$(grep -c '^OK ' "$LOGS/compare_$n.log") jobs equal; $(last_line "$LOGS/compare_$n.log" '^(EQUAL|DIFFERENCE)|compare_backends:')"
    done
  fi
  stop_servers 3.9
  kernel_test 3.7 mixture_window_test 60
  kernel_test 3.8 cuda_backend_test 150
}

# kernel_test ID NAME LIMIT_S: the bundle's runfiles/kernels/cuda/NAME, a gtest binary.
kernel_test() {
  local id="$1" name="$2" test="$BUNDLE/runfiles/kernels/cuda/$2"
  if [[ -x "$test" ]]; then
    step "$id" "$name" "$3" "$LOGS/$name.log" env TEST_TMPDIR="$WORK" "$test" &&
      gtest_row "$id" "$name" "$LOGS/$name.log"
  else
    row "$id" "$name" FAIL 0 "not in the bundle ($test)"
  fi
}

stage_4() {
  local args=()
  if step 4.1 "gpu_benchmark" 150 "$LOGS/bench.log" \
      "$BUNDLE/bin/gpu_benchmark" --sizes="$BENCH_SIZES"; then
    if [[ -n "$NO_GPU" && $STEP_RC -eq 2 ]]; then
      row 4.1 "gpu_benchmark" SKIP "$STEP_S" "$(last_line "$LOGS/bench.log" 'no usable GPU')"
    else
      row 4.1 "gpu_benchmark" "$(step_result)" "$STEP_S" \
        "N=$BENCH_SIZES: $(grep -c '^RESULT' "$LOGS/bench.log") results$(failure_tail "$LOGS/bench.log")"
    fi
  fi
  [[ -n "$NO_GPU" ]] && args=(--device=cpu)
  if step 4.2 "torch anchors${args[*]:+ (cpu)}" 150 "$LOGS/torch.log" \
      "${HOST[@]}" PYTHONUNBUFFERED=1 "$PY" bench/torch_anchors.py --sizes="$BENCH_SIZES" "${args[@]}"; then
    local device
    device="$(first_line "$LOGS/torch.log" '^DEVICE')"
    row 4.2 "torch anchors${args[*]:+ (cpu)}" "$(step_result)" "$STEP_S" \
      "N=$BENCH_SIZES: $(grep -c '^RESULT' "$LOGS/torch.log") results, $(grep -c '^SKIP' "$LOGS/torch.log") skipped${device:+; $device}$(failure_tail "$LOGS/torch.log")"
  fi
  profile_ops
  mixture_windows
}

# Step 4.4: a mixture job's window, N = 1e12 in 1e4 groups, through the $GPU_BACKEND backend at
# each M of MIXTURE_M (3 reps), PlanWindow on the CPU's cores as the anchor in the same run.
mixture_windows() {
  local m k=0 log threads
  threads="$(nproc)"
  IFS=',' read -r -a ms <<<"$MIXTURE_M"
  for m in "${ms[@]}"; do
    k=$((k + 1))
    log="$LOGS/mixture_window_$m.log"
    step "4.4.$k" "mixture window $GPU_BACKEND M=$m" 120 "$log" \
      "$BUNDLE/bin/mixture_window_benchmark" 10000 100000000 "$m" "$threads" 3 "$GPU_BACKEND" || return
    row "4.4.$k" "mixture window $GPU_BACKEND M=$m" "$(step_result)" "$STEP_S" \
      "$(last_line "$log" '^backend ' | sed -E 's/ +/ /g'); anchor: CPU PlanWindow $(last_line "$log" '^PlanWindow' | sed -E 's/^PlanWindow \(fill \+ shuffle\) +//')$(failure_tail "$log")"
  done
}

# ncu (Nsight Compute): on the PATH, in CUDA's bin/, or where Nsight Compute installs itself.
find_ncu() {
  local c
  for c in "$(command -v ncu)" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [[ -n "$c" && -x "$c" ]] && { echo "$c"; return; }
  done
}

# Step 4.3: where the time goes. Each operation of PROFILE_OPS alone (gpu_benchmark --ops, one
# warm-up and one timed run) under ncu, one line per kernel (tools/gpu/profile_table.py): time,
# share, DRAM bytes and rate, registers, occupancy, SM and memory throughput.
profile_ops() {
  local ncu op file k=0 files=() copy_gbps verdict
  ncu="$(find_ncu)"
  if [[ -z "$ncu" ]]; then
    if [[ -n "$NO_GPU" ]]; then
      row 4.3 "ncu per kernel" SKIP 0 "no GPU: $NO_GPU; ncu not found either"
    else
      row 4.3 "ncu per kernel" FAIL 0 "ncu not found (PATH, /usr/local/cuda/bin, /opt/nvidia/nsight-compute)"
    fi
    return
  fi
  IFS=',' read -r -a ops <<<"$PROFILE_OPS"
  for op in "${ops[@]}"; do
    k=$((k + 1))
    file="$LOGS/ncu_${op//[^A-Za-z0-9._-]/_}.csv"
    # ncu runs with the machine's libraries; gpu_benchmark needs none of the bundle's.
    step "4.3.$k" "ncu $op" 90 "$LOGS/ncu_run_$k.log" \
      "${HOST[@]}" "$ncu" --csv --page raw --print-units base --clock-control none \
      --metrics "$("$PY" tools/gpu/profile_table.py --print_metrics)" --log-file "$file" \
      "$BUNDLE/bin/gpu_benchmark" --sizes="$PROFILE_N" --reps=1 --ops="$op" || return
    if [[ -n "$NO_GPU" && $STEP_RC -eq 2 ]]; then
      row "4.3.$k" "ncu $op" SKIP "$STEP_S" "no GPU: $NO_GPU"
      continue
    fi
    # The benchmark's own line says the operation ran (whatever exit status ncu passes on).
    verdict="$(step_result)"
    [[ $verdict == PASS ]] && ! grep -q '^RESULT' "$LOGS/ncu_run_$k.log" && verdict=FAIL
    row "4.3.$k" "ncu $op" "$verdict" "$STEP_S" \
      "N=$PROFILE_N: $(grep -c '^"[0-9]' "$file" 2>/dev/null) kernel launches; $(last_line "$LOGS/ncu_run_$k.log" '^RESULT|^==ERROR==|gpu_benchmark:')"
    files+=("$file")
  done
  copy_gbps="$(awk -v n="$PROFILE_N" '$1 == "RESULT" && $2 == "copy_d2d" && $3 == n { print $7 }' "$LOGS/bench.log" 2>/dev/null | tail -1)"
  ((${#files[@]})) && "${HOST[@]}" "$PY" tools/gpu/profile_table.py ${copy_gbps:+--copy_gbps="$copy_gbps"} \
    "${files[@]}" >"$LOGS/profile.log" 2>&1
}

stage_5() {
  local n
  start_server 5.0 boundary "$GPU_BACKEND"
  if [[ -n "$ADDRESS" ]]; then
    IFS=',' read -r -a sizes <<<"$BOUNDARY_N"
    for n in "${sizes[@]}"; do
      step 5.1 "boundary $GPU_BACKEND N=$n" 150 "$LOGS/boundary_$n.log" \
        "$BUNDLE/bin/compare_backends" --a="$ADDRESS" --boundary_n="$n" --job_prefix=check || continue
      row 5.1 "boundary $GPU_BACKEND N=$n" "$(step_result)" "$STEP_S" \
        "$(last_line "$LOGS/boundary_$n.log" '^BOUNDARY|compare_backends:' | sed -E 's/^BOUNDARY //; s/ (n|m|world|boundaries)=[0-9]+//g')"
      cp "$LOGS/boundary_$n.log" "$LOGS/boundary.log"
    done
  fi
  stop_servers 5.9
}

stage_6() {
  local k=0 test log tmp
  while read -r test; do
    [[ -n "$test" ]] || continue
    k=$((k + 1))
    log="$LOGS/test_$(basename "$test").log"
    tmp="$(mktemp -d "$WORK/test.XXXXXX")"
    step "6.$k" "$(basename "$test")" 120 "$log" \
      env -C "$BUNDLE/runfiles" TEST_TMPDIR="$tmp" "./$test" || continue
    gtest_row "6.$k" "$(basename "$test")" "$log"
  done <"$BUNDLE/TESTS.txt"
  if step 6.8 "ReportFromDevice host cost" 90 "$LOGS/loss_reporter_bench.log" \
      "$BUNDLE/bin/loss_reporter_bench" --num_samples=2000000 --repeats=1 --report_calls=5000; then
    local line
    line="$(last_line "$LOGS/loss_reporter_bench.log" '"device_cost"')"
    if [[ $STEP_RC -eq 0 && "$line" == *skipped* ]]; then
      # Skipped for want of a GPU: expected in a rehearsal, a failure on the GPU machine.
      row 6.8 "ReportFromDevice host cost" "$([[ -n "$NO_GPU" ]] && echo SKIP || echo FAIL)" \
        "$STEP_S" "$line"
    else
      row 6.8 "ReportFromDevice host cost" "$(step_result)" "$STEP_S" "${line:-no device_cost line}"
    fi
  fi
  if [[ -n "$NO_GPU" ]]; then
    # The trainer's binary loads and reaches its GPU check (exit 2 naming what is missing).
    step 6.9 "DDP trainer (no GPU: its refusal)" 30 "$LOGS/trainer.log" \
      env WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$BUNDLE/bin/ddp_trainer" --address=127.0.0.1:1 --epochs=1 || return
    if [[ $STEP_RC -eq 2 ]] && grep -q 'no usable GPU' "$LOGS/trainer.log"; then
      row 6.9 "DDP trainer" SKIP "$STEP_S" "$(last_line "$LOGS/trainer.log" 'no usable GPU')"
    else
      row 6.9 "DDP trainer (no GPU)" FAIL "$STEP_S" "exit $STEP_RC, expected 2 with 'no usable GPU': $(tail -1 "$LOGS/trainer.log")"
    fi
  elif step 6.9 "DDP trainer, world size 1" 200 "$LOGS/trainer_run.log" \
      "${HOST[@]}" OUT="$LOGS/trainer" bash examples/cpp/run_on_gpu.sh "$BUNDLE"; then
    row 6.9 "DDP trainer, world size 1" "$(step_result)" "$STEP_S" \
      "$(grep -E '^(FAILED|balanced accuracy:|reporter cost|memcheck)' "$LOGS/trainer/summary.txt" 2>/dev/null | tr '\n' ' ' | cut -c1-240)"
  fi
}

# identity_sizes_start ID MIN_N MAX_N LIMIT_S LOG: identity_test's EverySize for
# MIN_N <= N <= MAX_N in the background (step_start; a cut run says how far it got);
# identity_sizes_row ID MIN_N MAX_N LOG waits for it and writes its row.
identity_sizes_start() {
  step_start "$1" "identity $(($2 - 1)) < N <= $3" "$4" "$5" "$IDENTITY" --min_n="$2" \
    --max_n="$3" --gtest_filter=IdentityTest.EverySize
}

identity_sizes_row() {
  step_wait "$1" "$4"
  identity_row "$1" "identity $(($2 - 1)) < N <= $3" "$4"
}

stage_7() {
  identity_sizes_start 7.1 $((IDENTITY_SMALL_N + 1)) "$IDENTITY_MID_N" 150 \
    "$LOGS/identity_mid.log" &&
    identity_sizes_row 7.1 $((IDENTITY_SMALL_N + 1)) "$IDENTITY_MID_N" "$LOGS/identity_mid.log"
}

# The second call's stage: the racecheck and the largest identity side by side, each under its
# own limit (the header gives the estimates).
stage_8() {
  local racecheck=0 identity=0
  sanitizer_start 8.1 racecheck 360 && racecheck=1
  identity_sizes_start 8.2 $((IDENTITY_MID_N + 1)) "$IDENTITY_LARGE_N" 420 \
    "$LOGS/identity_large.log" && identity=1
  ((racecheck)) && sanitizer_row 8.1 racecheck
  ((identity)) &&
    identity_sizes_row 8.2 $((IDENTITY_MID_N + 1)) "$IDENTITY_LARGE_N" "$LOGS/identity_large.log"
  return 0
}

# The test of the budget logic: a stage that only takes time.
stage_fake() {
  step "$1.1" "wait $CHECK_TESTONLY_STAGE_S s (test)" 600 "$LOGS/fake_$1.log" sleep "$CHECK_TESTONLY_STAGE_S" &&
    row "$1.1" "wait $CHECK_TESTONLY_STAGE_S s (test)" SKIP "$STEP_S" "CHECK_TESTONLY_STAGE_S: no check made"
}

save_logs() { tar -czf "$OUT/logs.tgz" -C "$WORK" logs 2>/dev/null; }

# ---- Run -----------------------------------------------------------------------------------------
{
  echo "# tools/gpu/check.sh $(date -u +%FT%TZ): stages $STAGES, budget $BUDGET_S s$([[ $REHEARSE == 1 ]] && echo ', rehearsal (CPU stand-ins)')"
  echo "# GPU: ${NO_GPU:-$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)}"
  printf '%-5s %-36s %-7s %5s  %s\n' step what result s detail
} | tee -a "$SUMMARY"

if [[ -z "$NO_GPU" || $REHEARSE == 1 ]] && [[ -z "${CHECK_TESTONLY_STAGE_S:-}" ]]; then
  # What travels is the archive (make_bundle.sh): unpacked here, outside the working tree.
  if [[ ! -d "$BUNDLE" && -f "$BUNDLE.tgz" ]]; then
    tar -xzf "$BUNDLE.tgz" -C "$WORK" &&
      echo "# bundle: $BUNDLE.tgz unpacked in $((SECONDS - START)) s" | tee -a "$SUMMARY"
    BUNDLE="$WORK/$(basename "$BUNDLE")"
  fi
  for f in MANIFEST.txt TESTS.txt bin/samplerd bin/compare_backends bin/gpu_benchmark \
           bin/ddp_trainer bin/loss_reporter_bench bin/mixture_window_benchmark \
           runfiles/kernels/cuda/identity_test; do
    if [[ ! -e "$BUNDLE/$f" ]]; then
      echo "check.sh: $BUNDLE/$f missing: make the bundle on a build machine (bash tools/gpu/make_bundle.sh) and carry it (carry=[\"out/gpu_bundle.tgz\"])" | tee -a "$SUMMARY" >&2
      exit 2
    fi
  done
  # The bundle's programs find their libraries in lib/; what is not the bundle's (python3 and
  # torch, the trainer's script, which sets its own) runs with the machine's own ("${HOST[@]}"):
  # lib/ holds a libcudart, OpenSSL, zlib... that must not replace torch's or Python's.
  export LD_LIBRARY_PATH="$BUNDLE/lib${HOST_LD_LIBRARY_PATH:+:$HOST_LD_LIBRARY_PATH}"
fi
IDENTITY="$BUNDLE/runfiles/kernels/cuda/identity_test"

IFS=',' read -r -a selected <<<"$STAGES"
for n in "${selected[@]}"; do
  STAGE_COUNT=()
  t0=$SECONDS
  echo "== stage $n: ${STAGE_NAMES[$n]} ($(left) s of the budget left)"
  if [[ -n "$NO_GPU" && $REHEARSE == 0 && -z "${CHECK_TESTONLY_STAGE_S:-}" ]]; then
    row "$n" "${STAGE_NAMES[$n]}" SKIP 0 "no GPU: $NO_GPU (--rehearse runs the CPU stand-ins)"
  elif (($(left) < MIN_START_S)); then
    row "$n" "${STAGE_NAMES[$n]}" NOTRUN 0 "budget spent ($BUDGET_S s, $(left) s left)"
  elif [[ -n "${CHECK_TESTONLY_STAGE_S:-}" ]]; then
    stage_fake "$n"
  else
    "stage_$n"
  fi
  save_logs
  counts=""
  for result in FAIL TIMEOUT CUT NOTRUN SKIP PASS; do
    [[ -n "${STAGE_COUNT[$result]:-}" ]] && counts+="${STAGE_COUNT[$result]} $result "
  done
  STAGE_ROWS+=("$(printf '%-3s %-42s %5s s  %s' "$n" "${STAGE_NAMES[$n]}" $((SECONDS - t0)) "$counts")")
done

# ---- Closing table (last: the device tool returns the end of the output) -------------------------
{
  echo
  echo "== steps not PASS (every row is in summary.txt, every log in logs.tgz)"
  awk '$1 ~ /^[0-9]/ && substr($0, 44, 5) != "PASS "' "$SUMMARY" | cut -c1-300  # row()'s columns.
  echo
  echo "== stages ($((SECONDS - START)) s of $BUDGET_S)"
  printf '%s\n' "${STAGE_ROWS[@]}"
  if [[ -s "$LOGS/bench.log" || -s "$LOGS/torch.log" || -s "$LOGS/boundary.log" ||
        -s "$LOGS/loss_reporter_bench.log" ]]; then
    echo
    "${HOST[@]}" "$PY" tools/gpu/bench_table.py --bench="$LOGS/bench.log" --torch="$LOGS/torch.log" \
      --boundary="$LOGS/boundary.log" --device_cost="$LOGS/loss_reporter_bench.log" 2>&1
  fi
  if [[ -s "$LOGS/profile.log" ]]; then
    echo
    cat "$LOGS/profile.log"
  fi
  echo "exit status $STATUS (0: all passed, 1: a failure, 3: incomplete)"
} | tee -a "$SUMMARY"
save_logs
exit $STATUS
