"""The C++ trainer library outside Bazel: tools/install_trainer_lib.sh installs it into a fresh
prefix, the out-of-tree CMake project tests/cmake_consumer is configured and built against it
(pkg-config), and the binary reads shards and reports losses against a real samplerd."""

import os
import shutil
import subprocess

import pytest

import samplerd
from conftest import ROOT, SamplerdProcess

CONSUMER = ROOT / "tests" / "cmake_consumer"
SAMPLES = 1000  # main.cc's job.


def run(cmd, **kwargs):
    """Runs cmd, failing the test with its output if it exits non-zero."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}:\n" \
                                 f"{done.stdout}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The library installed into a fresh prefix."""
    if shutil.which("bazel") is None or shutil.which("cmake") is None:
        pytest.fail("bazel and cmake are needed (tools/install_deps.sh installs them)")
    prefix = tmp_path_factory.mktemp("prefix")
    run(["bash", str(ROOT / "tools" / "install_trainer_lib.sh"), str(prefix)], cwd=ROOT,
        timeout=900)
    return prefix


def test_install_tree_has_the_library_headers_and_pkg_config(installed):
    assert (installed / "lib" / "libsamplerd_trainer.a").stat().st_size > 0
    headers = {p.relative_to(installed / "include" / "samplerd").as_posix()
               for p in (installed / "include" / "samplerd").rglob("*.h")}
    for h in ("client/cpp/epoch_loop.h", "client/cpp/shard_reader.h",
              "client/cpp/loss_reporter.h", "client/cpp/sampler_client.h",
              "client/cpp/reader_position.h", "proto/samplerd.pb.h",
              "proto/samplerd.grpc.pb.h"):
        assert h in headers
    # The archive holds the library's own code and the generated proto code.
    symbols = run(["nm", "-C", "--defined-only", str(installed / "lib" /
                                                       "libsamplerd_trainer.a")])
    assert "samplerd::EpochLoop::Run" in symbols
    assert "samplerd::v1::JobSpec::JobSpec" in symbols
    env = dict(os.environ, PKG_CONFIG_PATH=str(installed / "lib" / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "samplerd-trainer"], env=env)
    assert f"-I{installed}/include/samplerd" in flags.replace("/lib/pkgconfig/../..", "")
    for lib in ("-lsamplerd_trainer", "-lgrpc++", "-lprotobuf", "-labsl_status", "-lcudart"):
        assert lib in flags.split()


def test_cmake_consumer_builds_and_reads_and_reports_against_a_real_server(installed, tmp_path):
    build = tmp_path / "build"
    run(["cmake", "-S", str(CONSUMER), "-B", str(build), f"-DCMAKE_PREFIX_PATH={installed}",
         "-DCMAKE_BUILD_TYPE=Release"], timeout=300)
    run(["cmake", "--build", str(build), "-j", "2"], timeout=600)
    binary = build / "cmake_consumer"

    server = SamplerdProcess()
    try:
        out = run([str(binary), server.address], timeout=120)
        assert f"epoch 0 (ShardReader + LossReporter): read={SAMPLES} accepted={SAMPLES} " \
               "closed=1" in out
        assert f"epoch 1 (EpochLoop): read={SAMPLES} accepted={SAMPLES}" in out
        # The server's view: both epochs ended, every sample's loss arrived.
        with samplerd.Client(server.address) as client:
            status = client.status("cmake_consumer")
        assert status.job.current_epoch == 2
        assert status.samples_seen == SAMPLES
        # An unreachable server is a clear error, not a hang or a crash.
        failed = subprocess.run([str(binary), "127.0.0.1:1"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, timeout=120)
        assert failed.returncode == 1
        assert "cmake_consumer: UNAVAILABLE" in failed.stderr
    finally:
        assert server.stop() == 0
