#!/usr/bin/env bash
# Runs the C++ DDP trainer on the GPU machine at world size 1 (one H100; NCCL refuses two ranks
# on one GPU) against a samplerd started here, and prints the comparison (balanced x loss vs
# uniform) and the reporter's cost per step. No Bazel there: the binaries come prebuilt in the
# bundle tools/gpu/make_bundle.sh makes on a build machine. Run by tools/gpu/check.sh (stage 6,
# which unpacks the bundle and passes its folder; `check.sh --stages=6` runs it alone).
#
#   bash examples/cpp/run_on_gpu.sh [BUNDLE] [ddp_trainer flags, e.g. --epochs=20]
#
# Shared libraries: bin/ddp_trainer and bin/samplerd link the CUDA runtime statically and need
# (ldd, see the bundle's MANIFEST.txt) the gRPC/protobuf/Abseil/OpenSSL/c-ares/re2/zlib/glog/
# CivetWeb libraries of Debian 12, carried in lib/; glibc and libstdc++ (newer on that machine);
# the driver's libcuda.so.1 (loaded by the runtime at the first CUDA call); and libnccl.so.2,
# not carried (218 MB): found here in $NCCL_LIB_DIR, else by ldconfig, else in the nvidia-nccl
# Python package that torch uses, else next to torch.
#
# Writes to $OUT (default /tmp/samplerd_trainer_out): samplerd.log, trainer.log (the full
# output), trainer_wide.log (the reporter's cost on a wider model), resume_*.log (a run killed and
# resumed from its checkpoints, and its uninterrupted reference), sanitizer.log (a short run under
# compute-sanitizer memcheck), summary.txt (printed last). Exit status: non-zero if the trainer or the sanitizer run failed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT" || exit 1
BUNDLE="$ROOT/out/gpu_bundle"
if [[ $# -gt 0 && "$1" != -* ]]; then
  BUNDLE="$(cd "$1" && pwd)"
  shift
fi
OUT="${OUT:-/tmp/samplerd_trainer_out}"
mkdir -p "$OUT"
: >"$OUT/summary.txt"
status=0
note() { echo "$*" | tee -a "$OUT/summary.txt"; }
fail() { note "FAILED: $*"; status=1; }

for bin in ddp_trainer samplerd; do
  [[ -x "$BUNDLE/bin/$bin" ]] || { echo "run_on_gpu: $BUNDLE/bin/$bin missing (make it with tools/gpu/make_bundle.sh on a build machine)" >&2; exit 1; }
done

find_nccl() {
  local dir
  if [[ -n "${NCCL_LIB_DIR:-}" ]]; then echo "$NCCL_LIB_DIR"; return; fi
  dir="$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / {print $NF; exit}')"
  if [[ -n "$dir" ]]; then dirname "$dir"; return; fi
  for py in python3 "$ROOT/.venv/bin/python"; do
    dir="$("$py" - 2>/dev/null <<'PY'
import glob, os
try:
    import nvidia.nccl
    for d in nvidia.nccl.__path__:
        if glob.glob(os.path.join(d, "lib", "libnccl.so*")):
            print(os.path.join(d, "lib")); raise SystemExit
except ImportError:
    pass
import torch
d = os.path.join(os.path.dirname(torch.__file__), "lib")
if glob.glob(os.path.join(d, "libnccl.so*")):
    print(d)
PY
)"
    if [[ -n "$dir" ]]; then echo "$dir"; return; fi
  done
}
NCCL_DIR="$(find_nccl)"
export LD_LIBRARY_PATH="$BUNDLE/lib${NCCL_DIR:+:$NCCL_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
note "bundle: $(head -1 "$BUNDLE/MANIFEST.txt" 2>/dev/null | sed 's/^# //')"
note "libnccl.so.2 from: ${NCCL_DIR:-not found}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"
missing="$(ldd "$BUNDLE/bin/ddp_trainer" "$BUNDLE/bin/samplerd" | grep 'not found' | sort -u)"
if [[ -n "$missing" ]]; then
  fail "shared libraries not found: $missing"
  exit 1
fi

# samplerd on a free port (--port=0; it prints "samplerd listening on HOST:PORT").
"$BUNDLE/bin/samplerd" --plaintext --port=0 --log_level=1 >"$OUT/samplerd.out" 2>"$OUT/samplerd.log" &
SERVER_PID=$!
trap 'kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null' EXIT
ADDRESS=""
for _ in $(seq 1 200); do
  ADDRESS="$(sed -n 's/^samplerd listening on //p' "$OUT/samplerd.out" | head -1)"
  [[ -n "$ADDRESS" ]] && break
  kill -0 "$SERVER_PID" 2>/dev/null || break
  sleep 0.05
done
if [[ -z "$ADDRESS" ]]; then
  cat "$OUT/samplerd.log" >&2
  fail "samplerd did not start (samplerd.log)"
  exit 1
fi
note "samplerd listening on $ADDRESS"

echo "== trainer (world size 1)"
WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$BUNDLE/bin/ddp_trainer" --address="$ADDRESS" "$@" 2>&1 \
  | tee "$OUT/trainer.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "ddp_trainer (trainer.log)"

# The default model is small (a step of ~10 kernels of microseconds), so the reporter's fixed cost
# weighs more in it than in a real step; the same measurement on a wider model shows how it
# scales (its own jobs, two epochs per compared run).
echo "== reporter cost on a wider model (256-2048-4)"
WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$BUNDLE/bin/ddp_trainer" --address="$ADDRESS" \
  --job_prefix=cpp-ddp-wide --features=256 --hidden=2048 --epochs=2 --timing_epochs=6 2>&1 \
  | tee "$OUT/trainer_wide.log" | grep -E "^(balanced accuracy:|reporter cost)"
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "ddp_trainer, wide model (trainer_wide.log)"

# Checkpoints and resume (checkpointed_loop.h, as cpu_trainer's): a small run SIGKILLs itself at
# its 33rd step (the 7th of epoch 2 of the class-balanced x loss run: 13 steps of 512 per epoch of
# M = 6359; a checkpoint at the start of every 5th step, the last at position 2560), is started
# again with the same flags, resumes from its checkpoint with the saved parameters, and must end
# with the same balanced accuracies as an uninterrupted run of the same spec (the kernels are
# deterministic, the replayed losses count once: the same plans, the same model).
echo "== checkpoint, SIGKILL, resume (small run)"
CKPT="$OUT/checkpoints"
rm -rf "$CKPT" && mkdir -p "$CKPT"
small=(--address="$ADDRESS" --majority=20000 --epochs=4 --timing_epochs=0)
WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$BUNDLE/bin/ddp_trainer" "${small[@]}" --job_prefix=resume-ref \
  >"$OUT/resume_reference.log" 2>&1 || fail "ddp_trainer, resume reference (resume_reference.log)"
WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$BUNDLE/bin/ddp_trainer" "${small[@]}" --job_prefix=resume \
  --checkpoint_dir="$CKPT" --checkpoint_every=5 --crash_at_step=33 >"$OUT/resume_killed.log" 2>&1
killed=$?
[[ $killed -eq 137 ]] || fail "the crashing run exited $killed, not 137 (resume_killed.log)"
WORLD_SIZE=1 RANK=0 LOCAL_RANK=0 "$BUNDLE/bin/ddp_trainer" "${small[@]}" --job_prefix=resume \
  --checkpoint_dir="$CKPT" --checkpoint_every=5 >"$OUT/resume_restarted.log" 2>&1 \
  || fail "ddp_trainer, restarted (resume_restarted.log)"
grep -q "^resumed from the checkpoints at epoch 2 position 2560$" "$OUT/resume_restarted.log" \
  || fail "the restarted run did not resume at epoch 2 position 2560 (resume_restarted.log)"
reference="$(grep "^balanced accuracy:" "$OUT/resume_reference.log")"
restarted="$(grep "^balanced accuracy:" "$OUT/resume_restarted.log")"
if [[ -n "$reference" && "$reference" == "$restarted" ]]; then
  note "resume: the restarted run ends as the uninterrupted one ($restarted)"
else
  fail "resume: '$restarted' after the restart, '$reference' uninterrupted"
fi

echo "== compute-sanitizer memcheck (small run)"
[[ -x /usr/local/cuda/bin/compute-sanitizer ]] && PATH="$PATH:/usr/local/cuda/bin"
if command -v compute-sanitizer >/dev/null; then
  # --report-api-errors no: NCCL's ncclCommInitRank asks cudaFuncGetAttributes of each of its
  # kernels and ignores the ones its build has no image for; memcheck counted those 4 returned
  # errors as errors (first run on an H200, 2026-11-26, every frame in libnccl.so.2). The
  # trainer's own CUDA calls check what they return (an error ends it, non-zero exit), and
  # memcheck's memory errors (out-of-bounds and misaligned accesses) are reported as before.
  compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 "$BUNDLE/bin/ddp_trainer" \
    --address="$ADDRESS" --job_prefix=sanitizer --majority=5000 --epochs=2 --timing_epochs=0 \
    >"$OUT/sanitizer.log" 2>&1 || fail "compute-sanitizer memcheck (sanitizer.log)"
  note "memcheck: $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer.log" | tail -1)"
else
  note "compute-sanitizer not found: memcheck not run"
fi

echo "== summary"
grep -E "^(ddp_trainer:|balanced accuracy:|reporter cost)" "$OUT/trainer.log" >>"$OUT/summary.txt"
sed 's/^/wide model: /' <(grep -E "^reporter cost" "$OUT/trainer_wide.log") >>"$OUT/summary.txt"
cat "$OUT/summary.txt"
exit $status
