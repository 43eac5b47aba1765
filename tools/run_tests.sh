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
  "$PY" -m pytest -q tests/python --ignore=tests/python/frameworks 2>&1 | tee "$py_log"
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

# --- Python, the framework integrations on the PyPI stack (.venv-frameworks) -------------------
# Lightning, Accelerate, Transformers and torchdata with torch 2.x (tests/python/frameworks),
# in the environment tools/install_deps.sh makes from tools/frameworks-requirements.txt.
FW_PY="$ROOT/.venv-frameworks/bin/python"
if [[ -d tests/python/frameworks ]]; then
  if [[ ! -x "$FW_PY" ]]; then
    echo "run_tests: $FW_PY missing: run tools/install_deps.sh" >&2
    failed=$((failed + 1))
  else
    export SAMPLERD_BIN="$ROOT/bazel-bin/server/samplerd"
    fw_log="$(mktemp)"
    "$FW_PY" -m pytest -q -p no:cacheprovider tests/python/frameworks 2>&1 | tee "$fw_log"
    fw_rc=${PIPESTATUS[0]}
    line=$(grep -E '[0-9]+ (passed|failed)' "$fw_log" | tail -1)
    fw_pass=$(grep -Eo '[0-9]+ passed' <<<"$line" | awk '{print $1}')
    fw_fail=$(( $(grep -Eo '[0-9]+ failed' <<<"$line" | awk '{print $1}' || true) + 0 ))
    fw_fail=$(( fw_fail + $(grep -Eo '[0-9]+ errors?' <<<"$line" | awk '{print $1}' || true) + 0 ))
    if [[ $fw_rc -ne 0 && $fw_fail -eq 0 ]]; then fw_fail=1; fi
    passed=$((passed + ${fw_pass:-0}))
    failed=$((failed + fw_fail))
    rm -f "$fw_log"
  fi
fi

echo "tests: ${passed} passed, ${failed} failed"
[[ $failed -eq 0 ]]
