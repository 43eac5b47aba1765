"""Counts the test cases of a `bazel test --test_summary=short` run: passed, failed, skipped.

Bazel 4 counts targets and has no skip status, so a target whose every case was skipped (a GPU
test on a machine without one) would count as passed. This reads each target's status from
Bazel's summary in the log and its cases from <testlogs>/<package>/<name>/test.xml: gtest's XML
(a case with result="skipped" or a <skipped> element is skipped, one with <failure> or <error>
failed, any other passed), or Bazel's own for other tests (one case), or one a test wrote itself
($XML_OUTPUT_FILE: tools/testing/skip.sh). A target that failed with no readable XML (a build
failure, a crash) or that timed out counts one failed case; one that failed though its XML names
no failed case (an exit status after its cases) adds one failed case to them; one that passed
with no readable XML counts one passed case.

  python3 tools/testing/count_bazel_tests.py BAZEL_LOG TESTLOGS_DIR   # prints "PASSED FAILED SKIPPED"
"""
import os
import re
import sys
import xml.etree.ElementTree as ElementTree

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?"
                    r"(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE|"
                    r"REMOTE FAILURE)\b")


def cases_of(xml_path):
    """(passed, failed, skipped) of a test.xml, or None if it is missing or unreadable."""
    try:
        root = ElementTree.parse(xml_path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def count(log_lines, testlogs):
    passed = failed = skipped = 0
    for line in log_lines:
        match = STATUS.match(line)
        if not match:
            continue
        target, status = match.groups()
        package, _, name = target[2:].partition(":")
        cases = None
        if status in ("PASSED", "FLAKY", "FAILED"):
            cases = cases_of(os.path.join(testlogs, package, name, "test.xml"))
        if cases is None or sum(cases) == 0:
            cases = (1, 0, 0) if status in ("PASSED", "FLAKY") else (0, 1, 0)
        p, f, s = cases
        if status not in ("PASSED", "FLAKY") and f == 0:
            f = 1
        passed, failed, skipped = passed + p, failed + f, skipped + s
    return passed, failed, skipped


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], errors="replace") as f:
        print(*count(f.read().splitlines(), sys.argv[2]))


if __name__ == "__main__":
    main()
