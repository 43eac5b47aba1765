#!/usr/bin/env bash
# The hardening checks that fit CI (docs/HARDENING.md; .ci/run runs this after the test suite):
#   1. a short run of every fuzz target (tools/fuzz/run.sh, FUZZ_SECONDS each, default 20);
#   2. a subset of the C++ tests under --config=asan (ASan + UBSan) and --config=tsan.
# The whole C++ suite under both sanitizers and the long fuzzing runs are done by hand, their
# results kept in docs/HARDENING.md. Prints one closing line and exits non-zero on any failure.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
# The normal build's samplerd (the Python fuzz target's server), built by run_tests.sh.
bazel build //server:samplerd 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -1
SAMPLERD_BIN="${SAMPLERD_BIN:-$(readlink -f "$ROOT/bazel-bin/server/samplerd")}"
export SAMPLERD_BIN

# The sanitizer subset: the parsers and the persistence (what the fuzzers reach), and the
# concurrent pieces that are fast enough for a sanitizer in CI.
ASAN_TESTS=(
  //server:record_log_test //server:snapshot_test //server:job_journal_test
  //server:token_table_test //server:raw_request_test //server:loss_batch_test
  //client/cpp:reader_position_test //server:job_test
)
TSAN_TESTS=(
  //server:work_pool_test //server:epoch_waiters_test //server:job_journal_test
  //server:job_test
)

failed=()
start=$SECONDS
bash tools/fuzz/run.sh -t "${FUZZ_SECONDS:-20}" || failed+=("fuzzing")
echo "run_hardening: fuzzing took $((SECONDS - start)) s"
start=$SECONDS
bazel test --config=asan "${ASAN_TESTS[@]}" 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' \
  | tail -20
[[ ${PIPESTATUS[0]} -eq 0 ]] || failed+=("asan")
echo "run_hardening: asan subset took $((SECONDS - start)) s"
start=$SECONDS
bazel test --config=tsan "${TSAN_TESTS[@]}" 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' \
  | tail -20
[[ ${PIPESTATUS[0]} -eq 0 ]] || failed+=("tsan")
echo "run_hardening: tsan subset took $((SECONDS - start)) s"

if ((${#failed[@]})); then
  echo "hardening: failed: ${failed[*]}"
  exit 1
fi
echo "hardening: fuzzing, asan and tsan subsets passed"
