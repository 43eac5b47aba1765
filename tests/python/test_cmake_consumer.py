"""The C++ trainer library outside Bazel: tools/install_trainer_lib.sh installs it into a fresh
prefix, the out-of-tree CMake project tests/cmake_consumer is configured and built against it
(pkg-config), and the binary reads shards and reports losses against a real samplerd.

Two libraries: the CPU-only one (libsamplerd_trainer.a), which must build and link with no CUDA
header or library anywhere (no CUDA include path in its pkg-config flags, no CUDA header reached
from its public headers even when one is on the include path, no CUDA symbol in the archive);
and the one with the CUDA device paths (--cuda: libsamplerd_trainer_cuda.a)."""

import glob
import json
import os
import re
import shutil
import subprocess

import pytest

import samplerd
from conftest import ROOT, SamplerdProcess

CONSUMER = ROOT / "tests" / "cmake_consumer"
SAMPLES = 1000  # main.cc's job.
CUDA_INCLUDE = "/usr/local/cuda/include"  # The toolkit of WORKSPACE's @local_cuda.
# What NextToDevice says in the CPU-only library (client/cpp/device_port_none.cc).
CPU_ONLY_REFUSAL = r"device path: FAILED_PRECONDITION: this is the CPU-only trainer library"


def run(cmd, **kwargs):
    """Runs cmd, failing the test with its output if it exits non-zero."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} exited {done.returncode}:\n" \
                                 f"{done.stdout}"
    return done.stdout


def install(tmp_path_factory, *flags):
    if shutil.which("bazel") is None or shutil.which("cmake") is None:
        pytest.fail("bazel and cmake are needed (tools/install_deps.sh installs them)")
    prefix = tmp_path_factory.mktemp("prefix")
    run(["bash", str(ROOT / "tools" / "install_trainer_lib.sh"), *flags, str(prefix)], cwd=ROOT,
        timeout=900)
    return prefix


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The CPU-only library installed into a fresh prefix."""
    return install(tmp_path_factory)


@pytest.fixture(scope="module")
def installed_cuda(tmp_path_factory):
    """Both libraries (--cuda) installed into a fresh prefix."""
    return install(tmp_path_factory, "--cuda")


def pkg_config(prefix, *args):
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    return run(["pkg-config", *args], env=env).replace("/lib/pkgconfig/../..", "")


def installed_headers(prefix):
    root = prefix / "include" / "samplerd"
    return {p.relative_to(root).as_posix() for p in root.rglob("*.h")}


def test_install_tree_has_the_library_headers_and_pkg_config(installed):
    assert (installed / "lib" / "libsamplerd_trainer.a").stat().st_size > 0
    headers = installed_headers(installed)
    for h in ("client/cpp/epoch_loop.h", "client/cpp/shard_reader.h",
              "client/cpp/loss_reporter.h", "client/cpp/sampler_client.h",
              "client/cpp/reader_position.h", "client/cpp/device_port.h",
              "proto/samplerd.pb.h", "proto/samplerd.grpc.pb.h"):
        assert h in headers
    # The CPU-only install has none of the device part (samplerd::cuda included).
    assert not [h for h in headers if "cuda" in h or "device_uploader" in h], headers
    # The archive holds the library's own code and the generated proto code, and needs no CUDA.
    archive = str(installed / "lib" / "libsamplerd_trainer.a")
    symbols = run(["nm", "-C", "--defined-only", archive])
    assert "samplerd::EpochLoop::Run" in symbols
    assert "samplerd::v1::JobSpec::JobSpec" in symbols
    undefined = run(["nm", "--undefined-only", archive])
    assert not re.findall(r"\bcuda\w*", undefined), "the CPU-only archive calls the CUDA runtime"
    flags = pkg_config(installed, "--cflags", "--libs", "samplerd-trainer")
    assert f"-I{installed}/include/samplerd" in flags
    for lib in ("-lsamplerd_trainer", "-lgrpc++", "-lprotobuf", "-labsl_status"):
        assert lib in flags.split()
    assert "cuda" not in flags, flags


