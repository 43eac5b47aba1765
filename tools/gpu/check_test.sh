#!/usr/bin/env bash
# tools/gpu/check.sh's own logic, without a GPU: flags are checked (exit 2 naming the flag), a
# missing bundle is named, every stage is SKIP with the reason when there is no GPU, --stages
# picks stages, the budget stops starting stages (NOTRUN) while a stage that started finishes,
# stage 8 (the second call's) is not among the default stages, and on a machine that claims a
# GPU (a stand-in nvidia-smi) but cannot use it, the real identity_test (also stage 8's two runs
# side by side) and gpu_benchmark are FAIL, never PASS or SKIP. The full rehearsal with the
# bundle (check.sh --rehearse) is run by hand; tools/gpu/README.md says how.
set -uo pipefail
CHECK="$1"
# shellcheck source=tools/testing/skip.sh
source "$2"
IDENTITY_TEST="$3"
GPU_BENCHMARK="$4"
fail() { echo "FAIL: $*"; exit 1; }
OUT_BASE="${TEST_TMPDIR:-$(mktemp -d)}"

run() {  # NAME ARGS...: check.sh with OUT=$OUT_BASE/NAME; sets RC, SUMMARY (its summary.txt).
  local name="$1"
  shift
  OUT="$OUT_BASE/$name" bash "$CHECK" "$@" >"$OUT_BASE/$name.log" 2>&1
  RC=$?
  SUMMARY="$OUT_BASE/$name/summary.txt"
}

# Bad flags: exit 2, naming the flag, before anything runs.
run flags --stages=1,9
[[ $RC -eq 2 ]] || fail "--stages=1,9: exit $RC, expected 2"
grep -q -- '--stages=1,9: a comma-separated list of stage numbers 1 to 8' "$OUT_BASE/flags.log" ||
  fail "--stages=1,9: $(cat "$OUT_BASE/flags.log")"
run flags --budget=6m
[[ $RC -eq 2 ]] || fail "--budget=6m: exit $RC, expected 2"
grep -q -- '--budget=6m: seconds' "$OUT_BASE/flags.log" || fail "--budget=6m: $(cat "$OUT_BASE/flags.log")"
run flags --bogus
[[ $RC -eq 2 ]] || fail "--bogus: exit $RC, expected 2"
grep -q "unknown argument '--bogus'" "$OUT_BASE/flags.log" || fail "--bogus: $(cat "$OUT_BASE/flags.log")"

# The rehearsal needs the bundle: a missing one is named (exit 2).
run nobundle --rehearse --bundle="$OUT_BASE/no_such_bundle"
[[ $RC -eq 2 ]] || fail "missing bundle: exit $RC, expected 2"
grep -q "no_such_bundle/MANIFEST.txt missing: make the bundle" "$SUMMARY" ||
  fail "missing bundle not named: $(cat "$SUMMARY")"

# The budget: each stage takes 4 s (the test hook), 15 s of budget, stages start only with 10 s
# left: stage 1 (and, on a fast machine, 2) run, the others are NOTRUN; no stage is cut.
SECONDS=0
CHECK_TESTONLY_STAGE_S=4 run budget --budget=15
took=$SECONDS
[[ $RC -eq 3 ]] || fail "budget: exit $RC, expected 3 (incomplete): $(cat "$OUT_BASE/budget.log")"
grep -Eq '^1\.1 +wait 4 s \(test\) +SKIP +[45] ' "$SUMMARY" || fail "budget: stage 1 did not run: $(cat "$SUMMARY")"
for stage in 3 4 5 6 7; do
  grep -Eq "^$stage +.* NOTRUN +0  budget spent \(15 s" "$SUMMARY" ||
    fail "budget: stage $stage not NOTRUN: $(cat "$SUMMARY")"
done
(( took <= 15 + 5 )) || fail "budget: took $took s, budget 15 s"
[[ -s "$OUT_BASE/budget/logs.tgz" ]] || fail "budget: no logs.tgz"
grep -q '^exit status 3' "$SUMMARY" || fail "budget: no closing line: $(tail -3 "$SUMMARY")"

