"""tools/run_tests.sh's count of Bazel's test cases (tools/testing/count_bazel_tests.py).

Bazel 4 has no skip status: a target whose every case skipped (a GPU test here) must count as
skipped, not passed. The XML files are in the shapes gtest 1.12 and Bazel 4 write (copied from
bazel-testlogs); the sh_test skip is made by tools/testing/skip.sh itself.
"""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "testing" / "count_bazel_tests.py"

GTEST_ONE_PASSED_ONE_SKIPPED = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="0" disabled="0" errors="0" time="0" name="AllTests">
  <testsuite name="CudaStatusTest" tests="1" failures="0" disabled="0" skipped="0" errors="0">
    <testcase name="NamesTheCallAndTheRuntimeError" status="run" result="completed" time="0"
              classname="CudaStatusTest" />
  </testsuite>
  <testsuite name="GpuAvailableTest" tests="1" failures="0" disabled="0" skipped="1" errors="0">
    <testcase name="AnswersWithTheRuntimesReason" status="run" result="skipped" time="0"
              classname="GpuAvailableTest">
      <skipped message="client/cpp/cuda_support_test.cc:27&#x0A;no GPU: cuda"><![CDATA[no GPU]]></skipped>
    </testcase>
  </testsuite>
</testsuites>
"""

GTEST_ALL_SKIPPED = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="0" disabled="0" errors="0" time="0" name="AllTests">
  <testsuite name="IdentityTest" tests="2" failures="0" disabled="0" skipped="2" errors="0">
    <testcase name="EverySize" status="run" result="skipped" time="0" classname="IdentityTest">
      <skipped message="no usable GPU"><![CDATA[no usable GPU]]></skipped>
    </testcase>
    <testcase name="FixedCases" status="run" result="skipped" time="0" classname="IdentityTest">
      <skipped message="no usable GPU"><![CDATA[no usable GPU]]></skipped>
    </testcase>
  </testsuite>
</testsuites>
"""

GTEST_ONE_FAILED = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="1" disabled="0" errors="0" time="0" name="AllTests">
  <testsuite name="T" tests="2" failures="1" disabled="0" skipped="0" errors="0">
    <testcase name="A" status="run" result="completed" time="0" classname="T" />
    <testcase name="B" status="run" result="completed" time="0" classname="T">
      <failure message="x.cc:3&#x0A;Expected equality" type=""><![CDATA[x.cc:3]]></failure>
    </testcase>
  </testsuite>
</testsuites>
"""

BAZEL_GENERATED = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
  <testsuite name="examples/cpp/ddp_trainer_no_gpu_test" tests="1" failures="0" errors="0">
    <testcase name="examples/cpp/ddp_trainer_no_gpu_test" status="run" duration="3" time="3"></testcase>
      <system-out>PASS</system-out>
    </testsuite>
</testsuites>
"""


def write(testlogs, target, text):
    package, name = target[2:].split(":")
    directory = testlogs / package / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "test.xml").write_text(text)


def counts(tmp_path, log_lines):
    log = tmp_path / "bazel.log"
    log.write_text("\n".join(log_lines) + "\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(log), str(tmp_path / "testlogs")],
                         check=True, capture_output=True, text=True).stdout
    return tuple(int(x) for x in out.split())


def test_cases_are_counted_and_a_skipped_target_is_not_passed(tmp_path):
    testlogs = tmp_path / "testlogs"
    write(testlogs, "//client/cpp:cuda_support_test", GTEST_ONE_PASSED_ONE_SKIPPED)
    write(testlogs, "//kernels/cuda:identity_test", GTEST_ALL_SKIPPED)
    write(testlogs, "//examples/cpp:ddp_trainer_no_gpu_test", BAZEL_GENERATED)
    assert counts(tmp_path, [
        "INFO: Build completed successfully, 6 total actions",
        "//client/cpp:cuda_support_test                       (cached) PASSED in 0.8s",
        "//examples/cpp:ddp_trainer_no_gpu_test                        PASSED in 3.6s",
        "//kernels/cuda:identity_test                                  PASSED in 0.5s",
        "",
        "Executed 1 out of 3 tests: 3 tests pass.",
    ]) == (2, 0, 3)


def test_failures_count_their_cases_or_one(tmp_path):
    testlogs = tmp_path / "testlogs"
    write(testlogs, "//a:failed_case", GTEST_ONE_FAILED)
    write(testlogs, "//a:timed_out", GTEST_ONE_PASSED_ONE_SKIPPED)  # Cut short: not trusted.
    # Failed after its cases passed (exit status, a leak check): its case, and one failure.
    write(testlogs, "//a:failed_no_case", BAZEL_GENERATED)
    assert counts(tmp_path, [
        "//a:failed_case                                               FAILED in 1.0s",
        "//a:timed_out                                                 TIMEOUT in 300.0s",
        "//a:failed_no_case                                            FAILED in 0.1s",
        "//a:not_built                                                 FAILED TO BUILD",
        "//a:no_status                                                 NO STATUS",
        "//a:passed_no_xml                                             PASSED in 0.1s",
    ]) == (1 + 1 + 1, 1 + 1 + 1 + 1 + 1, 0)


def test_an_sh_test_skipped_by_skip_sh(tmp_path):
    """skip.sh writes the test.xml; the count reads it as one skipped case."""
    xml = tmp_path / "testlogs" / "tools" / "gpu" / "check_test" / "test.xml"
    xml.parent.mkdir(parents=True)
    result = subprocess.run(
        ["bash", "-c", f'source "{ROOT}/tools/testing/skip.sh"; bazel_skip "a GPU <is> here"'],
        env={"XML_OUTPUT_FILE": str(xml), "TEST_TARGET": "//tools/gpu:check_test"},
        capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout == "SKIPPED: a GPU <is> here\n"
    assert counts(tmp_path, ["//tools/gpu:check_test            PASSED in 2.0s"]) == (0, 0, 1)
