#!/usr/bin/env bash
# Runs every samplerd test: the Bazel C++ suites (unit, in-process gRPC, end-to-end against the
# real binary) and the Python client suite (real server + real PyTorch DDP processes on gloo).
# Prints one closing line: "tests: N passed, N failed".
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1

# A fresh machine: install first (a no-op when everything is there).
if ! command -v bazel >/dev/null || [[ ! -x .venv/bin/python ]]; then bash tools/install_deps.sh; fi

passed=0
failed=0

# --- C++ (Bazel) -------------------------------------------------------------------------------
bazel_log="$(mktemp)"
bazel test //... 2>&1 | tee "$bazel_log" | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/'
bazel_rc=${PIPESTATUS[0]}
# "Executed X out of Y tests: A tests pass and B fail locally." / "Y tests pass."
bz_total=$(grep -Eo 'Executed [0-9]+ out of [0-9]+ tests?' "$bazel_log" | tail -1 | awk '{print $5}')
bz_fail=$(grep -Ec '^//.* (FAILED|TIMEOUT|FAILED TO BUILD|NO STATUS)' "$bazel_log")
bz_total=${bz_total:-0}
if [[ $bazel_rc -ne 0 && $bz_fail -eq 0 ]]; then bz_fail=1; fi  # build failure: count it.
passed=$((passed + bz_total - (bz_fail > bz_total ? bz_total : bz_fail)))
failed=$((failed + bz_fail))
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
  line=$(grep -E '[0-9]+ (passed|failed)' "$py_log" | tail -1)
  py_pass=$(grep -Eo '[0-9]+ passed' <<<"$line" | awk '{print $1}')
  py_fail=$(grep -Eo '[0-9]+ failed' <<<"$line" | awk '{print $1}')
  py_err=$(grep -Eo '[0-9]+ errors?' <<<"$line" | awk '{print $1}')
  py_pass=${py_pass:-0}; py_fail=$(( ${py_fail:-0} + ${py_err:-0} ))
  if [[ $py_rc -ne 0 && $py_fail -eq 0 ]]; then py_fail=1; fi
  passed=$((passed + py_pass))
  failed=$((failed + py_fail))
  rm -f "$py_log"
fi

echo "tests: ${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
