#!/usr/bin/env bash
# The one command for the GPU machine (no Bazel, no Abseil/gRPC development packages there; nvcc,
# CUB, g++, torch and python3 are): builds the CUDA kernels (kernels/cuda) and their drivers with
# plain nvcc, runs the identity tests (device == host reference, up to N = 1e8; once under
# compute-sanitizer at small N), then the benchmark (bench/gpu_benchmark.cu) and torch's anchors
# (bench/torch_anchors.py) in the same run, and prints a short table last.
#
# Why it needs no Abseil: the identity tests compare the device with kernels/cuda/reference.*
# (plain C++ of the definition), not with the CPU backend (which needs Abseil); reference_test
# (Bazel, CI) checks those references against the CPU backend, closing the chain.
#
# Usage (from the repository root, e.g. through the device tool):
#   bash tools/gpu/run_on_gpu.sh            # all: kernels, then e2e (over 600 s: see README)
#   bash tools/gpu/run_on_gpu.sh kernels    # build, identity, sanitizer, benchmark, torch
#   bash tools/gpu/run_on_gpu.sh e2e        # only the end-to-end stage (tools/gpu/e2e_on_gpu.sh:
#                                           # the Bazel-built bundle of make_bundle.sh, no nvcc)
#   bash tools/gpu/run_on_gpu.sh build      # only the build (works without a GPU)
#   IDENTITY_MAX_N=10000000 BENCH_SIZES=10000000,100000000 bash tools/gpu/run_on_gpu.sh
# Writes build.log, identity.log, sanitizer.log, bench.log, torch.log and summary.txt to $OUT
# (default /tmp/samplerd_gpu_out). Exit status: non-zero if a build or test failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
MODE="${1:-all}"
OUT="${OUT:-/tmp/samplerd_gpu_out}"
export OUT
case "$MODE" in
  all|kernels|build) ;;
  e2e) exec bash "$ROOT/tools/gpu/e2e_on_gpu.sh" ;;
  *) echo "run_on_gpu.sh: unknown mode '$MODE' (all, kernels, e2e, build)" >&2; exit 2 ;;
esac
BUILD="${BUILD_DIR:-/tmp/samplerd_gpu_build}"
IDENTITY_MAX_N="${IDENTITY_MAX_N:-100000000}"
BENCH_SIZES="${BENCH_SIZES:-10000000,100000000,1000000000}"
NVCC="${NVCC:-/usr/local/cuda/bin/nvcc}"
[[ -x "$NVCC" ]] || NVCC="$(command -v nvcc)"
mkdir -p "$OUT" "$BUILD"

# The flags of tools/cuda/cuda.bzl (keep them equal: -fmad=false and IEEE division are part of
# the determinism contract), for the H100 only (sm_90 + its PTX).
# shellcheck disable=SC2054  # The commas are nvcc's -gencode syntax, not array separators.
FLAGS=(-std=c++17 -O3 -fmad=false -prec-div=true -prec-sqrt=true -ftz=false
       -Xcompiler -ffp-contract=off -DCUB_IGNORE_NAMESPACE_MAGIC_ERROR
       -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 -I"$ROOT")

status=0
fail() { echo "FAILED: $*" | tee -a "$OUT/summary.txt"; status=1; }

# ---- Build -------------------------------------------------------------------------------------
build() {
  echo "== build ($("$NVCC" --version | tail -1))"
  local pids=() f
  for f in kernels/cuda/es_select.cu kernels/cuda/plan_kernels.cu kernels/cuda/shuffle.cu \
           kernels/cuda/device_weights.cu kernels/cuda/reference.cc kernels/cuda/gpu_presence.cc; do
    "$NVCC" "${FLAGS[@]}" -c "$f" -o "$BUILD/$(basename "${f%.*}").o" & pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  local kernels=("$BUILD"/es_select.o "$BUILD"/plan_kernels.o "$BUILD"/shuffle.o
                 "$BUILD"/device_weights.o)
  "$NVCC" "${FLAGS[@]}" kernels/cuda/identity_test.cc "${kernels[@]}" "$BUILD"/reference.o \
    "$BUILD"/gpu_presence.o -o "$BUILD/identity_test" || return 1
  "$NVCC" "${FLAGS[@]}" bench/gpu_benchmark.cu "${kernels[@]}" -o "$BUILD/gpu_benchmark" || return 1
  echo "built: $BUILD/identity_test $BUILD/gpu_benchmark"
}
: >"$OUT/summary.txt"
if ! build >"$OUT/build.log" 2>&1; then
  tail -30 "$OUT/build.log"
  fail "build (see build.log)"
  exit 1
