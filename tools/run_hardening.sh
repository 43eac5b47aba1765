#!/usr/bin/env bash
# The hardening checks that fit CI (docs/HARDENING.md; .ci/run runs this after the test suite):
#   1. a short run of every fuzz target (tools/fuzz/run.sh, FUZZ_SECONDS each, default 15);
#   2. a subset of the C++ tests under --config=asan (ASan + UBSan) and --config=tsan.
# With --all: the larger sanitizer subsets too (by hand, not in CI).
# The whole C++ suite under both sanitizers and the long fuzzing runs are done by hand, their
# results kept in docs/HARDENING.md. Prints one closing line and exits non-zero on any failure.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
# The normal build's samplerd (the Python fuzz target's server), built by run_tests.sh.
bazel build //server:samplerd 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -1
SAMPLERD_BIN="${SAMPLERD_BIN:-$(readlink -f "$ROOT/bazel-bin/server/samplerd")}"
export SAMPLERD_BIN

# What CI runs (a 2-core machine, within its budget): every fuzz target for FUZZ_SECONDS (the two
# that reach the job core, job_recovery_fuzzer and raw_request_fuzzer, add about 575 s of
# --config=fuzz build from a cold cache, measured on a loaded 2-core machine: docs/HARDENING.md,
# "In CI") and the sanitizer subsets whose builds are small (no job core, no gRPC server). The
# larger sanitizer subsets run by hand: `tools/run_hardening.sh --all` (docs/HARDENING.md has
# their results).
FUZZ_TARGETS=(
  //server:record_log_fuzzer //server:snapshot_fuzzer //server:token_table_fuzzer
  //client/cpp:reader_position_fuzzer //server:job_recovery_fuzzer //server:raw_request_fuzzer
  load_state_dict
)
ASAN_TESTS=(
  //server:record_log_test //server:snapshot_test //server:token_table_test
  //client/cpp:reader_position_test //server:loss_batch_test
)
TSAN_TESTS=(
  //server:work_pool_test //server:epoch_waiters_test
)
if [[ "${1:-}" == "--all" ]]; then
  ASAN_TESTS+=(//server:job_journal_test //server:raw_request_test //server:job_test)
  TSAN_TESTS+=(//server:job_journal_test //server:job_test)
elif [[ -n "${1:-}" ]]; then
  echo "run_hardening: unknown argument '$1' (expected nothing or --all)" >&2
  exit 2
fi

failed=()
start=$SECONDS
bash tools/fuzz/run.sh -t "${FUZZ_SECONDS:-15}" "${FUZZ_TARGETS[@]}" || failed+=("fuzzing")
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
