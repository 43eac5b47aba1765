#!/usr/bin/env bash
# The trainer started where no GPU is usable (CI, the build machines) must stop before doing
# anything, with exit status 2 and a message naming what is missing (cuda_support's
# GpuAvailable(): the CUDA runtime's call, error name and message). Where a GPU is present the
# check cannot be made: the test reports itself skipped (tools/testing/skip.sh; tools/gpu/check.sh
# runs the trainer on that machine).
# Also: bad flags and a bad launcher environment are refused (exit 1) naming the value, on any
# machine, before the GPU is looked at.
set -uo pipefail
BIN="$1"
# shellcheck source=tools/testing/skip.sh
source "$2"
fail() { echo "FAIL: $*"; exit 1; }

# Host-side validation first: these never reach the GPU check.
out="$(RANK=x "$BIN" 2>&1)"; rc=$?
[[ $rc -eq 1 ]] || fail "RANK=x: exit $rc, expected 1 (output: $out)"
[[ "$out" == *"environment variable RANK = 'x' is not a decimal integer"* ]] || fail "RANK=x: $out"
out="$("$BIN" --classes=1 2>&1)"; rc=$?
[[ $rc -eq 1 ]] || fail "--classes=1: exit $rc, expected 1 (output: $out)"
[[ "$out" == *"classes must be in [2, 64], got 1"* ]] || fail "--classes=1: $out"

# Port 1 on loopback: nothing listens there, so even with a GPU the run cannot succeed.
out="$("$BIN" --address=127.0.0.1:1 --epochs=1 --timing_epochs=0 2>&1)"; rc=$?
echo "$out"
[[ $rc -ne 0 ]] || fail "the trainer succeeded without a server"
if [[ $rc -eq 2 ]]; then
  [[ "$out" == *"no usable GPU: cuda: cudaGetDeviceCount: cuda"* ]] \
    || fail "exit 2 without the runtime's reason: $out"
  echo "PASS: no GPU here, refused with the runtime's reason"
  exit 0
fi
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  bazel_skip "a GPU is present here (exit $rc without a server is expected)"
fi
fail "exit $rc without a GPU, expected 2: $out"