# A machine that claims a GPU it cannot give (a stand-in nvidia-smi and compute-sanitizer): a
# test that skips, a benchmark that cannot run are failures, with the reason. The bundle holds
# the two real binaries these stages run and stand-ins for the others.
if ! command -v nvidia-smi >/dev/null; then
  fake="$OUT_BASE/fake_bin"
  mkdir -p "$fake"
  # shellcheck disable=SC2016  # The stand-ins' own "$*", "$@" and $rc.
  printf '#!/bin/sh\ncase "$*" in -L) echo "GPU 0: Stand-in (UUID: GPU-test)";; *) echo "Stand-in, 0.0, 0 MiB";; esac\n' >"$fake/nvidia-smi"
  # shellcheck disable=SC2016
  printf '#!/bin/sh\nshift 4\n"$@"; rc=$?\necho "========= ERROR SUMMARY: 0 errors"\nexit $rc\n' >"$fake/compute-sanitizer"
  chmod +x "$fake/nvidia-smi" "$fake/compute-sanitizer"
  bundle="$OUT_BASE/bundle"
  mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/runfiles/kernels/cuda"
  # Links: the binaries find their Bazel-built libraries from where they are (the bundle copies
  # those into lib/; its check of them is not what this test is about).
  ln -s "$(realpath "$IDENTITY_TEST")" "$bundle/runfiles/kernels/cuda/identity_test"
  ln -s "$(realpath "$GPU_BENCHMARK")" "$bundle/bin/gpu_benchmark"
  for f in samplerd compare_backends ddp_trainer loss_reporter_bench mixture_window_benchmark; do
    printf '#!/bin/sh\nexit 1\n' >"$bundle/bin/$f"
    chmod +x "$bundle/bin/$f"
  done
  echo "# test bundle" >"$bundle/MANIFEST.txt"
  : >"$bundle/TESTS.txt"
  PATH="$fake:$PATH" BENCH_SIZES=1000 CHECK_PYTHON=/bin/false run claimed --stages=1,2,4,8 \
    --bundle="$bundle"
  [[ $RC -eq 1 ]] || fail "claimed GPU: exit $RC, expected 1: $(cat "$OUT_BASE/claimed.log")"
  grep -Eq '^1\.1 +GPU, driver, bundle +PASS' "$SUMMARY" || fail "claimed GPU: 1.1: $(cat "$SUMMARY")"
  # 8.1 and 8.2 ran side by side (stage 8), each with its own row.
  for id in 1.2 2.1 8.1 8.2; do
    grep -Eq "^$id +.* FAIL .*skipped on a machine with a GPU: no usable GPU" "$SUMMARY" ||
      fail "claimed GPU: $id not FAIL: $(cat "$SUMMARY")"
  done
  grep -Eq '^4\.1 +gpu_benchmark .* FAIL .*gpu_benchmark: no usable GPU' "$SUMMARY" ||
    fail "claimed GPU: 4.1 not FAIL: $(cat "$SUMMARY")"
  grep -Eq '^4\.2 +torch anchors .* FAIL' "$SUMMARY" || fail "claimed GPU: 4.2: $(cat "$SUMMARY")"
fi

# Without a GPU: every stage SKIP with the reason, at once, exit 3; --stages picks the stages.
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  bazel_skip "a GPU is present: check.sh's no-GPU path cannot be seen here (the rest passed)"
fi
run nogpu
[[ $RC -eq 3 ]] || fail "no GPU: exit $RC, expected 3: $(cat "$OUT_BASE/nogpu.log")"
for stage in 1 2 3 4 5 6 7; do
  grep -Eq "^$stage +.* SKIP +0  no GPU: nvidia-smi (not found|lists no GPU)" "$SUMMARY" ||
    fail "no GPU: stage $stage: $(cat "$SUMMARY")"
done
# Stage 8 is the second call's, never in the default stages.
! grep -Eq '^8 ' "$SUMMARY" || fail "no GPU: stage 8 ran by default: $(cat "$SUMMARY")"
run picked --stages=2,5
[[ $RC -eq 3 ]] || fail "--stages=2,5: exit $RC"
# The rows as they were written (the closing output repeats those that are not PASS).
rows="$(sed '/^== steps not PASS/q' "$SUMMARY" | grep -Ec '^[0-9] +.* SKIP +0  no GPU')"
if [[ $rows -ne 2 ]] || ! grep -Eq '^2 +' "$SUMMARY" || ! grep -Eq '^5 +' "$SUMMARY"; then
  fail "--stages=2,5: $(cat "$SUMMARY")"
fi
echo "PASS"