fi
tail -1 "$OUT/build.log"
[[ "$MODE" == "build" ]] && exit 0

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"

# ---- Identity ----------------------------------------------------------------------------------
echo "== identity (N up to $IDENTITY_MAX_N)"
"$BUILD/identity_test" --max_n="$IDENTITY_MAX_N" >"$OUT/identity.log" 2>&1 || fail "identity_test"
grep -E "^(FAIL|SKIPPED|GPU:)" "$OUT/identity.log" | head -20
tail -1 "$OUT/identity.log" | tee -a "$OUT/summary.txt"

echo "== compute-sanitizer (memcheck, racecheck; N <= 5000)"
: >"$OUT/sanitizer.log"
for tool in memcheck racecheck; do
  if command -v compute-sanitizer >/dev/null; then
    compute-sanitizer --tool "$tool" --error-exitcode 99 "$BUILD/identity_test" --quick \
      >>"$OUT/sanitizer.log" 2>&1 || fail "compute-sanitizer --tool $tool"
    echo "$tool: $(grep -E 'ERROR SUMMARY|identity:' "$OUT/sanitizer.log" | tail -2 | tr '\n' ' ')" \
      | tee -a "$OUT/summary.txt"
  else
    echo "compute-sanitizer not found" | tee -a "$OUT/summary.txt"
  fi
done

# ---- Benchmark ---------------------------------------------------------------------------------
echo "== benchmark (N in $BENCH_SIZES)"
"$BUILD/gpu_benchmark" --sizes="$BENCH_SIZES" >"$OUT/bench.log" 2>&1 || fail "gpu_benchmark"
PYTHONUNBUFFERED=1 python3 bench/torch_anchors.py --sizes="$BENCH_SIZES" >"$OUT/torch.log" 2>&1 \
  || fail "torch_anchors.py"

# ---- Table (last: the device tool returns the end of the output) --------------------------------
python3 - "$OUT/bench.log" "$OUT/torch.log" <<'PY' | tee -a "$OUT/summary.txt"
import sys
rows = {}
for path in sys.argv[1:]:
    for line in open(path):
        if line.startswith(("DEVICE", "MEMORY", "SKIP")):
            print(line.rstrip())
        if line.startswith("RESULT "):
            _, op, n, m, ms, ips, gbps, frac = line.split()
            rows[(op, int(n))] = (float(ms), float(ips), float(gbps), float(frac))
anchors = {"no_replacement_M=N": "torch_exp_keys_sort_M=N",
           "no_replacement_M=N/10_weighted": "torch_exp_keys_topk_M=N/10",
           "replacement_M=N_weighted": "torch_cumsum_searchsorted_M=N"}
targets = {"no_replacement_M=N": 20.0, "no_replacement_M=N/10_weighted": 15.0,
           "replacement_M=N_weighted": 40.0, "recompute_loss": 8.0, "recompute_loss_base": 8.0}
print(f"{'operation':34} {'N':>11} {'ms':>9} {'items/s':>9} {'GB/s':>7} {'copy%':>6} "
      f"{'torch ms':>9} {'x torch':>8} {'target':>7}")
for (op, n), (ms, ips, gbps, frac) in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    anchor = rows.get((anchors.get(op, ""), n))
    torch_ms = f"{anchor[0]:9.2f}" if anchor else f"{'-':>9}"
    speedup = f"{anchor[0] / ms:8.1f}" if anchor else f"{'-':>8}"
    target = f"{targets[op]:7.0f}" if op in targets and n == 10**9 else f"{'':7}"
    print(f"{op:34} {n:11d} {ms:9.3f} {ips:9.3g} {gbps:7.0f} {100 * frac:6.0f} {torch_ms} "
          f"{speedup} {target}")
PY

# ---- End to end (mode all, last): tools/gpu/e2e_on_gpu.sh, from the Bazel-built bundle --------
if [[ "$MODE" == all ]]; then
  bash "$ROOT/tools/gpu/e2e_on_gpu.sh" || fail "e2e (see $OUT/e2e/summary.txt)"
fi
exit $status
