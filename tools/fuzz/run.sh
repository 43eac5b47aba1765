#!/usr/bin/env bash
# Runs samplerd's fuzz targets (docs/HARDENING.md), each for a given time, and prints one line per
# target: executions, coverage (libFuzzer's cov: edges, ft: features), corpus size and findings.
#
#   tools/fuzz/run.sh [-t SECONDS] [-o OUT_DIR] [-j JOBS] [TARGET...]
#
#   -t SECONDS  how long each target runs (default 60)
#   -o OUT_DIR  where each target's working corpus, log and crash inputs go
#               (default: a new directory under ${TMPDIR:-/tmp})
#   -j JOBS     how many targets run at once (default 1)
#   TARGET      a C++ fuzz target's Bazel label, or "load_state_dict" for the Python one
#               (tests/python/fuzz/load_state_dict_fuzzer.py, atheris); default: every target.
#
# The C++ targets are built with --config=fuzz (clang 14, libFuzzer, ASan + UBSan) and start
# from their checked-in corpus (never written to: new inputs go to OUT_DIR). Exit status: 0 when
# no target found anything; 1 when one did (its input is under OUT_DIR/<target>/, crash-*;
# make it a regression test: copy it into the target's corpus directory, fix the bug).
# Needs clang-14, libclang-rt-14-dev and, for the Python target, atheris (tools/install_deps.sh)
# and the samplerd binary (SAMPLERD_BIN, default bazel-bin/server/samplerd). BAZEL (default
# `bazel`) is the command that builds, e.g. "bazel --output_base=DIR" to keep the clang build
# apart from the gcc one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"

seconds=60
out=""
jobs=1
while getopts "t:o:j:" opt; do
  case "$opt" in
    t) seconds="$OPTARG" ;;
    o) out="$OPTARG" ;;
    j) jobs="$OPTARG" ;;
    *) sed -n '2,20p' "$0" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))

# Every target: label -> checked-in corpus directory.
declare -A CORPUS=(
  [//server:record_log_fuzzer]=server/persistence/fuzz_corpus/record_log_fuzzer
  [//server:snapshot_fuzzer]=server/persistence/fuzz_corpus/snapshot_fuzzer
  [//server:job_recovery_fuzzer]=server/fuzz_corpus/job_recovery_fuzzer
  [//server:token_table_fuzzer]=server/auth/fuzz_corpus/token_table_fuzzer
  [//server:raw_request_fuzzer]=server/fuzz_corpus/raw_request_fuzzer
  [//client/cpp:reader_position_fuzzer]=client/cpp/fuzz_corpus/reader_position_fuzzer
  [load_state_dict]=tests/python/fuzz/corpus/load_state_dict_fuzzer
)
ORDER=(//server:record_log_fuzzer //server:snapshot_fuzzer //server:job_recovery_fuzzer
  //server:token_table_fuzzer //server:raw_request_fuzzer //client/cpp:reader_position_fuzzer
  load_state_dict)
targets=("$@")
((${#targets[@]})) || targets=("${ORDER[@]}")
for t in "${targets[@]}"; do
  [[ -n "${CORPUS[$t]:-}" ]] || { echo "fuzz/run.sh: unknown target '$t' (one of: ${ORDER[*]})" >&2; exit 2; }
done
[[ -n "$out" ]] || out="$(mktemp -d "${TMPDIR:-/tmp}/samplerd-fuzz.XXXXXX")"
# The normal build's samplerd, resolved now: a build with another config may move bazel-bin.
SAMPLERD_BIN="${SAMPLERD_BIN:-$(readlink -f "$ROOT/bazel-bin/server/samplerd" || true)}"
export SAMPLERD_BIN
mkdir -p "$out"

cc_targets=()
for t in "${targets[@]}"; do [[ "$t" == //* ]] && cc_targets+=("$t"); done
if ((${#cc_targets[@]})); then
  ${BAZEL:-bazel} build --config=fuzz "${cc_targets[@]}" 2>&1 | grep -Ev '^[0-9]+\.[0-9]+: src/main/tools/' | tail -3
  bin="$(${BAZEL:-bazel} info --config=fuzz bazel-bin 2>/dev/null)"
fi

# run_one TARGET: runs it for $seconds and writes OUT/<name>/summary.
run_one() {
  local t="$1" name dir corpus log
  name="${t##*:}"
  dir="$out/$name"
  corpus="$ROOT/${CORPUS[$t]}"
  mkdir -p "$dir/corpus"
  log="$dir/log"
  local rc=0 began=$SECONDS
  if [[ "$t" == load_state_dict ]]; then
    name=load_state_dict_fuzzer
    "$ROOT/.venv/bin/python" "$ROOT/tests/python/fuzz/load_state_dict_fuzzer.py" \
      -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$dir/" \
      "$dir/corpus" "$corpus" >"$log" 2>&1 || rc=$?
  else
    local path="${t#//}"
    path="${path/://}"
    "$bin/$path" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2560 \
      -timeout=25 -artifact_prefix="$dir/" "$dir/corpus" "$corpus" >"$log" 2>&1 || rc=$?
  fi
  local execs cov ft corp findings took=$((SECONDS - began))
  execs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -Eo 'cov: [0-9]+' | grep -Eo '[0-9]+' || true)
  ft=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -Eo 'ft: [0-9]+' | grep -Eo '[0-9]+' || true)
  corp=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -Eo 'corp: [0-9]+' | grep -Eo '[0-9]+' || true)
  findings=$(find "$dir" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' \
    -o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
  if [[ $rc -ne 0 && $findings -eq 0 ]]; then findings="exit $rc (see $log)"; fi
  printf '%-24s %6ss  execs %10s  cov %6s  ft %6s  corpus %5s  findings %s\n' "$name" "$took" \
    "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$findings" | tee "$dir/summary"
}

pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
done
wait
echo "fuzz/run.sh: logs, new corpus entries and findings in $out"
! grep -q 'findings [^0]' "$out"/*/summary
