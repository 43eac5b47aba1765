#!/usr/bin/env bash
# Runs every samplerd test: the Bazel C++ suites (unit, in-process gRPC, end-to-end against the
# real binary) and the Python client suite (real server + real PyTorch DDP processes on gloo).
# Prints one closing line: "tests: N passed, N failed, N skipped", counting test cases: gtest's
# cases (from Bazel's test.xml files: tools/testing/count_bazel_tests.py; a test that is not gtest
# is one case) and pytest's. A test that cannot run here (no GPU) is skipped, never passed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

# A fresh machine: install first (a no-op when everything is there).
if ! command -v bazel >/dev/null || [[ ! -x .venv/bin/python ]]; then bash tools/install_deps.sh; fi

passed=0
failed=0
skipped=0

# --- C++ (Bazel) -------------------------------------------------------------------------------
bazel_log="$(mktemp)"
# --test_summary=short: every target's status (tools/testing/count_bazel_tests.py reads them).
bazel test --test_summary=short //... 2>&1 | tee "$bazel_log" | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/'
bazel_rc=${PIPESTATUS[0]}
read -r bz_pass bz_fail bz_skip < <(python3 tools/testing/count_bazel_tests.py "$bazel_log" \
  "$(bazel info bazel-testlogs 2>/dev/null)")
if [[ $bazel_rc -ne 0 && ${bz_fail:-0} -eq 0 ]]; then bz_fail=1; fi  # build failure: count it.
passed=$((passed + ${bz_pass:-0}))
failed=$((failed + ${bz_fail:-1}))
skipped=$((skipped + ${bz_skip:-0}))
rm -f "$bazel_log"

# --- Python (pytest) ---------------------------------------------------------------------------
if [[ -d tests/python ]]; then
  PY="$ROOT/.venv/bin/python"
  [[ -x "$PY" ]] || PY=/usr/bin/python3
  bazel build //server:samplerd 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -3
  export SAMPLERD_BIN="$ROOT/bazel-bin/server/samplerd"
  py_log="$(mktemp)"
  "$PY" -m pytest -q tests/python 2>&1 | tee "$py_log"
  py_rc=${PIPESTATUS[0]}
  line=$(grep -E '[0-9]+ (passed|failed|skipped)' "$py_log" | tail -1)
  py_pass=$(grep -Eo '[0-9]+ passed' <<<"$line" | awk '{print $1}')
  py_fail=$(grep -Eo '[0-9]+ failed' <<<"$line" | awk '{print $1}')
  py_err=$(grep -Eo '[0-9]+ errors?' <<<"$line" | awk '{print $1}')
  py_skip=$(grep -Eo '[0-9]+ skipped' <<<"$line" | awk '{print $1}')
  py_pass=${py_pass:-0}; py_fail=$(( ${py_fail:-0} + ${py_err:-0} ))
  if [[ $py_rc -ne 0 && $py_fail -eq 0 ]]; then py_fail=1; fi
  passed=$((passed + py_pass))
  failed=$((failed + py_fail))
  skipped=$((skipped + ${py_skip:-0}))
  rm -f "$py_log"
fi

echo "tests: ${passed} passed, ${failed} failed, ${skipped} skipped"
[[ $failed -eq 0 ]]
