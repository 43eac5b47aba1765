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
if ! command -v bazel >/dev/null || [[ ! -x .venv/bin/python ]] || [[ ! -x .venv-frameworks/bin/python ]]; then bash tools/install_deps.sh; fi

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
# run_pytest NAME PYTHON ARGS...: runs one pytest suite and adds its counts to the totals.
run_pytest() {
  local name="$1" python="$2"; shift 2
  local log rc line n_pass n_fail n_err n_skip
  log="$(mktemp)"
  "$python" -m pytest -q "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  line=$(grep -E '[0-9]+ (passed|failed|skipped)' "$log" | tail -1)
  n_pass=$(grep -Eo '[0-9]+ passed' <<<"$line" | awk '{print $1}')
  n_fail=$(grep -Eo '[0-9]+ failed' <<<"$line" | awk '{print $1}')
  n_err=$(grep -Eo '[0-9]+ errors?' <<<"$line" | awk '{print $1}')
  n_skip=$(grep -Eo '[0-9]+ skipped' <<<"$line" | awk '{print $1}')
  n_fail=$(( ${n_fail:-0} + ${n_err:-0} ))
  if [[ $rc -ne 0 && $n_fail -eq 0 ]]; then n_fail=1; fi
  echo "run_tests: ${name}: ${n_pass:-0} passed, ${n_fail} failed, ${n_skip:-0} skipped"
  passed=$((passed + ${n_pass:-0}))
  failed=$((failed + n_fail))
  skipped=$((skipped + ${n_skip:-0}))
  rm -f "$log"
}

if [[ -d tests/python ]]; then
  PY="$ROOT/.venv/bin/python"
  [[ -x "$PY" ]] || PY=/usr/bin/python3
  bazel build //server:samplerd 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -3
  export SAMPLERD_BIN="$ROOT/bazel-bin/server/samplerd"
  # Debian's torch 1.13 (the demo's): everything but the framework integrations.
  run_pytest "python (Debian torch)" "$PY" tests/python --ignore=tests/python/frameworks

  # The framework integrations on the pinned PyPI stack (Lightning, Accelerate, Transformers,
  # torchdata with torch 2.x) in the environment tools/install_deps.sh makes from
  # tools/frameworks-requirements.txt.
  FW_PY="$ROOT/.venv-frameworks/bin/python"
  if [[ -d tests/python/frameworks ]]; then
    if [[ -x "$FW_PY" ]]; then
      run_pytest "python (PyPI frameworks)" "$FW_PY" -p no:cacheprovider tests/python/frameworks
    else
      echo "run_tests: $FW_PY missing: run tools/install_deps.sh" >&2
      failed=$((failed + 1))
    fi
  fi
fi

echo "tests: ${passed} passed, ${failed} failed, ${skipped} skipped"
[[ $failed -eq 0 ]]
