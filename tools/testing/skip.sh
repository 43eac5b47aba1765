# shellcheck shell=bash
# Sourced by sh_tests (data: //tools/testing:skip.sh). `bazel_skip REASON` reports the test as
# skipped and exits 0: Bazel 4 has no skip status, so the test writes its own test.xml
# ($XML_OUTPUT_FILE) with one skipped case, which tools/run_tests.sh counts as skipped
# (tools/testing/count_bazel_tests.py). Outside Bazel it only prints the reason.
bazel_skip() {
  local reason name
  reason="$(printf '%s' "$*" | sed 's/&/\&amp;/g; s/</\&lt;/g; s/>/\&gt;/g; s/"/\&quot;/g')"
  name="${TEST_TARGET:-$0}"
  echo "SKIPPED: $*"
  if [[ -n "${XML_OUTPUT_FILE:-}" ]]; then
    cat >"$XML_OUTPUT_FILE" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1" failures="0" errors="0" skipped="1">
  <testsuite name="$name" tests="1" failures="0" errors="0" skipped="1">
    <testcase name="$name" status="run" result="skipped"><skipped message="$reason"/></testcase>
  </testsuite>
</testsuites>
XML
  fi
  exit 0
}