def test_cpu_headers_reach_no_cuda_header(installed):
    """Every installed header, compiled alone with the CUDA headers ON the include path: the
    preprocessor's list of the files it reached names none of them (a header that included
    cuda_runtime_api.h, or anything of samplerd::cuda, would reach it)."""
    cflags = pkg_config(installed, "--cflags", "samplerd-trainer").split()
    cuda_path = ["-I" + CUDA_INCLUDE] if os.path.isdir(CUDA_INCLUDE) else []
    headers = sorted(installed_headers(installed))
    source = "".join(f'#include "{h}"\n' for h in headers)
    deps = run(["g++", "-std=c++17", "-M", *cflags, *cuda_path, "-x", "c++", "-"],
               input=source)
    reached = deps.replace("\\\n", " ").split()
    assert any(p.endswith("client/cpp/epoch_loop.h") for p in reached)
    cuda = [p for p in reached if "cuda" in p.lower()]
    assert not cuda, f"CPU-only headers reach CUDA headers: {cuda}"


def build_consumer(prefix, build, pc, wrap=()):
    """Configures and builds tests/cmake_consumer against `pc`; `wrap` runs both steps."""
    run([*wrap, "cmake", "-S", str(CONSUMER), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
         f"-DSAMPLERD_TRAINER_PC={pc}", "-DCMAKE_BUILD_TYPE=Release",
         "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"], timeout=300)
    run([*wrap, "cmake", "--build", str(build), "-j", "2", "--verbose"], timeout=600)
    return build / "cmake_consumer"


def headers_reached(build):
    """Every file the consumer's compile read (the compiler's dependency file of main.cc)."""
    deps = (build / "CMakeFiles" / "cmake_consumer.dir" / "main.cc.o.d").read_text()
    return deps.replace("\\\n", " ").split()


def cuda_folders():
    """This machine's CUDA toolkit folders (/usr/local/cuda*, links resolved)."""
    return sorted({os.path.realpath(p) for p in glob.glob("/usr/local/cuda*")})


def run_consumer(binary, device_refusal):
    """Runs the consumer against a real server; `device_refusal`: what its NextToDevice line
    must say."""
    server = SamplerdProcess()
    try:
        out = run([str(binary), server.address], timeout=120)
        assert re.search(device_refusal, out), out
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


def test_cmake_consumer_builds_without_cuda_and_reads_and_reports(installed, tmp_path):
    build = tmp_path / "build"
    binary = build_consumer(installed, build, "samplerd-trainer")
    # No CUDA include path in the compile, no CUDA header read (a machine may have them on a
    # default path: this one links them into /usr/local/include), nothing of CUDA in the link.
    commands = json.loads((build / "compile_commands.json").read_text())
    assert commands and all("cuda" not in c["command"] for c in commands), commands
    reached = headers_reached(build)
    assert any(p.endswith("client/cpp/epoch_loop.h") for p in reached)
    assert not [p for p in reached if "cuda" in p.lower()], reached
    needed = run(["readelf", "-d", str(binary)])
    assert "cudart" not in needed, needed
    run_consumer(binary, CPU_ONLY_REFUSAL)


def test_cmake_consumer_builds_with_every_cuda_folder_hidden(installed, tmp_path):
    """The same build in a mount namespace where an empty folder covers each CUDA folder (and so
    every link into one, such as /usr/local/include/cuda_runtime_api.h here): as on a machine
    that never had the toolkit."""
    folders = cuda_folders()
    if not folders:
        pytest.skip("no CUDA folder on this machine: the other consumer test is this one")
    empty = tmp_path / "empty"
    empty.mkdir()
    hide = " && ".join(f"mount --bind {empty} {f}" for f in folders)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", f"{hide} && true"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot hide the CUDA folders (unshare -m needs root): {probe.stdout}")
    wrap = ["unshare", "-m", "sh", "-c", f'{hide} && test ! -e {folders[0]}/include && '
            'exec "$@"', "hidden"]
    binary = build_consumer(installed, tmp_path / "build", "samplerd-trainer", wrap)
    run_consumer(binary, CPU_ONLY_REFUSAL)


def test_cmake_consumer_builds_with_the_cuda_library(installed_cuda, tmp_path):
    assert (installed_cuda / "lib" / "libsamplerd_trainer_cuda.a").stat().st_size > 0
    assert "client/cpp/cuda_support.h" in installed_headers(installed_cuda)
    flags = pkg_config(installed_cuda, "--cflags", "--libs", "samplerd-trainer-cuda").split()
    for flag in ("-lsamplerd_trainer_cuda", "-lcudart", "-I" + CUDA_INCLUDE):
        assert flag in flags
    # Without a GPU the CUDA runtime's reason; with one, the copy to a null pointer fails.
    run_consumer(build_consumer(installed_cuda, tmp_path / "build", "samplerd-trainer-cuda"),
                 r"device path: (FAILED_PRECONDITION|INVALID_ARGUMENT|INTERNAL): (?!.*CPU-only)")
